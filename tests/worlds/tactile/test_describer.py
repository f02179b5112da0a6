"""The description policy: a tiny Qwen2.5-VL built with the description vocabulary; samples hold exactly the tokens
through the first end token and never a special or chat token; the token log-probabilities are the model's; and
GTPO moves the policy towards what its reward pays for."""

import torch

from flowrl.worlds.tactile.describer import (
    GTPOConfig,
    build_describer,
    load_describer,
    prompt_inputs,
    refine_with_gtpo,
    sample,
    suppressed,
    token_log_probs,
)
from flowrl.worlds.tactile.scenes import world_pairs


def test_samples_are_masked_after_their_end_and_never_hold_special_tokens(tmp_path):
    build_describer(tmp_path, seed=0)
    model, processor = load_describer(tmp_path)
    rgb = torch.stack([p.rgb for p in world_pairs("eval", 6)])
    torch.manual_seed(0)
    texts, inputs = sample(model, processor, rgb)
    start = inputs["prompt_length"]
    answer, mask = inputs["input_ids"][:, start:], inputs["attention_mask"][:, start:]
    end = processor.tokenizer.eos_token_id
    for row in range(len(texts)):
        ends = (answer[row] == end).nonzero()
        last = int(ends[0]) if len(ends) else answer.shape[1] - 1
        assert mask[row, : last + 1].all() and not mask[row, last + 1 :].any()
        assert not set(answer[row, : last + 1].tolist()) & set(suppressed(processor))
    log_probs, answer_mask = token_log_probs(model, inputs)
    assert torch.equal(answer_mask, mask.float()) and (log_probs <= 0).all()
    teacher = prompt_inputs(processor, rgb[:1], ["woven, fine pitch"])
    assert teacher["input_ids"].shape[1] == teacher["prompt_length"] + 5  # woven , fine pitch and the end token


def test_gtpo_raises_the_share_of_what_its_reward_pays_for(tmp_path):
    model, processor = build_describer(tmp_path, seed=0)
    pairs = world_pairs("train", 16)

    def share(n=64):
        torch.manual_seed(1)
        texts, _ = sample(model, processor, torch.stack([pairs[i % 16].rgb for i in range(n)]))
        return sum("woven" in t for t in texts) / n

    before = share()
    history = refine_with_gtpo(
        model,
        processor,
        pairs,
        lambda texts, _: torch.tensor([float("woven" in t) for t in texts]),
        GTPOConfig(steps=8, images=4, group=6, lr=5e-3),
    )
    assert len(history) == 8
    assert share() > before + 0.2
