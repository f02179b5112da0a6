"""The safe-RL reward and the StableDiffusionSafetyChecker adapter (on a tiny random instance, offline)."""

import numpy as np
import pytest
import torch

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


CLIP_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
CLIP_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)


def _tiny_checker(folder, images):
    """A random checker whose thresholds sit inside the cosines of `images`, so both verdicts occur."""
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig

    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vocab_size": 99,
            "bos_token_id": 0,
            "eos_token_id": 1,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=8,
    )
    model = StableDiffusionSafetyChecker(config).eval()
    with torch.no_grad():
        model.concept_embeds.normal_()
        model.special_care_embeds.normal_()
        embeds = torch.nn.functional.normalize(
            model.visual_projection(model.vision_model((images - CLIP_MEAN) / CLIP_STD)[1])
        )
        model.concept_embeds_weights.copy_(
            (embeds @ torch.nn.functional.normalize(model.concept_embeds).T).quantile(0.97, dim=0)
        )
        model.special_care_embeds_weights.copy_(
            (embeds @ torch.nn.functional.normalize(model.special_care_embeds).T).quantile(0.9, dim=0)
        )
    model.save_pretrained(folder)
    return model


def test_safety_checker_margin_matches_the_checkers_own_verdict(tmp_path):
    from flowrl.rewards.safety_checker import SafetyChecker

    images = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    model = _tiny_checker(tmp_path / "checker", images)
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
