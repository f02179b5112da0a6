"""TempFlow-GRPO's and SAGE-GRPO's per-step weights against their papers' numbers and formulas, and as GRPO's item
weights."""

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from test_grpo import _batch
from tiny_pipelines import tiny_shapes_sd3

from flowrl.algorithms import build_algorithm
from flowrl.algorithms.step_weights import run_steps, step_noise, step_weights
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.policies import policy_for


def _sd35_schedule(steps: int = 10) -> torch.Tensor:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(steps)
    return scheduler.sigmas


def test_tempflow_normaliser_is_the_papers_constant_for_sd35():
    """TempFlow-GRPO's SD3.5 code multiplies the step std by 2.25 on the 9 trained of 10 steps (shift 3, a = 0.7)."""
    sigmas = _sd35_schedule()
    trained = torch.arange(10) < 9
    weights = step_weights("tempflow", "flow", sigmas, 0.7, trained)
    std = step_noise("flow", sigmas, 0.7)[0]
    assert weights[:9] / std[:9] == pytest.approx(torch.full((9,), 2.25), abs=0.005)
    assert weights[:9].mean() == pytest.approx(1.0)
    assert weights[0] > 1 > weights[8]  # high noise weighs more


def test_the_flow_step_std_by_hand():
    sigmas = _sd35_schedule()
    std = step_noise("flow", sigmas, 0.7)[0]
    for j in (1, 4, 8):  # a sqrt(s / (1 - s)) sqrt(s - s_next)
        s, s_next = float(sigmas[j]), float(sigmas[j + 1])
        assert float(std[j]) == pytest.approx(0.7 * math.sqrt(s / (1 - s)) * math.sqrt(s - s_next), rel=1e-5)


def test_sage_weights_equalise_the_gradient_scale():
    """g_j = |dt - V (1 - s) / (2 s)| / sqrt(V) with V the integrated variance; w_j = median g / g_j."""
    sigmas = _sd35_schedule(8)
    trained = torch.ones(8, dtype=torch.bool)
    weights = step_weights("sage", "sage", sigmas, 0.5, trained)
    scale = []
    for j in range(8):
        s, s_next = float(sigmas[j]), float(sigmas[j + 1])
        variance = 0.5**2 * (math.log((1 - s_next) / (1 - min(s, 1 - 3e-3))) - (s - s_next))
        scale.append(abs((s_next - s) - variance * (1 - s) / (2 * s)) / math.sqrt(variance))
    expected = torch.tensor(scale).median() / torch.tensor(scale)
    torch.testing.assert_close(weights, expected.float(), rtol=1e-4, atol=1e-6)
    assert weights[0] > weights[-1]


def test_grpo_items_carry_their_steps_weights():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    batch = _batch(policy)
    plain = build_algorithm("grpo", {}, SamplerSection())
    weighted = build_algorithm("grpo", {"step_weight": "tempflow"}, SamplerSection())
    items, _ = plain.prepare(batch, policy)
    weighted_items, _ = weighted.prepare(batch, policy)
    assert torch.equal(items.step, weighted_items.step) and torch.all(items.weight == 1)
    traj = batch.trajectory
    expected = step_weights("tempflow", "flow", traj.sigmas, 0.7, torch.ones(4, dtype=torch.bool))[items.step]
    torch.testing.assert_close(weighted_items.weight, expected)
    assert len(set(weighted_items.weight.tolist())) > 1


def test_step_weights_need_a_flow_sde():
    with pytest.raises(ConfigError, match="algorithm.params.step_weight: sage .* ddim"):
        build_algorithm("grpo", {"step_weight": "sage"}, SamplerSection(kind="ddim"))
    with pytest.raises(ConfigError, match="algorithm.params.step_weight: tempflow .* ddpo samples with DDIM"):
        build_algorithm("ddpo", {"step_weight": "tempflow"}, SamplerSection(kind="ddim"))


def test_the_normaliser_is_the_runs_not_the_updates():
    """Flow-GRPO's setting (every step SDE, the first 99%) normalises over 9 of 10 steps, as TempFlow-GRPO's constant
    does; with an SDE window, over every step a window can reach, so a high-noise window weighs more than a late one."""
    assert run_steps(SamplerSection(), 10, 0.99, "first").tolist() == [True] * 9 + [False]
    assert run_steps(SamplerSection(), 10, 0.99, "random").all()
    window = SamplerSection(sde_window_size=3, sde_window_range=[0, 6])
    assert torch.nonzero(run_steps(window, 10, 1.0, "random")).flatten().tolist() == list(range(8))
    sigmas = _sd35_schedule()
    weights = step_weights("tempflow", "flow", sigmas, 0.7, run_steps(window, 10, 1.0, "random"))
    assert weights[0:3].mean() > 1 > weights[5:8].mean()
    flow_grpo = step_weights("tempflow", "flow", sigmas, 0.7, run_steps(SamplerSection(), 10, 0.99, "first"))
    std = step_noise("flow", sigmas, 0.7)[0]
    assert flow_grpo[:9] / std[:9] == pytest.approx(torch.full((9,), 2.25), abs=0.005)


def test_a_strided_windows_normaliser_leaves_out_the_steps_no_window_trains():
    """Windows of 2 starting at 0 and 3 train steps 0, 1, 3, 4: TempFlow's mean is over those four, not over 0-4."""
    window = SamplerSection(
        sde_window_size=2, sde_window_range=[0, 5], sde_window_schedule="progressive", sde_window_stride=3
    )
    over = run_steps(window, 10, 1.0, "random")
    assert torch.nonzero(over).flatten().tolist() == [0, 1, 3, 4]
    sigmas = _sd35_schedule()
    std = step_noise("flow", sigmas, 0.7)[0]
    torch.testing.assert_close(step_weights("tempflow", "flow", sigmas, 0.7, over), std / std[[0, 1, 3, 4]].mean())
