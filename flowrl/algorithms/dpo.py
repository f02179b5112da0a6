"""Diffusion-DPO (Wallace et al., arXiv 2311.12908) on best-vs-worst pairs within each prompt group, in the
flow-matching form: the DPO-style baseline of the 3D comparison (benchmarks/compare_3d.py), usable on any flow
pipeline.

Per group of an online rollout, the k-th best sample is paired with the k-th worst (`pairs_per_group` pairs; pairs
with equal rewards are skipped). At a trained schedule point t both members are noised with one shared noise,
x_t = (1 - t) x0 + t eps, and the flow-matching errors err(v) = mean |v(x_t) - (eps - x0)|^2 of the policy and the
frozen reference (the LoRA-disabled base) enter
    L = -log sigmoid(-beta / 2 [(err_w - err_ref_w) - (err_l - err_ref_l)]),
the loss of diffusers' Diffusion-DPO training script with the epsilon error replaced by the velocity error.
Trained: the conditional velocity (guidance 1, the paper's setting; `guidance_scale` trains the guided one). Pairs
are formed among the samples a process holds, so groups_per_update must be a multiple of the number of processes
(checked at start-up: each group whole on one).

Deviations from the paper and diffusers' training script:
- Online pairs: the winner and loser are the policy's own samples, ranked by the run's reward, not a fixed
  dataset of human preference pairs.
- Velocity error instead of epsilon error (as Flow-DPO does), so the method needs a flow-matching pipeline.
- beta: the script's 5000 is for SD's 4x64x64 epsilon MSE; the default 1000 here suits normalised flow latents
  (stated, not tuned on an eval).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flowrl.algorithms.base import Algorithm, RolloutBatch, WorkItems, register_algorithm, trained_steps
from flowrl.errors import ConfigError
from flowrl.prompt_source import derived_seed


@dataclass
class DPOParams:
    beta: float = 1000.0
    """The preference temperature in -log sigmoid(-beta / 2 [...]) on flow-matching errors (> 0)."""
    pairs_per_group: int = 1
    """Pairs per group: the best with the worst, the second best with the second worst, ...; ties are skipped."""
    timestep_fraction: float = 0.5
    """Fraction of the schedule's steps trained, in (0, 1]."""
    guidance_scale: float = 1.0
    """The velocity trained: 1.0 the conditional one (Diffusion-DPO's); above 1 the guided one."""

    def validate(self):
        if self.beta <= 0:
            raise ConfigError(f"algorithm.params.beta: expected a positive number, got {self.beta}")
        if self.pairs_per_group < 1:
            raise ConfigError(f"algorithm.params.pairs_per_group: expected an integer >= 1, got {self.pairs_per_group}")
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(
                f"algorithm.params.timestep_fraction: expected a number in (0, 1], got {self.timestep_fraction}"
            )


def best_worst_pairs(rewards: torch.Tensor, group_ids: torch.Tensor, pairs_per_group: int) -> list[tuple[int, int]]:
    """(winner, loser) index pairs: per group the k-th best with the k-th worst, k < pairs_per_group, distinct
    samples, strictly better winners only."""
    pairs = []
    for g in torch.unique(group_ids).tolist():
        members = torch.nonzero(group_ids == g).flatten()
        order = members[torch.argsort(rewards[members], descending=True, stable=True)].tolist()
        for k in range(min(pairs_per_group, len(order) // 2)):
            winner, loser = order[k], order[-1 - k]
            if rewards[winner] > rewards[loser]:
                pairs.append((winner, loser))
    return pairs


def flow_error(v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (v - target).pow(2).flatten(1).mean(1)


@register_algorithm
class DiffusionDPO(Algorithm):
    name = "dpo"
    Params = DPOParams

    needs_reference = True  # the loop checks for a LoRA adapter before training
    needs_flow_matching = True  # noised as (1 - t) x0 + t eps, velocity targets (on an SD pipeline: meaningless)
    needs_whole_groups = True  # best and worst of a group are paired among the rows one process holds

    def prepare(self, batch: RolloutBatch, policy):
        p, traj = self.params, batch.trajectory
        pairs = best_worst_pairs(batch.rewards, batch.group_ids, p.pairs_per_group)
        winners, losers, steps = [], [], []
        for winner, loser in pairs:
            for k in trained_steps(
                torch.ones(traj.num_steps, dtype=torch.bool), p.timestep_fraction, batch.seeds[winner]
            ).tolist():
                winners.append(winner), losers.append(loser), steps.append(k)
        items = WorkItems.build(winners, steps)
        self.losers = torch.tensor(losers, dtype=torch.long)
        final = traj.final
        t = traj.sigmas[items.step].to(final.device)
        noise = (
            torch.stack(
                [
                    torch.randn(
                        final.shape[1:], generator=torch.Generator().manual_seed(derived_seed(batch.seeds[w], k, 307))
                    )
                    for w, k in zip(winners, steps)
                ]
            ).to(final.device)
            if winners
            else final[:0]
        )
        shaped = t.reshape(-1, *[1] * (final.ndim - 1))
        self.t = t
        self.x_w = (1 - shaped) * final[items.sample] + shaped * noise
        self.x_l = (1 - shaped) * final[self.losers] + shaped * noise
        self.u_w, self.u_l = noise - final[items.sample], noise - final[self.losers]
        self.ref_w, self.ref_l = torch.zeros(len(items)), torch.zeros(len(items))
        with torch.no_grad(), policy.reference():
            for chunk in torch.split(torch.arange(len(items)), self.chunk) if len(items) else []:
                v_w, v_l = self.velocities(policy, traj, chunk, items.sample[chunk])
                self.ref_w[chunk] = flow_error(v_w, self.u_w[chunk]).cpu()
                self.ref_l[chunk] = flow_error(v_l, self.u_l[chunk]).cpu()
        gaps = [float(batch.rewards[winner] - batch.rewards[loser]) for winner, loser in pairs]
        return items, {"pairs": float(len(pairs)), "pair_reward_gap": sum(gaps) / len(gaps) if gaps else 0.0}

    def velocities(self, policy, traj, keys: torch.Tensor, winners: torch.Tensor):
        """Winner and loser velocities at the items `keys` (one batched call)."""
        rows = torch.cat([winners, self.losers[keys]])
        x = torch.cat([self.x_w[keys], self.x_l[keys]])
        v = policy.velocity(x, torch.cat([self.t[keys]] * 2), traj.cond.select(rows), self.params.guidance_scale)
        return v.chunk(2)

    def loss(self, policy, batch: RolloutBatch, items: WorkItems):
        v_w, v_l = self.velocities(policy, batch.trajectory, items.key, items.sample)
        err_w, err_l = flow_error(v_w, self.u_w[items.key]), flow_error(v_l, self.u_l[items.key])
        margin = (err_w - self.ref_w[items.key].to(err_w.device)) - (err_l - self.ref_l[items.key].to(err_l.device))
        inside = -0.5 * self.params.beta * margin
        losses = -F.logsigmoid(inside)
        return losses, {"implicit_accuracy": (inside > 0).float().detach(), "dpo_margin": margin.detach()}
