"""Advantage Weighted Matching (AWM; Xue et al., arXiv 2509.25050): the pretraining flow-matching loss on the policy's
own samples, each weighted by its advantage.

No likelihoods: the rollout may come from any sampler. Each final sample x0 is re-noised at T fresh times,
x_t = (1 - t) x0 + t eps, and the velocity is matched to eps - x0:
    l = mean((v_theta(x_t, t) - (eps - x0))^2),        L = A W(l, t)
with A the group advantage clipped to +-adv_clip_max and divided by it (|A| <= 1), and W the weighting:
    uniform   W = l                                  (then A = 1 is exactly flow matching on the samples)
    ghuber    W = (t / p) ((l + 1e-10)^p - 1e-10^p)    (the paper's configs, p = 0.25: a robust loss whose
                                                      gradient t (l + 1e-10)^(p - 1) grad l shrinks on large errors)
A negative advantage pushes away from its sample, bounded by the clip. The T times are stratified over the rollout
schedule's points as the paper's `discrete_wo_init` does: bounds b = long(linspace(1, floor(N x time_fraction),
T + 1)), stratum k the points b_k .. b_(k+1) - 1 (b_k alone where that is empty), one drawn in each from the sample's
seed; so the points 1 .. floor(N x time_fraction) - 1 (1 .. 11 at the paper's N = 14, fraction 0.9), never the
pure-noise point 0 nor floor(N x time_fraction) itself. An optional KL term pulls v towards the LoRA-free reference,
beta mean((v - v_ref)^2).

Deviations from the paper's code (scxue/advantage_weighted_matching; Flow-Factory's port):
- The loss is A W(l, t) itself. Their code wraps -W as a log-likelihood in PPO's clipped ratio, with the old value
  the same pass detached, so the ratio is 1 and the gradient is A grad W: the same gradient.
- No EMA trust region (their second KL, to a fast EMA of the weights), and the reference KL is off by default
  (their GenEval config: 1e-3).
- The advantage is divided by adv_clip_max as in the paper's code (Flow-Factory clips without rescaling).
- T defaults to 4, not the paper's configs' 6: each time costs a forward and backward pass per sample, and at
  flowrl's 10-step schedules (points 1 .. 8 in range) 4 strata of two points each cover the range evenly, where 6
  would draw points 3, 4, 7 and 8 half as often as the others.
- Where floor(N x time_fraction) < 2 (their range is empty) point 1 is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from flowrl.algorithms.advantages import group_advantages
from flowrl.algorithms.base import Algorithm, RolloutBatch, WorkItems, register_algorithm
from flowrl.errors import ConfigError
from flowrl.prompt_source import derived_seed

GHUBER_FLOOR = 1e-10


@dataclass
class AWMParams:
    timesteps: int = 4
    """T: times each sample is re-noised at per update (>= 1), one per stratum of the schedule's points."""
    time_fraction: float = 0.9
    """The strata cover the schedule's points 1 .. floor(N x time_fraction) - 1 (the paper's code's range), in
    (0, 1]."""
    weighting: Literal["uniform", "ghuber"] = "ghuber"
    """W(l, t): `uniform` (l, plain flow matching) or `ghuber` ((t / p) ((l + 1e-10)^p - 1e-10^p))."""
    ghuber_power: float = 0.25
    """p of the ghuber weighting, in (0, 1]."""
    adv_clip_max: float = 5.0
    """Advantages are clipped to +-adv_clip_max, then divided by it."""
    std: Literal["global", "group"] = "global"
    """The std that scales the advantages: `global` or `group`."""
    kl_beta: float = 0.0
    """Weight of the velocity MSE to the LoRA-free reference (0: none)."""

    def validate(self):
        if self.timesteps < 1:
            raise ConfigError(f"algorithm.params.timesteps: expected an integer >= 1, got {self.timesteps}")
        if not 0 < self.time_fraction <= 1:
            raise ConfigError(f"algorithm.params.time_fraction: expected a number in (0, 1], got {self.time_fraction}")
        if not 0 < self.ghuber_power <= 1:
            raise ConfigError(f"algorithm.params.ghuber_power: expected a number in (0, 1], got {self.ghuber_power}")
        if self.adv_clip_max <= 0:
            raise ConfigError(f"algorithm.params.adv_clip_max: expected a positive number, got {self.adv_clip_max}")


def stratified_points(num_steps: int, count: int, fraction: float, seed: int) -> list[int]:
    """`count` schedule indices in [1, floor(num_steps x fraction) - 1], one drawn in each of `count` strata of that
    range as the paper's code cuts them (an empty stratum gives its lower bound, repeating an index when the range is
    shorter than `count`)."""
    last = max(1, int(num_steps * fraction))  # exclusive, as the paper's code has it; at least point 1
    bounds = torch.linspace(1, last, count + 1).long()
    generator = torch.Generator().manual_seed(derived_seed(seed, 0, 131))
    draws = torch.rand(count, generator=generator)
    return [int(lo + (draw * max(int(hi - lo), 1)).long()) for lo, hi, draw in zip(bounds[:-1], bounds[1:], draws)]


def matching_weight(error: torch.Tensor, t: torch.Tensor, weighting: str, power: float) -> torch.Tensor:
    """W(l, t) of per-item matching errors l [N] at times t [N]."""
    if weighting == "uniform":
        return error
    return t / power * ((error + GHUBER_FLOOR) ** power - GHUBER_FLOOR**power)


@register_algorithm
class AWM(Algorithm):
    name = "awm"
    Params = AWMParams
    needs_flow_matching = True

    def prepare(self, batch: RolloutBatch, policy):
        p, traj = self.params, batch.trajectory
        advantages = group_advantages(batch.global_rewards, batch.global_group_ids, p.std, clip=p.adv_clip_max)
        self.advantages = advantages[batch.local_index] / p.adv_clip_max
        samples, steps, noise = [], [], []
        shape = traj.final.shape[1:]
        for i in range(len(batch.rewards)):
            chosen = stratified_points(traj.num_steps, p.timesteps, p.time_fraction, batch.seeds[i])
            samples += [i] * len(chosen)
            steps += chosen
            # the k-th time's noise of each sample is its own, however the batch is split across processes
            noise += [
                torch.randn(shape, generator=torch.Generator().manual_seed(derived_seed(batch.seeds[i], k, 137)))
                for k in range(len(chosen))
            ]
        items = WorkItems.build(samples, steps)
        self.t = traj.sigmas[items.step].to(traj.final.device)
        self.noise = torch.stack(noise).to(traj.final.device) if noise else traj.final[:0].clone()
        metrics = {"advantage_abs_mean": advantages.abs().mean().item()}  # every process's, unscaled (as GRPO logs)
        return items, metrics

    def loss(self, policy, batch: RolloutBatch, items: WorkItems):
        p, traj = self.params, batch.trajectory
        x0, noise, t = traj.final[items.sample], self.noise[items.key], self.t[items.key]
        shaped = t.reshape(-1, *[1] * (x0.ndim - 1))
        x_t = (1 - shaped) * x0 + shaped * noise
        cond = traj.cond.select(items.sample)
        v = policy.velocity(x_t, t, cond, traj.guidance_scale)
        error = (v.float() - (noise - x0)).pow(2).flatten(1).mean(1)
        advantage = self.advantages[items.sample].to(v.device)
        losses = advantage * matching_weight(error, t.to(v.device), p.weighting, p.ghuber_power)
        diagnostics = {"matching_error": error.detach()}
        if p.kl_beta > 0:
            with torch.no_grad(), policy.reference():
                v_ref = policy.velocity(x_t, t, cond, traj.guidance_scale)
            kl = (v - v_ref).pow(2).flatten(1).mean(1)
            losses = losses + p.kl_beta * kl
            diagnostics["kl"] = kl.detach()
        return losses, diagnostics
