"""The VLM-judge reward on a tiny random Qwen2.5-VL (the real transformers classes, a local word-level tokenizer with
Qwen's special tokens, a chat template), run locally and behind an OpenAI-compatible endpoint on loopback."""

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from conftest import REPO
from PIL import Image
from tiny_vlm import PROMPTS, SPECIAL, WORDS, save_tiny_qwen25_vl, send_json

from flowrl.errors import ConfigError
from flowrl.rewards import build_reward
from flowrl.rewards.base import RewardUnavailable


@pytest.fixture(scope="module")
def judge_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_qwen25_vl")
    save_tiny_qwen25_vl(folder)
    return folder


def images(n=3, seed=0):
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_local_judge_scores_are_yes_shares_independent_of_the_batch(judge_folder):
    judge = build_reward("vlm_judge", path=str(judge_folder), batch_size=3)
    out = judge(images(), PROMPTS)
    assert out.scores.shape == (3,) and ((out.scores > 0) & (out.scores < 1)).all()
    assert (out.info["p_yes"] <= out.scores).all()  # the share renormalises over yes + no only
    one_by_one = torch.cat([judge(images()[i : i + 1], PROMPTS[i : i + 1]).scores for i in range(3)])
    torch.testing.assert_close(out.scores, one_by_one, atol=1e-5, rtol=1e-4)  # left padding changes nothing


def test_the_score_follows_the_models_yes_and_no_logits(judge_folder):
    judge = build_reward("vlm_judge", path=str(judge_folder))
    vocab = judge.processor.tokenizer.get_vocab()
    head = judge.model.lm_head
    for word, expected in [("Yes", 1.0), ("No", 0.0)]:
        biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
        biased.weight.data.copy_(head.weight.data)
        biased.bias.data.zero_()
        biased.bias.data[vocab[word]] = 30.0  # the judge now all but surely answers `word`
        judge.model.lm_head = biased
        torch.testing.assert_close(judge(images(), PROMPTS).scores, torch.full((3,), expected), atol=1e-4, rtol=0)
    judge.model.lm_head = head


class FakeOpenAI(BaseHTTPRequestHandler):
    """/v1/chat/completions answering one token with top_logprobs from the tiny local judge."""

    judge = None

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = request["messages"][0]["content"]
        image = Image.open(io.BytesIO(base64.b64decode(content[0]["image_url"]["url"].split(",", 1)[1])))
        question = content[1]["text"]
        judge = self.judge
        chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        text = judge.processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        with torch.no_grad():
            logits = judge.model(**judge.processor(text=[text], images=[image], return_tensors="pt")).logits[0, -1]
        logprobs = logits.float().log_softmax(-1)
        top = logprobs.topk(request["top_logprobs"])
        tokens = judge.processor.tokenizer.convert_ids_to_tokens(top.indices.tolist())
        body = {
            "choices": [
                {
                    "logprobs": {
                        "content": [
                            {
                                "token": tokens[0],
                                "logprob": top.values[0].item(),
                                "top_logprobs": [
                                    {"token": t, "logprob": v} for t, v in zip(tokens, top.values.tolist())
                                ],
                            }
                        ]
                    }
                }
            ]
        }
        if "nologprobs" in question:
            body = {"choices": [{"message": {"content": "Yes"}}]}
        send_json(self, body)

    def log_message(self, *args):
        pass


def test_an_openai_compatible_endpoint_gives_the_local_scores(judge_folder):
    local = build_reward("vlm_judge", path=str(judge_folder))
    FakeOpenAI.judge = local
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        remote = build_reward("vlm_judge", url=url, top_logprobs=len(SPECIAL + WORDS), concurrency=2)
        torch.testing.assert_close(
            remote(images(), PROMPTS).scores, local(images(), PROMPTS).scores, atol=1e-4, rtol=1e-4
        )
        with pytest.raises(Exception, match="answered without logprobs"):
            build_reward("vlm_judge", url=url, question="nologprobs {prompt}")(images(1), PROMPTS[:1])
    finally:
        server.shutdown()
    with pytest.raises(RewardUnavailable, match=f"reward server {url} did not answer after 1 tries"):
        build_reward("vlm_judge", url=url, retries=0, timeout=2)(images(1), PROMPTS[:1])


def test_bad_judge_params_are_named():
    with pytest.raises(ConfigError, match="exactly one of params.path"):
        build_reward("vlm_judge")
    with pytest.raises(ConfigError, match="must contain {prompt}"):
        build_reward("vlm_judge", url="http://127.0.0.1:1/v1", question="Is it good?")


def test_answer_words_as_yaml_reads_them_are_named(tmp_path):
    """YAML 1.1 reads `yes: [Yes, yes]` as {True: [True, True]}: the key once failed as 'keywords must be strings',
    the values made every endpoint score NaN (or a TypeError after a local model loaded), and one string was taken
    letter by letter; a questions_file was read only after the model loaded, and a string of questions as letters."""
    import yaml

    from flowrl.config import load_config
    from flowrl.errors import UserError
    from flowrl.rewards.base import check_reward
    from flowrl.rewards.vlm_questions import VLMQuestionScorer

    params = yaml.safe_load("{url: 'http://127.0.0.1:1/v1', 'yes': [Yes, yes]}")
    with pytest.raises(ConfigError, match=r"params.yes: expected a list of answer words .* got \[True, True\]"):
        build_reward("vlm_judge", **params)
    with pytest.raises(ConfigError, match="reward.0..params: a key reads as True: YAML takes a bare yes / no"):
        load_config(REPO / "configs/shapes_grpo.yaml", ["reward=[{name: vlm_judge, params: {yes: ['Yes']}}]"])
    with pytest.raises(ConfigError, match=r"reward.0..params.judge: a key reads as False"):
        load_config(REPO / "configs/shapes_grpo.yaml", ["reward=[{name: edit_rubric, params: {judge: {no: ['No']}}}]"])
    assert build_reward("vlm_judge", url="http://127.0.0.1:1/v1", yes="Yes").yes == ("Yes",)
    with pytest.raises(ConfigError, match="judge.no: expected a list"):
        build_reward("edit_rubric", judge={"url": "http://127.0.0.1:1/v1", "no": [False]})
    with pytest.raises(ConfigError, match="params.questions_file: .*nowhere.jsonl does not exist"):
        check_reward("vlm_questions", {"path": str(tmp_path), "questions_file": str(tmp_path / "nowhere.jsonl")})
    letters = tmp_path / "questions.jsonl"
    letters.write_text(json.dumps({"prompt": "a red circle", "questions": "Is it red?"}) + "\n")
    with pytest.raises(UserError, match="line 1: expected"):
        VLMQuestionScorer.read_questions(str(letters))


def test_the_yes_share_normalises_over_both_words_when_both_are_likely():
    """P(yes) / (P(yes) + P(no)) where both hold mass (0.45 and 0.35: 0.5625, not 0.45); no mass on either is NaN,
    a failed sample rather than a score."""
    from flowrl.rewards.vlm import yes_share

    shares = yes_share(torch.tensor([0.45, 0.2, 0.0]), torch.tensor([0.35, 0.6, 0.0]))
    torch.testing.assert_close(shares[:2], torch.tensor([0.5625, 0.25]))
    assert torch.isnan(shares[2])


SWITCHED = (  # opens a think block unless told enable_thinking=false, as Qwen3's templates do
    "{% for m in messages %}<|user|>{{ m['content'][0]['text'] }}\n{% endfor %}{% if add_generation_prompt %}"
    "<|assistant|>{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}{% endif %}"
)
ALWAYS = (  # opens one whatever it is told
    "{% for m in messages %}<|user|>{{ m['content'][0]['text'] }}\n{% endfor %}{% if add_generation_prompt %}"
    "<|assistant|><think>\n{% endif %}"
)


def test_the_judge_scores_the_answer_not_the_opening_of_a_thought(judge_folder):
    """The first token the judges read must be the answer: thinking is switched off through the template's own
    switch, a block opened regardless is closed empty, and a template without thinking is left as it was."""
    from transformers import AutoProcessor

    from flowrl.rewards.vlm import generation_prompt

    processor = AutoProcessor.from_pretrained(judge_folder)
    chat = [{"role": "user", "content": [{"type": "text", "text": "is it red?"}]}]
    plain = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert generation_prompt(processor, chat) == plain
    processor.chat_template = SWITCHED
    assert "<think>" in processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert generation_prompt(processor, chat) == "<|user|>is it red?\n<|assistant|>"
    processor.chat_template = ALWAYS
    assert generation_prompt(processor, chat) == "<|user|>is it red?\n<|assistant|><think>\n\n</think>\n\n"
