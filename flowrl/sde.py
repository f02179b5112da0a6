"""Pure numerics of one denoising step with its Gaussian log-probability.

Convention (diffusers `FlowMatchEulerDiscreteScheduler`, SD3/FLUX/Wan): x_sigma = (1 - sigma) x0 + sigma eps,
the network predicts the velocity v = eps - x0, sampling runs sigma: 1 -> 0, so dt = sigma_next - sigma < 0.
All maths runs in fp32 whatever the model dtype; results come back in fp32.

Step kinds (one signature, `sde_step`):
  ode    Euler step x + dt v; deterministic (std 0, log-prob 0).
  flow   Flow-GRPO (arXiv 2505.05470, eq. 9): std_t = a sqrt(sigma / (1 - sigma)),
         mean = x + [v + std_t^2 / (2 sigma) (x + (1 - sigma) v)] dt, step std = std_t sqrt(-dt).
         At sigma = 1 the denominator uses sigma_next, as flow_grpo does with sigmas[1].
  dance  DanceGRPO (arXiv 2505.07818): the same drift with a constant std_t = eta (= noise_level).
  cps    Coefficients-preserving sampling (arXiv 2509.05952): std = sigma_next sin(a pi / 2),
         mean = (1 - sigma_next) x0_hat + sqrt(sigma_next^2 - std^2) eps_hat.
  sage   SAGE-GRPO (arXiv 2603.21872): the step variance integrated exactly over the step,
         V = a^2 [log((1 - sigma_next) / (1 - sigma)) - (sigma - sigma_next)], and the drift's score term scaled
         by that same variance: mean = x + v dt - V / (2 sigma) (x + (1 - sigma) v). (Flow-GRPO's mean is this with
         V = std_t^2 |dt|; pairing the smaller V with the Euler one's score term leaves samples too narrow.)
         At sigma = 1, where the integral diverges, sigma is clamped to 1 - 3e-3 inside the log, as SAGE-GRPO's
         released code does. The sampler only: the paper's per-timestep gradient-norm equaliser and its dual
         trust region are not applied.
Every log-prob is the exact Gaussian density of the stored next sample; `reduce="mean"` averages it over all
non-batch elements (as the anchors do, hence their tiny PPO clip ranges), `reduce="none"` keeps the per-element
map for token-level credit. The anchors' CPS log-prob drops the constants and the 1/(2 std^2) factor; here every
kind uses the true density, so ratios share one temperature.
"""

from __future__ import annotations

import math

import torch

SDE_KINDS = ("ode", "flow", "dance", "cps", "sage")
SAMPLER_KINDS = SDE_KINDS + ("ddim",)  # ddim: epsilon-prediction pipelines
SAGE_MAX_SIGMA = 1 - 3e-3  # sage's first step: the integrated variance diverges at sigma = 1
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _batch_shaped(value, like: torch.Tensor) -> torch.Tensor:
    """A float or [B] tensor broadcast against a [B, ...] sample, in fp32."""
    value = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    return value.reshape(-1, *([1] * (like.ndim - 1))) if value.ndim else value


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
    """log N(x; mean, std^2) per element, averaged over non-batch dims unless reduce == 'none'.

    Where std == 0 (a deterministic step) the log-prob is defined as 0.
    """
    std = torch.broadcast_to(std, x.shape)
    safe = torch.where(std > 0, std, torch.ones_like(std))
    log_prob = -((x - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _LOG_SQRT_2PI
    log_prob = torch.where(std > 0, log_prob, torch.zeros_like(log_prob))
    if reduce == "none":
        return log_prob
    if reduce == "mean":
        return log_prob.mean(dim=tuple(range(1, x.ndim)))
    raise ValueError(f"reduce must be 'mean' or 'none', got {reduce!r}")


def _gaussian_transition(mean, std, noise, prev_sample, reduce, generator):
    """Draw (or take the given) next sample of N(mean, std^2) and score it: (prev_sample, mean, std, log_prob)."""
    if prev_sample is None:
        if noise is None and not bool((std > 0).any()):
            prev_sample = mean  # deterministic step: draw nothing
        else:
            if noise is None:
                noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=torch.float32)
            prev_sample = mean + std * noise.float()
    prev_sample = prev_sample.float().detach()
    return prev_sample, mean, std, gaussian_log_prob(prev_sample, mean, std, reduce)


def sde_step(
    kind: str,
    velocity: torch.Tensor,
    sample: torch.Tensor,
    sigma,
    sigma_next,
    noise_level: float,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduce: str = "mean",
    generator: torch.Generator | None = None,
):
    """One step from `sigma` to `sigma_next` (floats or [B] tensors).

    Returns (prev_sample, mean, std, log_prob): the next sample (the given `prev_sample` when scoring a stored
    trajectory, else mean + std * noise), the step mean (carries the gradient of `velocity`), the step std
    broadcastable to the sample, and log pi(prev_sample | sample) reduced as `reduce` says.
    """
    if kind not in SDE_KINDS:
        raise ValueError(f"unknown sde kind {kind!r}; expected one of {SDE_KINDS}")
    v = velocity.float()
    x = sample.float()
    s = _batch_shaped(sigma, x)
    s_next = _batch_shaped(sigma_next, x)
    dt = s_next - s
    a = float(noise_level)
    if kind == "ode":
        mean, std = x + dt * v, torch.zeros_like(s)
    elif kind == "cps":
        std = s_next * math.sin(a * math.pi / 2)
        x0_hat, eps_hat = x - s * v, x + (1 - s) * v
        mean = (1 - s_next) * x0_hat + torch.sqrt((s_next**2 - std**2).clamp(min=0)) * eps_hat
    else:
        if kind == "dance":
            variance = a**2 * -dt
        elif kind == "flow":
            std_t = a * torch.sqrt(s / torch.where(s >= 1, 1 - s_next, 1 - s))
            variance = std_t**2 * -dt
        else:  # sage: the diffusion a^2 s / (1 - s) integrated over [sigma_next, sigma]
            variance = (a**2 * (torch.log((1 - s_next) / (1 - s.clamp(max=SAGE_MAX_SIGMA))) + dt)).clamp(min=0)
        # x + v dt and half the variance times the score of x0_hat = x - s v, which is -(x + (1 - s) v) / s
        mean = x + v * dt - variance / (2 * s) * (x + (1 - s) * v)
        std = variance.sqrt()
    return _gaussian_transition(mean, std, noise, prev_sample, reduce, generator)


def ddim_step(
    epsilon: torch.Tensor,
    sample: torch.Tensor,
    alpha_prod,
    alpha_prod_prev,
    eta: float,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduce: str = "mean",
    generator: torch.Generator | None = None,
):
    """DDIM step with log-prob for epsilon-prediction models (DDPO, arXiv 2305.13301; Song et al. eq. 12).

    alpha_prod / alpha_prod_prev are the cumulative alphas at t and at the previous (less noisy) timestep.
    Returns (prev_sample, mean, std, log_prob) like `sde_step`.
    """
    eps = epsilon.float()
    x = sample.float()
    a_t = _batch_shaped(alpha_prod, x)
    a_prev = _batch_shaped(alpha_prod_prev, x)
    x0_hat = (x - torch.sqrt(1 - a_t) * eps) / torch.sqrt(a_t)
    variance = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
    std = eta * torch.sqrt(variance.clamp(min=0))
    mean = torch.sqrt(a_prev) * x0_hat + torch.sqrt((1 - a_prev - std**2).clamp(min=0)) * eps
    return _gaussian_transition(mean, std, noise, prev_sample, reduce, generator)


def diffusion_time_scale(kind: str, sigma, sigma_next) -> torch.Tensor:
    """|dt| for the Euler-Maruyama kinds (flow, dance, sage); 1 otherwise.

    For flow and dance, whose step variance is std_t^2 |dt|, dividing a squared mean gap by the step variance and
    multiplying by this gives Flow-GRPO's coded KL, mean((mu - mu_ref)^2) / (2 std_t^2): the per-unit-time form,
    whose published betas (0.004-0.04) assume it. sage's step variance is the exact integral, below the Euler one
    at high noise (0.489 against 0.931 on the 0.95 -> 0.85 step) but above it on a first step from sigma = 1, so
    the same beta weighs its KL differently along the path: a beta tuned for flow does not carry over one to one.
    CPS (whose coded std_dev_t is the step std) and DDIM keep the exact Gaussian KL.
    """
    if kind in ("flow", "dance", "sage"):
        return (torch.as_tensor(sigma, dtype=torch.float32) - torch.as_tensor(sigma_next, dtype=torch.float32)).abs()
    return torch.ones_like(torch.as_tensor(sigma, dtype=torch.float32))


def x0_prediction(velocity: torch.Tensor, sample: torch.Tensor, sigma) -> torch.Tensor:
    """One-step clean-sample estimate x0_hat = x - sigma v (fp32)."""
    return sample.float() - _batch_shaped(sigma, sample) * velocity.float()


def _half_log_snr(sigma: float) -> float:
    """lambda = log(alpha / sigma) with alpha = 1 - sigma (-inf at sigma = 1, +inf at sigma = 0)."""
    if sigma >= 1:
        return -math.inf
    return math.inf if sigma <= 0 else math.log((1 - sigma) / sigma)


def dpm_solver_pp_step(
    sample: torch.Tensor,
    x0: torch.Tensor,
    x0_previous: torch.Tensor | None,
    sigma_previous: float | None,
    sigma: float,
    sigma_next: float,
) -> torch.Tensor:
    """One deterministic DPM-Solver++ step (arXiv 2211.01095) from `sigma` to `sigma_next` in the flow
    parametrisation (alpha = 1 - sigma, lambda = log(alpha / sigma), h = lambda_next - lambda), second-order
    multistep in its midpoint form (diffusers' `dpmsolver++` 2M with `solver_type="midpoint"`):
        x_next = (sigma_next / sigma) x - alpha_next (e^-h - 1) (D0 + D1 / 2),
        D0 = x0,  D1 = (x0 - x0_previous) / r,  r = (lambda - lambda_previous) / h,
    with x0 the step's prediction x - sigma v and x0_previous the one at `sigma_previous`. First order (D1 = 0)
    without a previous prediction or one at sigma = 1; the step to sigma 0 returns the prediction itself."""
    if sigma_next <= 0:
        return x0.float()
    lam, lam_next = _half_log_snr(sigma), _half_log_snr(sigma_next)
    h = lam_next - lam
    phi = -1.0 if math.isinf(h) else math.expm1(-h)  # e^-h - 1
    alpha_next = 1 - sigma_next
    out = sigma_next / sigma * sample.float() - alpha_next * phi * x0.float()
    if x0_previous is not None and sigma_previous is not None and sigma_previous < 1 and not math.isinf(h):
        r = (lam - _half_log_snr(sigma_previous)) / h
        out = out - 0.5 * alpha_next * phi * (x0.float() - x0_previous.float()) / r
    return out


def time_shift(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """The SD3 time shift sigma' = s sigma / (1 + (s - 1) sigma): more of the path at high noise for s > 1."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def shifted_sigmas(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """linspace(1, 0, N + 1) under the SD3 time shift (`time_shift`; DanceGRPO's grid)."""
    return time_shift(torch.linspace(1.0, 0.0, num_steps + 1), shift)
