"""AWM against hand computations: with uniform weighting each item's loss is its advantage times the flow-matching
error of the re-noised sample, the ghuber weight is (t / p)((l + 1e-10)^p - 1e-10^p), the times are stratified, and a
step on a positive (negative) advantage lowers (raises) the sample's matching error."""

import pytest
import torch
from test_grpo import _batch
from tiny_pipelines import tiny_shapes_sd3

from flowrl.algorithms import build_algorithm
from flowrl.algorithms.awm import matching_weight, stratified_points
from flowrl.algorithms.base import RolloutBatch
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.policies import policy_for


def _policy_and_batch():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    return policy, _batch(policy, "ode")


def _hand_error(policy, batch, algorithm, items):
    traj = batch.trajectory
    x0, noise, t = traj.final[items.sample], algorithm.noise[items.key], algorithm.t[items.key]
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
    with torch.no_grad():
        v = policy.velocity(x_t, t, traj.cond.select(items.sample), traj.guidance_scale)
    return (v - (noise - x0)).pow(2).flatten(1).mean(1), t


def test_uniform_awm_is_the_advantage_times_flow_matching_on_the_samples():
    policy, batch = _policy_and_batch()
    awm = build_algorithm("awm", {"weighting": "uniform"}, SamplerSection(kind="ode"))
    items, _ = awm.prepare(batch, policy)
    with torch.no_grad():
        losses, _ = awm.loss(policy, batch, items)
    error, _ = _hand_error(policy, batch, awm, items)
    rewards = batch.rewards  # groups of 3: [0, 1, 0.5], [0.2, 0.9, 0.4]; global std; clip 5 then / 5
    centred = rewards - torch.stack([rewards[:3].mean()] * 3 + [rewards[3:].mean()] * 3)
    advantage = (centred / (rewards.std(correction=0) + 1e-4)).clamp(-5, 5) / 5
    torch.testing.assert_close(losses, advantage[items.sample] * error, rtol=1e-5, atol=1e-7)


def test_equal_advantages_give_plain_flow_matching():
    """With every advantage equal (here 1), uniform AWM is the flow-matching loss on the policy's own samples."""
    policy, batch = _policy_and_batch()
    awm = build_algorithm("awm", {"weighting": "uniform"}, SamplerSection(kind="ode"))
    items, _ = awm.prepare(batch, policy)
    awm.advantages = torch.ones(6)
    with torch.no_grad():
        losses, diagnostics = awm.loss(policy, batch, items)
    error, _ = _hand_error(policy, batch, awm, items)
    torch.testing.assert_close(losses, error, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(diagnostics["matching_error"], error, rtol=1e-5, atol=1e-7)


def test_the_ghuber_weighting_by_hand():
    error, t = torch.tensor([0.0, 0.04, 1.5]), torch.tensor([0.9, 0.5, 0.2])
    expected = torch.tensor([0.0, 0.5 / 0.25 * (0.04**0.25 - 1e-10**0.25), 0.2 / 0.25 * (1.5**0.25 - 1e-10**0.25)])
    torch.testing.assert_close(matching_weight(error, t, "ghuber", 0.25), expected, rtol=1e-4, atol=1e-6)
    assert torch.equal(matching_weight(error, t, "uniform", 0.25), error)


def test_times_are_one_per_stratum_of_the_schedule():
    for seed in range(20):  # 10 steps, fraction 0.9: points 1..8 in strata [1, 3), [3, 5), [5, 7), [7, 9)
        points = stratified_points(10, 4, 0.9, seed)
        assert [lo <= p < hi for p, (lo, hi) in zip(points, [(1, 3), (3, 5), (5, 7), (7, 9)])] == [True] * 4
    assert len({tuple(stratified_points(10, 4, 0.9, s)) for s in range(20)}) > 1


def test_the_strata_are_the_papers_discrete_wo_init():
    """The paper's configs (N = 14, fraction 0.9, T = 6): its bounds long(linspace(1, floor(12.6), 7)) = 1, 2, 4, 6,
    8, 10, 12 give the strata {1}, {2, 3}, ..., {10, 11}; over 2000 seeds each stratum draws all its points and no
    other (never 12)."""
    drawn = [set() for _ in range(6)]
    for seed in range(2000):
        for k, point in enumerate(stratified_points(14, 6, 0.9, seed)):
            drawn[k].add(point)
    assert drawn == [{1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_step_moves_the_matching_error_against_the_advantages_sign(sign):
    policy, batch = _policy_and_batch()
    awm = build_algorithm("awm", {"weighting": "uniform", "timesteps": 2}, SamplerSection(kind="ode"))
    items, _ = awm.prepare(batch, policy)
    awm.advantages = torch.full((6,), sign)
    before, _ = _hand_error(policy, batch, awm, items)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        awm.loss(policy, batch, items)[0].mean().backward()
        optimizer.step()
    after, _ = _hand_error(policy, batch, awm, items)
    assert sign * (after.mean() - before.mean()) < 0


def test_bad_awm_params_are_named():
    with pytest.raises(ConfigError, match="algorithm.params.time_fraction"):
        build_algorithm("awm", {"time_fraction": 0.0}, SamplerSection(kind="ode"))
    with pytest.raises(ConfigError, match="algorithm.params.timesteps"):
        build_algorithm("awm", {"timesteps": 0}, SamplerSection(kind="ode"))


def test_noise_is_each_samples_own_however_the_batch_is_split():
    policy, batch = _policy_and_batch()
    awm = build_algorithm("awm", {}, SamplerSection(kind="ode"))
    items, _ = awm.prepare(batch, policy)
    whole = awm.noise[items.sample >= 3]
    rows = torch.arange(3, 6)
    half = RolloutBatch(
        batch.trajectory.__class__(
            batch.trajectory.latents[:, rows],
            batch.trajectory.log_probs[:, rows],
            batch.trajectory.sigmas,
            batch.trajectory.stochastic,
            "ode",
            0.0,
            batch.trajectory.guidance_scale,
            batch.trajectory.cond.select(rows.tolist()),
        ),
        batch.rewards[rows],
        batch.group_ids[rows],
        batch.seeds[3:],
        batch.global_rewards,
        batch.global_group_ids,
        rows,
        batch.prompts[3:],
    )
    awm.prepare(half, policy)
    assert torch.equal(awm.noise, whole)
