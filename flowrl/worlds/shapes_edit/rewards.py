"""The `shapes_edit` reward, from the shapes-editing verifier."""

from __future__ import annotations

import torch

from flowrl.errors import ConfigError
from flowrl.images import to_uint8
from flowrl.rewards.base import Reward, RewardOutput, condition_items, register_reward
from flowrl.worlds.shapes_edit.task import judge_items


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
        judged = judge_items(to_uint8(samples), condition_items(prompts, meta))
        binary = torch.tensor([float(j.success) for j in judged])
        verdict = torch.tensor([j.dense for j in judged]) if self.dense else binary
        fidelity = torch.tensor([j.fidelity for j in judged])
        reward = (1 - self.fidelity_weight) * verdict + self.fidelity_weight * fidelity
        return RewardOutput(
            reward,
            {"accuracy": binary, "fidelity": fidelity, "off_target": torch.tensor([j.off_target for j in judged])},
        )
