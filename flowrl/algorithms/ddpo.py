"""DDPO (Black et al., arXiv 2305.13301): PPO on the DDIM sampling chain of an epsilon-prediction model.

The objective is GRPO's clipped surrogate on per-step log-densities; what makes it DDPO is the policy: DDIM steps
with eta > 0 (`sampler.kind: ddim`, `noise_level` = eta, 1.0 in the paper) are Gaussians
N(mean_DDIM(eps_theta), std_eta^2) whose log-density `sampling.ddim_step` computes. Advantages are normalised per
prompt (std per group, not per batch).

Deviations from the paper's code (ddpo-pytorch):
- Per-prompt statistics: ddpo-pytorch tracks each prompt's rewards over a buffer of recent updates (falling back
  to batch statistics below its minimum count); here every update draws a group of samples per prompt, so the
  group itself is the prompt's statistics.
- The std takes GRPO's + 1e-4 (ddpo-pytorch adds 1e-6): only groups whose rewards spread by ~1e-3 or less differ.
- Everything else is GRPO's (grpo.py), including its options and its own deviations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flowrl.algorithms.base import register_algorithm
from flowrl.algorithms.grpo import GRPO, GRPOParams
from flowrl.errors import ConfigError


@dataclass
class DDPOParams(GRPOParams):
    std: Literal["global", "group"] = "group"
    """As grpo's, with the per-group std by default (DDPO's per-prompt statistics)."""


@register_algorithm
class DDPO(GRPO):
    name = "ddpo"
    Params = DDPOParams

    def check_sampler(self, sampler) -> None:
        if self.params.step_weight != "none":
            raise ConfigError(
                f"algorithm.params.step_weight: {self.params.step_weight} weighs the steps of a flow SDE; ddpo samples "
                "with DDIM (use none)"
            )
        if sampler.kind != "ddim":
            raise ConfigError(f"sampler.kind: ddpo samples with stochastic DDIM; expected 'ddim', got {sampler.kind!r}")
