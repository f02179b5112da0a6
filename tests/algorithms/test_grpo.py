from dataclasses import replace

import pytest
import torch
from tiny_pipelines import tiny_shapes_sd3

from flowrl.algorithms import RolloutBatch, build_algorithm
from flowrl.algorithms.advantages import group_advantages, zero_std_groups
from flowrl.algorithms.base import trained_steps
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import per_sample_noise, rollout, sample_generators


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1])
    global_std = rewards.std(unbiased=False)
    expected = torch.tensor([-1.0, 1.0, 0.0, 0.0]) / (global_std + 1e-4)
    torch.testing.assert_close(group_advantages(rewards, groups, "global"), expected)
    torch.testing.assert_close(
        group_advantages(rewards, groups, "group"), torch.tensor([-1.0, 1.0, 0.0, 0.0]) / (1 + 1e-4)
    )
    assert group_advantages(torch.tensor([0.0, 100.0]), torch.tensor([0, 0]), "group", clip=5.0).abs().max() <= 5.0
    assert zero_std_groups(rewards, groups).tolist() == [False, False, True, True]


def test_group_advantages_with_unequal_group_spreads_and_a_clamp_that_bites():
    """Population std per group (not the unbiased one, not the variance), eps added to it, then the clamp."""
    import math

    rewards = torch.tensor([0.0, 2.0, 4.0, 10.0, 10.0, 40.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    first, second = math.sqrt(8 / 3), math.sqrt(200.0)  # population stds: (4 + 0 + 4) / 3 and (100 + 100 + 400) / 3
    by_group = torch.tensor([-2 / (first + 1e-4), 0.0, 2 / (first + 1e-4), -10 / (second + 1e-4)])
    by_group = torch.cat([by_group, torch.tensor([-10 / (second + 1e-4), 20 / (second + 1e-4)])])
    torch.testing.assert_close(group_advantages(rewards, groups, "group", clip=None), by_group)
    clamped = group_advantages(rewards, groups, "group", clip=1.0)  # 1.22 and 1.41 are cut to 1
    torch.testing.assert_close(clamped, by_group.clamp(-1.0, 1.0))
    assert clamped[2] == 1.0 and clamped[5] == 1.0 and clamped[3] > -1.0
    spread = math.sqrt(1094 / 6)  # every reward about the batch mean 11: 121 + 81 + 49 + 1 + 1 + 841
    centred = torch.tensor([-2.0, 0.0, 2.0, -10.0, -10.0, 20.0])
    torch.testing.assert_close(group_advantages(rewards, groups, "global", clip=None), centred / (spread + 1e-4))


def test_the_clipped_surrogate_has_no_gradient_where_it_clips():
    """clip_range 0.2: with A > 0 a ratio above 1.2 is clipped (no gradient) and one below 0.8 is not; with A < 0 the
    reverse; inside the range the gradient is -A."""
    from flowrl.algorithms.grpo import clipped_surrogate

    ratio = torch.tensor([0.5, 0.9, 1.1, 1.5], requires_grad=True)
    clipped_surrogate(ratio, torch.tensor(1.0), 0.2).sum().backward()
    assert ratio.grad.tolist() == [-1.0, -1.0, -1.0, 0.0]
    ratio.grad = None
    clipped_surrogate(ratio, torch.tensor(-1.0), 0.2).sum().backward()
    assert ratio.grad.tolist() == [0.0, 1.0, 1.0, 1.0]
    values = clipped_surrogate(ratio.detach(), torch.tensor(1.0), 0.2)
    torch.testing.assert_close(values, torch.tensor([-0.5, -0.9, -1.1, -1.2]))


def test_trained_steps_are_a_seeded_subset():
    mask = torch.tensor([True] * 8 + [False, False])
    chosen = trained_steps(mask, 0.5, seed=3)
    assert len(chosen) == 4 and set(chosen.tolist()) <= set(range(8))
    assert torch.equal(chosen, trained_steps(mask, 0.5, seed=3))
    assert len(trained_steps(mask, 1.0, seed=3)) == 8


def test_trained_steps_are_counted_as_the_anchors_count_them():
    """int(fraction x n), at least 1 (Flow-GRPO, DanceGRPO, DiffusionNFT, Flow-Factory): 0.99 of 10 steps is 9, 0.6
    of 16 is 9; `first` takes them in sampling order, as Flow-GRPO trains (its last, lowest-noise step never)."""
    ten, sixteen = torch.ones(10, dtype=torch.bool), torch.ones(16, dtype=torch.bool)
    assert len(trained_steps(ten, 0.99, seed=0)) == 9 and len(trained_steps(sixteen, 0.6, seed=0)) == 9
    assert len(trained_steps(ten, 0.3, seed=0)) == 3 and len(trained_steps(ten, 0.01, seed=0)) == 1
    assert trained_steps(ten, 0.99, seed=5, order="first").tolist() == list(range(9))
    window = torch.tensor([False, True, True, True] + [False] * 6)  # only the SDE window's steps are trainable
    assert trained_steps(window, 0.7, seed=5, order="first").tolist() == [1, 2]


def _batch(policy, kind="flow"):
    prompts = ["a red circle"] * 3 + ["a square"] * 3
    cond = policy.encode(prompts, 2.0)
    traj = rollout(policy, cond, sample_generators(range(6)), policy.noise_shape(SampleSpec(32, 32)), 4, kind, 0.7, 2.0)
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


def test_a_shared_initial_noise_is_not_reused_as_the_first_samples_step_noise():
    """DanceGRPO's shared x_T is drawn from the group's first seed; that sample's SDE noise must be a fresh draw,
    not the same numbers again (its first step would then be deterministic given x_T)."""
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    shape, seeds = policy.noise_shape(SampleSpec(32, 32)), [5, 6]
    shared = per_sample_noise(sample_generators([seeds[0]] * 2), shape)
    seen, step = [], policy.step

    def recording(kind, x, *args, noise=None, **kwargs):
        seen.append(noise)
        return step(kind, x, *args, noise=noise, **kwargs)

    policy.step = recording
    traj = rollout(
        policy,
        policy.encode(["a circle"] * 2, 4.5),
        sample_generators(seeds),
        shape,
        2,
        "dance",
        0.3,
        4.5,
        initial_noise=shared,
    )
    torch.testing.assert_close(traj.latents[0], shared)
    assert not torch.allclose(seen[0][0], shared[0]) and not torch.allclose(seen[0][1], shared[1])


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


def test_a_process_whose_groups_all_tie_keeps_one_item_of_weight_zero():
    """Under DDP a process whose groups all tie (dropped) still runs the forward and backward the others run: one
    placeholder item of weight 0 (before, it had none and the run stopped as soon as another process trained)."""
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    batch = _batch(policy)
    batch.global_rewards = torch.tensor([1.0, 1.0, 1.0, 0.2, 0.9, 0.4])  # the other process's group varies
    batch.rewards = batch.global_rewards[:3]
    batch.local_index = torch.arange(3)  # this process holds the tied group alone
    batch.trajectory = replace(
        batch.trajectory,
        latents=batch.trajectory.latents[:, :3],
        log_probs=batch.trajectory.log_probs[:, :3],
        cond=batch.trajectory.cond.select([0, 1, 2]),
    )
    items, _ = build_algorithm("grpo", {}, SamplerSection()).prepare(batch, policy)
    assert len(items) == 1 and items.weight.tolist() == [0.0]
    assert bool(batch.trajectory.stochastic[items.step[0]])  # a step the loss can score


def test_best_of_trains_each_groups_highest_and_lowest_advantages():
    """DanceGRPO's best-of-N: with best_of 4, each group of 6 keeps its 2 highest and 2 lowest advantages (computed
    over the whole group); a group no larger than best_of keeps everyone; an odd best_of is a config error."""
    from flowrl.algorithms.grpo import best_and_worst

    advantages = torch.tensor([0.5, -1.0, 2.0, 0.1, -0.3, 1.0, 0.2, -0.2, 0.0, 0.3])
    groups = torch.tensor([0] * 6 + [1] * 4)
    chosen = best_and_worst(advantages, groups, 4)
    assert torch.nonzero(chosen).flatten().tolist() == [1, 2, 4, 5, 6, 7, 8, 9]
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    batch = _batch(policy)  # groups of 3: rewards [0, 1, 0.5] and [0.2, 0.9, 0.4]
    items, _ = build_algorithm("grpo", {"best_of": 2}, SamplerSection()).prepare(batch, policy)
    assert sorted(set(items.sample.tolist())) == [0, 1, 3, 4]  # each group's worst and best
    with pytest.raises(ConfigError, match="algorithm.params.best_of: expected 0 .* or an even number"):
        build_algorithm("grpo", {"best_of": 3}, SamplerSection())
    with pytest.raises(ConfigError, match="algorithm.params.best_of: picks samples by their final reward"):
        build_algorithm("grpo", {"best_of": 2, "credit": "incremental"}, SamplerSection())


def test_bad_algorithm_params_are_named():
    with pytest.raises(ConfigError, match="algorithm.params.timestep_fraction"):
        build_algorithm("grpo", {"timestep_fraction": 1.5}, SamplerSection())
    with pytest.raises(ConfigError, match="algorithm.params.clip_rnage: unknown field"):
        build_algorithm("grpo", {"clip_rnage": 0.1}, SamplerSection())
    with pytest.raises(ConfigError, match="algorithm.name"):
        build_algorithm("nope", {}, SamplerSection())


@pytest.mark.parametrize("kind", ["flow", "cps"])
def test_kl_forms_against_their_formulas(kind):
    """flow_grpo: mean((mu - mu_ref)^2) / (2 std_t^2) with Flow-GRPO's std_t = a sqrt(s / (1 - s)) (CPS: the step
    std); gaussian: the exact step-Gaussian KL, mean((mu - mu_ref)^2) / (2 std^2)."""
    import math

    from flowrl.sde import sde_step

    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    batch = _batch(policy, kind)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    results = {}
    for form in ("flow_grpo", "gaussian"):
        algorithm = build_algorithm("grpo", {"kl_beta": 0.1, "kl_form": form}, SamplerSection(kind=kind))
        items, _ = algorithm.prepare(batch, policy)
        results[form] = algorithm.loss(policy, batch, items)[1]["kl"]
    traj, a = batch.trajectory, 0.7
    x = traj.latents[items.step, items.sample]
    s, s_next = traj.sigmas[items.step], traj.sigmas[items.step + 1]
    cond = traj.cond.select(items.sample)
    with torch.no_grad():
        mean = sde_step(kind, policy.velocity(x, s, cond, 2.0), x, s, s_next, a)[1]
        with policy.reference():
            mean_ref, step_std = sde_step(kind, policy.velocity(x, s, cond, 2.0), x, s, s_next, a)[1:3]
    gap = (mean - mean_ref).pow(2).flatten(1).mean(1)
    if kind == "flow":
        std_t = torch.tensor(
            [a * math.sqrt(si / (1 - (sn if si >= 1 else si))) for si, sn in zip(s.tolist(), s_next.tolist())]
        )
    else:
        std_t = step_std.flatten()[: len(s)] if step_std.numel() == len(s) else step_std.reshape(len(s), -1)[:, 0]
    torch.testing.assert_close(results["flow_grpo"], gap / (2 * std_t**2), rtol=1e-4, atol=1e-10)
    gaussian = gap / (2 * step_std.reshape(len(s), -1)[:, 0] ** 2)
    torch.testing.assert_close(results["gaussian"], gaussian, rtol=1e-4, atol=1e-10)
    if kind == "flow":
        assert torch.all(results["gaussian"] > results["flow_grpo"])  # the exact KL is 1/|dt| times larger


def test_the_unconditional_gradient_rule_defaults_to_the_methods_own():
    """Unset, train.cfg_uncond_grad follows the method: a likelihood ratio method drops the unconditional branch's
    gradient (Flow-GRPO), one that differentiates the sampler keeps it (DRaFT's gradient is the guided output's); a
    set value wins."""
    from conftest import REPO

    from flowrl.builders import uncond_grad_of
    from flowrl.config import load_config

    config = REPO / "configs" / "shapes_grpo.yaml"
    unset = ["train.cfg_uncond_grad=null"]
    assert uncond_grad_of(load_config(config, unset)) is False
    for name in ("draft", "refl"):
        assert (
            uncond_grad_of(
                load_config(
                    config, [*unset, f"algorithm.name={name}", "algorithm.params={}", "reward=[{name: shapes_clip}]"]
                )
            )
            is True
        )
    assert (
        uncond_grad_of(
            load_config(
                config,
                [
                    "algorithm.name=draft",
                    "algorithm.params={}",
                    "reward=[{name: shapes_clip}]",
                    "train.cfg_uncond_grad=false",
                ],
            )
        )
        is False
    )


def test_cfg_unconditional_branch_is_detached_by_default():
    """Guided v = v_u + w (v_c - v_u): by default only w v_c carries gradient (Flow-GRPO); with cfg_uncond_grad the
    full expression does. The values are identical."""
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(["a red circle", "a square"], 4.5)
    x = torch.randn(2, *policy.noise_shape(SampleSpec(32, 32)), generator=torch.Generator().manual_seed(1))
    sigma, w = torch.tensor([0.6, 0.6]), 4.5
    param = next(p for n, p in policy.transformer.named_parameters() if "lora_A" in n)

    def grad_of(fn):
        return torch.autograd.grad(fn().sum(), param)[0]

    uncond_grad = grad_of(lambda: policy.branch_outputs(x, sigma, [cond.negative], w)[0])
    text_grad = grad_of(lambda: policy.branch_outputs(x, sigma, [cond.tensors], w)[0])
    detached = grad_of(lambda: policy.velocity(x, sigma, cond, w))
    torch.testing.assert_close(detached, w * text_grad, rtol=1e-3, atol=1e-4)
    policy.cfg_uncond_grad = True
    full = grad_of(lambda: policy.velocity(x, sigma, cond, w))
    torch.testing.assert_close(full, (1 - w) * uncond_grad + w * text_grad, rtol=1e-3, atol=1e-4)
    assert (full - detached).norm() > 0.1 * full.norm()
