"""benchmarks/probe_rewards.py: the path-check rewards score what they say."""

import torch

from flowrl.worlds.shapes.world import PALETTE


def test_probe_rewards_score_brightness_and_the_prompts_own_colour():
    from benchmarks.probe_rewards import MeanBrightness, PromptColourShare

    clips = torch.zeros(3, 3, 9, 8, 8)  # videos [B, 3, F, H, W]
    clips[0] = torch.tensor(PALETTE["red"]).view(3, 1, 1, 1) / 255
    clips[1, :, :, :4] = torch.tensor(PALETTE["blue"]).view(3, 1, 1, 1) / 255  # the top half blue
    prompts = ["a square turning from red to blue", "a blue circle moving left", "a red circle"]
    share = PromptColourShare()(clips, prompts).scores
    assert torch.allclose(share, torch.tensor([1.0, 0.5, 0.0]))
    assert PromptColourShare()(clips[:1], ["a blue circle"]).scores.item() == 0.0  # red is not the named blue
    assert PromptColourShare()(clips[:1], ["two circles"]).scores.item() == 0.0  # no colour named
    bright = MeanBrightness()(clips, prompts).scores
    assert bright[2] == 0 and torch.isclose(bright[0], clips[0].mean())
    images = clips[:, :, 0]  # images [B, 3, H, W] score the same way
    assert torch.allclose(PromptColourShare()(images, prompts).scores, share)
