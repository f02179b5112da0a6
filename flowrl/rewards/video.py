"""Video rewards built from image rewards: any image reward scored on a video's frames and aggregated."""

from __future__ import annotations

import torch

from flowrl.errors import ConfigError
from flowrl.rewards.base import Reward, RewardOutput, build_reward, register_reward


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

    def bind_policy(self, policy) -> None:
        self.inner.bind_policy(policy)

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        if samples.ndim == 4:
            return self.inner(samples, prompts, meta)
        b, c, f, h, w = samples.shape
        index = (
            torch.arange(f)
            if not self.frames or self.frames >= f
            else torch.linspace(0, f - 1, self.frames).round().long()
        )
        k = len(index)
        frames = samples[:, :, index.to(samples.device)].permute(0, 2, 1, 3, 4).reshape(b * k, c, h, w)
        repeat = {key: [v for v in values for _ in range(k)] for key, values in (meta or {}).items()}
        scores = self.inner(frames, [p for p in prompts for _ in range(k)], repeat).scores.view(b, k)
        return RewardOutput(scores.mean(1) if self.aggregate == "mean" else scores.min(1).values)


@register_reward("frame_consistency")
class FrameConsistencyReward(Reward):
    """How steady a video's content is, VBench's subject-consistency form: per frame t >= 1, the mean of
    cos(f_t, f_0) and cos(f_t, f_{t-1}), averaged over frames, in [-1, 1] (1: frames identical in feature space).
    Features are the frames' CLIP image embeddings when `path` names a CLIPModel folder (as VBench uses DINO / CLIP
    features), else the frames themselves, area-downsampled to `size` and centred per frame (cheap; sees pixel
    flicker, not semantic drift). Differentiable. Videos only."""

    name = "frame_consistency"
    modalities = ("video",)
    differentiable = True

    def __init__(self, path: str | None = None, size: int = 16):
        self.size = size
        self.clip = None
        if path is not None:
            from flowrl.rewards.clip import CLIPReward, require_local_folder

            self.clip = CLIPReward(
                require_local_folder(path, "frame_consistency", "a CLIPModel folder"), "cosine", "frame_consistency"
            )

    def features(self, frames: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] -> L2-normalised features [N, D]."""
        if self.clip is not None:
            return self.clip.image_embeddings(frames)
        small = torch.nn.functional.adaptive_avg_pool2d(frames.float(), self.size).flatten(1)
        return torch.nn.functional.normalize(small - small.mean(1, keepdim=True), dim=-1)

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        if samples.ndim != 5:
            raise ConfigError("reward frame_consistency: expected videos [B, 3, F, H, W]")
        b, c, f, h, w = samples.shape
        feats = self.features(samples.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)).view(b, f, -1)
        to_first = (feats[:, 1:] * feats[:, :1]).sum(-1)
        to_previous = (feats[:, 1:] * feats[:, :-1]).sum(-1)
        return RewardOutput(((to_first + to_previous) / 2).mean(1))
