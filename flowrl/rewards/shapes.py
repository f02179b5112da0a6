"""Rewards from the shapes verifier: dense (fraction of the prompt's constraints met) for training and the
binary GenEval-style verdict for evaluation."""
from __future__ import annotations

import torch

from ..images import to_uint8
from ..shapes import verifier
from .base import Reward, RewardOutput, register_reward


@register_reward("shapes")
class ShapesReward(Reward):
    name = "shapes"

    def __init__(self, dense: bool = True):
        self.dense = dense

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        images = to_uint8(samples)
        binary = torch.tensor([verifier.score(im, p) for im, p in zip(images, prompts)])
        if not self.dense:
            return RewardOutput(binary, {"accuracy": binary})
        dense = torch.tensor([verifier.dense_score(im, p) for im, p in zip(images, prompts)])
        return RewardOutput(dense, {"accuracy": binary})
