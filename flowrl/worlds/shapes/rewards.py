"""The `shapes` reward, from the shapes verifier: dense (fraction of the
prompt's constraints met, for images optionally with "no objects beyond the named ones" as one more constraint)
for training and the binary GenEval-style verdict for evaluation."""

from __future__ import annotations

import torch

from flowrl.images import to_uint8
from flowrl.rewards.base import Reward, RewardOutput, register_reward
from flowrl.worlds.shapes import verifier


@register_reward("shapes")
class ShapesReward(Reward):
    name = "shapes"

    def __init__(self, dense: bool = True, exact_objects: bool = False):
        self.dense = dense
        self.exact_objects = exact_objects  # dense only: also pay for holding no objects beyond the named ones

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        judged = [verifier.verdict_and_dense(im, p, self.exact_objects) for im, p in zip(to_uint8(samples), prompts)]
        binary = torch.tensor([verdict for verdict, _ in judged])
        dense = torch.tensor([value for _, value in judged])
        return RewardOutput(dense if self.dense else binary, {"accuracy": binary})
