"""Per-step loss weights of the SDE-sampled policy gradients, from the step's noise alone (no model call).

Both weights read two numbers off each stochastic step j of the rollout's schedule: its step std s_j and the gain
d mu_j / d v of its mean in the velocity (the step is linear in v, so the gain is the mean at v = 1 minus the mean
at v = 0, both at x = 0).

  tempflow   TempFlow-GRPO (arXiv 2508.04324): w_j = s_j / mean_k s_k over the steps the run can train, so the
             high-noise steps, where the trajectory's course is set, weigh more. The paper's code hard-codes the
             normaliser per model (2.25 for SD3.5 at 10 steps, 1.73 for FLUX), which is 1 / mean s over its trained
             steps; here it is computed from the run's own schedule.
  sage       SAGE-GRPO (arXiv 2603.21872), its gradient-norm equaliser: g_j = |d mu_j / d v| / s_j (the scale of the
             log-density's gradient in v) and w_j = median_k g_k / g_j, so every step's gradient has about the
             median's scale (torch's median over the run's steps: the lower middle value of an even count).

Deviations: TempFlow-GRPO uses its weight with per-step advantages from one-step branches off an ODE path (its
trajectory branching); here the weight multiplies GRPO's terminal advantage on ordinary SDE rollouts, without the
branching. SAGE-GRPO takes the median over every step of its rollout schedule; here over the steps the run can train
(`run_steps`: those an SDE window reaches), so a window's weights keep their place on the schedule.
"""

from __future__ import annotations

import torch

from flowrl.sde import sde_step
from flowrl.sde_window import reachable_steps

STEP_WEIGHTS = ("none", "tempflow", "sage")


def step_noise(kind: str, sigmas: torch.Tensor, noise_level: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's std s_j and |d mu_j / d v| under SDE `kind` on the schedule `sigmas` [T + 1]: two [T] tensors."""
    sigma, sigma_next = sigmas[:-1].float(), sigmas[1:].float()
    zero = torch.zeros(len(sigma), 1)
    _, mean_at_zero, std, _ = sde_step(kind, zero, zero, sigma, sigma_next, noise_level)
    _, mean_at_one, _, _ = sde_step(kind, torch.ones_like(zero), zero, sigma, sigma_next, noise_level)
    return torch.broadcast_to(std, zero.shape).flatten(), (mean_at_one - mean_at_zero).abs().flatten()


def run_steps(sampler, num_steps: int, fraction: float, order: str) -> torch.Tensor:
    """[T] bool: the steps a run's updates can train, the set the weights are normalised over (fixed for the run, so a
    window at high noise weighs more than one at low noise): every step an SDE window can reach (all steps without a
    window); without a window and with `order` "first", only the first floor(fraction x T) of them, as Flow-GRPO
    trains (TempFlow-GRPO's 9 of 10)."""
    steps = torch.zeros(num_steps, dtype=torch.bool)
    if sampler.sde_window_size:
        steps[list(reachable_steps(sampler))] = True
    elif order == "first":
        steps[: max(1, int(fraction * num_steps))] = True
    else:
        steps[:] = True
    return steps


def step_weights(form: str, kind: str, sigmas: torch.Tensor, noise_level: float, over: torch.Tensor) -> torch.Tensor:
    """Weights [T] of the steps under `form`, normalised over the steps `over` [T] bool (the run's, `run_steps`).

    Args:
        form: one of STEP_WEIGHTS.
        kind: the rollout's SDE kind.
        sigmas: the rollout's schedule [T + 1].
        noise_level: the SDE's noise level.
        over: the steps the normaliser (TempFlow's mean, SAGE's median) is taken over.

    Returns:
        [T] float weights; 1 for `none` and on steps without noise (which never train).
    """
    weights = torch.ones(len(sigmas) - 1)
    if form == "none":
        return weights
    std, gain = step_noise(kind, sigmas, noise_level)
    noisy = std > 0
    over = over & noisy
    if not over.any():
        return weights
    if form == "tempflow":
        weights[noisy] = std[noisy] / std[over].mean()
    elif form == "sage":
        scale = gain / std.clamp(min=1e-12)
        weights[noisy] = scale[over].median() / scale[noisy]
    else:
        raise ValueError(f"step weight {form!r}: expected one of {STEP_WEIGHTS}")
    return weights
