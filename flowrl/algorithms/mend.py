"""MEND: reward post-training of flow models by proximal velocity matching.

No arXiv id given by the source, and no public code: this is flowrl's reading of the method's description, built
on its nearest published relatives, DiffusionNFT (arXiv 2509.16117; velocity regression without likelihoods) and
ReFL (arXiv 2304.05977; a capped reward climbed by its gradient). The reading's steps (trajectory-shift targets):
1. Cap: per prompt group, kappa = the q-quantile of the group's rewards; the capped reward is min(R, kappa).
   Samples at or above the cap get no move.
2. Proposals: for a sample below the cap, g = dR(D(x0))/dx0 through the VAE decoder and the reward, normalised to
   unit RMS; candidates delta_m = eta_max 2^-m g_hat, m = 0..M-1. With `reward_shift` > 0, g is the gradient of the
   reward averaged over shifted copies of the image (rewards/augment.py); acceptance always uses the plain reward.
3. Acceptance: net(delta) = [min(R(x0 + delta), kappa) - min(r, kappa)] / s - (lambda / 2) MSE(delta), with s the
   group's reward std (so lambda does not depend on the reward's scale). The best candidate is accepted only when
   its net is > 0, i.e. its capped gain exceeds its quadratic displacement price; otherwise delta = 0.
4. Targets: the stored ODE trajectory is shifted so that it starts from the same noise and ends at x0 + delta:
   x~_k = x_k + (1 - t_k) delta, u*_k = v_old(x_k) - delta, where v_old is read off the stored Euler step
   (x_{k+1} - x_k) / (t_{k+1} - t_k). Integrating u* from x~_0 = x_0 ends exactly at x_K + delta.
5. Loss: mean ||v_theta(x~_k) - u*_k||^2 (optionally weighted by t^2, an x0-space loss). No KL, no reference, no
   advantage weights: samples with delta = 0 are anchors that keep their old velocity.
Groups where every sample is at the cap (all rewards equal) carry no move and are not trained at all, so such a
batch gives exactly zero gradient. Anchor rows are kept in every group that has a sample below the cap (decided
from the gathered rewards, so the split is the same on one process or many).

Deviations from that reading (each measured; the figures are in docs/research/benchmarks.md):
- `target_states: stored` (the default): v_theta regresses at the stored states x_k, not at the shifted x~_k (same
  targets u*_k). At x~_k the residual at theta_old is v_old(x~_k) - v_old(x_k) + delta: the model's own response
  to the shifted input, larger than delta, dominates the gradient. At x_k it is exactly delta (still zero for
  anchors); benchmarks/mend_moves.py shows the resampled endpoints following delta more closely, and the learned
  reward rises in the comparison benchmark where it fell with shifted states. The price: the new path reaches
  x0 + delta only to first order. `target_states: shifted` is the exact reading.
- `move_space: prediction` (an option): the move is made on the one-step prediction x0_hat_k = x_k - t_k v_old_k
  at a seeded step k in `step_range` (early steps by default) instead of on the final sample. The proposal follows
  dR(D(x0_hat_k))/dx0_hat_k, its capped gain is measured on the prediction's reward with the sample's own
  headroom (kappa - r, from the final rewards) as the cap, and the one target is u*_k = v_old_k - delta / t_k at
  the stored x_k (which moves x0_hat_k by exactly delta). A move on the final sample can only edit what is already
  drawn; at early steps the prediction still decides the layout (on shapes-sd3, ReFL's one-step gradient lowers
  eval accuracy at late steps and raises it at early ones).
- `normalize: batch` (an option): proposals are g / RMS over the process's below-cap samples instead of g / RMS(g)
  per sample. Per-sample scaling gives a sample whose reward is nearly flat (its gradient mostly noise) as large a
  proposal as one whose reward is steep; with prediction moves on shapes-sd3 that drew streaks and lowered eval
  accuracy, where batch scaling raised it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from flowrl.algorithms.base import (
    Algorithm,
    RewardGradientParams,
    RolloutBatch,
    WorkItems,
    register_algorithm,
    step_in_range,
    trained_steps,
    validate_step_range,
)
from flowrl.errors import ConfigError


@dataclass
class MENDParams(RewardGradientParams):
    quantile: float = 0.75
    """q: the group's cap is its q-quantile reward."""
    price: float = 100.0
    """lambda of the quadratic displacement price (per-element MSE, rewards in group-std units)."""
    step_max: float = 0.2
    """eta_max: the largest proposal, in latent RMS units."""
    num_step_sizes: int = 4
    """M: proposal step sizes tried per sample."""
    timestep_fraction: float = 0.5
    """Fraction of the schedule's steps trained, in (0, 1]."""
    time_weight: Literal["uniform", "t2"] = "uniform"
    """The loss's weight over time: `uniform` or `t2`."""
    target_states: Literal["stored", "shifted"] = "stored"
    """Where v_theta regresses onto u*: `stored` (the rollout's x_k) or `shifted` (x~_k)."""
    move_space: Literal["final", "prediction"] = "final"
    """Move the final sample (`final`) or an early one-step prediction (`prediction`)."""
    step_range: list[float] = field(default_factory=lambda: [0.0, 0.4])
    """For prediction moves: the fraction range of the schedule k is drawn from."""
    normalize: Literal["sample", "batch"] = "sample"
    """The proposal's scale: per-sample unit RMS (`sample`) or one RMS per batch (`batch`)."""

    def validate(self):
        super().validate()
        if not 0 < self.quantile <= 1:
            raise ConfigError(f"algorithm.params.quantile: expected a number in (0, 1], got {self.quantile}")
        if self.price <= 0 or self.step_max <= 0 or self.num_step_sizes < 1:
            raise ConfigError(
                "algorithm.params: price and step_max must be positive and num_step_sizes >= 1, got "
                f"{self.price}, {self.step_max}, {self.num_step_sizes}"
            )
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(
                f"algorithm.params.timestep_fraction: expected a number in (0, 1], got {self.timestep_fraction}"
            )
        validate_step_range(self.step_range)


def group_caps(rewards: torch.Tensor, group_ids: torch.Tensor, quantile: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: its group's q-quantile reward (the cap) and the group's reward std."""
    cap, scale = torch.empty_like(rewards, dtype=torch.float32), torch.empty_like(rewards, dtype=torch.float32)
    for g in torch.unique(group_ids):
        members = group_ids == g
        cap[members] = torch.quantile(rewards[members].float(), quantile)
        scale[members] = rewards[members].float().std(unbiased=False)
    return cap, scale


def choose_moves(
    reward_of: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    gradient: torch.Tensor,
    rewards: torch.Tensor,
    cap: torch.Tensor,
    scale: torch.Tensor,
    price: float,
    step_max: float,
    num_step_sizes: int,
    normalize: str = "sample",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted moves delta [B, ...] (zero where none pays) and their net gains [B] (0 where rejected).

    `reward_of(x)` scores latents [B, ...]; rewards/cap/scale are [B]; the gradient need not be normalised.
    `normalize`: "sample" scales each gradient to unit RMS (the reference); "batch" divides all by one RMS over
    the batch, so a sample where the reward is flat gets a proportionally small proposal.
    """
    dims = tuple(range(1, x0.ndim))
    shape = (-1, *[1] * (x0.ndim - 1))
    rms_dims = dims if normalize == "sample" else tuple(range(x0.ndim))
    unit = gradient / gradient.pow(2).mean(dim=rms_dims, keepdim=True).sqrt().clamp(min=1e-12)
    base = torch.minimum(rewards, cap)
    best_net = torch.zeros_like(rewards)
    best = torch.zeros_like(x0)
    for m in range(num_step_sizes):
        delta = step_max * 2.0**-m * unit
        gain = (torch.minimum(reward_of(x0 + delta), cap) - base) / scale.clamp(min=1e-8)
        net = gain - price / 2 * delta.pow(2).mean(dim=dims)
        better = net > best_net  # strictly: a move is taken only when its gain exceeds its price
        best_net = torch.where(better, net, best_net)
        best = torch.where(better.reshape(shape), delta, best)
    return best, best_net


def shifted_trajectory(latents: torch.Tensor, sigmas: torch.Tensor, delta: torch.Tensor):
    """States x~_k = x_k + (1 - t_k) delta and targets u*_k = v_old_k - delta of an ODE trajectory [K + 1, ...].

    v_old_k is the velocity of the stored Euler step k. Returns ([K, ...] states, [K, ...] targets).
    """
    t = sigmas.reshape(-1, *[1] * (latents.ndim - 1)).to(latents)
    v_old = (latents[1:] - latents[:-1]) / (t[1:] - t[:-1])
    return latents[:-1] + (1 - t[:-1]) * delta, v_old - delta


@register_algorithm
class MEND(Algorithm):
    name = "mend"
    Params = MENDParams
    needs_ode_rollout = True
    # v_old is read off the stored steps: the velocity of the policy that drew the batch
    refuses_stale_rollouts = (
        "regresses onto the velocities of the policy that drew the batch, which under staleness is an older snapshot "
        "than the learner"
    )
    needs_reward_gradient = True
    needs_raw_rewards = True  # caps and gains from the batch's rewards against its proposals' R(x0 + delta)

    def prepare(self, batch: RolloutBatch, policy):
        p, traj = self.params, batch.trajectory
        cap_all, scale_all = group_caps(batch.global_rewards, batch.global_group_ids, p.quantile)
        below_all = batch.global_rewards < cap_all
        live_groups = torch.unique(batch.global_group_ids[below_all])
        cap, scale = cap_all[batch.local_index], scale_all[batch.local_index]
        below = below_all[batch.local_index]
        x0 = traj.final
        device = x0.device
        if p.move_space == "prediction":
            self.step = torch.tensor([step_in_range(p.step_range, traj.num_steps, seed) for seed in batch.seeds])
            x0 = self.prediction(traj, torch.arange(len(x0)), self.step)
        delta = torch.zeros_like(x0)
        net = torch.zeros(len(x0))
        index = torch.nonzero(below).flatten()
        if len(index):
            rows = index.tolist()
            with torch.enable_grad():  # proposals follow the shift-averaged gradient
                x = x0[index].detach().requires_grad_(True)
                (gradient,) = torch.autograd.grad(self.score_latents(policy, x, batch, rows).sum(), x)
            reward_of = lambda z: self.score_latents(policy, z, batch, rows, shifted=False).float()  # noqa: E731
            with torch.no_grad():
                rewards = batch.rewards[index].float().to(device)
                caps = cap[index].to(device)
                if p.move_space == "prediction":  # the prediction's reward, capped by the sample's own headroom
                    predicted = reward_of(x0[index])
                    rewards, caps = predicted, predicted + (caps - rewards)
                moves, gains = choose_moves(
                    reward_of,
                    x0[index],
                    gradient,
                    rewards,
                    caps,
                    scale[index].to(device),
                    p.price,
                    p.step_max,
                    p.num_step_sizes,
                    p.normalize,
                )
            delta[index], net[index] = moves, gains.cpu()
        self.delta = delta
        samples, steps = [], []
        for i in torch.nonzero(torch.isin(batch.group_ids, live_groups)).flatten().tolist():
            if p.move_space == "prediction":
                chosen = self.step[i : i + 1]
            else:
                chosen = trained_steps(
                    torch.ones(traj.num_steps, dtype=torch.bool), p.timestep_fraction, batch.seeds[i]
                )
            samples += [i] * len(chosen)
            steps += chosen.tolist()
        moved = net > 0
        dims = tuple(range(1, x0.ndim))
        metrics = {
            "below_cap_share": below.float().mean().item(),
            "moved_share": moved.float().mean().item(),
            "move_mse": delta[moved].pow(2).mean(dim=dims).mean().item() if moved.any() else 0.0,
            "net_gain": net[moved].mean().item() if moved.any() else 0.0,
        }
        return WorkItems.build(samples, steps), metrics

    @staticmethod
    def stored_velocity(
        traj, sample: torch.Tensor, step: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_k, v_old_k) of stored ODE steps, v_old read off the Euler step, and t_k shaped to broadcast."""
        t, t_next = [traj.sigmas[s].to(traj.final).reshape(-1, *[1] * (traj.final.ndim - 1)) for s in (step, step + 1)]
        x = traj.latents[step, sample]
        return x, (traj.latents[step + 1, sample] - x) / (t_next - t), t

    def prediction(self, traj, sample: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """One-step predictions x0_hat_k = x_k - t_k v_old_k."""
        x, v_old, t = self.stored_velocity(traj, sample, step)
        return x - t * v_old

    def regression_pairs(self, traj, items: WorkItems) -> tuple[torch.Tensor, torch.Tensor]:
        """Per item, the state where v_theta is regressed and its target u*."""
        if self.params.move_space == "prediction":  # u*_k = v_old_k - delta / t_k moves x0_hat_k by delta
            x, v_old, t = self.stored_velocity(traj, items.sample, items.step)
            return x, v_old - self.delta[items.sample] / t
        states, targets = [], []
        for i, k in zip(items.sample.tolist(), items.step.tolist()):
            x, u = shifted_trajectory(traj.latents[k : k + 2, i], traj.sigmas[k : k + 2], self.delta[i])
            states.append(x[0] if self.params.target_states == "shifted" else traj.latents[k, i])
            targets.append(u[0])
        return torch.stack(states), torch.stack(targets)

    def loss(self, policy, batch: RolloutBatch, items: WorkItems):
        traj = batch.trajectory
        states, targets = self.regression_pairs(traj, items)
        sigma = traj.sigmas[items.step]
        v = policy.velocity(states, sigma, traj.cond.select(items.sample), traj.guidance_scale)
        losses = (v - targets).pow(2).flatten(1).mean(1)
        if self.params.time_weight == "t2":
            losses = losses * sigma.to(losses) ** 2
        moved = self.delta[items.sample].flatten(1).abs().amax(1) > 0
        return losses, {"moved_rows": moved.float()}
