"""SDE-sampled GRPO: Flow-GRPO (arXiv 2505.05470) and DanceGRPO (arXiv 2505.07818).

Per prompt group, A_i = (r_i - mean_group r) / (std + 1e-4), clipped to +-adv_clip_max. At each trained step j
of sample i, the current policy's log-density of the stored transition x_j -> x_{j+1} gives
rho = exp(log pi_theta - log pi_old) and the clipped surrogate max(-A rho, -A clip(rho, 1 - eps, 1 + eps)),
plus beta * KL(pi_theta || pi_ref) between the two step Gaussians, where the reference is the LoRA-disabled base.
Two forms of that KL (`kl_form`), both means over elements:
    gaussian   mean((mu_theta - mu_ref)^2) / (2 std^2)     the exact KL of the step Gaussians (std^2 = std_t^2 |dt|)
    flow_grpo  mean((mu_theta - mu_ref)^2) / (2 std_t^2)   Flow-GRPO's code: the gaussian form times |dt|
The default is flow_grpo, so betas copied from Flow-GRPO's configs (0.004-0.04) mean what they meant there; the
gaussian form is up to ~1/|dt| (~100x at low-noise steps) stronger for the same beta. For CPS and DDIM the two
agree. Groups whose rewards are all equal carry no signal and are dropped.
Each sample trains a `timestep_fraction` of its stochastic steps, chosen by its own seed. The SDE steps
themselves (every step, or a window of them: Flow-GRPO-Fast's and MixGRPO's, arXiv 2507.21802) are the
sampler's (`sampler.sde_window_size`), not the algorithm's.
Options for incremental Feynman-Kac training (credit.py): `credit: incremental` replaces the terminal advantage
of step j by the group-normalised change of the intermediate reward across that step; `window_schedule` limits the
trainable steps to an early window growing over the run (`incremental`) or to the last steps (`latter`).

Deviations from the papers' code (flow_grpo, DanceGRPO):
- Trained steps: `step_order: random` (the default) is DanceGRPO's per-sample permutation; Flow-GRPO trains the
  first floor(fraction x n) steps in sampling order (`step_order: first`). Both count floor(fraction x n) steps.
- Zero-std groups are dropped and not topped up: Flow-GRPO re-adds random zero-advantage samples so the batch
  divides into its minibatches. A process whose groups all tied trains one item of weight 0 instead, so that
  every process runs the same forward and backward passes.
- `std: group` divides by the population std + 1e-4 (Flow-GRPO's per-prompt form); DanceGRPO's `--use_group`
  divides by the unbiased std + 1e-8 (see advantages.group_advantages).
- `credit: incremental` and `window_schedule` belong to neither paper (credit.py).
- `step_weight` adds TempFlow-GRPO's or SAGE-GRPO's per-step weight (step_weights.py), off by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from flowrl.algorithms.advantages import group_advantages, zero_std_groups
from flowrl.algorithms.base import Algorithm, RolloutBatch, WorkItems, register_algorithm, trained_steps
from flowrl.algorithms.credit import fold_deterministic_tail, incremental_credits, step_advantages, window_mask
from flowrl.algorithms.step_weights import run_steps, step_weights
from flowrl.errors import ConfigError
from flowrl.sde import diffusion_time_scale


def stored_step_terms(policy, traj, items: WorkItems):
    """The current policy's step on the stored transitions of `items`: (x, cond, sigma, sigma_next, the step
    Gaussian's mean and std, the log-prob of the stored next latent)."""
    x = traj.latents[items.step, items.sample]
    x_next = traj.latents[items.step + 1, items.sample]
    sigma, sigma_next = traj.sigmas[items.step], traj.sigmas[items.step + 1]
    cond = traj.cond.select(items.sample)
    _, mean, std, log_prob, _ = policy.step(
        traj.kind, x, sigma, sigma_next, cond, traj.guidance_scale, traj.noise_level, prev_sample=x_next
    )
    return x, cond, sigma, sigma_next, mean, std, log_prob


@dataclass
class GRPOParams:
    clip_range: float = 1e-4
    """PPO clip range of the likelihood ratio (> 0)."""
    adv_clip_max: float = 5.0
    """Advantages are clipped to [-adv_clip_max, adv_clip_max]."""
    std: Literal["global", "group"] = "global"
    """The std that scales the advantages: `global` (the whole batch's) or `group` (each prompt group's)."""
    kl_beta: float = 0.0
    """Weight of the KL penalty to the LoRA-free reference policy (0: none)."""
    kl_form: Literal["flow_grpo", "gaussian"] = "flow_grpo"
    """`flow_grpo` (Flow-GRPO's coded KL: the exact Gaussian form times the step's |dt|) or `gaussian` (the exact KL of
    the step Gaussians); the two agree for CPS and DDIM."""
    timestep_fraction: float = 1.0
    """Fraction of a sample's stochastic steps trained, in (0, 1]: int(fraction x n) of its n steps (at least 1), as the
    reference implementations count them (0.99 of 10 is 9)."""
    step_order: Literal["random", "first"] = "random"
    """Which steps train: `random` (a per-sample seeded subset, DanceGRPO's) or `first` (in sampling order, Flow-GRPO's:
    at 0.99 the last, lowest-noise step is the one left out)."""
    shared_initial_noise: bool = False
    """DanceGRPO: one initial noise per prompt group (its first sample's)."""
    best_of: int = 0
    """DanceGRPO's best-of-N: train only each group's best_of / 2 samples of highest and best_of / 2 of lowest advantage
    (advantages over the whole group; an even number); 0: every sample."""
    drop_zero_std: bool = True
    """Drop the groups whose rewards have zero std (they carry no signal)."""
    credit: Literal["terminal", "incremental"] = "terminal"
    """`terminal` (the final reward's advantage credits every step) or `incremental` (step j's credit is the group-
    normalised change of the intermediate reward across it)."""
    window_schedule: Literal["all", "incremental", "latter"] = "all"
    """The steps an update may train: `all`, an early window growing over the run (`incremental`) or the last
    `window_size` steps (`latter`)."""
    window_size: int = 3
    """The size of the `incremental` and `latter` windows (>= 1)."""
    step_weight: Literal["none", "tempflow", "sage"] = "none"
    """Per-step loss weights from the step's noise (step_weights.py): `tempflow` (TempFlow-GRPO's: the step std over
    its mean), `sage` (SAGE-GRPO's gradient-norm equaliser) or `none`."""

    def validate(self):
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(
                f"algorithm.params.timestep_fraction: expected a number in (0, 1], got {self.timestep_fraction}"
            )
        if self.clip_range <= 0:
            raise ConfigError(f"algorithm.params.clip_range: expected a positive number, got {self.clip_range}")
        if self.window_size < 1:
            raise ConfigError(f"algorithm.params.window_size: expected an integer >= 1, got {self.window_size}")
        if self.best_of < 0 or self.best_of % 2:
            raise ConfigError(
                f"algorithm.params.best_of: expected 0 (every sample) or an even number of samples per "
                f"group, got {self.best_of}"
            )
        if self.best_of and self.credit == "incremental":
            raise ConfigError(
                "algorithm.params.best_of: picks samples by their final reward's advantage; with credit: "
                "incremental every sample trains on its per-step credit: use one or the other"
            )


def best_and_worst(advantages: torch.Tensor, group_ids: torch.Tensor, count: int) -> torch.Tensor:
    """Per sample: whether it is among its group's count / 2 highest or count / 2 lowest advantages (the whole group
    where it has at most `count` samples)."""
    chosen = torch.zeros_like(advantages, dtype=torch.bool)
    for group in torch.unique(group_ids):
        members = torch.nonzero(group_ids == group).flatten()
        order = members[torch.argsort(advantages[members], stable=True)]
        chosen[order if len(order) <= count else torch.cat([order[: count // 2], order[-(count // 2) :]])] = True
    return chosen


def clipped_surrogate(ratio: torch.Tensor, advantage: torch.Tensor, clip_range: float) -> torch.Tensor:
    """PPO's clipped surrogate loss max(-A rho, -A clip(rho, 1 - eps, 1 + eps)), elementwise (A broadcasts)."""
    return torch.maximum(-advantage * ratio, -advantage * torch.clamp(ratio, 1 - clip_range, 1 + clip_range))


@register_algorithm
class GRPO(Algorithm):
    name = "grpo"
    Params = GRPOParams

    @property
    def shared_initial_noise(self) -> bool:
        return self.params.shared_initial_noise

    @property
    def needs_step_rewards(self) -> bool:
        return self.params.credit == "incremental"

    def check_sampler(self, sampler) -> None:
        super().check_sampler(sampler)
        if self.params.step_weight != "none" and sampler.kind == "ddim":
            raise ConfigError(
                f"algorithm.params.step_weight: {self.params.step_weight} weighs the steps of a flow SDE; "
                "sampler.kind ddim has none (use none)"
            )

    def prepare(self, batch: RolloutBatch, policy=None):
        p = self.params
        advantages = group_advantages(batch.global_rewards, batch.global_group_ids, p.std, clip=p.adv_clip_max)
        dead = zero_std_groups(batch.global_rewards, batch.global_group_ids)
        self.advantages = advantages[batch.local_index]
        keep = ~dead[batch.local_index] if p.drop_zero_std else torch.ones_like(self.advantages, dtype=torch.bool)
        if p.best_of:
            keep = keep & best_and_worst(advantages, batch.global_group_ids, p.best_of)[batch.local_index]
        if p.credit == "incremental":  # per-step credit carries signal even where final rewards tie
            credits = fold_deterministic_tail(
                incremental_credits(batch.global_step_rewards), batch.trajectory.stochastic
            )
            self.step_advantages = step_advantages(credits, batch.global_group_ids, p.std, p.adv_clip_max)[
                batch.local_index
            ]
            keep = torch.ones_like(keep)
        traj = batch.trajectory
        trainable = traj.stochastic & window_mask(traj.num_steps, p.window_schedule, batch.progress, p.window_size)
        samples, steps = [], []
        for i in torch.nonzero(keep).flatten().tolist():
            chosen = trained_steps(trainable, p.timestep_fraction, batch.seeds[i], p.step_order)
            samples += [i] * len(chosen)
            steps += chosen.tolist()
        over = run_steps(self.sampler, traj.num_steps, p.timestep_fraction, p.step_order)
        weight_of_step = step_weights(p.step_weight, traj.kind, traj.sigmas, traj.noise_level, over)
        weights = weight_of_step[steps].tolist()
        if not samples and len(keep) and trainable.any():
            # every group on this process tied: one item of weight 0, so the process still runs the forward and
            # backward the others run (a distributed wrapper's gradient collective needs all of them every time)
            samples, steps, weights = [0], [int(torch.nonzero(trainable)[0])], [0.0]
        items = WorkItems.build(samples, steps, weights)
        metrics = {"zero_std_share": dead.float().mean().item(), "advantage_abs_mean": advantages.abs().mean().item()}
        return items, metrics

    def step_terms(self, policy, traj, items: WorkItems):
        """stored_step_terms: the current policy's step Gaussian on the stored transitions of `items`."""
        return stored_step_terms(policy, traj, items)

    def surrogate(self, items, log_prob, old_log_prob, advantage, mean, std, sigma, sigma_next):
        """Per-item clipped surrogate losses and the likelihood ratios they clip (GRPO-Guard overrides it)."""
        ratio = torch.exp(log_prob - old_log_prob)
        return clipped_surrogate(ratio, advantage, self.params.clip_range), ratio

    def loss(self, policy, batch: RolloutBatch, items: WorkItems):
        p, traj = self.params, batch.trajectory
        x, cond, sigma, sigma_next, mean, std, log_prob = self.step_terms(policy, traj, items)
        old_log_prob = traj.log_probs[items.step, items.sample]
        if p.credit == "incremental":
            advantage = self.step_advantages[items.sample, items.step].to(log_prob.device)
        else:
            advantage = self.advantages[items.sample].to(log_prob.device)
        losses, ratio = self.surrogate(items, log_prob, old_log_prob, advantage, mean, std, sigma, sigma_next)
        diagnostics = {
            "ratio": ratio.detach(),
            "clip_frac": ((ratio - 1).abs() > p.clip_range).float(),
            "approx_kl": 0.5 * (log_prob - old_log_prob).detach() ** 2,
        }
        if p.kl_beta > 0:
            with torch.no_grad(), policy.reference():
                _, mean_ref, _, _, _ = policy.step(
                    traj.kind, x, sigma, sigma_next, cond, traj.guidance_scale, traj.noise_level, prev_sample=x
                )
            kl = ((mean - mean_ref) ** 2 / (2 * std**2)).mean(dim=tuple(range(1, mean.ndim)))
            if p.kl_form == "flow_grpo":
                kl = kl * diffusion_time_scale(traj.kind, sigma, sigma_next).to(kl.device)
            losses = losses + p.kl_beta * kl
            diagnostics["kl"] = kl.detach()
        return losses, diagnostics
