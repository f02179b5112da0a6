"""`flowrl serve-reward` in a real server process on loopback and the `remote` reward: the same scores as the reward
in-process, training through it, a token, and a server that dies mid-run stopping the run cleanly."""

import pytest
import torch
from run_helpers import tiny_run_config

from flowrl.config import load_config
from flowrl.errors import UserError
from flowrl.rewards import build_reward
from flowrl.rewards.remote import start_reward_server
from flowrl.train import Trainer

pytest.importorskip("fastapi")  # the test extra installs fastapi and uvicorn


@pytest.fixture
def server():
    process, url, health = start_reward_server("jpeg_compressibility", {}, token="secret")
    assert health["reward"] == "jpeg_compressibility" and health["modalities"] == ["image"]
    yield url, process
    process.kill()
    process.wait(timeout=30)


def test_remote_scores_equal_local_scores_and_training_goes_through_it(server, tiny_sd3_dir, tmp_path):
    url, _ = server
    images = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    remote = build_reward("remote", url=url, token="secret")
    assert torch.equal(remote(images, ["a"] * 5).scores, build_reward("jpeg_compressibility")(images, ["a"] * 5).scores)
    with pytest.raises(Exception, match="HTTP 401"):
        build_reward("remote", url=url, token="wrong")(images, ["a"] * 5)
    with pytest.MonkeyPatch.context() as patch:  # the token from the environment, as the server takes it
        patch.setenv("FLOWRL_REWARD_TOKEN", "secret")
        assert torch.equal(build_reward("remote", url=url)(images, ["a"] * 5).scores, remote(images, ["a"] * 5).scores)

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "remote", updates=2)
    rows = {}
    for name, reward in [
        ("local", "{name: jpeg_compressibility}"),
        ("served", f"{{name: remote, params: {{url: '{url}', token: secret}}}}"),
    ]:
        trainer = Trainer(load_config(path, [f"run.name={name}", f"reward=[{reward}]"]), log=False)
        rows[name] = []
        trainer.run(lambda update, metrics: rows[name].append(metrics["reward_mean"]))
    assert rows["served"] == rows["local"]  # two updates, the same rewards, so the same training


def test_a_reward_in_its_own_process_scores_and_trains_exactly_as_in_process(tiny_sd3_dir, tmp_path):
    from flowrl.rewards.remote import ProcessReward

    images = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    served = ProcessReward("jpeg_compressibility")
    assert served.process.poll() is None and served.modalities == ("image",)
    assert torch.equal(served(images, ["a"] * 5).scores, build_reward("jpeg_compressibility")(images, ["a"] * 5).scores)
    child = served.process
    del served
    assert child.wait(timeout=30) is not None  # collected: the child is stopped

    path = tiny_run_config(
        tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "process", updates=2, rollout_microbatch=4
    )
    rows = {}
    for name, extra in [
        ("inline", []),
        ("process_async", ["reward=[{name: jpeg_compressibility, process: true}]", "runtime.async_rewards=true"]),
    ]:
        trainer = Trainer(load_config(path, [f"run.name={name}", *extra]), log=False)
        rows[name] = []
        trainer.run(lambda update, metrics: rows[name].append(metrics["reward_mean"]))
    assert rows["process_async"] == rows["inline"]


def test_a_dying_reward_server_stops_the_run_cleanly(server, tiny_sd3_dir, tmp_path):
    url, process = server
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "dies", updates=3)
    reward = f"{{name: remote, params: {{url: '{url}', token: secret, retries: 1, backoff: 0.1, timeout: 5}}}}"
    trainer = Trainer(load_config(path, [f"reward=[{reward}]"]), log=False)
    state = {"killed": False}

    def kill_after_first(update, metrics):
        if not state["killed"]:
            process.kill()
            process.wait(timeout=30)
            state["killed"] = True

    with pytest.raises(
        UserError, match=f"reward server {url} did not answer after 2 tries.*stopped with a checkpoint at update 1"
    ):
        trainer.run(kill_after_first)
    assert (trainer.checkpoint_dir / "update_000001" / "state.json").is_file()


def test_a_request_carries_each_items_inputs_and_metadata_as_they_were():
    import numpy as np
    from safetensors.torch import load

    from flowrl.rewards.remote import decode_request, encode_request
    from flowrl.tasks.base import Condition

    source = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    image = torch.rand(3, 5, 5)
    edit = Condition("edit me", inputs={"source_image": source}, meta={"tag": "a", "scene_seed": 3})
    references = [source, source[:3, :2].copy()]  # several reference images of different sizes: a list
    items = [
        edit,
        Condition("shape me", inputs={"image": image}),
        Condition("refs", inputs={"source_image": references, "none#yet": [], "weights": [0.5, 2.0]}),
        Condition("bare"),
        edit,
    ]  # a group shares `edit`
    body = encode_request(
        torch.rand(5, 3, 8, 8), [i.prompt for i in items], {"conditions": items, "step": [1, 2, 3, 4, 5]}
    )
    assert sorted(k for k in load(body) if k.startswith("input/")) == [
        "input/0/source_image",
        "input/1/image",
        "input/2/source_image#0",
        "input/2/source_image#1",
        "input/2/weights",
    ]
    samples, prompts, meta = decode_request(body)
    got = meta["conditions"]
    assert prompts == ["edit me", "shape me", "refs", "bare", "edit me"] and meta["step"] == [1, 2, 3, 4, 5]
    assert samples.shape == (5, 3, 8, 8) and got[4] is got[0]
    assert [c.prompt for c in got] == prompts and [c.meta for c in got] == [i.meta for i in items]
    assert isinstance(got[0].inputs["source_image"], np.ndarray) and np.array_equal(
        got[0].inputs["source_image"], source
    )
    assert isinstance(got[1].inputs["image"], torch.Tensor) and torch.equal(got[1].inputs["image"], image)
    assert [r.shape for r in got[2].inputs["source_image"]] == [(4, 6, 3), (3, 2, 3)]
    assert all(np.array_equal(a, b) for a, b in zip(got[2].inputs["source_image"], references))
    assert got[2].inputs["none#yet"] == [] and np.array_equal(got[2].inputs["weights"], [0.5, 2.0])
    assert got[3].inputs == {}


def test_a_served_3d_reward_reads_the_condition_image_the_item_carries():
    """silhouette_iou behind serve-reward on an item outside the 3D world's grammar: its condition image comes only
    from the item's inputs, so the served score equals the in-process one."""
    from flowrl.tasks.base import Condition
    from flowrl.worlds.shapes3d.conditions import condition_item, world_image

    item = Condition("my own object", inputs={"image": world_image(condition_item("a sphere on top of a cylinder", 5))})
    grids = torch.rand(2, 32, 32, 32) - 0.3
    local = build_reward("silhouette_iou")(grids, [item.prompt] * 2, {"conditions": [item] * 2}).scores
    process, url, health = start_reward_server("silhouette_iou", {})
    try:
        assert health["modalities"] == ["3d"]
        remote = build_reward("remote", url=url)(grids, [item.prompt] * 2, {"conditions": [item] * 2}).scores
    finally:
        process.kill()
        process.wait(timeout=30)
    assert torch.equal(remote, local)


def test_a_served_reward_that_raises_costs_only_its_samples(monkeypatch):
    """The served reward raising on a request is its failure, not an outage: the client scores the samples one by
    one, as for an in-process reward, and only the raising sample gets no score (all NaN before: the 500 was
    retried as a dead server)."""
    import os

    from conftest import REPO

    from flowrl.rewards.base import score_robustly
    from flowrl.rewards.remote import RemoteReward

    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "tests" / "support"), os.environ.get("PYTHONPATH", "")])
    )
    process, url, _ = start_reward_server("toy_rewards:RaisesOnSomeSeeds", {})
    try:
        samples = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        out, error = score_robustly(RemoteReward(url, retries=0), samples, ["a"] * 4, {"seeds": [7, 1, 2, 3]})
    finally:
        process.kill()
        process.wait(timeout=30)
    assert "cannot score this one" in error
    assert torch.isnan(out.scores[0]) and torch.isfinite(out.scores[1:]).all()
    torch.testing.assert_close(out.scores[1:], samples[1:].flatten(1).mean(1))


def test_a_server_dying_mid_answer_is_retried_as_an_outage(monkeypatch):
    """http.client's IncompleteRead (the connection closed mid-response) is no OSError: it was not retried, and fell
    through to the per-sample path (a wait per sample) instead of the next try."""
    import http.client
    import urllib.request

    from flowrl.rewards.remote import post_with_retries

    calls = []

    class Answer:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            calls.append(1)
            if len(calls) == 1:
                raise http.client.IncompleteRead(b"par")
            return b"whole"

    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout: Answer())
    assert post_with_retries("http://x", "/score", b"", "application/octet-stream", None, 1.0, 2, 0.0) == b"whole"
    assert len(calls) == 2


def test_the_server_answers_malformed_requests_with_400_and_refuses_large_bodies():
    """An empty body, plain text and JSON are the client's errors (400 naming what was expected, no traceback in the
    server's log); a body over the limit is refused with 413 before it is read whole; a real request still scores."""
    from fastapi.testclient import TestClient

    from flowrl.rewards import build_reward
    from flowrl.rewards.remote import encode_request, reward_app

    app = reward_app(build_reward("jpeg_compressibility"), "jpeg_compressibility", torch.device("cpu"), max_body_mb=1)
    client = TestClient(app, raise_server_exceptions=False)
    for body, content_type in [
        (b"", "application/octet-stream"),
        (b"hello", "text/plain"),
        (b'{"samples": [1, 2]}', "application/json"),
    ]:
        answer = client.post("/score", content=body, headers={"Content-Type": content_type})
        assert answer.status_code == 400, (body, answer.status_code, answer.text)
        assert "expected the safetensors request of flowrl's client" in answer.json()["detail"]
    assert client.post("/score", content=b"x" * (2 * 2**20)).status_code == 413
    samples = torch.rand(2, 3, 16, 16)
    good = client.post("/score", content=encode_request(samples, ["a", "b"], {}))
    assert good.status_code == 200


def _nan_pixel(samples: torch.Tensor) -> torch.Tensor:
    samples[1, 0, 3, 4] = float("nan")
    return samples


UNSCORABLE_REQUESTS = {  # case: (samples, prompts, expected detail)
    "more images than prompts": (torch.rand(2, 3, 16, 16), ["a red circle"], "2 samples and 1 prompts"),
    "NaN in an image": (
        _nan_pixel(torch.rand(2, 3, 16, 16)),
        ["a red circle"] * 2,
        "samples [1] hold NaN or infinite values",
    ),
}


@pytest.mark.parametrize("case", UNSCORABLE_REQUESTS)
def test_the_server_answers_requests_it_cannot_score_with_400_naming_why(case):
    """A well-formed body whose samples and prompts do not pair up, or whose images hold NaN, is the client's error:
    400 naming it, before the reward sees it (which scored as many samples as there were prompts, or the NaN
    image as if it were one)."""
    from fastapi.testclient import TestClient

    from flowrl.rewards.remote import encode_request, reward_app

    samples, prompts, expected = UNSCORABLE_REQUESTS[case]
    client = TestClient(
        reward_app(build_reward("shapes"), "shapes", torch.device("cpu")), raise_server_exceptions=False
    )
    answer = client.post("/score", content=encode_request(samples, prompts, {}))
    assert answer.status_code == 400 and expected in answer.json()["detail"], (answer.status_code, answer.text)
