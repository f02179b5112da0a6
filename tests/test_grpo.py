import pytest
import torch

from flowrl.algorithms import RolloutBatch, build_algorithm
from flowrl.algorithms.advantages import group_advantages, zero_std_groups
from flowrl.algorithms.base import trained_steps
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.policies import policy_for
from flowrl.rollout import rollout, sample_generators
from tiny_pipelines import tiny_shapes_sd3


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1])
    global_std = rewards.std(unbiased=False)
    expected = torch.tensor([-1.0, 1.0, 0.0, 0.0]) / (global_std + 1e-4)
    torch.testing.assert_close(group_advantages(rewards, groups, "global"), expected)
    torch.testing.assert_close(group_advantages(rewards, groups, "group"), torch.tensor([-1.0, 1.0, 0.0, 0.0]) / (1 + 1e-4))
    assert group_advantages(torch.tensor([0.0, 100.0]), torch.tensor([0, 0]), "group", clip=5.0).abs().max() <= 5.0
    assert zero_std_groups(rewards, groups).tolist() == [False, False, True, True]


def test_trained_steps_are_a_seeded_subset():
    mask = torch.tensor([True] * 8 + [False, False])
    chosen = trained_steps(mask, 0.5, seed=3)
    assert len(chosen) == 4 and set(chosen.tolist()) <= set(range(8))
    assert torch.equal(chosen, trained_steps(mask, 0.5, seed=3))
    assert len(trained_steps(mask, 1.0, seed=3)) == 8


def _batch(policy, kind="flow"):
    prompts = ["a red circle"] * 3 + ["a square"] * 3
    cond = policy.encode(prompts, 2.0)
    traj = rollout(policy, cond, sample_generators(range(6)), policy.noise_shape(32, 32), 4, kind, 0.7, 2.0)
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.2, 0.9, 0.4])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    return RolloutBatch(traj, rewards, groups, list(range(6)), rewards, groups, torch.arange(6), ["a circle"] * 6)


@pytest.mark.parametrize("kind", ["flow", "dance", "sage", "cps"])
def test_ratio_is_exactly_one_on_the_first_on_policy_step(kind):
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    batch = _batch(policy, kind)
    algorithm = build_algorithm("grpo", {"kl_beta": 0.1}, SamplerSection(kind=kind))
    items, _ = algorithm.prepare(batch, policy)
    losses, diagnostics = algorithm.loss(policy, batch, items)
    assert torch.equal(diagnostics["ratio"], torch.ones_like(diagnostics["ratio"]))
    assert torch.all(diagnostics["clip_frac"] == 0)
    assert torch.all(diagnostics["kl"] == 0)  # LoRA starts at zero: policy == reference
    torch.testing.assert_close(losses, -algorithm.advantages[items.sample])
    losses.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())


def test_clipped_surrogate_stops_the_gradient_outside_the_trust_region():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    batch = _batch(policy)
    algorithm = build_algorithm("grpo", {"clip_range": 1e-6}, SamplerSection())
    items, _ = algorithm.prepare(batch, policy)
    with torch.no_grad():  # move the policy so every ratio leaves [1 - eps, 1 + eps]
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    losses, diagnostics = algorithm.loss(policy, batch, items)
    ratio, adv = diagnostics["ratio"], algorithm.advantages[items.sample]
    expected = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - 1e-6, 1 + 1e-6))
    torch.testing.assert_close(losses.detach(), expected)
    assert diagnostics["clip_frac"].mean() > 0.9


def test_zero_std_groups_are_dropped_and_deterministic_steps_skipped():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    batch = _batch(policy, "cps")
    batch.global_rewards = batch.rewards = torch.tensor([1.0, 1.0, 1.0, 0.2, 0.9, 0.4])
    algorithm = build_algorithm("grpo", {}, SamplerSection(kind="cps"))
    items, metrics = algorithm.prepare(batch, policy)
    assert set(items.sample.tolist()) == {3, 4, 5}
    assert metrics["zero_std_share"] == pytest.approx(0.5)
    assert 3 not in items.step.tolist()  # CPS's last step has zero variance


def test_bad_algorithm_params_are_named():
    with pytest.raises(ConfigError, match="algorithm.params.timestep_fraction"):
        build_algorithm("grpo", {"timestep_fraction": 1.5}, SamplerSection())
    with pytest.raises(ConfigError, match="algorithm.params.clip_rnage: unknown field"):
        build_algorithm("grpo", {"clip_rnage": 0.1}, SamplerSection())
    with pytest.raises(ConfigError, match="algorithm.name"):
        build_algorithm("nope", {}, SamplerSection())
