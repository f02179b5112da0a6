"""Incremental Feynman-Kac credit and timestep-window schedules."""

import torch
from tiny_pipelines import tiny_shapes_sd3

from flowrl.algorithms import RolloutBatch, build_algorithm
from flowrl.algorithms.advantages import group_advantages
from flowrl.algorithms.credit import (
    IntermediateRewards,
    fold_deterministic_tail,
    incremental_credits,
    step_advantages,
    window_mask,
)
from flowrl.config import SamplerSection
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rewards import Reward, RewardOutput, build_reward, latent_scorer
from flowrl.rewards.base import condition_items
from flowrl.rollout import rollout, sample_generators


def test_per_step_credits_telescope_to_the_final_reward_gain():
    rewards = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    credits = incremental_credits(rewards)
    assert credits.shape == (5, 10)
    torch.testing.assert_close(credits.sum(1), rewards[:, -1] - rewards[:, 0])


def test_the_deterministic_tail_is_credited_to_the_last_stochastic_step():
    rewards = torch.tensor([[0.0, 0.5, 0.25, 1.0, 2.0]])  # 4 steps; the SDE window is steps 0-1
    folded = fold_deterministic_tail(incremental_credits(rewards), torch.tensor([True, True, False, False]))
    torch.testing.assert_close(folded, torch.tensor([[0.5, 1.5, 0.0, 0.0]]))  # step 1: r_T - r_1
    torch.testing.assert_close(folded.sum(1), rewards[:, -1] - rewards[:, 0])


def test_step_advantages_normalise_each_step_over_its_group():
    credits = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 5.0], [2.0, 1.0]])
    groups = torch.tensor([0, 0, 1, 1])
    adv = step_advantages(credits, groups, "group", clip=None)
    torch.testing.assert_close(adv[:, 0], group_advantages(credits[:, 0], groups, "group", clip=None))
    torch.testing.assert_close(adv[:, 1], group_advantages(credits[:, 1], groups, "group", clip=None))


def test_window_schedules():
    assert window_mask(10, "all", 0.3, 3).all()
    assert window_mask(10, "latter", 0.0, 3).tolist() == [False] * 7 + [True] * 3
    assert window_mask(10, "incremental", 0.0, 3).tolist() == [True] * 3 + [False] * 7
    assert window_mask(10, "incremental", 0.5, 3).sum() == 3 + 4
    assert window_mask(10, "incremental", 0.999, 3).all()  # grows to every step by the end of the run


def test_intermediate_rewards_and_incremental_grpo_on_a_tiny_rollout():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    reward = build_reward("jpeg_compressibility")
    prompts = ["a red circle"] * 3 + ["a square"] * 3
    recorder = IntermediateRewards(lambda z, texts, items: reward(policy.decode(z), texts).scores, 4)
    traj = rollout(
        policy,
        policy.encode(prompts, 2.0),
        sample_generators(range(6)),
        policy.noise_shape(SampleSpec(32, 32)),
        4,
        "flow",
        0.7,
        2.0,
        callbacks=[recorder],
    )
    step_rewards = recorder.rewards
    assert step_rewards.shape == (6, 5)
    with torch.no_grad():
        final = reward(policy.decode(traj.final), prompts).scores
    torch.testing.assert_close(step_rewards[:, -1], final)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    batch = RolloutBatch(
        traj,
        final,
        groups,
        list(range(6)),
        final,
        groups,
        torch.arange(6),
        prompts,
        progress=0.0,
        step_rewards=step_rewards,
        global_step_rewards=step_rewards,
    )
    algorithm = build_algorithm(
        "grpo", {"credit": "incremental", "window_schedule": "incremental", "window_size": 2}, SamplerSection()
    )
    assert algorithm.needs_step_rewards
    items, _ = algorithm.prepare(batch, policy)
    assert set(items.step.tolist()) <= {0, 1}  # the first window at the start of a run
    losses, diagnostics = algorithm.loss(policy, batch, items)
    assert torch.equal(diagnostics["ratio"], torch.ones_like(diagnostics["ratio"]))
    expected = -step_advantages(incremental_credits(step_rewards), groups)[items.sample, items.step]
    torch.testing.assert_close(losses.detach(), expected)


class SceneOfItem(Reward):
    """Scores each sample by its condition item's scene seed (what a world reward judges against); a bare prompt
    scores -1. (Declared differentiable so the reward-gradient methods take it: only what it is given is read.)"""

    differentiable = True

    def __call__(self, samples, prompts, meta=None):
        items = condition_items(prompts, meta)
        return RewardOutput(torch.tensor([float(item.meta.get("scene_seed", -1)) for item in items]), {})


def test_step_rewards_and_fk_potentials_judge_each_sample_against_its_own_item():
    """FK potentials and intermediate rewards pass the condition items to the reward: a world reward (edit, 3D)
    judges a sample against its item's scene, not the scene a bare prompt stands for (they once got prompts only)."""
    from flowrl.fk import FKConfig, FKSteering
    from flowrl.tasks.base import Condition

    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    k, steps = 2, 3
    items = [Condition("a circle", meta={"scene_seed": s}) for s in (7, 11) for _ in range(k)]
    scorer = latent_scorer(policy, SceneOfItem())
    steering = FKSteering(
        FKConfig(num_particles=k, lam=1.0, resample_every=1, ess_threshold=1.0),
        scorer,
        steps,
        2,
        torch.Generator().manual_seed(0),
    )
    recorder = IntermediateRewards(scorer, steps)
    traj = rollout(
        policy,
        policy.encode(items, 2.0),
        sample_generators(range(4)),
        policy.noise_shape(SampleSpec(32, 32)),
        steps,
        "flow",
        0.7,
        2.0,
        callbacks=[steering, recorder],
    )
    expected = torch.tensor([7.0, 7.0, 11.0, 11.0])
    torch.testing.assert_close(recorder.rewards, expected[:, None].expand(4, steps + 1))
    torch.testing.assert_close(steering.final_rewards.float(), expected)
    # the reward-gradient methods' scoring of latents too (ReFL, DRaFT, MEND), shifted copies included
    groups = torch.tensor([0, 0, 1, 1])
    batch = RolloutBatch(traj, expected, groups, [0, 1, 2, 3], expected, groups, torch.arange(4), ["a circle"] * 4)
    for params in ({}, {"reward_shift": 1, "reward_shift_copies": 2}):
        refl = build_algorithm("refl", params, SamplerSection(kind="ode"))
        refl.bind_reward(SceneOfItem())
        torch.testing.assert_close(refl.score_latents(policy, traj.final, batch, [3, 0]), torch.tensor([11.0, 7.0]))
