"""Video rewards built from image rewards: any image reward scored on a video's frames and aggregated."""
from __future__ import annotations

import torch

from ..errors import ConfigError
from .base import Reward, RewardOutput, build_reward, register_reward


@register_reward("per_frame")
class PerFrameReward(Reward):
    """`reward` (an image reward, with `params`) on `frames` evenly spaced frames of each video [B, 3, F, H, W]
    (0: every frame), aggregated over frames by `aggregate` (mean or min). Images pass through unchanged."""
    modalities = ("image", "video")

    def __init__(self, reward: str, params: dict | None = None, aggregate: str = "mean", frames: int = 0):
        if aggregate not in ("mean", "min"):
            raise ConfigError(f"reward.params.aggregate: expected 'mean' or 'min', got {aggregate!r}")
        self.inner = build_reward(reward, where="reward.params.reward", **(params or {}))
        self.aggregate, self.frames = aggregate, frames
        self.name = f"per_frame_{self.inner.name}"
        self.differentiable = self.inner.differentiable

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        if samples.ndim == 4:
            return self.inner(samples, prompts, meta)
        b, c, f, h, w = samples.shape
        index = torch.arange(f) if not self.frames or self.frames >= f else torch.linspace(0, f - 1, self.frames).round().long()
        k = len(index)
        frames = samples[:, :, index.to(samples.device)].permute(0, 2, 1, 3, 4).reshape(b * k, c, h, w)
        repeat = {key: [v for v in values for _ in range(k)] for key, values in (meta or {}).items()}
        scores = self.inner(frames, [p for p in prompts for _ in range(k)], repeat).scores.view(b, k)
        return RewardOutput(scores.mean(1) if self.aggregate == "mean" else scores.min(1).values)
