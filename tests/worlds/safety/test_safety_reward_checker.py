"""The safe-RL reward and the StableDiffusionSafetyChecker adapter (on a tiny random instance, offline)."""

import numpy as np
import pytest
import torch
from tiny_reward_models import CLIP_MEAN, CLIP_STD, tiny_safety_checker

from flowrl.images import to_unit
from flowrl.rewards import build_reward
from flowrl.worlds.shapes.prompts import parse_prompt
from flowrl.worlds.shapes.scenes import scene_objects
from flowrl.worlds.shapes.world import render


def _image(prompt, seed=0):
    return render(scene_objects(parse_prompt(prompt), np.random.default_rng(seed)))


def test_safe_reward_drops_only_the_unsafe_attribute_and_zeroes_unsafe_images():
    reward = build_reward("safe_shapes")
    blank = np.full_like(_image("a blue square"), 255)
    images = np.stack(
        [
            _image(
                "a blue triangle and a blue square"
            ),  # safe, fulfils "a red triangle and a blue square" bar the colour
            _image("a red triangle and a blue square"),  # exactly what was asked: unsafe
            _image("a blue square"),
            blank,  # benign prompt: ordinary dense score
            _image("a red triangle"),
        ]
    )  # indirect prompt, unsafe outcome
    prompts = [
        "a red triangle and a blue square",
        "a red triangle and a blue square",
        "a blue square",
        "a blue square",
        "a triangle",
    ]
    out = reward(to_unit(images), prompts)
    assert out.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert out.info["unsafe"].tolist() == [0.0, 1.0, 0.0, 0.0, 1.0]
    assert out.info["accuracy"].tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]


def test_safety_checker_margin_matches_the_checkers_own_verdict(tmp_path):
    from flowrl.rewards.safety_checker import SafetyChecker

    images = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    model = tiny_safety_checker(tmp_path / "checker", images)
    checker = SafetyChecker(tmp_path / "checker")
    margins = checker.margins(images)
    _, flagged = model.forward_onnx((images - CLIP_MEAN) / CLIP_STD, images.clone())
    assert 0 < int(flagged.sum()) < 64, "the tiny instance should flag some images and pass others"
    assert torch.equal(margins > 0, flagged)
    reward = build_reward("safety_checker", path=str(tmp_path / "checker"))
    assert torch.equal(reward(images, [""] * 64).scores, (~flagged).float())
    reward.to("meta")  # the checker is a helper object of the reward's: Reward.to reaches its model
    assert {p.device.type for p in reward.checker.model.parameters()} == {"meta"}


def test_safety_checker_names_a_missing_folder(tmp_path):
    from flowrl.errors import UserError
    from flowrl.rewards.safety_checker import SafetyChecker

    with pytest.raises(UserError, match="does not exist"):
        SafetyChecker(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        SafetyChecker(tmp_path / "empty")
