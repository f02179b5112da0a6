"""Path-check rewards: easy targets a working RL path must raise within a few dozen updates.

When a method does not learn on a task's real reward, these tell a broken path (log-densities, advantages, the
prompt-to-sample pairing) from a weak signal. Both score images [B, 3, H, W] and videos [B, 3, F, H, W]:
- `MeanBrightness`: the mean pixel value (ignores the prompt);
- `PromptColourShare`: the share of pixels within 0.3 (RGB distance, values in [0, 1]) of the colour the prompt names
  first (the start colour of a turning object), 0 for a prompt naming none: it needs each sample paired with its
  own prompt.

    python -m flowrl train configs/moving_shapes_grpo.yaml train.updates=40 eval.enabled=false \
        "reward=[{name: 'benchmarks.probe_rewards:PromptColourShare'}]"

(run from the repository root, which puts `benchmarks` on the import path). docs/research/video.md has the measured
runs.
"""

from __future__ import annotations

import re

import torch

from flowrl.rewards.base import Reward, RewardOutput
from flowrl.worlds.shapes.world import PALETTE

NEAR = 0.3


class MeanBrightness(Reward):
    name = "mean_brightness"
    modalities = ("image", "video")

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        return RewardOutput(samples.float().flatten(1).mean(1))


class PromptColourShare(Reward):
    name = "prompt_colour_share"
    modalities = ("image", "video")

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        scores = []
        for sample, prompt in zip(samples.float(), prompts):
            named = re.search(r"\b(" + "|".join(PALETTE) + r")\b", prompt)
            if named is None:
                scores.append(torch.zeros(()))
                continue
            rgb = torch.tensor(PALETTE[named.group(1)], dtype=torch.float32) / 255
            distance = (sample - rgb.view(3, *[1] * (sample.ndim - 1))).pow(2).sum(0).sqrt()
            scores.append((distance < NEAR).float().mean())
        return RewardOutput(torch.stack(scores))
