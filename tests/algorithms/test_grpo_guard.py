"""GRPO-Guard against hand computations: RatioNorm's log-ratio is mean_D(eps * (mu_theta - mu_old)), the reweighting
divides each step's loss by its |dt|, and with both off it is GRPO."""

from types import SimpleNamespace

import pytest
import torch
from test_grpo import _batch
from tiny_pipelines import tiny_shapes_sd3

from flowrl.algorithms import build_algorithm
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.policies import policy_for
from flowrl.sde import gaussian_log_prob, sde_step


def _moved_policy_and_batch(kind="flow"):
    """A batch rolled out by a LoRA policy at zero, and the policy moved off it afterwards (as after an update)."""
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    return policy, _batch(policy, kind)


def _move(policy):
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))


@pytest.mark.parametrize("kind", ["flow", "sage"])
def test_rationorm_is_the_step_noise_dotted_with_the_mean_gap(kind):
    policy, batch = _moved_policy_and_batch(kind)
    guard = build_algorithm("grpo_guard", {"reweight": False}, SamplerSection(kind=kind))
    items, _ = guard.prepare(batch, policy)  # mu_old: the rollout's policy
    grpo = build_algorithm("grpo", {}, SamplerSection(kind=kind))
    grpo.prepare(batch, policy)
    traj = batch.trajectory
    x, x_next = traj.latents[items.step, items.sample], traj.latents[items.step + 1, items.sample]
    s, s_next = traj.sigmas[items.step], traj.sigmas[items.step + 1]
    cond = traj.cond.select(items.sample)
    with torch.no_grad():
        mean_old, std = sde_step(kind, policy.velocity(x, s, cond, 2.0), x, s, s_next, 0.7)[1:3]
    _move(policy)
    with torch.no_grad():
        _, diagnostics = guard.loss(policy, batch, items)
        mean_new = sde_step(kind, policy.velocity(x, s, cond, 2.0), x, s, s_next, 0.7)[1]
    noise = (x_next - mean_old) / std
    expected = (noise * (mean_new - mean_old)).flatten(1).mean(1)
    assert expected.abs().max() > 1e-4  # the policy did move
    torch.testing.assert_close(diagnostics["ratio"].log(), expected, atol=2e-6, rtol=1e-3)
    # GRPO's raw log-ratio is the normalised one over s, shifted left by mean_D(dmu^2) / (2 s^2)
    with torch.no_grad():
        raw = grpo.loss(policy, batch, items)[1]["ratio"].log()
    step_std = std.flatten(1)[:, 0]
    gap = (mean_new - mean_old).pow(2).flatten(1).mean(1)
    torch.testing.assert_close(raw, expected / step_std - gap / (2 * step_std**2), atol=1e-4, rtol=1e-3)
    assert torch.all(gap > 0)


def test_rationorms_gradient_is_the_step_noise_where_the_policy_has_moved():
    """Past the first inner optimizer step mu_theta != mu_old, and the bias mean_D(dmu^2) / (2 s^2) that RatioNorm
    adds carries a gradient cancelling the raw log-ratio's -dmu / (D s): d log rho_hat / d mu_theta = eps / D. A bias
    that kept its value but lost its gradient would give eps / D - dmu / (D s), which only such a point tells apart."""
    generator = torch.Generator().manual_seed(0)
    old_mean = torch.randn(3, 2, 4, 4, generator=generator)
    std = torch.tensor([0.3, 0.2, 0.1]).view(3, 1, 1, 1)  # one step std per item, broadcast as the SDE's is
    x_next = old_mean + std * torch.randn(old_mean.shape, generator=generator)
    mean = (old_mean + 0.1 * torch.randn(old_mean.shape, generator=generator)).requires_grad_()
    guard = build_algorithm("grpo_guard", {"reweight": False, "clip_range": 1e3}, SamplerSection())  # no clipping
    guard.old_mean = old_mean
    advantage = torch.tensor([1.0, -0.5, 2.0])
    log_prob, old_log_prob = gaussian_log_prob(x_next, mean, std), gaussian_log_prob(x_next, old_mean, std)
    items = SimpleNamespace(key=torch.arange(3))
    losses, _ = guard.surrogate(items, log_prob, old_log_prob, advantage, mean, std, 0.8, 0.7)
    losses.sum().backward()
    noise = (x_next - old_mean) / std
    ratio = torch.exp((noise * (mean - old_mean)).flatten(1).mean(1)).detach()
    # the unclipped loss -A rho_hat with rho_hat = exp(mean_D(eps dmu)): its gradient is -A rho_hat eps / D
    expected = -(advantage * ratio).view(3, 1, 1, 1) * noise / noise[0].numel()
    torch.testing.assert_close(mean.grad, expected)


def test_the_reweighting_divides_each_steps_loss_by_its_dt():
    policy, batch = _moved_policy_and_batch()
    plain = build_algorithm("grpo_guard", {"reweight": False, "clip_range": 1.0}, SamplerSection())
    weighted = build_algorithm("grpo_guard", {"reweight": True, "clip_range": 1.0}, SamplerSection())
    items, _ = plain.prepare(batch, policy)
    weighted.prepare(batch, policy)
    _move(policy)
    with torch.no_grad():
        unweighted_losses = plain.loss(policy, batch, items)[0]
        weighted_losses = weighted.loss(policy, batch, items)[0]
    sigmas = batch.trajectory.sigmas
    dt = sigmas[items.step] - sigmas[items.step + 1]
    assert len(set(dt.tolist())) > 1  # several steps, several weights
    torch.testing.assert_close(weighted_losses, unweighted_losses / dt, rtol=1e-5, atol=1e-8)


def test_without_its_normaliser_and_weights_it_is_grpo():
    policy, batch = _moved_policy_and_batch()
    params = {"clip_range": 1e-3, "kl_beta": 0.05}
    grpo = build_algorithm("grpo", params, SamplerSection())
    guard = build_algorithm("grpo_guard", {**params, "ratio_norm": False, "reweight": False}, SamplerSection())
    items, _ = grpo.prepare(batch, policy)
    guard_items, _ = guard.prepare(batch, policy)
    assert torch.equal(items.sample, guard_items.sample) and torch.equal(items.step, guard_items.step)
    _move(policy)
    grpo_losses, grpo_diagnostics = grpo.loss(policy, batch, items)
    guard_losses, guard_diagnostics = guard.loss(policy, batch, items)
    assert torch.equal(guard_losses, grpo_losses)
    assert torch.equal(guard_diagnostics["ratio"], grpo_diagnostics["ratio"])


def test_the_guard_takes_only_euler_type_sde_steps():
    with pytest.raises(ConfigError, match="sampler.kind: algorithm 'grpo_guard' .* got 'cps'"):
        build_algorithm("grpo_guard", {}, SamplerSection(kind="cps"))
