"""DiffusionNFT: online RL by forward-process negative-aware fine-tuning (Zheng et al., arXiv 2509.16117).

No likelihoods and no SDE: samples come from any sampler (here the ODE rollout). Each sample's group advantage
becomes an optimality weight r = clip(A / adv_clip_max / 2 + 0.5, 0, 1). At a trained timestep t the final sample
x0 is re-noised with fresh noise, x_t = (1 - t) x0 + t eps, and two implicit policies are built from the current
velocity v and the old policy's v_old (the learner as the update starts, evaluated in `prepare`):
    v+ = beta v + (1 - beta) v_old          (positive: should reconstruct good samples)
    v- = (1 + beta) v_old - beta v          (negative: should reconstruct bad ones)
with x0-space losses normalised by their own (stop-gradient) mean absolute error,
    L = C [r L(v+) + (1 - r) L(v-)] / beta,   L(u) = mean((x_t - t u - x0)^2) / sg(mean|x_t - t u - x0|),
with C = adv_clip_max as in the reference code (`scale_by_adv_clip: false` drops it, so kl_beta and grad_clip
act C times more strongly relative to the loss). At v = v_old the gradient is C (2r - 1) grad L(v+):
advantage-weighted flow matching on the policy's own samples. Like the reference, items with A = 0 (r = 1/2) are
trained too (their gradient vanishes only at v = v_old); `drop_zero_advantage: true` skips them.
An optional KL term pulls v towards the LoRA-disabled reference. The velocity trained is the guided one at
`guidance_scale` (None: the sampler's; 1.0: the paper's CFG-free setting).

Deviations from the paper's code (NVlabs/DiffusionNFT):
- The old policy is the learner as the update starts (the paper's EMA old policy with decay 0): no separate "old"
  adapter updated by a soft copy after each epoch. It is the policy that drew the rollout unless
  `runtime.async_rollouts` samples with older weights (`runtime.staleness` > 0): then the rollout's policy is an
  older snapshot, which NFT needs no correction for (no likelihoods), while v_old stays the learner's.
- Rollouts come from flowrl's Euler ODE sampler (`sampler.kind: ode`), not the reference's deterministic `dpm2`
  solver.
- Defaults: `kl_beta` 0 (the reference's 1e-4 is available) and `timestep_fraction` 0.5 (the reference trains
  nearly every step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from flowrl.algorithms.advantages import group_advantages
from flowrl.algorithms.base import (
    Algorithm,
    RolloutBatch,
    WorkItems,
    chunked_velocity,
    register_algorithm,
    trained_steps,
)
from flowrl.errors import ConfigError
from flowrl.prompt_source import derived_seed


@dataclass
class NFTParams:
    beta: float = 1.0
    """The mix of the implicit policies, v+ = beta v + (1 - beta) v_old and v- = (1 + beta) v_old - beta v (> 0)."""
    adv_clip_max: float = 5.0
    """Advantages are clipped to [-adv_clip_max, adv_clip_max]."""
    std: Literal["global", "group"] = "global"
    """The std that scales the advantages: `global` or `group`."""
    timestep_fraction: float = 0.5
    """Fraction of the schedule's steps trained, in (0, 1]."""
    kl_beta: float = 0.0
    """Weight of a KL penalty: the velocity MSE to the LoRA-free reference (0: none)."""
    guidance_scale: float | None = None
    """The velocity trained: null trains the sampler's guided velocity; 1.0 the CFG-free one of the paper's CFG-free
    setting."""
    scale_by_adv_clip: bool = True
    """Multiply the loss by adv_clip_max, as the reference code does."""
    drop_zero_advantage: bool = False
    """Skip the items with advantage 0 (the reference code keeps them)."""

    def validate(self):
        if self.beta <= 0:
            raise ConfigError(f"algorithm.params.beta: expected a positive number, got {self.beta}")
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(
                f"algorithm.params.timestep_fraction: expected a number in (0, 1], got {self.timestep_fraction}"
            )


def optimality_weight(advantages: torch.Tensor, adv_clip_max: float) -> torch.Tensor:
    """r = clip(A / adv_clip_max / 2 + 0.5, 0, 1): 1 for the best samples, 0 for the worst, 0.5 for average."""
    return (advantages / adv_clip_max / 2 + 0.5).clamp(0, 1)


def _normalised_x0_loss(x0_pred: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    dims = tuple(range(1, x0.ndim))
    error = x0_pred - x0
    return (error**2).mean(dim=dims) / error.abs().mean(dim=dims).detach().clamp(min=1e-5)


def nft_loss(
    v: torch.Tensor,
    v_old: torch.Tensor,
    x_t: torch.Tensor,
    x0: torch.Tensor,
    t: torch.Tensor,
    r: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Per-item DiffusionNFT loss (see the module docstring); t and r are [N]."""
    t = t.reshape(-1, *[1] * (x_t.ndim - 1))
    v_pos = beta * v + (1 - beta) * v_old
    v_neg = (1 + beta) * v_old - beta * v
    loss_pos = _normalised_x0_loss(x_t - t * v_pos, x0)
    loss_neg = _normalised_x0_loss(x_t - t * v_neg, x0)
    return (r * loss_pos + (1 - r) * loss_neg) / beta


@register_algorithm
class DiffusionNFT(Algorithm):
    name = "nft"
    Params = NFTParams
    needs_ode_rollout = True

    def prepare(self, batch: RolloutBatch, policy):
        p, traj = self.params, batch.trajectory
        advantages = group_advantages(batch.global_rewards, batch.global_group_ids, p.std, clip=p.adv_clip_max)
        self.weights = optimality_weight(advantages[batch.local_index], p.adv_clip_max)
        samples, steps = [], []
        local = advantages[batch.local_index]
        for i in (
            torch.nonzero(local != 0 if p.drop_zero_advantage else torch.ones_like(local, dtype=torch.bool))
            .flatten()
            .tolist()
        ):
            chosen = trained_steps(torch.ones(traj.num_steps, dtype=torch.bool), p.timestep_fraction, batch.seeds[i])
            samples += [i] * len(chosen)
            steps += chosen.tolist()
        items = WorkItems.build(samples, steps)
        x0 = traj.final[items.sample]
        t = traj.sigmas[items.step].to(x0.device)
        noise = (
            torch.stack(
                [
                    torch.randn(
                        x0.shape[1:], generator=torch.Generator().manual_seed(derived_seed(batch.seeds[i], j, 101))
                    )
                    for i, j in zip(samples, steps)
                ]
            )
            if samples
            else x0.clone()
        )
        shaped = t.reshape(-1, *[1] * (x0.ndim - 1))
        self.x_t = (1 - shaped) * x0 + shaped * noise.to(x0.device)
        self.t = t
        self.v_old = chunked_velocity(policy, self.x_t, t, traj.cond, items.sample, self.guidance(traj), self.chunk)
        metrics = {
            "advantage_abs_mean": advantages.abs().mean().item(),
            "positive_share": (self.weights > 0.5).float().mean().item(),
        }
        return items, metrics

    def guidance(self, traj) -> float:
        return traj.guidance_scale if self.params.guidance_scale is None else self.params.guidance_scale

    def loss(self, policy, batch: RolloutBatch, items: WorkItems):
        p, traj = self.params, batch.trajectory
        x_t, t = self.x_t[items.key], self.t[items.key]
        cond = traj.cond.select(items.sample)
        v = policy.velocity(x_t, t, cond, self.guidance(traj))
        losses = nft_loss(
            v, self.v_old[items.key], x_t, traj.final[items.sample], t, self.weights[items.sample].to(v.device), p.beta
        )
        if p.scale_by_adv_clip:
            losses = p.adv_clip_max * losses
        diagnostics = {"velocity_change": (v - self.v_old[items.key]).detach().pow(2).flatten(1).mean(1)}
        if p.kl_beta > 0:
            with torch.no_grad(), policy.reference():
                v_ref = policy.velocity(x_t, t, cond, self.guidance(traj))
            kl = (v - v_ref).pow(2).flatten(1).mean(1)
            losses = losses + p.kl_beta * kl
            diagnostics["kl"] = kl.detach()
        return losses, diagnostics
