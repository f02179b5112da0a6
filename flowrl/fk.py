"""Feynman-Kac steering (Singhal et al., arXiv 2501.06848): sample k particles per prompt and resample them
during denoising by potentials of intermediate rewards, so the final particles follow p(x0) exp(lambda r(x0)).

The intermediate reward of a particle is the reward of its one-step x0 prediction, r_t = r(D(x0_hat(x_t))).
Potentials (log G_t), with r_prev the particle's running value (0 at the start):
    diff: lambda (r_t - r_prev)     max: lambda max(r_t, r_prev)     add: lambda (r_t + r_prev)     rt: lambda r_t
r_prev becomes r_t for diff / rt, the running max for max, and the running sum for add. At the final step the
potential is lambda r(x0) minus the log-product of the potentials applied so far, so every particle's product of
potentials is exactly exp(lambda r(x0)) (for diff it telescopes to that already). Weights accumulate between
resamplings; at a scheduled step the particles of each prompt are resampled (multinomial) when the effective
sample size 1 / sum(w_norm^2) is below ess_threshold * k (ess_threshold 1 resamples at every scheduled step where
the weights are not all equal), and always at the final step. Works for every policy: it runs as a rollout callback
on the policy's x0 prediction.

Deviations from the paper's public code:
- weights are kept in log space with no clamp to [0, 1e10];
- ESS-adaptive resampling is on by default (threshold 0.5), every second step by default;
- a steered sample is the first particle of its set after the final resampling;
- as a training-time sampler (`sampler.fk`) the resampled groups are not importance-corrected: the policy's
  log-probabilities are those of the resampled paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

POTENTIALS = ("diff", "max", "add", "rt")


@dataclass
class FKConfig:
    num_particles: int = 4
    """Particles per set: a prompt group's samples, so it must equal train.group_size."""
    lam: float = 10.0
    """lambda of the potentials: the particles' final distribution is p(x0) exp(lambda r(x0))."""
    potential: Literal["diff", "max", "add", "rt"] = "diff"
    """How intermediate rewards make the potential: `diff` (lambda (r_t - r_prev)), `max`, `add` or `rt` (lambda r_t).
    """
    resample_every: int = 2
    """Steps between scheduled resamplings (>= 1)."""
    resample_range: list[int] | None = None
    """[start, end] steps (inclusive) where resampling may happen; null: the whole trajectory."""
    ess_threshold: float = 0.5
    """A scheduled step resamples when the effective sample size is below this share of the particles, in [0, 1] (1: at
    every scheduled step where the weights are not all equal); the final step always resamples."""

    def validate(self, where: str = "fk"):
        from flowrl.errors import ConfigError

        if self.num_particles < 1 or self.resample_every < 1:
            raise ConfigError(f"{where}: num_particles and resample_every must be >= 1")
        if self.potential not in POTENTIALS:
            raise ConfigError(f"{where}.potential: expected one of {list(POTENTIALS)}, got {self.potential!r}")
        if not 0 <= self.ess_threshold <= 1:
            raise ConfigError(f"{where}.ess_threshold: expected a number in [0, 1], got {self.ess_threshold}")
        if self.resample_range is not None and (
            len(self.resample_range) != 2 or not 0 <= self.resample_range[0] <= self.resample_range[1]
        ):
            raise ConfigError(
                f"{where}.resample_range: expected [start, end] steps with 0 <= start <= end, got {self.resample_range}"
            )

    def scheduled(self, step: int, num_steps: int) -> bool:
        start, end = self.resample_range or (0, num_steps - 1)
        return start <= step <= end and (step - start) % self.resample_every == 0


def log_potential(kind: str, lam: float, r_t: torch.Tensor, r_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log G_t, the new running value) for potential `kind`."""
    if kind == "diff":
        return lam * (r_t - r_prev), r_t
    if kind == "max":
        running = torch.maximum(r_t, r_prev)
        return lam * running, running
    if kind == "add":
        return lam * (r_t + r_prev), r_t + r_prev
    if kind == "rt":
        return lam * r_t, r_t
    raise ValueError(f"unknown potential {kind!r}; expected one of {POTENTIALS}")


def normalized_weights(log_weights: torch.Tensor) -> torch.Tensor:
    """[G, k] log-weights -> each group's normalised weights, a particle whose log-weight is not finite (its reward
    failed: NaN) weighing 0 (as the reference code maps NaN weights), a group with no valid particle uniform."""
    valid = torch.isfinite(log_weights)
    lw = torch.where(valid, log_weights.double(), torch.full_like(log_weights, float("-inf"), dtype=torch.float64))
    w = torch.softmax(lw, dim=1)
    w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
    return torch.where(w.sum(1, keepdim=True) > 0, w, torch.full_like(w, 1.0 / log_weights.shape[1]))


def effective_sample_size(log_weights: torch.Tensor) -> torch.Tensor:
    """ESS per group of a [G, k] log-weight matrix: 1 / sum(w_norm^2)."""
    return (1.0 / (normalized_weights(log_weights) ** 2).sum(dim=1)).to(log_weights.dtype)


def resample_indices(
    log_weights: torch.Tensor,
    generator: torch.Generator | list[torch.Generator],
    groups_to_resample: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multinomial resampling within each group: [G, k] log-weights -> flat indices [G * k] into the particles.

    Groups outside `groups_to_resample` (a [G] bool mask; default all) keep their particles in place. `generator`:
    one for all groups, or one per group (each group's draws then depend on it alone, not on its batch-mates).
    """
    groups, k = log_weights.shape
    w = normalized_weights(log_weights)
    if isinstance(generator, (list, tuple)):
        picks = torch.stack(
            [torch.multinomial(w[g], k, replacement=True, generator=own) for g, own in enumerate(generator)]
        )
    else:
        picks = torch.multinomial(w, k, replacement=True, generator=generator)
    if groups_to_resample is not None:
        picks = torch.where(groups_to_resample[:, None], picks, torch.arange(k).expand(groups, k))
    return (picks + torch.arange(groups)[:, None] * k).flatten()


class FKSteering:
    """A rollout callback. Particles are laid out prompt-major: particle j belongs to prompt j // k.

    `reward_of(latents, prompts, items) -> [N]` scores latents (decode + reward) against their condition items; it
    is called on x0 predictions at scheduled steps and on the final samples.
    """

    def __init__(self, config: FKConfig, reward_of, num_steps: int, num_prompts: int, generator: torch.Generator):
        if config.potential not in POTENTIALS:
            raise ValueError(f"potential: expected one of {POTENTIALS}, got {config.potential!r}")
        self.config, self.reward_of, self.num_steps = config, reward_of, num_steps
        self.k, self.groups = config.num_particles, num_prompts
        self.generator = generator
        n = num_prompts * config.num_particles
        self.r_prev = torch.zeros(n, dtype=torch.float64)
        self.log_product = torch.zeros(n, dtype=torch.float64)  # sum of applied log-potentials
        self.log_weights = torch.zeros(n, dtype=torch.float64)  # accumulated since the last resampling
        self.resampled_at: list[int] = []
        self.final_rewards: torch.Tensor | None = None

    def score(self, state, last: bool) -> torch.Tensor:
        """The reward r_t the potentials are built from: of the x0 prediction, or of the sample at the end."""
        with torch.no_grad():
            target = state.latents if last else state.x0_pred
            return self.reward_of(target, state.cond.prompts, state.cond.items).double().cpu()

    def __call__(self, state) -> None:
        last = state.step == self.num_steps - 1
        if not last and not self.config.scheduled(state.step, self.num_steps):
            return
        r_t = self.score(state, last)
        if last:
            log_g = self.config.lam * r_t - self.log_product
            self.final_rewards = r_t
        else:
            log_g, self.r_prev = log_potential(self.config.potential, self.config.lam, r_t, self.r_prev)
        self.log_product += log_g
        self.log_weights += log_g
        grouped = self.log_weights.view(self.groups, self.k)
        low = effective_sample_size(grouped) < self.config.ess_threshold * self.k
        if last:
            low = torch.ones_like(low)
        if low.any():
            index = resample_indices(grouped, self.generator, low)
            state.latents = state.latents[index.to(state.latents.device)]
            state.index = index
            self.r_prev, self.log_product = self.r_prev[index], self.log_product[index]
            self.log_weights = self.log_weights.view(self.groups, self.k).masked_fill(low[:, None], 0.0).flatten()
            if self.final_rewards is not None:
                self.final_rewards = self.final_rewards[index]
            self.resampled_at.append(state.step)


class FKSteer:
    """FK steering of generation (inference.Steer): each output is the first particle of its own resampled set of
    `num_particles`, and its record carries that particle's final reward."""

    def __init__(self, config: FKConfig, reward):
        self.config, self.reward, self.particles = config, reward, config.num_particles

    def start(self, policy, cond, num_outputs: int, num_steps: int, generator: torch.Generator):
        from flowrl.rewards import latent_scorer

        self.resampler = FKSteering(self.config, latent_scorer(policy, self.reward), num_steps, num_outputs, generator)
        return [self.resampler], None

    def record(self, n: int) -> dict:
        return {"fk_reward": float(self.resampler.final_rewards[n * self.particles])}
