"""Reward backpropagation: ReFL (Xu et al., ImageReward, arXiv 2304.05977) and DRaFT-K (Clark et al., arXiv
2309.17400), with AlignProp-style random truncation as an option.

Both maximise a differentiable reward R(D(x0)) by its gradient; they differ in where the gradient enters.
- ReFL: at a random late step k (a fraction range of the schedule), one velocity call with gradient gives the
  one-step prediction x0_hat = x_k - t_k v(x_k); loss = ReLU(cap - R) (ReFL's cap) or -R.
- DRaFT-K: the last K steps of the stored ODE rollout are re-run with gradient (each velocity call checkpointed
  so memory does not grow with K); loss = ReLU(cap - R) or -R on the final sample. `random_k` draws K per sample
  uniformly from 1..K (AlignProp's randomised truncation). DRaFT-1 on a flow model equals ReFL at the last step.
Both take `reward_shift` / `reward_shift_copies` (base.RewardGradientParams): the reward they climb is averaged
over shifted copies of each image, which keeps its content gradient and blunts pixel-position adversarial ones.

Deviations from the papers and their code (THUDM/ImageReward's ReFL, DRaFT, AlignProp):
- Flow-model port: the one-step prediction is x0_hat = x_k - t_k v(x_k) (ReFL takes the epsilon scheduler's
  `pred_original_sample`), and DRaFT re-runs Euler steps of the velocity instead of DDIM steps.
- The loss is -R unless `cap` is set (ReFL's own loss is ReLU(2 - R) on ImageReward: `cap: 2`). ReFL's step range
  [0.7, 1.0) is a little wider than its k in 30..39 of 40 (see ReFLParams).
- The starting states come from the stored ODE rollout (sampled without gradient), so neither method runs a
  sampler of its own; DRaFT-LV's re-noised variants are not implemented.
- ReFL's paper alternates the reward loss with a pretraining loss; here that is `train.data_loss`
  (flowrl.data_loss), added at every optimizer step rather than alternated, and off by default (ReFL's public
  script uses the reward loss alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.checkpoint import checkpoint

from flowrl.algorithms.base import (
    Algorithm,
    RewardGradientParams,
    RolloutBatch,
    WorkItems,
    register_algorithm,
    step_in_range,
    validate_step_range,
)
from flowrl.errors import ConfigError
from flowrl.sde import x0_prediction


def reward_loss(scores: torch.Tensor, cap: float | None, scale: float) -> torch.Tensor:
    """scale * ReLU(cap - R) (no gradient once R reaches the cap) or scale * -R without a cap."""
    return scale * (torch.relu(cap - scores) if cap is not None else -scores)


@dataclass
class ReFLParams(RewardGradientParams):
    step_range: list[float] = field(default_factory=lambda: [0.7, 1.0])
    """The fraction of the schedule the one trained step k is drawn from (ReFL's own range, 30..39 of 40 steps, is
    [0.75, 1.0); this one is a little wider)."""
    cap: float | None = None
    """Set for ReFL's ReLU(cap - R) loss; null: -R."""
    loss_scale: float = 1.0
    """Multiplies the loss."""

    def validate(self):
        super().validate()
        validate_step_range(self.step_range)


@dataclass
class DRaFTParams(RewardGradientParams):
    k: int = 1
    """The last K steps are re-run with gradient (>= 1)."""
    random_k: bool = False
    """AlignProp-style random truncation: K drawn in 1..K per update."""
    cap: float | None = None
    """Set for a ReLU(cap - R) loss; null: -R."""
    loss_scale: float = 1.0
    """Multiplies the loss."""
    checkpointing: bool = True
    """Gradient checkpointing through the re-run steps."""

    def validate(self):
        super().validate()
        if self.k < 1:
            raise ConfigError(f"algorithm.params.k: expected an integer >= 1, got {self.k}")


class _RewardBackprop(Algorithm):
    needs_ode_rollout = True
    needs_reward_gradient = True

    def first_step(self, num_steps: int, seed: int) -> int:
        raise NotImplementedError

    def prepare(self, batch: RolloutBatch, policy):
        num_steps = batch.trajectory.num_steps
        steps = [self.first_step(num_steps, seed) for seed in batch.seeds]
        return WorkItems.build(list(range(len(steps))), steps), {}


@register_algorithm
class ReFL(_RewardBackprop):
    name = "refl"
    Params = ReFLParams

    def first_step(self, num_steps, seed):
        return step_in_range(self.params.step_range, num_steps, seed)

    def loss(self, policy, batch, items):
        traj = batch.trajectory
        x = traj.latents[items.step, items.sample]
        sigma = traj.sigmas[items.step].to(x)
        v = policy.velocity(x, sigma, traj.cond.select(items.sample), traj.guidance_scale)
        x0_hat = x0_prediction(v, x, sigma)
        scores = self.score_latents(policy, x0_hat, batch, items.sample.tolist())
        return reward_loss(scores, self.params.cap, self.params.loss_scale), {"reward_of_prediction": scores.detach()}


@register_algorithm
class DRaFT(_RewardBackprop):
    name = "draft"
    Params = DRaFTParams

    def first_step(self, num_steps, seed):
        k = min(self.params.k, num_steps)
        if self.params.random_k:
            k = int(torch.randint(1, k + 1, (1,), generator=torch.Generator().manual_seed(seed + 13)))
        return num_steps - k

    def loss(self, policy, batch, items):
        traj = batch.trajectory
        losses, scores = [], []
        for start in torch.unique(items.step).tolist():  # samples that share a truncation point run together
            rows = torch.nonzero(items.step == start).flatten()
            sample = items.sample[rows]
            cond = traj.cond.select(sample)
            x = traj.latents[start, sample]
            for j in range(start, traj.num_steps):
                sigma, sigma_next = float(traj.sigmas[j]), float(traj.sigmas[j + 1])
                if self.params.checkpointing:
                    v = checkpoint(policy.velocity, x, sigma, cond, traj.guidance_scale, use_reentrant=False)
                else:
                    v = policy.velocity(x, sigma, cond, traj.guidance_scale)
                x = x + (sigma_next - sigma) * v
            score = self.score_latents(policy, x, batch, sample.tolist())
            losses.append((rows, reward_loss(score, self.params.cap, self.params.loss_scale)))
            scores.append((rows, score.detach()))
        out = torch.zeros(len(items), device=traj.final.device)
        reward = torch.zeros(len(items))
        out = out.index_put((torch.cat([r for r, _ in losses]),), torch.cat([loss for _, loss in losses]))
        reward[torch.cat([r for r, _ in scores])] = torch.cat([s for _, s in scores]).float().cpu()
        return out, {"reward_of_sample": reward}
