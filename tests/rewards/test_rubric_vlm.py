"""The VLM auditor of the group rubric (flowrl/rewards/rubric_vlm.py): answers parsed into checks, hallucinated
checks dropped by the source, the rubric reward by hand on a scripted judge, one audit pass per group, and the local
(tiny random Qwen2.5-VL) and OpenAI-compatible back-ends end to end."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from tiny_vlm import save_tiny_qwen25_vl, send_json

from flowrl.errors import ConfigError
from flowrl.rewards import build_reward
from flowrl.rewards.rubric import EditRubricReward
from flowrl.rewards.rubric_vlm import VLMEditAuditor, parse_checks
from flowrl.tasks.base import Condition

RED, GREEN, BLUE = (220, 40, 40), (40, 200, 60), (40, 60, 220)
INSTRUCTION = "make the red block green"
KEEP_BLUE = "the blue block is still on the right"


def picture(left=None, right=None) -> np.ndarray:
    image = np.zeros((32, 32, 3), dtype=np.uint8)
    if left:
        image[8:24, 2:14] = left
    if right:
        image[8:24, 18:30] = right
    return image


SOURCE = picture(RED, BLUE)
ITEM = Condition(INSTRUCTION, inputs={"source_image": SOURCE})


def shows(image, color, side) -> bool:
    half = np.asarray(image)[:, :16] if side == "left" else np.asarray(image)[:, 16:]
    return bool((np.abs(half.astype(int) - color).sum(-1) < 30).any())


class ScriptedJudge:
    """A deterministic stand-in for a VLM: audits list the lost blue block (and always a hallucinated hat); checks
    read the pixels."""

    def __init__(self, answer=None):
        self.generations, self.questions, self.answer = [], [], answer

    def generate(self, images, text):
        self.generations.append(len(images))
        if self.answer is not None:
            return self.answer
        issues = ["the yellow hat is kept"]
        if any(not shows(image, BLUE, "right") for image in images[1:]):
            issues.append(KEEP_BLUE)
        return "Here you go: " + json.dumps(issues)

    def yes_no(self, images, text):
        source, edit = images
        self.questions.append(text)
        assert np.array_equal(np.asarray(source), SOURCE)  # every question sees the source first
        if "Was the instruction" in text:
            holds = shows(edit, GREEN, "left")
        elif KEEP_BLUE in text:
            holds = shows(edit, BLUE, "right")
        else:  # the hat: nothing yellow anywhere
            holds = False
        return (0.9, 0.1) if holds else (0.2, 0.7)


def candidates() -> torch.Tensor:
    batch = np.stack([picture(GREEN, BLUE), picture(GREEN, None), SOURCE])  # perfect, blue lost, not edited
    return torch.from_numpy(batch).permute(0, 3, 1, 2).float() / 255


def test_judge_answers_become_checks_or_count_as_unparsed():
    assert parse_checks('Sure. ["a", " b ", ""] done') == ["a", "b"]
    assert parse_checks("[]") == []
    assert parse_checks("no list here") is None
    assert parse_checks('["a", 3]') is None and parse_checks("[unquoted]") is None


@pytest.mark.parametrize("group_audit", [False, True])
def test_the_vlm_rubric_equals_the_hand_computation(group_audit):
    judge = ScriptedJudge()
    reward = EditRubricReward("group", auditor=VLMEditAuditor(judge, group_audit=group_audit))
    out = reward(candidates(), [INSTRUCTION] * 3, {"conditions": [ITEM] * 3})
    # the hat fails on the source itself and is dropped; rubric = requested (0.5) + blue kept (0.5)
    # perfect: both; blue lost: requested only; not edited: blue kept only
    assert out.scores.tolist() == [1.0, 0.5, 0.5] and out.info["rubric_size"].tolist() == [2, 2, 2]
    assert reward.rubrics_built == 1
    # one audit pass with the source and all three candidates, or one per candidate with the source and it
    assert judge.generations == ([4] if group_audit else [2, 2, 2])


def test_per_sample_audits_score_each_candidate_against_its_own_issues():
    out = EditRubricReward("sample", auditor=VLMEditAuditor(ScriptedJudge()))(
        candidates(), [INSTRUCTION] * 3, {"conditions": [ITEM] * 3}
    )
    # only the blue-lost candidate lists the blue block: it scores 0.5 of 1; the others are judged by the request
    assert out.scores.tolist() == [1.0, 0.5, 0.0] and out.info["rubric_size"].tolist() == [1, 2, 1]


def test_an_unparsed_audit_lists_nothing_and_is_counted():
    auditor = VLMEditAuditor(ScriptedJudge(answer="I think it is fine."))
    out = EditRubricReward("group", auditor=auditor)(candidates(), [INSTRUCTION] * 3, {"conditions": [ITEM] * 3})
    assert out.scores.tolist() == [1.0, 1.0, 0.0] and auditor.unparsed == 3


def test_bad_judge_params_are_named():
    with pytest.raises(ConfigError, match="exactly one of path"):
        build_reward("edit_rubric", judge={})
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['pth'\]"):
        build_reward("edit_rubric", judge={"pth": "x"})
    with pytest.raises(ConfigError, match="threshold"):
        VLMEditAuditor(ScriptedJudge(), threshold=1.5)


def test_a_local_vlm_folder_audits_and_checks_end_to_end(tmp_path):
    save_tiny_qwen25_vl(tmp_path)
    for group_audit in (False, True):
        reward = build_reward(
            "edit_rubric", judge={"path": str(tmp_path), "max_new_tokens": 4, "group_audit": group_audit}
        )
        out = reward(candidates()[:2], [INSTRUCTION] * 2, {"conditions": [ITEM] * 2})
        # the tiny vocabulary has no "[": its answers are never a list, so the rubric is the request alone
        assert reward.auditor.unparsed == (1 if group_audit else 2)
        assert out.info["rubric_size"].tolist() == [1, 1] and set(out.scores.tolist()) <= {0.0, 1.0}
    model = reward.auditor.backend.model
    vocab = reward.auditor.backend.processor.tokenizer.get_vocab()
    head = model.lm_head
    for word, expected in [("Yes", 1.0), ("No", 0.0)]:
        biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
        biased.weight.data.copy_(head.weight.data)
        biased.bias.data.zero_()
        biased.bias.data[vocab[word]] = 30.0  # the judge now all but surely answers `word`
        model.lm_head = biased
        out = reward(candidates()[:2], [INSTRUCTION] * 2, {"conditions": [ITEM] * 2})
        assert out.scores.tolist() == [expected, expected]


class FakeEndpoint(BaseHTTPRequestHandler):
    """/v1/chat/completions: one-token requests get yes/no log-probabilities, longer ones an audit list."""

    requests: list = []

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = request["messages"][0]["content"]
        FakeEndpoint.requests.append((request.get("max_tokens"), sum(c["type"] == "image_url" for c in content)))
        if request.get("max_tokens") == 1:
            top = [{"token": "Yes", "logprob": -0.1}, {"token": " no", "logprob": -2.5}]
            body = {"choices": [{"logprobs": {"content": [{"token": "Yes", "logprob": -0.1, "top_logprobs": top}]}}]}
        else:
            body = {"choices": [{"message": {"content": json.dumps([KEEP_BLUE])}}]}
        send_json(self, body)

    def log_message(self, *args):
        pass


def test_an_openai_compatible_judge_audits_and_checks():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeEndpoint.requests = []
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        reward = build_reward("edit_rubric", judge={"url": url, "group_audit": True})
        out = reward(candidates(), [INSTRUCTION] * 3, {"conditions": [ITEM] * 3})
    finally:
        server.shutdown()
    # the endpoint says yes to everything: rubric = request + blue kept, every candidate passes both
    assert out.scores.tolist() == [1.0, 1.0, 1.0] and out.info["rubric_size"].tolist() == [2, 2, 2]
    audits = [images for tokens, images in FakeEndpoint.requests if tokens != 1]
    checks = [images for tokens, images in FakeEndpoint.requests if tokens == 1]
    assert audits == [4] and set(checks) == {2}


class SourceRecorder:
    """A judge that lists nothing, passes every check and records the source image (the first) of every call."""

    def __init__(self):
        self.sources = []

    def generate(self, images, text):
        self.sources.append(np.asarray(images[0]))
        return "[]"

    def yes_no(self, images, text):
        self.sources.append(np.asarray(images[0]))
        return 0.9, 0.1


def test_the_judge_sees_each_source_at_the_size_of_the_edits_it_judges():
    """A 24x40 source and 16x16 edits: every question shows the source resized to 16x16, as the editor was given it
    (flowrl.images.resized, the policy's own resizing), not the original."""
    from flowrl.images import as_image_batch, resized, to_uint8

    rng = np.random.default_rng(0)
    source = rng.integers(0, 255, (24, 40, 3), dtype=np.uint8)
    item = Condition(INSTRUCTION, inputs={"source_image": source})
    judge = SourceRecorder()
    seen = judge.sources
    reward = EditRubricReward(mode="group", auditor=VLMEditAuditor(judge))
    edits = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    reward(edits, [INSTRUCTION] * 2, {"conditions": [item, item]})
    expected = to_uint8(resized(as_image_batch(source)[0], 16, 16)[None])[0]
    assert seen and all(np.array_equal(s, expected) for s in seen)


def test_an_editor_given_its_source_at_its_own_aspect_is_judged_against_the_source_as_it_is():
    """Under pipeline.reference_size (FLUX.2, Qwen-Image-Edit) the editor takes a 24x40 source at its own aspect, not
    stretched to the 16x16 sample: the judge is shown the source unstretched (a stretch it never saw would pass for
    an unintended change)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    source = rng.integers(0, 255, (24, 40, 3), dtype=np.uint8)
    item = Condition(INSTRUCTION, inputs={"source_image": source})
    judge = SourceRecorder()
    seen = judge.sources
    reward = build_reward("edit_rubric", mode="group")
    reward.auditor = VLMEditAuditor(judge)
    reward.bind_policy(SimpleNamespace(reference_size=384))
    reward(
        torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)),
        [INSTRUCTION] * 2,
        {"conditions": [item, item]},
    )
    assert seen and all(np.array_equal(s, source) for s in seen)
    seen.clear()
    reward.bind_policy(SimpleNamespace(reference_size=None))  # the sample size again
    reward(
        torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)),
        [INSTRUCTION] * 2,
        {"conditions": [item, item]},
    )
    assert seen and all(s.shape == (16, 16, 3) for s in seen)


def test_eval_rewards_binds_a_judge_to_the_samples_reference_size(tmp_path):
    """`flowrl eval rewards` has no policy: what the folder's sampling.json says of it (--reference-size) stands in,
    so an edit judge sees the sources as the editor took them; a folder without it, at the sample size."""
    from flowrl.cli.eval import sampled_policy_facts

    assert sampled_policy_facts(tmp_path).reference_size is None
    (tmp_path / "sampling.json").write_text(json.dumps({"reference_size": 384, "steps": 20}))
    reward = build_reward("edit_rubric", mode="group")
    reward.bind_policy(sampled_policy_facts(tmp_path))
    assert reward.sources_at_sample_size is False


def test_paraphrases_of_one_issue_make_one_criterion():
    """Candidates' audits that name one issue in other words ("green square kept", "The green square is still
    there.") build one criterion beside the requested change, not two; a different issue stays its own."""
    from types import SimpleNamespace

    from flowrl.rewards.rubric import Criterion, EditRubricReward, issue_key

    class Auditor:
        def requested(self, item):
            return Criterion("requested: " + item.prompt, lambda image: True)

        def verify(self, criterion, item):
            return True

    reward = EditRubricReward(auditor=Auditor())
    item = SimpleNamespace(prompt="make the circle red")
    issues = [Criterion(name, lambda image: True) for name in ("green square kept", "The green square is still there.")]
    assert len(reward.rubric(item, issues)) == 2
    other = issues + [Criterion("blue triangle kept", lambda image: True)]
    assert len(reward.rubric(item, other)) == 3
    assert issue_key("no extra objects") != issue_key("extra objects")
