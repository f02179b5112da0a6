"""MixGRPO's pieces: the progressive SDE window is where its schedule says at every update, and DPM-Solver++'s
second-order step after the window is more accurate than Euler's while the window's steps and log-probs are
untouched."""

import math

import pytest
import torch
from tiny_pipelines import tiny_shapes_sd3

from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.sde import dpm_solver_pp_step
from flowrl.sde_window import reachable_steps, sde_window, window_start


def _progressive(lo, hi, stride, every=25, size=3, steps=10):
    return SamplerSection(
        num_steps=steps,
        sde_window_size=size,
        sde_window_range=[lo, hi],
        sde_window_schedule="progressive",
        sde_window_stride=stride,
        sde_window_shift_every=every,
    )


def test_the_progressive_window_moves_every_interval_and_wraps():
    sampler = _progressive(0, 4, 1)
    starts = [window_start(sampler, 0, u) for u in (0, 24, 25, 49, 50, 75, 99, 100, 125)]
    assert starts == [0, 0, 1, 1, 2, 3, 3, 0, 1]
    # MixGRPO's closed form with stride 1 over starts 0 .. M - 1: floor(u / tau) mod M
    assert all(window_start(sampler, 0, u) == (u // 25) % 4 for u in range(300))
    assert sde_window(sampler, 0, 60) == (2, 5)


def test_a_wider_stride_visits_its_starts_and_stride_zero_stays():
    sampler = _progressive(1, 6, 2, every=10)  # starts 1, 3, 5
    assert [window_start(sampler, 0, u) for u in (0, 10, 20, 30, 40)] == [1, 3, 5, 1, 3]
    frozen = _progressive(2, 5, 0)
    assert {window_start(frozen, 0, u) for u in range(200)} == {2}


@pytest.mark.parametrize(
    "sampler",
    [
        _progressive(0, 5, 3, size=2),  # starts 0, 3: step 2 lies between the windows
        _progressive(1, 6, 2, size=3),
        _progressive(2, 5, 0),
        SamplerSection(sde_window_size=3, sde_window_range=[0, 6]),
    ],
)
def test_reachable_steps_are_the_steps_some_window_covers(sampler):
    covered = {step for update in range(400) for step in range(*sde_window(sampler, 0, update))}
    assert reachable_steps(sampler) == tuple(sorted(covered))


def test_a_stride_wider_than_the_window_skips_the_steps_between():
    assert reachable_steps(_progressive(0, 5, 3, size=2)) == (0, 1, 3, 4)
    assert reachable_steps(SamplerSection(num_steps=4)) == (0, 1, 2, 3)  # no window: every step


def test_the_random_window_stays_in_its_range_and_follows_the_run_seed():
    sampler = SamplerSection(sde_window_size=3, sde_window_range=[0, 3])
    starts = [window_start(sampler, 0, u) for u in range(40)]
    assert set(starts) == {0, 1, 2}
    assert starts != [window_start(sampler, 1, u) for u in range(40)]


def test_bad_window_schedules_and_solvers_are_named():
    with pytest.raises(ConfigError, match="sampler.sde_window_shift_every"):
        _progressive(0, 4, 1, every=0).validate()
    with pytest.raises(ConfigError, match="sampler.ode_solver: dpm2 acts on an SDE window"):
        SamplerSection(ode_solver="dpm2").validate()
    with pytest.raises(ConfigError, match="sampler.sde_window_schedule: progressive acts on an SDE window"):
        SamplerSection(sde_window_schedule="progressive").validate()
    with pytest.raises(ConfigError, match="sampler.ode_solver: dpm2 .* 'ode'"):
        SamplerSection(kind="ode", ode_solver="dpm2", sde_window_size=3, sde_window_range=[0, 3]).validate()


# data N(MU, C^2): the posterior mean is linear in x_t, and the ODE maps x_t by the ratio of the marginals' stds
MU, C = 0.7, 0.4


def _posterior_mean(x, sigma):
    return MU + (1 - sigma) * C**2 / ((1 - sigma) ** 2 * C**2 + sigma**2) * (x - (1 - sigma) * MU)


def _exact(x, sigma, sigma_end):
    def marginal_std(s):
        return ((1 - s) ** 2 * C**2 + s**2) ** 0.5

    return (1 - sigma_end) * MU + marginal_std(sigma_end) / marginal_std(sigma) * (x - (1 - sigma) * MU)


def _integrate(x, sigmas, solver):
    x0_previous = sigma_previous = None
    for sigma, sigma_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist()):
        x0 = _posterior_mean(x, sigma)
        if solver == "euler":
            x = x + (sigma_next - sigma) * (x - x0) / sigma
        else:
            x = dpm_solver_pp_step(x, x0, x0_previous, sigma_previous, sigma, sigma_next).double()
        x0_previous, sigma_previous = x0, sigma
    return x


def test_dpm_solver_pp_is_second_order_on_an_exact_flow():
    """On Gaussian data, whose probability-flow ODE has a closed form, from sigma 0.9 to 0.05: DPM-Solver++ 2M's error
    falls 4x per halving of the step (second order), Euler's 2x (first order)."""
    x = torch.randn(256, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    exact = _exact(x, 0.9, 0.05)
    errors = {
        solver: [
            (_integrate(x, torch.linspace(0.9, 0.05, n + 1, dtype=torch.float64), solver) - exact).abs().mean().item()
            for n in (16, 32, 64)
        ]
        for solver in ("euler", "dpm2")
    }
    assert errors["dpm2"][1] / errors["dpm2"][2] > 3.5
    assert errors["euler"][1] / errors["euler"][2] < 2.2
    assert errors["dpm2"][2] < errors["euler"][2] / 10


@pytest.mark.parametrize("sigma_previous,sigma,sigma_next", [(0.9, 0.7, 0.2), (0.95, 0.5, 0.45)])
def test_the_2m_step_is_the_papers_where_the_log_snr_steps_differ(sigma_previous, sigma, sigma_next):
    """DPM-Solver++(2M), arXiv 2211.01095 Algorithm 2, with alpha = 1 - sigma and lambda = log(alpha / sigma):
    x_i = (sigma_i / sigma_{i-1}) x - alpha_i (e^-h_i - 1) [(1 + 1 / (2 r_i)) x0_{i-1} - x0_{i-2} / (2 r_i)],
    h_i = lambda_i - lambda_{i-1}, r_i = h_{i-1} / h_i. Here r is 0.60 and 14.7: on a smooth grid r tends to 1 as the
    steps shrink, so D1's r against 1 / r shows neither in one step nor in the order of convergence."""

    def lam(s):
        return math.log((1 - s) / s)

    h = lam(sigma_next) - lam(sigma)
    r = (lam(sigma) - lam(sigma_previous)) / h
    g = torch.Generator().manual_seed(7)
    x, x0, x0_previous = (torch.randn(3, 8, generator=g, dtype=torch.float64) for _ in range(3))
    d = (1 + 1 / (2 * r)) * x0 - x0_previous / (2 * r)
    expected = sigma_next / sigma * x - (1 - sigma_next) * math.expm1(-h) * d
    ours = dpm_solver_pp_step(x, x0, x0_previous, sigma_previous, sigma, sigma_next)
    torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-5)


def test_the_first_order_step_is_exact_for_a_point_mass():
    """For data at one point x0 the path is x_t = (1 - t) x0 + t eps: one first-order step lands on it exactly."""
    x0, eps = torch.tensor([0.3, -1.2]), torch.tensor([1.5, 0.4])
    x = 0.2 * x0 + 0.8 * eps
    torch.testing.assert_close(dpm_solver_pp_step(x, x0, None, None, 0.8, 0.35), 0.65 * x0 + 0.35 * eps)
    assert float(dpm_solver_pp_step(x, x0, x0, 0.9, 0.8, 0.0)[0]) == pytest.approx(0.3)  # the last step: x0


def test_dpm2_changes_only_the_steps_after_the_window():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    cond = policy.encode(["a red circle", "a square"], 2.0)
    shape = policy.noise_shape(SampleSpec(32, 32))
    runs = {
        solver: rollout(policy, cond, sample_generators([3, 4]), shape, 6, "flow", 0.7, 2.0, (1, 3), ode_solver=solver)
        for solver in ("euler", "dpm2")
    }
    euler, dpm2 = runs["euler"], runs["dpm2"]
    assert torch.equal(dpm2.latents[:4], euler.latents[:4])  # before and through the window (steps 1, 2)
    assert torch.equal(dpm2.log_probs, euler.log_probs)
    assert torch.equal(dpm2.stochastic, euler.stochastic)
    assert not torch.allclose(dpm2.latents[4], euler.latents[4])
