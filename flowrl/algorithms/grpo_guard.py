"""GRPO-Guard (arXiv 2510.22319): Flow-GRPO with the likelihood ratio re-centred and rescaled per step, and each
step's loss reweighted, against the over-optimisation a left-shifted ratio lets through its clip.

On an SDE step with step std s, mean mu_theta under the trained policy and mu_old under the rollout's, the log-ratio
of the stored next sample x' = mu_old + s eps is
    log rho = mean_D(eps * dmu) / s - mean_D(dmu^2) / (2 s^2),       dmu = mu_theta - mu_old
whose expectation -mean_D(dmu^2) / (2 s^2) is negative and grows like 1/s^2 at low-noise steps, so the clip
(which is symmetric around 1) catches fewer of the ratios it should. RatioNorm adds that bias back and rescales by s:
    log rho_hat = s (log rho + mean_D(dmu^2) / (2 s^2)) = mean_D(eps * dmu)
(zero mean, one scale at every step; the bias carries a gradient, as in the paper's code). The clipped surrogate
takes rho_hat, and the gradient reweighting divides step j's loss by its |dt| = sigma_j - sigma_{j+1}, which evens
the steps' gradient scales (d mu / d v is proportional to |dt| for the Euler-type SDEs).
With `ratio_norm: false` and `reweight: false` it is exactly GRPO (tested).

Deviations from the anchors' code (the paper's, merged into flow_grpo; VeRL-Omni's port computes the same):
- s is each item's own step std: their code takes the batch means of sqrt(|dt|) and std_t, one step per batch. Here a
  microbatch holds items of different steps, so the per-item value is the same formula. (Flow-Factory's RatioNorm is
  also per sample, and leaves out the 1/|dt| reweighting; `reweight: false` is that form.)
- mu_old is recomputed before the update by a no-grad pass of the rollout's policy (VeRL-Omni's way), where the
  paper's code keeps the rollout's means: one extra forward per trained item. A batch sampled with older weights
  would make that pass disagree with the stored log-probs, so asynchronous rollouts with staleness are refused.
- Only the Euler-type SDE kinds (flow, dance, sage) are taken, whose |dt| reweighting the paper derives.
- Default clip range 2e-6, the paper's OCR and GenEval configs (Flow-GRPO's 1e-4 is ~50x wider than a unit-scale
  ratio needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowrl.algorithms.base import RolloutBatch, WorkItems, register_algorithm
from flowrl.algorithms.grpo import GRPO, GRPOParams, clipped_surrogate
from flowrl.errors import ConfigError
from flowrl.sharding import most_calls_of_any_process

GUARDED_KINDS = ("flow", "dance", "sage")


@dataclass
class GRPOGuardParams(GRPOParams):
    clip_range: float = 2e-6
    """Clip range of the normalised ratio (> 0); the paper's configs use 2e-6 (OCR, GenEval) and 4e-6 (PickScore)."""
    ratio_norm: bool = True
    """RatioNorm: the log-ratio plus its bias mean_D(dmu^2) / (2 s^2), times the step std s."""
    reweight: bool = True
    """Divide each step's loss by its |dt| (the paper's gradient reweighting)."""


@register_algorithm
class GRPOGuard(GRPO):
    name = "grpo_guard"
    Params = GRPOGuardParams
    refuses_stale_rollouts = (
        "recomputes the rollout policy's step means before the update, which a batch sampled with older weights "
        "would not match"
    )

    def check_sampler(self, sampler) -> None:
        super().check_sampler(sampler)
        if sampler.kind not in GUARDED_KINDS:
            raise ConfigError(
                f"sampler.kind: algorithm 'grpo_guard' normalises the ratio of an Euler-type SDE step; expected one "
                f"of {list(GUARDED_KINDS)}, got {sampler.kind!r}"
            )

    def prepare(self, batch: RolloutBatch, policy=None):
        items, metrics = super().prepare(batch, policy)
        self.old_mean = self.rollout_means(policy, batch, items) if self.params.ratio_norm else None
        return items, metrics

    @torch.no_grad()
    def rollout_means(self, policy, batch: RolloutBatch, items: WorkItems) -> torch.Tensor:
        """The step means mu_old of the items' stored transitions under the rollout's policy, `chunk` at a time."""
        parts = list(torch.split(torch.arange(len(items)), self.chunk))
        means = []
        for part in parts:
            _, _, _, _, mean, _, _ = self.step_terms(policy, batch.trajectory, items.subset(part))
            means.append(mean)
        for _ in range(most_calls_of_any_process(len(parts), policy.device) - len(parts)):
            # a sharded (FSDP2) denoiser gathers its weights in every forward: every process runs as many
            self.step_terms(policy, batch.trajectory, items.subset(slice(0, 1)))
        return torch.cat(means)

    def surrogate(self, items, log_prob, old_log_prob, advantage, mean, std, sigma, sigma_next):
        p = self.params
        log_ratio = log_prob - old_log_prob
        if p.ratio_norm:
            dims = tuple(range(1, mean.ndim))
            step_std = torch.broadcast_to(std, mean.shape).amax(dim=dims)  # one std per item (the kinds' is uniform)
            gap = (mean - self.old_mean[items.key].to(mean.device)) ** 2
            log_ratio = step_std * (log_ratio + gap.mean(dim=dims) / (2 * step_std**2))
        ratio = torch.exp(log_ratio)
        losses = clipped_surrogate(ratio, advantage, p.clip_range)
        if p.reweight:
            dt = (torch.as_tensor(sigma) - torch.as_tensor(sigma_next)).abs().to(losses.device, torch.float32)
            losses = losses / dt
        return losses, ratio
