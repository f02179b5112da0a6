"""Per-step loss weights of the SDE-sampled policy gradients, from the step's noise alone (no model call).

Both weights read two numbers off each stochastic step j of the rollout's schedule: its step std s_j and the gain
d mu_j / d v of its mean in the velocity (the step is linear in v, so the gain is the mean at v = 1 minus the mean
at v = 0, both at x = 0).

  tempflow   TempFlow-GRPO (arXiv 2508.04324): w_j = s_j / mean_k s_k over the steps that may train, so the
             high-noise steps, where the trajectory's course is set, weigh more. The paper's code hard-codes the
             normaliser per model (2.25 for SD3.5 at 10 steps, 1.73 for FLUX), which is 1 / mean s over its trained
             steps; here it is computed from the run's own schedule.
  sage       SAGE-GRPO (arXiv 2603.21872), its gradient-norm equaliser: g_j = |d mu_j / d v| / s_j (the scale of the
             log-density's gradient in v) and w_j = median_k g_k / g_j, so every step's gradient has about the
             median's scale (torch's median: the lower middle value of an even count).

Deviations: TempFlow-GRPO uses its weight with per-step advantages from one-step branches off an ODE path (its
trajectory branching); here the weight multiplies GRPO's terminal advantage on ordinary SDE rollouts, without the
branching. SAGE-GRPO takes the median over every step of its rollout schedule; here over the stochastic steps only
(a deterministic step has no step std, where its code falls back to a weight of 1).
"""

from __future__ import annotations

import torch

from flowrl.sde import sde_step

STEP_WEIGHTS = ("none", "tempflow", "sage")


def step_noise(kind: str, sigmas: torch.Tensor, noise_level: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's std s_j and |d mu_j / d v| under SDE `kind` on the schedule `sigmas` [T + 1]: two [T] tensors."""
    sigma, sigma_next = sigmas[:-1].float(), sigmas[1:].float()
    zero = torch.zeros(len(sigma), 1)
    _, mean_at_zero, std, _ = sde_step(kind, zero, zero, sigma, sigma_next, noise_level)
    _, mean_at_one, _, _ = sde_step(kind, torch.ones_like(zero), zero, sigma, sigma_next, noise_level)
    return torch.broadcast_to(std, zero.shape).flatten(), (mean_at_one - mean_at_zero).abs().flatten()


def step_weights(form: str, kind: str, sigmas: torch.Tensor, noise_level: float, trained: torch.Tensor) -> torch.Tensor:
    """Weights [T] of the steps under `form`, normalised over the steps `trained` [T] bool (1 elsewhere).

    Args:
        form: one of STEP_WEIGHTS.
        kind: the rollout's SDE kind.
        sigmas: the rollout's schedule [T + 1].
        noise_level: the SDE's noise level.
        trained: the steps that train (stochastic and in the window).

    Returns:
        [T] float weights; all 1 for `none`.
    """
    weights = torch.ones(len(sigmas) - 1)
    if form == "none" or not trained.any():
        return weights
    std, gain = step_noise(kind, sigmas, noise_level)
    if form == "tempflow":
        weights[trained] = std[trained] / std[trained].mean()
    elif form == "sage":
        scale = gain[trained] / std[trained]
        weights[trained] = scale.median() / scale
    else:
        raise ValueError(f"step weight {form!r}: expected one of {STEP_WEIGHTS}")
    return weights
