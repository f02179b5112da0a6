"""A VLM auditor for the ARRO-style group rubric (`edit_rubric` with `params.judge`): the same three duties as the
rule-based `ShapesEditAuditor`, answered by a vision-language model from a local folder or an OpenAI-compatible
endpoint, for edits of real images where no exact target exists.

- requested(item): one criterion, "was the instruction carried out?", a yes/no question over (source, edit);
- audit(image, item): the model lists, as a JSON list of short checks a correct edit passes ("the blue car is
  still parked on the left"), the unintended changes it sees in the edit; each becomes a yes/no criterion;
- audit_group(images, item): one audit pass over the whole group (source and every candidate in one chat, in a
  shuffled order against positional bias) when `group_audit: true` and the judge takes several images;
- verify(criterion, item): with no exact target to check against (the rule-based auditor's verification), a listed
  preservation check is kept only when the *source itself* passes it: whatever a correct edit must keep is visible
  in the source, so a hallucinated issue ("the green hat is kept" with no hat) is dropped.

A yes/no criterion holds when P(yes) / (P(yes) + P(no)) at the first answer token exceeds `threshold` (s in {0, 1},
as the rubric scores). Answers that are not a JSON list count as no issues and are counted in `unparsed`. Every
question sees the source first, then the image judged. Cost: one generation per audit (per candidate, or per group)
and one forward per (image, criterion); nothing is batched across questions yet.
"""

from __future__ import annotations

import json
import os
import random
import re

import torch

from flowrl.errors import ConfigError, UserError
from flowrl.rewards.rubric import AUDITORS, Criterion
from flowrl.rewards.vlm import generation_prompt

AUDIT_QUESTION = (
    'The first image is a source image. The edit instruction was: "{instruction}". {which} the result of that '
    "edit. List every unintended change (something the instruction did not ask for that differs from the source), "
    'each written as a short check that a correct edit would pass, e.g. "the blue square is still in the top '
    'left". Answer with a JSON list of strings only; [] when there is none.'
)
CHECK_QUESTION = (
    "The first image is a source image, the second an edit of it. Does the edit pass this check: "
    '"{check}"? Answer yes or no.'
)
REQUESTED_QUESTION = (
    "The first image is a source image, the second an edit of it made for the instruction "
    '"{instruction}". Was the instruction carried out? Answer yes or no.'
)


def parse_checks(text: str) -> list[str] | None:
    """The JSON list of strings in a judge's answer (the first [...] in it), or None when there is none."""
    match = re.search(r"\[.*\]", text, re.S)
    if match is None:
        return None
    try:
        value = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return [v.strip() for v in value if v.strip()]


class LocalVLM:
    """A local Qwen2.5-VL-style folder through transformers: yes/no shares from the next-token distribution and
    greedy generation."""

    def __init__(self, path: str, dtype: str, yes, no, max_new_tokens: int):
        from flowrl.rewards.vlm import answer_token_ids, load_local_vlm

        self.processor, self.model = load_local_vlm(
            path,
            dtype,
            "edit_rubric",
            "save a Qwen2.5-VL-style model and its processor (save_pretrained) into one local folder",
        )
        self.yes_ids = answer_token_ids(self.processor.tokenizer, yes, path, "edit_rubric")
        self.no_ids = answer_token_ids(self.processor.tokenizer, no, path, "edit_rubric")
        self.max_new_tokens = max_new_tokens

    def inputs(self, images, text):
        chat = [{"role": "user", "content": [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]}]
        prompt = generation_prompt(self.processor, chat)
        device = next(self.model.parameters()).device
        return self.processor(text=[prompt], images=list(images), return_tensors="pt").to(device)

    @torch.no_grad()
    def yes_no(self, images, text) -> tuple[float, float]:
        probs = self.model(**self.inputs(images, text)).logits[0, -1].float().softmax(-1).cpu()
        return float(probs[self.yes_ids].sum()), float(probs[self.no_ids].sum())

    @torch.no_grad()
    def generate(self, images, text) -> str:
        inputs = self.inputs(images, text)
        out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
        return self.processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


class RemoteVLM:
    """An OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted API): yes/no shares from one token's
    top log-probabilities, generation at temperature 0."""

    def __init__(
        self,
        url: str,
        model: str,
        yes,
        no,
        max_new_tokens: int,
        api_key_env: str,
        timeout: float,
        retries: int,
        top_logprobs: int,
    ):
        self.url, self.model_name, self.yes, self.no = url.rstrip("/"), model, tuple(yes), tuple(no)
        self.max_new_tokens, self.timeout, self.retries = max_new_tokens, timeout, retries
        self.top_logprobs = top_logprobs
        self.api_key = os.environ.get(api_key_env)

    def complete(self, images, text, **options) -> dict:
        from flowrl.rewards.vlm import chat_completion

        return chat_completion(
            self.url, self.model_name, images, text, self.api_key, self.timeout, self.retries, **options
        )

    def yes_no(self, images, text) -> tuple[float, float]:
        from flowrl.rewards.vlm import answer_mass

        answer = self.complete(images, text, max_tokens=1, logprobs=True, top_logprobs=self.top_logprobs)
        return answer_mass(answer, self.yes, self.no, self.url, "edit_rubric")

    def generate(self, images, text) -> str:
        answer = self.complete(images, text, max_tokens=self.max_new_tokens)
        try:
            return answer["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise UserError(f"reward edit_rubric: {self.url} answered without a message") from None


class VLMEditAuditor:
    """The rubric's auditor backed by a VLM `backend` (anything with `yes_no(images, text) -> (p_yes, p_no)` and
    `generate(images, text) -> str`; `LocalVLM` and `RemoteVLM` here). Source images come from the items as the
    editing policy reads them (`flowrl.images.item_image`)."""

    def __init__(
        self,
        backend,
        threshold: float = 0.5,
        group_audit: bool = False,
        source_input: str = "source_image",
        world: str = "shapes_edit",
        seed: int = 0,
    ):
        if not 0 < threshold < 1:
            raise ConfigError(
                f"reward edit_rubric: params.judge.threshold: expected a number in (0, 1), got {threshold}"
            )
        self.backend, self.threshold, self.group_audit = backend, threshold, group_audit
        self.source_input, self.world = source_input, world
        self.shuffle = random.Random(seed)
        self.unparsed = 0  # audit answers that were not a JSON list of strings
        self._last_source = None  # (item, size, its source image): a group asks for one item's source many times
        self.sample_size = None  # (height, width) of the edits judged in the current call

    def source(self, item):
        """The item's source image as the editor was given it: resized to the size of the edits being judged
        (`sample_size`, which the rubric reward sets per call), as the editing policy resizes it to the sample size,
        so a stretch the editor saw is not judged an unintended change; as it is (None) where the editor took it at
        its own aspect (pipeline.reference_size). Read or rendered once for consecutive calls on the same item."""
        from flowrl.images import item_image, to_pil

        cached = self._last_source
        if cached is None or cached[0] is not item or cached[1] != self.sample_size:
            image = item_image(
                item, self.source_input, self.world, "the edit_rubric VLM auditor", resize_to=self.sample_size
            )
            self._last_source = (item, self.sample_size, to_pil(image))
        return self._last_source[2]

    def passes(self, images, text) -> bool:
        p_yes, p_no = self.backend.yes_no(images, text)
        return p_yes + p_no > 0 and p_yes / (p_yes + p_no) > self.threshold

    def criterion(self, name: str, question: str, item) -> Criterion:
        source = self.source(item)
        return Criterion(name, lambda image: self.passes([source, _pil(image)], question))

    def requested(self, item) -> Criterion:
        return self.criterion(f"requested: {item.prompt}", REQUESTED_QUESTION.format(instruction=item.prompt), item)

    def checks(self, answer: str, item) -> list[Criterion]:
        found = parse_checks(answer)
        if found is None:
            self.unparsed += 1
            return []
        return [self.criterion(f"kept: {check}", CHECK_QUESTION.format(check=check), item) for check in found]

    def audit(self, image, item) -> list[Criterion]:
        question = AUDIT_QUESTION.format(instruction=item.prompt, which="The second image is")
        return self.checks(self.backend.generate([self.source(item), _pil(image)], question), item)

    def audit_group(self, images, item) -> list[Criterion]:
        """One audit pass over the group: the source, then every candidate in a shuffled order."""
        order = list(range(len(images)))
        self.shuffle.shuffle(order)
        question = AUDIT_QUESTION.format(
            instruction=item.prompt, which=f"Each of the other {len(images)} images is a candidate for"
        )
        return self.checks(
            self.backend.generate([self.source(item)] + [_pil(images[i]) for i in order], question), item
        )

    def verify(self, criterion: Criterion, item) -> bool:
        """Kept when the source passes the preservation check itself (it keeps everything by definition)."""
        return bool(criterion.check(self.source(item)))


def _pil(image):
    from PIL import Image

    return image if isinstance(image, Image.Image) else Image.fromarray(image)


@AUDITORS.register("vlm")
def build_vlm_auditor(judge: dict | None) -> VLMEditAuditor:
    """`params.judge` of edit_rubric: {path | url, model, dtype, yes, no, max_new_tokens, threshold, group_audit,
    api_key_env, timeout, retries, top_logprobs}."""
    if judge is None:
        raise ConfigError("reward edit_rubric: the vlm auditor needs params.judge (a local folder or an endpoint)")
    known = {
        "path",
        "url",
        "model",
        "dtype",
        "yes",
        "no",
        "max_new_tokens",
        "threshold",
        "group_audit",
        "api_key_env",
        "timeout",
        "retries",
        "top_logprobs",
    }
    unknown = sorted(set(judge) - known)
    if unknown:
        raise ConfigError(
            f"reward edit_rubric: params.judge: unknown field(s) {unknown}; expected some of {sorted(known)}"
        )
    if ("path" in judge) == ("url" in judge):
        raise ConfigError(
            "reward edit_rubric: params.judge: give exactly one of path (a local VLM folder) and url "
            "(an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1)"
        )
    from flowrl.rewards.vlm import answer_words

    yes = answer_words(judge.get("yes", ("Yes", "yes")), "judge.yes", "edit_rubric")
    no = answer_words(judge.get("no", ("No", "no")), "judge.no", "edit_rubric")
    tokens = int(judge.get("max_new_tokens", 256))
    if "path" in judge:
        backend = LocalVLM(judge["path"], judge.get("dtype", "float32"), yes, no, tokens)
    else:
        backend = RemoteVLM(
            judge["url"],
            judge.get("model", "judge"),
            yes,
            no,
            tokens,
            judge.get("api_key_env", "OPENAI_API_KEY"),
            float(judge.get("timeout", 60.0)),
            int(judge.get("retries", 3)),
            int(judge.get("top_logprobs", 20)),
        )
    return VLMEditAuditor(backend, float(judge.get("threshold", 0.5)), bool(judge.get("group_audit", False)))
