"""DHO (Dynamic Homing Optimization, from Flow3D-Pro): give every negative sample its own positive target and steer
its trajectory home with a remaining-time-aware corrective velocity.

No arXiv id given by the source, and no public code: this is flowrl's reading of the method's description, built on
DiffusionNFT (arXiv 2509.16117; forward-process regression with its normalised x0-space loss) and minibatch
optimal-transport couplings (the Hungarian matching), every choice stated.

Per prompt group of a deterministic (ODE) rollout, with group advantages A:
1. Split: positives A > 0, negatives A <= 0.
2. MAM (minimum-cost attractive matching): cost C[n, p] = |x0_n - x0_p|^2 / d (+ noise_cost |eps_n - eps_p|^2 / d)
   (+ chamfer_cost x the Chamfer distance of the decoded shapes' surface points, 3D pipelines), solved with the
   Hungarian algorithm so each negative gets a distinct positive. When negatives outnumber positives,
   `capacity: replicate` repeats every positive ceil(|N| / |P|) times (distinct within a round);
   `capacity: lowest` keeps only the |P| lowest-reward negatives.
3. TDC (time-aware dynamic correction): at a state (x_t, t) of negative n with target x+,
   u = v_old + lambda(t) (v_home - v_old),  v_home = (x_t - x+) / t,
   lambda(t) = 1 for t <= knee, falling linearly to lambda_min at t = 1 (early states get a mild pull). With
   lambda = 1 an Euler path of u from eps_n ends exactly at x+.
   Variants: `dynamic` (the states are those of the corrected path, re-integrated from eps_n with the policy the
   update starts from, v_old: the description's reading), `trajectory` (the rollout's own states), `forward`
   (reflow on the MAM coupling: x_t = (1 - t) x+ + t eps_n with target eps_n - x+, no stored path).
4. Loss, weighted by how much better the positive is: a matched pair (n, p) weighs w = (A_p - A_n) / 2 (1 for a
   pair one std either side of the mean) and trains t^2 |v - u|^2 = |x0_pred(v) - x0_pred(u)|^2 in x0 space, divided
   by one batch-level scale, the stop-gradient mean |x0| of the update's samples on every process (`homing_scale`:
   |x0| summed and counted over the process group, so a pair weighs the same on any number of processes, as the
   advantages, normalised over the gathered rewards, do); pairs whose rewards differ by less
   than `min_reward_gap` are dropped. Plus alpha_pos times A_p times DiffusionNFT's normalised flow-matching loss on
   forward-noised positives (fresh noise, target eps - x0_p), for positives that beat a negative of their group by
   the gap.
   Why not DiffusionNFT's per-item normalisation (each item's error divided by its own stop-gradient mean |error|):
   at the first step of an update v = v_old, so the error is lambda t (v_old - v_home), and that normaliser cancels
   both lambda(t) and the homing distance from the gradient, leaving the advantage only its sign: a group whose
   rewards differ by float noise would be pulled as hard as a clearly separated one. With the batch-level scale the
   gradient grows with lambda, with the homing distance and with the advantage gap.
No likelihood ratio is involved, so rollouts made by a stale policy need no importance correction (the loop's
`runtime.staleness`).

Deviations from that reading:
- The advantage weights, the batch-level scale and the reward-gap threshold (step 4) are flowrl's: the reading
  trains every matched pair alike. The scale is gathered over the processes rather than fixed: a fixed number would
  not follow the latent space's scale, which differs by VAE, and one process's own mean would make a pair's weight
  depend on which samples share its process.
- Under `runtime.async_rollouts`, v_old (of the `dynamic` path and of the targets) is the learner's current policy,
  not the older snapshot that drew the batch (and not NFT's EMA old policy either): staleness is bounded, never
  corrected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
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
from flowrl.algorithms.nft import _normalised_x0_loss
from flowrl.errors import ConfigError
from flowrl.prompt_source import derived_seed
from flowrl.sharding import reduced_over_processes


@dataclass
class DHOParams:
    variant: Literal["dynamic", "trajectory", "forward"] = "dynamic"
    """The states regressed: `dynamic` (of the corrected, re-integrated path), `trajectory` (the rollout's), or
    `forward` (reflow on the matching: x_t = (1 - t) x+ + t eps_n, target eps_n - x+)."""
    lambda_min: float = 0.25
    """lambda(t) at t = 1."""
    lambda_knee: float = 0.5
    """lambda(t) = 1 for t <= knee, linear to lambda_min at t = 1."""
    capacity: Literal["replicate", "lowest"] = "replicate"
    """More negatives than positives: `replicate` (each positive takes ceil(N / P)) or `lowest` (only the P
    lowest-reward negatives)."""
    noise_cost: float = 0.0
    """Weight of the initial noises' MSE in the matching cost."""
    chamfer_cost: float = 0.0
    """Weight of the decoded shapes' Chamfer distance in the matching cost (3D pipelines only)."""
    alpha_pos: float = 1.0
    """Weight of the positives' flow-matching term."""
    adv_clip_max: float = 5.0
    """Advantages are clipped to [-adv_clip_max, adv_clip_max]."""
    min_reward_gap: float = 1e-4
    """Pairs whose rewards differ by less than this (reward units) are ties: not trained."""
    std: Literal["global", "group"] = "global"
    """The std that scales the advantages: `global` or `group`."""
    timestep_fraction: float = 0.5
    """Fraction of the schedule's steps trained, in (0, 1]."""
    guidance_scale: float | None = None
    """The velocity trained and re-integrated; null: the sampler's guided one."""

    def validate(self):
        if self.variant not in ("dynamic", "trajectory", "forward"):
            raise ConfigError(
                f"algorithm.params.variant: expected dynamic, trajectory or forward, got {self.variant!r}"
            )
        if self.capacity not in ("replicate", "lowest"):
            raise ConfigError(f"algorithm.params.capacity: expected replicate or lowest, got {self.capacity!r}")
        if not 0 <= self.lambda_min <= 1 or not 0 <= self.lambda_knee < 1:
            raise ConfigError(
                "algorithm.params.lambda_min / lambda_knee: expected lambda_min in [0, 1] and "
                f"lambda_knee in [0, 1), got {self.lambda_min} and {self.lambda_knee}"
            )
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(
                f"algorithm.params.timestep_fraction: expected a number in (0, 1], got {self.timestep_fraction}"
            )
        if self.min_reward_gap < 0:
            raise ConfigError(f"algorithm.params.min_reward_gap: expected a number >= 0, got {self.min_reward_gap}")
        if self.noise_cost < 0 or self.chamfer_cost < 0:
            raise ConfigError("algorithm.params.noise_cost / chamfer_cost: expected numbers >= 0")


def mam_assign(
    neg_x0: torch.Tensor,
    pos_x0: torch.Tensor,
    neg_noise: torch.Tensor | None = None,
    pos_noise: torch.Tensor | None = None,
    noise_cost: float = 0.0,
    capacity: str = "replicate",
    neg_rewards: torch.Tensor | None = None,
    extra_cost: torch.Tensor | None = None,
) -> tuple[list[int], list[int]]:
    """Minimum-cost matching of negatives to positives: (negative indices kept, positive index of each).

    Cost per pair: mean squared latent difference (+ noise_cost x mean squared noise difference, + `extra_cost`
    [N, P], e.g. weighted Chamfer distances of the decoded shapes). Each positive
    takes at most ceil(|N| / |P|) negatives (`replicate`) or only the |P| lowest-reward negatives are matched
    (`lowest`, needs `neg_rewards`)."""
    from scipy.optimize import linear_sum_assignment

    n, p = len(neg_x0), len(pos_x0)
    if n == 0 or p == 0:
        return [], []
    cost = (neg_x0.flatten(1)[:, None] - pos_x0.flatten(1)[None]).pow(2).mean(-1)
    if noise_cost:
        cost = cost + noise_cost * (neg_noise.flatten(1)[:, None] - pos_noise.flatten(1)[None]).pow(2).mean(-1)
    if extra_cost is not None:
        cost = cost + extra_cost.to(cost)
    rows = list(range(n))
    if n > p and capacity == "lowest":
        rows = sorted(torch.argsort(neg_rewards)[:p].tolist())
    copies = 1 if len(rows) <= p else math.ceil(len(rows) / p)
    matrix = cost[rows].repeat(1, copies).double().cpu().numpy()  # column c is positive c % p
    assigned_rows, columns = linear_sum_assignment(matrix)
    order = np.argsort(assigned_rows)
    return [rows[i] for i in assigned_rows[order]], [int(c) % p for c in columns[order]]


def chamfer_matrix(negatives: list, positives: list, missing: float = 4.0) -> torch.Tensor:
    """[N, P] Chamfer distances between point sets; `missing` where a shape has no surface: more than any two
    surfaces in the cube [-1, 1]^3 can cost (at most its diagonal, 2 sqrt 3), so an empty shape is never preferred."""
    from flowrl.sdf import chamfer_and_fscore

    return torch.tensor(
        [[missing if a is None or b is None else chamfer_and_fscore(a, b)[0] for b in positives] for a in negatives],
        dtype=torch.float32,
    ).reshape(len(negatives), len(positives))


def homing_lambda(t: torch.Tensor, knee: float, lambda_min: float) -> torch.Tensor:
    """lambda(t): 1 for t <= knee, then linear down to lambda_min at t = 1."""
    ramp = ((t - knee) / (1 - knee)).clamp(0, 1)
    return 1 - (1 - lambda_min) * ramp


def tdc_target(
    x_t: torch.Tensor, v_old: torch.Tensor, x_plus: torch.Tensor, t: torch.Tensor, lam: torch.Tensor
) -> torch.Tensor:
    """u = v_old + lambda (v_home - v_old), v_home = (x_t - x+) / t (the velocity that reaches x+ in the time left)."""
    shape = (-1, *[1] * (x_t.ndim - 1))
    v_home = (x_t - x_plus) / t.reshape(shape)
    return v_old + lam.reshape(shape) * (v_home - v_old)


def homing_scale(final: torch.Tensor) -> float:
    """The homing loss's divisor: the mean |x0| of the update's final samples over every process (a collective: each
    process passes its own samples [B_local, ...]), at least 1e-5."""
    stats = torch.stack([final.detach().float().abs().sum(), torch.tensor(float(final.numel()), device=final.device)])
    total, count = reduced_over_processes(stats).tolist()
    return max(total / max(count, 1.0), 1e-5)


def split_groups(advantages: torch.Tensor, group_ids: torch.Tensor) -> list[tuple[list[int], list[int]]]:
    """Per group: (positive indices A > 0, negative indices A <= 0)."""
    out = []
    for g in torch.unique(group_ids).tolist():
        members = torch.nonzero(group_ids == g).flatten()
        out.append(([int(i) for i in members if advantages[i] > 0], [int(i) for i in members if advantages[i] <= 0]))
    return out


@register_algorithm
class DHO(Algorithm):
    name = "dho"
    Params = DHOParams
    needs_ode_rollout = True
    needs_whole_groups = True  # positives are matched to the negatives of their group on the same process

    def guidance(self, traj) -> float:
        return traj.guidance_scale if self.params.guidance_scale is None else self.params.guidance_scale

    def prepare(self, batch: RolloutBatch, policy):
        p, traj = self.params, batch.trajectory
        advantages = group_advantages(batch.global_rewards, batch.global_group_ids, p.std, clip=p.adv_clip_max)
        local = advantages[batch.local_index]
        noise, final, sigmas = traj.latents[0], traj.final, traj.sigmas
        rewards = batch.rewards.float()
        negatives, targets, positives, pairs_tied = [], [], [], 0
        points = self.surface_points(policy, final) if p.chamfer_cost > 0 else None
        for pos, neg in split_groups(local, batch.group_ids):
            extra = (
                None
                if points is None
                else p.chamfer_cost * chamfer_matrix([points[i] for i in neg], [points[j] for j in pos])
            )
            kept, matched = mam_assign(
                final[neg], final[pos], noise[neg], noise[pos], p.noise_cost, p.capacity, batch.rewards[neg], extra
            )
            for n, m in zip((neg[i] for i in kept), (pos[j] for j in matched)):
                if rewards[m] - rewards[n] >= p.min_reward_gap:
                    negatives.append(n), targets.append(m)
                else:
                    pairs_tied += 1
            if neg:
                positives += [i for i in pos if rewards[i] - rewards[neg].min() >= p.min_reward_gap]
        x_plus = final[targets] if targets else final[:0]
        states, path_targets = self.negative_paths(policy, traj, negatives, x_plus)
        samples, steps, keys_state, kinds = [], [], [], []
        for row, n in enumerate(negatives):
            for k in trained_steps(
                torch.ones(traj.num_steps, dtype=torch.bool), p.timestep_fraction, batch.seeds[n]
            ).tolist():
                samples.append(n), steps.append(k), keys_state.append(row), kinds.append(0)
        for i in positives:
            for k in trained_steps(
                torch.ones(traj.num_steps, dtype=torch.bool), p.timestep_fraction, batch.seeds[i] + 1
            ).tolist():
                samples.append(i), steps.append(k), keys_state.append(-1), kinds.append(1)
        items = WorkItems.build(samples, steps)
        self.is_positive = torch.tensor(kinds, dtype=torch.bool)
        pair_weight = [(local[targets[row]] - local[n]).item() / 2 for row, n in enumerate(negatives)]
        self.weight = torch.tensor(
            [local[i].item() if positive else pair_weight[row] for i, row, positive in zip(samples, keys_state, kinds)],
            dtype=torch.float32,
        )
        self.scale = homing_scale(final)
        t = sigmas[items.step].to(final.device) if len(items) else sigmas[:0]
        self.t = t
        x_t = torch.zeros((len(items), *final.shape[1:]), device=final.device)
        target = torch.zeros_like(x_t)
        neg_items = torch.nonzero(~self.is_positive).flatten()
        pos_items = torch.nonzero(self.is_positive).flatten()
        if len(neg_items):
            rows = torch.tensor([keys_state[i] for i in neg_items.tolist()])
            x_t[neg_items] = states[items.step[neg_items], rows]
            if path_targets is not None:
                target[neg_items] = path_targets[items.step[neg_items], rows]
            else:  # the rollout's own states: the old velocity at the trained ones only
                lam = homing_lambda(t[neg_items], p.lambda_knee, p.lambda_min)
                v_old = self.old_velocity(policy, traj, x_t[neg_items], t[neg_items], items.sample[neg_items])
                target[neg_items] = tdc_target(x_t[neg_items], v_old, x_plus[rows], t[neg_items], lam)
        if len(pos_items):
            fresh = torch.stack(
                [
                    torch.randn(
                        final.shape[1:],
                        generator=torch.Generator().manual_seed(derived_seed(batch.seeds[int(i)], int(k), 211)),
                    )
                    for i, k in zip(items.sample[pos_items], items.step[pos_items])
                ]
            )
            x0 = final[items.sample[pos_items]]
            tt = t[pos_items].reshape(-1, *[1] * (x0.ndim - 1))
            x_t[pos_items] = (1 - tt) * x0 + tt * fresh.to(x0.device)
            target[pos_items] = fresh.to(x0.device) - x0
        self.x_t, self.target = x_t, target
        metrics = {
            "negatives_matched": float(len(negatives)),
            "positives": float(len(positives)),
            "pairs_tied": float(pairs_tied),
            "pair_weight": float(np.mean(pair_weight)) if pair_weight else 0.0,
            "homing_distance": (final[negatives] - x_plus).pow(2).flatten(1).mean(1).mean().item()
            if negatives
            else 0.0,
        }
        return items, metrics

    @staticmethod
    def surface_points(policy, final: torch.Tensor) -> list:
        """Surface points of every sample's decoded shape (None where it has no surface): the Chamfer cost's input."""
        from flowrl.sdf import surface_points

        if policy.modality != "3d":
            raise ConfigError("algorithm.params.chamfer_cost: needs a 3D pipeline (decoded shapes with surfaces)")
        with torch.no_grad():
            meshes = policy.decode_samples(final).meshes()
        return [None if m is None else surface_points(m, 512, seed=0) for m in meshes]

    def negative_paths(self, policy, traj, negatives: list[int], x_plus: torch.Tensor):
        """(states [T + 1, N, ...] each matched negative is trained at, their targets [T, N, ...] where the path
        gives them: the homing velocities of the re-integrated path (`dynamic`), eps_n - x+ on the straight one
        (`forward`); None for the rollout's own states (`trajectory`), whose targets need the old velocity at the
        trained states only)."""
        p = self.params
        if p.variant == "trajectory" or not negatives:
            return traj.latents[:, negatives], None
        sigmas = traj.sigmas.to(x_plus.device)
        noise = traj.latents[0][negatives]
        if p.variant == "forward":  # reflow on the coupling
            states = torch.stack([(1 - s) * x_plus + s * noise for s in sigmas])
            return states, (noise - x_plus).expand(traj.num_steps, *noise.shape)
        states, targets = [noise], []
        x = noise
        with torch.no_grad():
            for k in range(traj.num_steps):  # the corrected path, re-integrated with the rollout policy
                t = sigmas[k].expand(len(negatives))
                u = tdc_target(
                    x,
                    self.old_velocity(policy, traj, x, t, negatives),
                    x_plus,
                    t,
                    homing_lambda(t, p.lambda_knee, p.lambda_min),
                )
                targets.append(u)
                x = x + (sigmas[k + 1] - sigmas[k]) * u
                states.append(x)
        return torch.stack(states), torch.stack(targets)

    def old_velocity(self, policy, traj, x, t, rows) -> torch.Tensor:
        return chunked_velocity(policy, x, t, traj.cond, rows, self.guidance(traj), self.chunk)

    def loss(self, policy, batch: RolloutBatch, items: WorkItems):
        p, traj = self.params, batch.trajectory
        x_t, t, target = self.x_t[items.key], self.t[items.key], self.target[items.key]
        v = policy.velocity(x_t, t, traj.cond.select(items.sample), self.guidance(traj))
        shaped = t.reshape(-1, *[1] * (x_t.ndim - 1))
        weight = self.weight[items.key].to(v.device)
        positive = self.is_positive[items.key].to(v.device)
        x0_pred, x0_target = x_t - shaped * v, x_t - shaped * target
        # negatives: t^2 |v - u|^2 is the x0-space error |(x_t - t v) - (x_t - t u)|^2, over the batch's latent scale
        homing = (x0_pred - x0_target).pow(2).flatten(1).mean(1) / self.scale
        forward = p.alpha_pos * _normalised_x0_loss(x0_pred, x0_target)
        losses = weight * torch.where(positive, forward, homing)
        return losses, {"positive_item": positive.float()}
