"""DHO (the module's reading): MAM against brute force, TDC's homing, and a training step that brings negatives'
predictions towards their targets on states it did not train on."""

import itertools
import math

import numpy as np
import pytest
import torch
from test_methods import ODE, _ode_batch, _policy

from flowrl.algorithms import build_algorithm
from flowrl.algorithms.dho import homing_lambda, homing_scale, mam_assign, split_groups, tdc_target
from flowrl.errors import ConfigError


def brute_force(cost: torch.Tensor, capacity: int) -> float:
    """The least total cost over assignments of every row to a column, each column used at most `capacity` times."""
    n, p = cost.shape
    best = math.inf
    for columns in itertools.product(range(p), repeat=n):
        if max(columns.count(c) for c in range(p)) <= capacity:
            best = min(best, sum(cost[i, c].item() for i, c in enumerate(columns)))
    return best


@pytest.mark.parametrize("n,p", [(1, 1), (2, 3), (3, 3), (4, 2), (5, 2), (6, 4), (3, 6)])
def test_mam_is_injective_per_round_and_as_cheap_as_brute_force(n, p):
    g = torch.Generator().manual_seed(10 * n + p)
    neg, pos = torch.randn(n, 2, 4, generator=g), torch.randn(p, 2, 4, generator=g)
    kept, matched = mam_assign(neg, pos)
    assert kept == list(range(n))
    capacity = math.ceil(n / p)
    assert max(matched.count(c) for c in set(matched)) <= capacity
    if n <= p:
        assert len(set(matched)) == n  # a distinct positive for every negative
    cost = (neg.flatten(1)[:, None] - pos.flatten(1)[None]).pow(2).mean(-1)
    assert sum(cost[i, j].item() for i, j in zip(kept, matched)) == pytest.approx(brute_force(cost, capacity))


def test_mam_lowest_capacity_keeps_the_worst_negatives():
    g = torch.Generator().manual_seed(0)
    neg, pos = torch.randn(5, 8, generator=g), torch.randn(2, 8, generator=g)
    rewards = torch.tensor([0.3, 0.1, 0.5, 0.0, 0.2])
    kept, matched = mam_assign(neg, pos, capacity="lowest", neg_rewards=rewards)
    assert kept == [1, 3] and sorted(matched) == [0, 1]
    cost = (neg[:, None] - pos[None]).pow(2).mean(-1)
    assert sum(cost[i, j].item() for i, j in zip(kept, matched)) == pytest.approx(brute_force(cost[kept], 1))


def test_mam_noise_cost_adds_the_noise_distance():
    neg, pos = torch.zeros(2, 4), torch.zeros(2, 4)
    neg_noise, pos_noise = torch.tensor([[0.0] * 4, [1.0] * 4]), torch.tensor([[1.0] * 4, [0.0] * 4])
    assert mam_assign(neg, pos, neg_noise, pos_noise, noise_cost=1.0)[1] == [1, 0]


def test_mam_chamfer_cost_matches_shapes_by_their_surfaces():
    from flowrl.algorithms.dho import chamfer_matrix

    rng = np.random.default_rng(0)
    blob = rng.normal(size=(200, 3)) * 0.1
    near, far = blob + 0.02, blob + 1.0
    cost = chamfer_matrix([blob, None], [far, near])
    assert cost[0, 1] < 0.1 < cost[0, 0] and cost[1].tolist() == [4.0, 4.0]  # no surface: the `missing` cost
    neg, pos = torch.zeros(1, 4), torch.tensor([[0.0] * 4, [0.3] * 4])  # latents prefer positive 0
    assert mam_assign(neg, pos)[1] == [0]
    assert mam_assign(neg, pos, extra_cost=10 * chamfer_matrix([blob], [far, near]))[1] == [1]


def test_with_lambda_one_euler_on_the_tdc_field_lands_on_the_target():
    g = torch.Generator().manual_seed(1)
    eps, x_plus = torch.randn(3, 4, 4, generator=g), torch.randn(3, 4, 4, generator=g)
    weights = torch.randn(4, 4, generator=g)
    sigmas = torch.tensor([1.0, 0.8, 0.55, 0.3, 0.1, 0.0])
    x = eps
    for k in range(len(sigmas) - 1):
        t = sigmas[k].expand(3)
        v_old = torch.tanh(x @ weights)  # any old velocity: homing with lambda = 1 ignores it
        x = x + (sigmas[k + 1] - sigmas[k]) * tdc_target(x, v_old, x_plus, t, torch.ones(3))
    torch.testing.assert_close(x, x_plus, atol=1e-5, rtol=0)


def test_lambda_schedule_and_target_blend():
    t = torch.tensor([0.2, 0.5, 0.75, 1.0])
    torch.testing.assert_close(homing_lambda(t, 0.5, 0.25), torch.tensor([1.0, 1.0, 0.625, 0.25]))
    x_t, v_old, x_plus = torch.ones(1, 2), torch.zeros(1, 2), torch.full((1, 2), -1.0)
    # v_home = (1 - (-1)) / 0.5 = 4; lambda 0.5 takes half of the way from v_old = 0
    torch.testing.assert_close(
        tdc_target(x_t, v_old, x_plus, torch.tensor([0.5]), torch.tensor([0.5])), torch.full((1, 2), 2.0)
    )


def test_split_groups_by_advantage_sign():
    advantages = torch.tensor([1.0, -0.5, 0.0, 2.0, -1.0, 0.3])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    assert split_groups(advantages, groups) == [([0], [1, 2]), ([3, 5], [4])]


def _red_batch(policy, seeds):
    """Two groups of four ODE rollouts scored by RedReward: positives share a direction (redder) for DHO to learn."""
    from test_methods import RedReward

    from flowrl.algorithms import RolloutBatch
    from flowrl.policies.base import SampleSpec
    from flowrl.rollout import rollout, sample_generators

    prompts = ["a red circle"] * 4 + ["a square"] * 4
    traj = rollout(
        policy,
        policy.encode(prompts, 2.0),
        sample_generators(seeds),
        policy.noise_shape(SampleSpec(32, 32)),
        6,
        "ode",
        0.7,
        2.0,
    )
    with torch.no_grad():
        rewards = RedReward()(policy.decode(traj.final), prompts).scores
    groups = torch.tensor([0] * 4 + [1] * 4)
    return RolloutBatch(traj, rewards, groups, list(seeds), rewards, groups, torch.arange(8), prompts)


@pytest.mark.parametrize("variant", ["dynamic", "trajectory", "forward"])
def test_dho_steps_bring_negatives_towards_their_targets_at_steps_they_did_not_train(variant):
    """Train on half the steps of one batch's matched negatives; at every step of their paths (half never trained
    on) their x0 predictions get closer to their targets (the x0-space distance over the batch's scale, unweighted, so
    a pull the wrong way shows). Another batch's negatives are not asserted: on this tiny random model they move
    either way."""
    policy = _policy()
    train = _red_batch(policy, range(8))
    algorithm = build_algorithm("dho", {"variant": variant, "timestep_fraction": 0.5, "alpha_pos": 0.0}, ODE)
    items, metrics = algorithm.prepare(train, policy)
    assert metrics["negatives_matched"] >= 2
    probe_algorithm = build_algorithm("dho", {"variant": variant, "timestep_fraction": 1.0}, ODE)
    probe_items, _ = probe_algorithm.prepare(train, policy)
    probe = probe_items.subset(torch.nonzero(~probe_algorithm.is_positive).flatten())
    probe_algorithm.weight = torch.ones_like(probe_algorithm.weight)  # the distance itself, whatever the pair weights

    def distance():
        with torch.no_grad():
            return probe_algorithm.loss(policy, train, probe)[0].mean().item()

    before = distance()
    optimizer = torch.optim.Adam(list(policy.trainable_parameters()), lr=1e-2)
    for _ in range(30):
        losses, _ = algorithm.loss(policy, train, items)
        optimizer.zero_grad()
        losses.mean().backward()
        optimizer.step()
    assert distance() < 0.99 * before


def test_positive_items_regress_forward_noised_positives():
    policy = _policy()
    batch = _ode_batch(policy, rewards=torch.tensor([0.9, 0.1, 0.2, 0.8, 0.3, 0.7, 0.6, 0.0]))
    algorithm = build_algorithm("dho", {"variant": "forward"}, ODE)
    items, _ = algorithm.prepare(batch, policy)
    positive = algorithm.is_positive
    assert set(items.sample[positive].tolist()) == {0, 3, 5, 6}
    x0 = batch.trajectory.final[items.sample[positive]]
    t = algorithm.t[positive].reshape(-1, 1, 1, 1)
    noise = algorithm.target[positive] + x0
    torch.testing.assert_close(algorithm.x_t[positive], (1 - t) * x0 + t * noise)


class _OffsetVelocity:
    """The wrapped policy, whose velocity gets a zero offset once `offset` is set: the loss's gradient with respect
    to v at v = v_old (the first optimiser step of an update)."""

    def __init__(self, policy):
        self.policy, self.offset = policy, None

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def velocity(self, x, t, cond, guidance_scale):
        v = self.policy.velocity(x, t, cond, guidance_scale).detach()
        return v if self.offset is None else v + self.offset


def _negative_gradients(rewards, **params):
    """Per-item gradient norms of the negatives' loss with respect to v at v = v_old, and the items' groups."""
    policy = _OffsetVelocity(_policy())
    batch = _ode_batch(policy, rewards=rewards)
    algorithm = build_algorithm(
        "dho", {"variant": "trajectory", "timestep_fraction": 1.0, "alpha_pos": 0.0, **params}, ODE
    )
    items, _ = algorithm.prepare(batch, policy)
    negative = items.subset(torch.nonzero(~algorithm.is_positive).flatten())
    policy.offset = torch.zeros(len(negative), *batch.trajectory.final.shape[1:], requires_grad=True)
    losses, _ = algorithm.loss(policy, batch, negative)
    losses.sum().backward()
    return policy.offset.grad.flatten(1).norm(dim=1), batch.group_ids[negative.sample], algorithm.t[negative.key]


REWARDS = torch.tensor([0.9, 0.1, 0.2, 0.8, 0.3, 0.7, 0.6, 0.0])


def test_the_pull_grows_with_lambda():
    """At v = v_old the error is lambda t (v_old - v_home): the gradient must scale with lambda(t), which a loss
    normalised by each item's own error cancels."""
    full, _, t = _negative_gradients(REWARDS, lambda_min=1.0, lambda_knee=0.0)
    ramped, _, t_ramped = _negative_gradients(REWARDS, lambda_min=0.25, lambda_knee=0.0)
    torch.testing.assert_close(t, t_ramped)
    torch.testing.assert_close(ramped / full, 1 - 0.75 * t, rtol=1e-4, atol=1e-6)


def test_the_pull_grows_with_the_advantage_gap():
    """Halving one group's reward spread halves its pairs' pull relative to the other group's (global std)."""
    halved = REWARDS.clone()
    halved[4:] = 0.5 * (REWARDS[4:] - REWARDS[4:].mean()) + REWARDS[4:].mean()
    ratios = []
    for rewards in (REWARDS, halved):
        norms, groups, _ = _negative_gradients(rewards, std="global")
        ratios.append(norms[groups == 1].mean() / norms[groups == 0].mean())
    torch.testing.assert_close(ratios[1], ratios[0] / 2, rtol=1e-4, atol=0)


def test_a_descent_step_moves_each_negatives_prediction_towards_its_positive():
    """With lambda = 1 a negative's target x0 is its matched positive x+ itself. Descending the loss moves v by -g, so
    x0_pred = x_t - t v by +t g: at v = v_old, g must point from the negative's x0 prediction to x+, for every pair
    (the pull's direction; its size is the other tests')."""
    policy = _OffsetVelocity(_policy())
    batch = _ode_batch(policy, rewards=REWARDS)
    params = {"variant": "trajectory", "timestep_fraction": 1.0, "alpha_pos": 0.0, "lambda_min": 1.0}
    algorithm = build_algorithm("dho", {**params, "lambda_knee": 0.0}, ODE)
    items, _ = algorithm.prepare(batch, policy)
    negative = items.subset(torch.nonzero(~algorithm.is_positive).flatten())
    x_t, t = algorithm.x_t[negative.key], algorithm.t[negative.key]
    shaped = t.view(-1, 1, 1, 1)
    x_plus = x_t - shaped * algorithm.target[negative.key]
    final, positive = batch.trajectory.final, REWARDS > REWARDS.view(2, 4).mean(1).repeat_interleave(4)
    nearest = torch.cdist(x_plus.flatten(1), final.flatten(1)).min(dim=1)
    assert nearest.values.max() < 1e-4 and positive[nearest.indices].all()  # each target is a positive's sample
    with torch.no_grad():
        x0_pred = x_t - shaped * policy.velocity(x_t, t, batch.trajectory.cond.select(negative.sample), 2.0)
    policy.offset = torch.zeros_like(x_t, requires_grad=True)
    algorithm.loss(policy, batch, negative)[0].sum().backward()
    towards = torch.nn.functional.cosine_similarity(policy.offset.grad.flatten(1), (x_plus - x0_pred).flatten(1))
    assert len(towards) >= 8 and towards.min() > 0.999


def test_the_scale_is_the_whole_batchs_on_any_number_of_processes():
    """Two processes holding half the batch each both divide by the whole batch's mean |x0|, not their own half's
    (here the halves differ threefold)."""
    import socket

    import torch.multiprocessing as mp
    from dho_scale_worker import scale_of_one_half

    final = torch.randn(8, 4, 4, 4, generator=torch.Generator().manual_seed(3))
    final[4:] *= 3
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = torch.zeros(2).share_memory_()
    mp.spawn(scale_of_one_half, args=(port, final, out), nprocs=2)
    whole = final.abs().mean().item()
    assert homing_scale(final) == pytest.approx(whole)  # one process
    assert out.tolist() == pytest.approx([whole, whole])
    assert homing_scale(final[4:]) > 2 * homing_scale(final[:4])  # what each would use on its own


def test_pairs_closer_than_the_reward_gap_are_not_trained():
    rewards = torch.tensor([0.9, 0.1, 0.2, 0.8, 0.5, 0.5 + 1e-6, 0.5 - 1e-6, 0.5])
    policy = _policy()
    algorithm = build_algorithm("dho", {"variant": "forward", "min_reward_gap": 1e-3}, ODE)
    items, metrics = algorithm.prepare(_ode_batch(policy, rewards=rewards), policy)
    assert set(items.sample.tolist()) <= {0, 1, 2, 3}
    assert metrics["negatives_matched"] == 2 and metrics["positives"] == 2 and metrics["pairs_tied"] >= 2


def test_bad_params_are_named():
    with pytest.raises(ConfigError, match="variant"):
        build_algorithm("dho", {"variant": "reflow"}, ODE)
    with pytest.raises(ConfigError, match="expected 'ode'"):
        build_algorithm("dho", {}, ODE.__class__(kind="flow"))


@pytest.mark.parametrize("config", ["shapes_dho.yaml", "shapes3d_dpo.yaml"])
def test_groups_split_over_processes_are_refused_for_methods_that_pair_within_a_group(
    config, tiny_sd3_dir, monkeypatch
):
    """3 groups of 4 on 2 processes would put half of the middle group on each: DHO would match (DPO pair) only
    within each half, so the result would depend on the number of processes."""
    from accelerate import Accelerator
    from conftest import REPO

    from flowrl.config import load_config
    from flowrl.train import Trainer

    monkeypatch.setattr(Accelerator, "num_processes", property(lambda self: 2))
    overrides = ["train.groups_per_update=3", "train.group_size=4", "eval.enabled=false"]
    if config == "shapes_dho.yaml":
        overrides.append(f"pipeline.path={tiny_sd3_dir}")
    with pytest.raises(ConfigError, match="pairs samples within a group on one process; expected a multiple of 2"):
        Trainer(load_config(REPO / "configs" / config, overrides), log=False)
