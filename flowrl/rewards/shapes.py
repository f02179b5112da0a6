"""Rewards from the shapes verifiers (`shapes` for images, `moving_shapes` for videos): dense (fraction of the
prompt's constraints met, for images optionally with "no objects beyond the named ones" as one more constraint)
for training and the binary GenEval-style verdict for evaluation."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..images import to_uint8
from ..shapes import verifier
from .base import Reward, RewardOutput, condition_items, register_reward


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


@register_reward("moving_shapes")
class MovingShapesReward(Reward):
    """The moving-shapes video verifier: dense (fraction of the prompt's constraints met) or the binary verdict."""

    name = "moving_shapes"
    modalities = ("video",)

    def __init__(self, dense: bool = True):
        self.dense = dense

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        from ..motion.verifier import judge_clip

        judged = [judge_clip(clip, p) for clip, p in zip(to_uint8(samples), prompts)]
        binary = torch.tensor([verdict for verdict, _ in judged])
        dense = torch.tensor([value for _, value in judged])
        return RewardOutput(dense if self.dense else binary, {"accuracy": binary})


@register_reward("shapes_edit")
class ShapesEditReward(Reward):
    """The edit verifier on edited images: dense (0.5 requested change made + 0.5 the share of everything else kept)
    or the binary success; `fidelity_weight` w mixes in the edit's agreement with the exact target render,
    (1 - w) x verdict + w x fidelity. `off_target` (share of pixels outside the edit that changed), `fidelity` and
    `accuracy` in info. Needs the condition items (instruction + scene seed) in meta, as the loop passes them."""

    name = "shapes_edit"

    def __init__(self, dense: bool = True, fidelity_weight: float = 0.0):
        if not 0.0 <= fidelity_weight <= 1.0:
            raise ConfigError(
                f"reward shapes_edit: params.fidelity_weight: expected a number in [0, 1], got {fidelity_weight}"
            )
        self.dense = dense
        self.fidelity_weight = fidelity_weight

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        from ..tasks.shapes_edit import judge_items

        judged = judge_items(to_uint8(samples), condition_items(prompts, meta))
        binary = torch.tensor([float(j.success) for j in judged])
        verdict = torch.tensor([j.dense for j in judged]) if self.dense else binary
        fidelity = torch.tensor([j.fidelity for j in judged])
        reward = (1 - self.fidelity_weight) * verdict + self.fidelity_weight * fidelity
        return RewardOutput(
            reward,
            {"accuracy": binary, "fidelity": fidelity, "off_target": torch.tensor([j.off_target for j in judged])},
        )
