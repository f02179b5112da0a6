"""Rewards from the shapes verifier: dense (fraction of the prompt's constraints met) for training and the
binary GenEval-style verdict for evaluation."""
from __future__ import annotations

import numpy as np
import torch

from ..shapes import verifier
from .base import Reward, RewardOutput, register_reward


def to_uint8_images(samples: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] in [0, 1] -> uint8 [B, H, W, 3]."""
    return (samples.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


@register_reward("shapes")
class ShapesReward(Reward):
    name = "shapes"

    def __init__(self, dense: bool = True):
        self.dense = dense

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        images = to_uint8_images(samples)
        binary = torch.tensor([verifier.score(im, p) for im, p in zip(images, prompts)])
        if not self.dense:
            return RewardOutput(binary, {"accuracy": binary})
        dense = torch.tensor([verifier.dense_score(im, p) for im, p in zip(images, prompts)])
        return RewardOutput(dense, {"accuracy": binary})
