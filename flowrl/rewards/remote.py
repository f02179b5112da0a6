"""Rewards served over HTTP: `flowrl serve-reward NAME` serves any registered reward (FastAPI + uvicorn), and the
`remote` reward scores through such a server, so a reward with its own dependencies (a detector, OCR, a VLM judge)
runs in its own environment, as the anchors run theirs.

The wire format is safetensors, never pickle: a request holds the samples (float32 in [0, 1], so a served reward
sees what a local one sees) and, in the file's metadata, the prompts and the JSON-able per-sample metadata; a
response holds `scores` and the info tensors.
An optional shared token travels as `Authorization: Bearer TOKEN`. The server binds 127.0.0.1 unless told
otherwise. The client retries with exponential back-off and then raises `RewardUnavailable` naming the URL; the
loop turns that into a clean stop with a checkpoint (train.max_failed_reward_share), and resuming once the server
is back continues exactly.
"""
# no `from __future__ import annotations`: FastAPI must see the real Request class in the handlers below

import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref

import numpy as np
import torch
from safetensors.torch import load, save

from flowrl.errors import UserError
from flowrl.rewards.base import Reward, RewardOutput, RewardUnavailable, build_reward, register_reward


def encode_request(samples: torch.Tensor, prompts: list[str], meta: dict | None) -> bytes:
    """A reward call as one safetensors body: the samples and the condition items' per-sample inputs (a source or
    condition image) as tensors, once per distinct item (a group's samples share theirs), the prompts and the other
    metadata (each item's included) as JSON in its header. A source named by a file path in the metadata (a .jsonl
    prompt file's "image", made absolute when the file is read) travels as the path: the server must see that file."""
    shareable = {k: v for k, v in (meta or {}).items() if k != "conditions"}  # conditions hold arrays: sent apart
    tensors = {"samples": samples.detach().float().cpu().contiguous()}
    kinds = {}  # which inputs were numpy arrays (a uint8 [H, W, 3] image), so the server gets them as they were
    if meta and "conditions" in meta:
        first = {}
        shareable["condition_refs"] = [first.setdefault(id(item), i) for i, item in enumerate(meta["conditions"])]
        shareable["condition_meta"] = [c.meta for c in meta["conditions"]]
        for i, item in enumerate(meta["conditions"]):
            if shareable["condition_refs"][i] != i:
                continue
            for key, value in item.inputs.items():
                parts = {key: value}
                if isinstance(value, list) and all(_is_image(v) for v in value):
                    # several reference images (sizes may differ): marked as a list, then element by element
                    kinds[f"{i}/{key}"] = "list"
                    parts = {f"{key}#{k}": v for k, v in enumerate(value)}
                for name, part in parts.items():
                    numpy = not isinstance(part, torch.Tensor)
                    kinds[f"{i}/{name}"] = "numpy" if numpy else "tensor"
                    tensors[f"input/{i}/{name}"] = (
                        torch.tensor(np.asarray(part)) if numpy else part.detach().cpu().contiguous().clone()
                    )
    header = {
        "prompts": json.dumps(prompts),
        "meta": json.dumps(shareable, default=str),
        "input_kinds": json.dumps(kinds),
    }
    return save(tensors, metadata=header)


def decode_request(body: bytes) -> tuple[torch.Tensor, list[str], dict]:
    """The reward call `encode_request` sent: samples, prompts and metadata, with the condition items rebuilt (their
    inputs included; samples that shared an item share it again) when the call carried them."""
    from flowrl.tasks.base import Condition

    tensors = load(body)
    header = json.loads(_metadata(body))
    prompts, meta = json.loads(header["prompts"]), json.loads(header["meta"])
    if meta.get("condition_meta") is not None:
        inputs = {}
        kinds = json.loads(header["input_kinds"])
        for name, kind in kinds.items():  # in the order written: a list's marker, then its elements in order
            i, key = name.split("/", 1)
            mine = inputs.setdefault(int(i), {})
            if kind == "list":
                mine[key] = []
                continue
            value = tensors[f"input/{name}"]
            value = value.numpy() if kind == "numpy" else value
            parent = key.rsplit("#", 1)[0]
            if "#" in key and kinds.get(f"{i}/{parent}") == "list":
                mine[parent].append(value)
            else:
                mine[key] = value
        refs, metas, items = meta.pop("condition_refs"), meta.pop("condition_meta"), []
        for i, (prompt, ref) in enumerate(zip(prompts, refs)):
            items.append(items[ref] if ref != i else Condition(prompt, inputs=inputs.get(i, {}), meta=dict(metas[i])))
        meta["conditions"] = items
    return tensors["samples"].float(), prompts, meta


def _is_image(value) -> bool:
    """An image as condition inputs hold one: a PIL image, an array or tensor of at least 2 dimensions."""
    return hasattr(value, "convert") or getattr(value, "ndim", 0) >= 2


def _metadata(body: bytes) -> str:
    """The safetensors header's __metadata__ as JSON text."""
    size = int.from_bytes(body[:8], "little")
    return json.dumps(json.loads(body[8 : 8 + size]).get("__metadata__", {}))


def request_problem(samples: torch.Tensor, prompts) -> str | None:
    """What makes a decoded request the client's error rather than the reward's (None when nothing does): checked
    before scoring, since a reward may zip a count mismatch away or score NaN pixels as if they were an image."""
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        return "prompts: expected a list of strings, one per sample"
    count = len(samples) if samples.ndim else 0
    if count != len(prompts):
        return f"{count} samples and {len(prompts)} prompts; expected one prompt per sample"
    broken = [i for i, sample in enumerate(samples) if not torch.isfinite(sample).all()]
    if broken:
        return f"samples {broken[:8]} hold NaN or infinite values; expected finite samples (images in [0, 1])"
    return None


REWARD_RAISED = 422  # the served reward raised on the request's samples (not an outage: no retry)


MAX_BODY_MB = 256.0  # the largest request body a reward server reads by default


def reward_app(reward, name: str, device, token: str | None = None, max_body_mb: float = MAX_BODY_MB):
    """The FastAPI app that serves `reward` (already built and on `device`): GET /health, POST /score. A body that is
    not a request of flowrl's client, or one whose samples and prompts do not pair up or hold NaN, is answered 400
    naming the problem, one over `max_body_mb` 413 (read no further), a reward that raises on the samples 422."""
    from fastapi import FastAPI, HTTPException, Request, Response

    app = FastAPI(title=f"flowrl reward {name}")
    limit = int(max_body_mb * 2**20)

    def check(request: Request) -> None:
        if token is not None and request.headers.get("authorization") != f"Bearer {token}":
            raise HTTPException(status_code=401, detail="missing or wrong token")

    async def bounded_body(request: Request) -> bytes:
        too_large = HTTPException(
            status_code=413, detail=f"request body over {max_body_mb:g} MB (serve-reward --max-body-mb)"
        )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    @app.get("/health")
    def health(request: Request) -> dict:
        check(request)
        return {"reward": name, "differentiable": reward.differentiable, "modalities": list(reward.modalities)}

    @app.post("/score")
    async def score(request: Request) -> Response:
        check(request)
        body = await bounded_body(request)
        if not body:
            raise HTTPException(
                status_code=400, detail="empty body; expected the safetensors request of flowrl's client"
            )
        try:
            samples, prompts, meta = decode_request(body)
        except Exception as error:  # any body the decoder cannot read is the client's error, said as such
            raise HTTPException(
                status_code=400,
                detail=f"malformed request ({type(error).__name__}: {str(error)[:200]}); expected the safetensors "
                "request of flowrl's client (a `samples` tensor and `prompts` / `meta` in its metadata)",
            ) from None
        problem = request_problem(samples, prompts)
        if problem is not None:
            raise HTTPException(status_code=400, detail=problem)
        try:
            with torch.no_grad():  # the samples on the reward's device, as a run hands them to its rewards
                out = reward(samples.to(device), prompts, meta)
        except Exception as error:  # the reward's own failure on these samples, not the server's: 422, so the
            # client scores them one by one (as in-process) rather than taking the server for down
            raise HTTPException(status_code=REWARD_RAISED, detail=f"{type(error).__name__}: {error}") from None
        tensors = {
            "scores": out.scores.float().cpu().contiguous(),
            **{f"info/{k}": v.float().cpu().contiguous() for k, v in out.info.items()},
        }
        return Response(content=save(tensors), media_type="application/octet-stream")

    return app


def serve_reward(
    name: str,
    params: dict,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    device: str | None = None,
    max_body_mb: float = MAX_BODY_MB,
):
    """Serve reward `name` (built with `params`) until interrupted, its models on `device` (None: the GPU of this
    process's LOCAL_RANK, as a run's `process: true` child inherits it, when there is one; else the CPU); request
    bodies over `max_body_mb` are refused."""
    import uvicorn

    from flowrl.devices import chosen_device

    device = chosen_device(device)
    reward = build_reward(name, where="serve-reward", **params).to(device)
    print(f"serving reward {name} at http://{host}:{port} (POST /score, GET /health)", flush=True)  # once it is built
    uvicorn.run(reward_app(reward, name, device, token, max_body_mb), host=host, port=port, log_level="warning")


def post_with_retries(
    server: str,
    route: str,
    body: bytes,
    content_type: str,
    token: str | None,
    timeout: float,
    retries: int,
    backoff: float,
) -> bytes:
    """POST `body` to server + route; network errors and HTTP 5xx are retried `retries` times with exponential
    back-off, then `RewardUnavailable` names the server; HTTP 4xx (bad token, bad request) fails at once."""
    url = server + route
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})},
    )
    last = None
    for attempt in range(retries + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            if error.code == REWARD_RAISED:  # the served reward raised on these samples: its failure, as in-process
                raise RuntimeError(
                    f"reward served at {server} raised: {error.read()[:300].decode(errors='replace')}"
                ) from None
            if error.code < 500:  # a client error will not heal by retrying
                raise RewardUnavailable(
                    f"reward server {server} refused the request: HTTP "
                    f"{error.code} {error.read()[:200].decode(errors='replace')}"
                ) from None
            last = f"HTTP {error.code}"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:  # (a server dying mid-answer:
            # IncompleteRead, an HTTPException, not an OSError)
            last = str(getattr(error, "reason", error)) or type(error).__name__
        if attempt < retries:
            time.sleep(backoff * 2**attempt)
    raise RewardUnavailable(f"reward server {server} did not answer after {retries + 1} tries ({last})")


@register_reward("remote")
class RemoteReward(Reward):
    """A reward computed by `flowrl serve-reward` at `url` (e.g. http://127.0.0.1:8765). What a reward learns of the
    sampling policy (`bind_policy`) does not cross the wire: a served edit judge sees each source at the sample size."""

    modalities = ("image", "video", "3d")  # whatever the served reward takes; the server answers for it
    scores_groups = True  # the served reward may be a group rubric: keep a condition's samples in one request

    @classmethod
    def groups_scored(cls, params: dict) -> bool:
        # what the server scores is not known here: a run does not refuse cuts for it (a served group rubric needs
        # memory.reward_microbatch and batch sizes of whole groups, set by hand: docs/guide/rewards.md)
        return False

    def __init__(
        self,
        url: str,
        name: str = "remote",
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 1.0,
        token: str | None = None,
        batch_size: int = 0,
    ):
        self.url, self.name, self.timeout, self.retries, self.backoff = url.rstrip("/"), name, timeout, retries, backoff
        # unset: $FLOWRL_REWARD_TOKEN, as the server reads it (a token in params is written to config.yaml, every
        # checkpoint's run_config.yaml and W&B)
        self.token = token if token is not None else os.environ.get("FLOWRL_REWARD_TOKEN")
        self.batch_size = batch_size

    def _post(self, body: bytes) -> bytes:
        return post_with_retries(
            self.url, "/score", body, "application/octet-stream", self.token, self.timeout, self.retries, self.backoff
        )

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        size = self.batch_size or len(prompts)
        scores, info = [], {}
        for start in range(0, len(prompts), size):
            part = slice(start, start + size)
            part_meta = {k: v[part] for k, v in (meta or {}).items()}
            tensors = load(self._post(encode_request(samples[part], prompts[part], part_meta)))
            scores.append(tensors.pop("scores"))
            for key, value in tensors.items():
                info.setdefault(key.removeprefix("info/"), []).append(value)
        return RewardOutput(torch.cat(scores).to(samples.device), {k: torch.cat(v) for k, v in info.items()})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_reward_server(
    name: str, params: dict, token: str | None = None, port: int | None = None, startup_timeout: float = 120.0
) -> tuple[subprocess.Popen, str, dict]:
    """`flowrl serve-reward NAME` in a child process on loopback; returns it, its URL and its /health answer once
    it answers
    (UserError with the child's last output when it exits or does not come up within `startup_timeout`)."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    env = {**os.environ, **({"FLOWRL_REWARD_TOKEN": token} if token else {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "flowrl", "serve-reward", name, "--params", json.dumps(params), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    request = urllib.request.Request(f"{url}/health", headers={"Authorization": f"Bearer {token}"} if token else {})
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(request, timeout=1) as response:
                return process, url, json.loads(response.read())
        except OSError:
            time.sleep(0.25)
    process.kill()
    process.wait()
    log.seek(0)
    raise UserError(
        f"reward {name}: its server process did not come up at {url}: {log.read()[-1500:].decode(errors='replace')}"
    )


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


class ProcessReward(RemoteReward):
    """Reward `name` (with `params`) scored in a child process of its own (`reward[i].process: true`): its
    computation runs beside the rollout without holding this process's GIL, with its own memory, and through the
    same wire as a remote server (the child is `flowrl serve-reward` on a loopback port with a random token).
    The child is stopped when this object is collected or the interpreter exits."""

    def __init__(self, name: str, params: dict | None = None, **client):
        token = secrets.token_hex(16)
        self.process, url, health = start_reward_server(name, params or {}, token=token)
        weakref.finalize(self, stop_process, self.process)
        super().__init__(url, name=name, token=token, **client)
        self.modalities = tuple(health["modalities"])
