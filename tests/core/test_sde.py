"""Step numerics against closed forms."""

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from scipy.integrate import quad

from flowrl.sde import ddim_step, gaussian_log_prob, sde_step, shifted_sigmas

KINDS = ["flow", "dance", "cps", "sage"]


@pytest.mark.parametrize("kind", KINDS)
def test_log_prob_is_the_gaussian_density(kind):
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(3, 4, 5, 5, generator=g), torch.randn(3, 4, 5, 5, generator=g)
    prev, mean, std, log_prob = sde_step(kind, v, x, 0.8, 0.6, 0.7, generator=g)
    expected = torch.distributions.Normal(mean, torch.broadcast_to(std, mean.shape)).log_prob(prev)
    torch.testing.assert_close(log_prob, expected.mean(dim=(1, 2, 3)))
    per_element = sde_step(kind, v, x, 0.8, 0.6, 0.7, prev_sample=prev, reduce="none")[3]
    torch.testing.assert_close(per_element, expected)


def test_flow_step_matches_flow_grpo_formula():
    g = torch.Generator().manual_seed(1)
    x, v = torch.randn(2, 8, generator=g), torch.randn(2, 8, generator=g)
    s, s_next, a = 0.7, 0.5, 0.7
    _, mean, std, _ = sde_step("flow", v, x, s, s_next, a, noise=torch.zeros_like(x))
    std_t = a * math.sqrt(s / (1 - s))
    dt = s_next - s
    expected = x * (1 + std_t**2 / (2 * s) * dt) + v * (1 + std_t**2 * (1 - s) / (2 * s)) * dt
    torch.testing.assert_close(mean, expected)
    assert float(std) == pytest.approx(std_t * math.sqrt(-dt))
    # at sigma = 1 the denominator takes sigma_next (flow_grpo's sigmas[1])
    _, _, std_first, _ = sde_step("flow", v, x, 1.0, 0.9, a)
    assert float(std_first) == pytest.approx(a * math.sqrt(1 / 0.1) * math.sqrt(0.1))


def test_dance_has_constant_noise_and_flow_drift():
    x, v = torch.randn(2, 8), torch.randn(2, 8)
    _, mean_d, std_d, _ = sde_step("dance", v, x, 0.6, 0.4, 0.3)
    assert float(std_d) == pytest.approx(0.3 * math.sqrt(0.2))
    score = -(x + 0.4 * v) / 0.6  # DanceGRPO's score of x0_hat = x - sigma v
    torch.testing.assert_close(mean_d, x - 0.2 * v - 0.5 * 0.3**2 * score * -0.2)


def test_sage_variance_is_the_integrated_diffusion():
    a, s, s_next = 0.7, 0.95, 0.85
    _, _, std, _ = sde_step("sage", torch.zeros(1, 4), torch.zeros(1, 4), s, s_next, a)
    integral, _ = quad(lambda u: a**2 * u / (1 - u), s_next, s)
    assert float(std) ** 2 == pytest.approx(integral, rel=1e-5)
    assert float(std) ** 2 == pytest.approx(0.489, abs=1e-3)  # the worked example of flowrl.sde's sage docstring
    _, _, std_flow, _ = sde_step("flow", torch.zeros(1, 4), torch.zeros(1, 4), s, s_next, a)
    assert float(std_flow) ** 2 == pytest.approx(0.931, abs=1e-3)


@pytest.mark.parametrize("kind", ["ode"] + KINDS)
def test_zero_noise_limit_is_the_diffusers_euler_step(kind):
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(6)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 8, 8, generator=g)
    for i, t in enumerate(scheduler.timesteps):
        v = torch.randn(x.shape, generator=g)
        expected = scheduler.step(v, t, x, return_dict=False)[0]
        ours, _, std, log_prob = sde_step(kind, v, x, scheduler.sigmas[i], scheduler.sigmas[i + 1], 0.0)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
        assert torch.all(log_prob == 0)  # deterministic: density defined as 0
        x = expected


DATA_STD = 0.5


def _data_velocity(x, t):
    """The exact velocity E[eps - x0 | x_t] of Gaussian data x0 ~ N(0, DATA_STD^2), x_t = (1 - t) x0 + t eps."""
    var = (1 - t) ** 2 * DATA_STD**2 + t**2
    return (t - (1 - t) * DATA_STD**2) / var * x


def _gaussian_data_samples(kind, noise_level, steps, shift=1.0, n=40000, seed=3):
    """Samples of an SDE kind driven by the exact velocity of Gaussian data x0 ~ N(0, DATA_STD^2)."""
    g = torch.Generator().manual_seed(seed)
    sigmas = shifted_sigmas(steps, shift)
    x = torch.randn(1, n, generator=g)
    for i in range(steps):
        s, s_next = float(sigmas[i]), float(sigmas[i + 1])
        x = sde_step(kind, _data_velocity(x, s), x, s, s_next, noise_level, generator=g)[0]
    return x


def _exact_end_std(mean_kind, std_kind, noise_level, steps, shift=1.0):
    """The std `_gaussian_data_samples` ends at, without sampling: the velocity is linear in x, so each step is
    x' = m x + s z and Var' = m^2 Var + s^2 from Var = 1. m is `mean_kind`'s step, s `std_kind`'s (two kinds pair one
    kind's mean with another's noise)."""
    sigmas = shifted_sigmas(steps, shift)
    one, variance = torch.ones(1, 1), 1.0
    for i in range(steps):
        s, s_next = float(sigmas[i]), float(sigmas[i + 1])
        mean = sde_step(mean_kind, _data_velocity(one, s), one, s, s_next, noise_level, noise=torch.zeros_like(one))[1]
        std = sde_step(std_kind, _data_velocity(one, s), one, s, s_next, noise_level)[2]
        variance = float(mean) ** 2 * variance + float(std) ** 2
    return math.sqrt(variance)


@pytest.mark.parametrize("kind,noise_level", [("flow", 0.7), ("dance", 0.3), ("sage", 0.7)])
def test_sde_keeps_the_data_marginal(kind, noise_level):
    """With the exact velocity of Gaussian data, every SDE kind must end near the data's N(0, c^2) at 60 steps."""
    x = _gaussian_data_samples(kind, noise_level, 60)
    assert x.std().item() == pytest.approx(DATA_STD, rel=0.05)
    assert abs(x.mean().item()) < 0.02


# exact end stds (`_exact_end_std`) of flow, of sage, and of sage's variance under Flow-GRPO's Euler score term
END_STDS = {(10, 1.0): (0.4795, 0.5118, 0.4629), (16, 5.0): (0.4199, 0.4103, 0.3578)}


@pytest.mark.parametrize("steps,shift", list(END_STDS))
def test_sage_is_as_wide_as_flow_at_the_step_counts_rl_uses(steps, shift):
    """At few steps the 60-step tolerance hides a narrow sampler: sage must end no narrower than flow less 2% of the
    data std, which pairing its integrated variance with the Euler score term breaks. The bound holds on the exact
    end stds, with no sampling noise (at 16 steps, shift 5 sage clears it by 5e-4 and the pairing misses it by 0.05);
    the sampled chains must match those stds to 4 standard errors of a sample std, std / sqrt(2 n) (a 6e-5 chance
    each of missing by sampling alone)."""
    pairs = (("flow", "flow"), ("sage", "sage"), ("flow", "sage"))
    flow, sage, euler_score = (_exact_end_std(m, s, 0.7, steps, shift) for m, s in pairs)
    assert (flow, sage, euler_score) == pytest.approx(END_STDS[steps, shift], abs=1e-4)  # rounded to 4 places
    assert sage > flow - 0.02 * DATA_STD > euler_score
    n = 400000
    for kind, exact in (("flow", flow), ("sage", sage)):
        sampled = _gaussian_data_samples(kind, 0.7, steps, shift, n=n).std().item()
        assert sampled == pytest.approx(exact, abs=4 * exact / math.sqrt(2 * n))


def test_cps_preserves_the_forward_coefficients():
    """Given the true x0 and eps (oracle velocity eps - x0), a CPS step lands on x_{s'} = (1 - s') x0 + s' eps'."""
    g = torch.Generator().manual_seed(5)
    x0, eps = 0.5 * torch.randn(1, 50000, generator=g), torch.randn(1, 50000, generator=g)
    s, s_next = 0.8, 0.5
    x = (1 - s) * x0 + s * eps
    x_next = sde_step("cps", eps - x0, x, s, s_next, 0.8, generator=g)[0]
    slope = ((x_next * x0).mean() / (x0 * x0).mean()).item()
    assert slope == pytest.approx(1 - s_next, abs=0.01)
    residual = x_next - (1 - s_next) * x0
    assert residual.std().item() == pytest.approx(s_next, rel=0.01)


def test_ddim_log_prob_matches_torch_normal():
    g = torch.Generator().manual_seed(4)
    x, eps = torch.randn(3, 4, 6, 6, generator=g), torch.randn(3, 4, 6, 6, generator=g)
    prev, mean, std, log_prob = ddim_step(eps, x, 0.5, 0.7, eta=1.0, generator=g)
    normal = torch.distributions.Normal(mean, torch.broadcast_to(std, mean.shape))
    torch.testing.assert_close(log_prob, normal.log_prob(prev).mean(dim=(1, 2, 3)))
    # eta = 0 is plain DDIM: x0_hat re-noised deterministically
    det, _, _, _ = ddim_step(eps, x, 0.5, 0.7, eta=0.0)
    x0 = (x - math.sqrt(0.5) * eps) / math.sqrt(0.5)
    torch.testing.assert_close(det, math.sqrt(0.7) * x0 + math.sqrt(0.3) * eps)


def test_ddim_at_eta_one_half_is_diffusers_ddim_step():
    """eta = 0.5, where eta and eta^2 part (at eta = 1 they agree): the stochastic DDIM step equals DDIMScheduler.step
    with the same noise, its std and its mean."""
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(num_train_timesteps=1000, clip_sample=False)
    scheduler.set_timesteps(10)
    t = int(scheduler.timesteps[3])
    a_t, a_prev = scheduler.alphas_cumprod[t], scheduler.alphas_cumprod[t - 100]
    g = torch.Generator().manual_seed(5)
    x, eps, noise = (torch.randn(2, 4, 6, 6, generator=g) for _ in range(3))
    prev, mean, std, _ = ddim_step(eps, x, float(a_t), float(a_prev), eta=0.5, noise=noise)
    theirs = scheduler.step(eps, t, x, eta=0.5, variance_noise=noise).prev_sample
    torch.testing.assert_close(prev, theirs, atol=1e-5, rtol=1e-5)
    variance = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
    assert float(std.flatten()[0]) == pytest.approx(0.5 * math.sqrt(float(variance)), rel=1e-5)


def test_cps_step_std_and_mean_by_hand():
    """CPS at noise level 0.7 from sigma 0.6 to 0.4: std = 0.4 sin(0.35 pi), mean = 0.6 x0_hat + sqrt(0.4^2 - std^2)
    eps_hat, with x0_hat = x - 0.6 v and eps_hat = x + 0.4 v."""
    g = torch.Generator().manual_seed(6)
    x, v = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    _, mean, std, _ = sde_step("cps", v, x, 0.6, 0.4, 0.7, noise=torch.zeros_like(x))
    expected_std = 0.4 * math.sin(0.7 * math.pi / 2)
    assert float(std.flatten()[0]) == pytest.approx(expected_std, rel=1e-6)
    expected_mean = 0.6 * (x - 0.6 * v) + math.sqrt(0.4**2 - expected_std**2) * (x + 0.4 * v)
    torch.testing.assert_close(mean, expected_mean)


def test_gaussian_log_prob_rejects_unknown_reduction():
    with pytest.raises(ValueError):
        gaussian_log_prob(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 1), reduce="sum")
