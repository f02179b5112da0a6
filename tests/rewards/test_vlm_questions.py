"""TVRL's real-VLM question scorer (`vlm_questions`) on a tiny random Qwen2.5-VL built offline: the differentiable
pixel path equals the processor's, log p(yes) does not depend on the batch, its gradient is the model's, and TVRL
takes credit maps from it."""

import json

import numpy as np
import pytest
import torch
from tiny_vlm import save_tiny_qwen25_vl

from flowrl.algorithms import build_algorithm
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError, UserError
from flowrl.rewards import build_reward
from flowrl.rewards.base import WeightedSum
from flowrl.rewards.vlm_questions import video_pixel_values
from flowrl.worlds.moving_shapes.world import sample_pairs


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen25_vl_video")
    save_tiny_qwen25_vl(path)
    return path


@pytest.fixture(scope="module")
def scorer(folder):
    return build_reward("vlm_questions", path=str(folder), batch_size=2)


def processor_pixels(scorer, videos_u8: torch.Tensor) -> torch.Tensor:
    frames = [v.permute(1, 0, 2, 3) for v in videos_u8]  # [F, 3, H, W] uint8, as the processor takes them
    text = ["a <|vision_start|><|video_pad|><|vision_end|>"] * len(frames)
    return scorer.processor(text=text, videos=frames, return_tensors="pt", do_sample_frames=False)[
        "pixel_values_videos"
    ]


def test_pixel_values_equal_the_processors(scorer):
    u8 = torch.randint(0, 256, (2, 3, 9, 56, 56), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    ours = video_pixel_values(u8.float() / 255, scorer.processor.video_processor)
    torch.testing.assert_close(ours, processor_pixels(scorer, u8), atol=1e-5, rtol=0)  # no resize: exact
    clips = torch.from_numpy(sample_pairs(2, np.random.default_rng(0))[0]).permute(0, 4, 1, 2, 3).contiguous()
    ours = video_pixel_values(clips.float() / 255, scorer.processor.video_processor)  # 32 -> 28 px per frame
    reference = processor_pixels(scorer, clips)
    assert ours.shape == reference.shape
    # float bicubic against torchvision's uint8 kernel: equal but for a few hard edges (normalised units)
    assert (ours - reference).abs().mean() < 0.01


def test_log_yes_is_the_models_and_independent_of_the_batch(scorer):
    videos = torch.rand(3, 3, 9, 32, 32, generator=torch.Generator().manual_seed(1))
    questions = [
        "Does this video show a red circle? Answer yes or no.",
        "a square moving left",
        "Does this video show two blue squares moving left? Answer yes or no.",
    ]
    together = scorer.log_yes(videos, questions)
    alone = torch.cat([scorer.log_yes(videos[i : i + 1], [q]) for i, q in enumerate(questions)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    assert (together < 0).all()
    # a bias on the yes token drives log p(yes) to 0: the score is read from the model's yes tokens
    head = scorer.model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight.data.copy_(head.weight.data)
    biased.bias.data.zero_()
    biased.bias.data[scorer.yes_ids] = 30.0
    scorer.model.lm_head = biased
    try:
        torch.testing.assert_close(scorer.log_yes(videos, questions), torch.zeros(3), atol=1e-4, rtol=0)
    finally:
        scorer.model.lm_head = head


def test_the_pixel_gradient_is_the_directional_derivative(scorer):
    videos = torch.rand(1, 3, 9, 56, 56, generator=torch.Generator().manual_seed(2), dtype=torch.float32)
    question = ["Does this video show a red circle? Answer yes or no."]
    x = videos.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(scorer.log_yes(x, question).sum(), x)
    direction = grad / grad.norm()
    h = 1e-2
    with torch.no_grad():
        slope = scorer.log_yes(videos + h * direction, question) - scorer.log_yes(videos - h * direction, question)
    assert grad.norm() > 0
    assert (slope / (2 * h)).item() == pytest.approx(grad.norm().item(), rel=0.05)


def test_tvrl_takes_credit_maps_from_the_vlm(folder, scorer):
    from tiny_pipelines import rolled_out, tiny_wan

    policy, batch = rolled_out(tiny_wan)  # the tiny Wan rollout batch
    algorithm = build_algorithm("tvrl", {}, SamplerSection())
    algorithm.bind_reward(WeightedSum([scorer], [1.0]))
    raw = algorithm.credit_maps(policy, batch)
    assert raw.shape == (6, 12) and torch.isfinite(raw).all()
    torch.testing.assert_close(raw.mean(1), torch.ones(6))
    assert (raw.std(1) > 0).all()  # the VLM's gradient is not flat over tokens


def test_questions_file_and_bad_params(folder, tmp_path):
    table = tmp_path / "questions.jsonl"
    table.write_text(
        json.dumps({"prompt": "a red circle", "questions": ["Is there a red circle?", "Is it red?"]}) + "\n"
    )
    scorer = build_reward("vlm_questions", path=str(folder), questions_file=str(table))
    assert scorer.questions("a red circle") == ["Is there a red circle?", "Is it red?"]
    assert scorer.questions("a square") == ["Does this video show a square? Answer yes or no."]
    table.write_text('{"prompt": "a red circle"}\n')
    with pytest.raises(UserError, match="line 1"):
        build_reward("vlm_questions", path=str(folder), questions_file=str(table))
    with pytest.raises(ConfigError, match="must contain"):
        build_reward("vlm_questions", path=str(folder), question="Is it good?")
    with pytest.raises(ConfigError, match="videos"):
        scorer.log_yes(torch.rand(1, 3, 32, 32), ["q"])
