"""DiffusionNFT, MEND, ReFL and DRaFT against hand computations and the properties their definitions promise."""

import pytest
import torch
from tiny_pipelines import tiny_shapes_sd3

from flowrl.algorithms import RolloutBatch, build_algorithm
from flowrl.algorithms.mend import choose_moves, group_caps, shifted_trajectory
from flowrl.algorithms.nft import nft_loss, optimality_weight
from flowrl.algorithms.reward_backprop import reward_loss
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rewards.base import Reward, RewardOutput
from flowrl.rollout import rollout, sample_generators

ODE = SamplerSection(kind="ode", guidance_scale=2.0)


class RedReward(Reward):
    """A differentiable stand-in for a learned reward: mean red minus mean green."""

    name = "red"
    differentiable = True

    def __call__(self, samples, prompts, meta=None):
        return RewardOutput(samples[:, 0].mean((1, 2)) - samples[:, 1].mean((1, 2)))


def _policy():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    return policy


def _ode_batch(policy, rewards=None, steps=4):
    prompts = ["a red circle"] * 4 + ["a square"] * 4
    cond = policy.encode(prompts, 2.0)
    traj = rollout(
        policy, cond, sample_generators(range(8)), policy.noise_shape(SampleSpec(32, 32)), steps, "ode", 0.7, 2.0
    )
    if rewards is None:
        with torch.no_grad():
            rewards = RedReward()(policy.decode(traj.final), prompts).scores
    groups = torch.tensor([0] * 4 + [1] * 4)
    return RolloutBatch(traj, rewards, groups, list(range(8)), rewards, groups, torch.arange(8), prompts)


# ---- MEND ----------------------------------------------------------------------------------------------------
def test_mend_shifted_trajectory_ends_at_x0_plus_delta():
    torch.manual_seed(0)
    sigmas = torch.tensor([1.0, 0.8, 0.55, 0.3, 0.1, 0.0])
    latents = torch.randn(6, 3, 4, 4).cumsum(0)  # any stored Euler trajectory
    delta = 0.1 * torch.randn(3, 4, 4)
    states, targets = shifted_trajectory(latents, sigmas, delta)
    for k in range(5):
        torch.testing.assert_close(states[k], latents[k] + (1 - sigmas[k]) * delta)
    x = states[0]  # t = 1: the same noise as the stored trajectory
    torch.testing.assert_close(x, latents[0])
    for k in range(5):
        x = x + (sigmas[k + 1] - sigmas[k]) * targets[k]
    torch.testing.assert_close(x, latents[-1] + delta, atol=1e-5, rtol=0)


def test_mend_never_accepts_a_move_whose_capped_gain_is_at_most_its_price():
    torch.manual_seed(1)
    x0 = torch.randn(64, 2, 3, 3)
    direction = torch.randn(2, 3, 3)
    reward_of = lambda z: (z * direction).flatten(1).sum(1) + 0.3 * z.flatten(1).pow(2).sum(1).sin()  # noqa: E731
    rewards = reward_of(x0)
    cap, scale = group_caps(rewards, torch.arange(64) // 8, 0.75)
    gradient = torch.func.vmap(torch.func.grad(lambda z: reward_of(z[None])[0]))(x0)
    price = 30.0
    delta, net = choose_moves(reward_of, x0, gradient, rewards, cap, scale, price, 0.5, 4)
    moved = delta.flatten(1).abs().amax(1) > 0
    assert 0 < moved.sum() < 64
    mse = delta.pow(2).flatten(1).mean(1)
    gain = (torch.minimum(reward_of(x0 + delta), cap) - torch.minimum(rewards, cap)) / scale
    assert torch.all(gain[moved] > price / 2 * mse[moved])  # every accepted move pays for itself
    torch.testing.assert_close(net[moved], gain[moved] - price / 2 * mse[moved])
    assert torch.all(mse[moved] < 2 * (cap - rewards)[moved] / scale[moved] / price)  # the built-in trust region
    assert not moved[rewards >= cap].any()  # at or above the cap: no move
    none, _ = choose_moves(reward_of, x0, gradient, rewards, cap, scale, 1e12, 0.5, 4)
    assert torch.all(none == 0)  # an infinite price accepts nothing


def test_mend_batch_scaled_proposals_keep_the_gradients_relative_sizes():
    x0 = torch.zeros(2, 4)
    gradient = torch.tensor([[1.0, -1.0, 1.0, -1.0], [0.1, 0.1, -0.1, -0.1]])
    reward_of = lambda z: (z * gradient).sum(1)  # noqa: E731  (linear: every proposal gains)
    rewards, cap, scale = torch.zeros(2), torch.full((2,), 10.0), torch.ones(2)
    per_sample, _ = choose_moves(reward_of, x0, gradient, rewards, cap, scale, 1e-3, 0.5, 1, normalize="sample")
    per_batch, _ = choose_moves(reward_of, x0, gradient, rewards, cap, scale, 1e-3, 0.5, 1, normalize="batch")
    rms = lambda d: d.pow(2).mean(1).sqrt()  # noqa: E731
    torch.testing.assert_close(rms(per_sample), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(rms(per_batch)[1] / rms(per_batch)[0], torch.tensor(0.1))
    torch.testing.assert_close(per_batch.pow(2).mean().sqrt(), torch.tensor(0.5))  # one RMS over the batch


def test_mend_gives_exactly_zero_gradient_when_every_sample_is_at_the_cap():
    policy = _policy()
    batch = _ode_batch(policy, rewards=torch.tensor([0.5] * 4 + [0.2] * 4))
    algorithm = build_algorithm("mend", {}, ODE)
    algorithm.bind_reward(RedReward())
    items, metrics = algorithm.prepare(batch, policy)
    assert len(items) == 0 and metrics["moved_share"] == 0
    assert torch.all(algorithm.delta == 0)


def test_mend_moves_raise_the_reward_and_regress_onto_their_targets():
    policy = _policy()
    batch = _ode_batch(policy)
    algorithm = build_algorithm("mend", {"price": 1.0, "timestep_fraction": 1.0}, ODE)
    algorithm.bind_reward(RedReward())
    items, metrics = algorithm.prepare(batch, policy)
    assert metrics["moved_share"] > 0 and len(items) == 8 * 4
    moved = algorithm.delta.flatten(1).abs().amax(1) > 0
    with torch.no_grad():
        after = RedReward()(policy.decode(batch.trajectory.final + algorithm.delta), batch.prompts).scores
    assert torch.all(after[moved] > batch.rewards[moved])
    losses, diagnostics = algorithm.loss(policy, batch, items)
    anchors = diagnostics["moved_rows"] == 0
    assert losses[anchors].max() < 1e-8  # at theta_old an anchor's target is its own velocity
    assert losses[~anchors].min() > 1e-6
    losses.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())


def test_mend_stored_state_targets_have_residual_exactly_delta():
    policy = _policy()
    batch = _ode_batch(policy)
    algorithm = build_algorithm("mend", {"price": 1.0, "timestep_fraction": 1.0, "target_states": "stored"}, ODE)
    algorithm.bind_reward(RedReward())
    items, _ = algorithm.prepare(batch, policy)
    with torch.no_grad():
        losses, diagnostics = algorithm.loss(policy, batch, items)
    expected = algorithm.delta[items.sample].pow(2).flatten(1).mean(1)  # v_theta_old(x_k) - (v_old - delta) = delta
    assert diagnostics["moved_rows"].sum() > 0
    torch.testing.assert_close(losses, expected, atol=1e-7, rtol=1e-4)
    shifted = build_algorithm("mend", {"price": 1.0, "timestep_fraction": 1.0, "target_states": "shifted"}, ODE)
    shifted.bind_reward(RedReward())
    shifted.prepare(batch, policy)
    with torch.no_grad():
        at_shifted, _ = shifted.loss(policy, batch, items)
    moved = diagnostics["moved_rows"] > 0
    assert not torch.allclose(at_shifted[moved], expected[moved])  # there the model's response to the shift adds in


def test_mend_prediction_moves_shift_the_one_step_prediction_by_delta():
    policy = _policy()
    batch = _ode_batch(policy)
    algorithm = build_algorithm("mend", {"price": 1.0, "move_space": "prediction", "step_range": [0.0, 0.5]}, ODE)
    algorithm.bind_reward(RedReward())
    items, metrics = algorithm.prepare(batch, policy)
    assert metrics["moved_share"] > 0 and len(items) == 8  # one item per sample: its own prediction step
    assert set(items.step.tolist()) <= {0, 1} and torch.equal(items.step, algorithm.step[items.sample])
    traj = batch.trajectory
    before = algorithm.prediction(traj, items.sample, items.step)
    moved = algorithm.delta[items.sample].flatten(1).abs().amax(1) > 0
    with torch.no_grad():
        reward = lambda z: RedReward()(policy.decode(z), batch.prompts).scores  # noqa: E731
        assert torch.all(reward(before + algorithm.delta)[moved] > reward(before)[moved])
        losses, _ = algorithm.loss(policy, batch, items)
        # regressing v(x_k) onto u* = v_old - delta / t_k: at theta_old the residual is delta / t_k, and a model
        # that met u* would predict x_k - t_k u* = x0_hat_k + delta
        t = traj.sigmas[items.step].reshape(-1, 1, 1, 1)
        expected = (algorithm.delta[items.sample] / t).pow(2).flatten(1).mean(1)
        torch.testing.assert_close(losses, expected, atol=1e-7, rtol=1e-4)
        _, targets = algorithm.regression_pairs(traj, items)
        x = traj.latents[items.step, items.sample]
        torch.testing.assert_close(x - t * targets, before + algorithm.delta[items.sample], atol=1e-5, rtol=1e-5)


# ---- DiffusionNFT ----------------------------------------------------------------------------------------------
def test_nft_loss_matches_a_hand_computation():
    x0 = torch.tensor([[1.0, -1.0]])
    x_t = torch.tensor([[0.5, 0.5]])
    t, r, beta = torch.tensor([0.5]), torch.tensor([0.75]), 0.5
    v, v_old = torch.tensor([[0.0, 2.0]]), torch.tensor([[-1.0, 2.0]])
    # v+ = 0.5 v + 0.5 v_old = [-0.5, 2];  x0+ = x_t - 0.5 v+ = [0.75, -0.5];  error [-0.25, 0.5]
    loss_pos = ((0.25**2 + 0.5**2) / 2) / ((0.25 + 0.5) / 2)
    # v- = 1.5 v_old - 0.5 v = [-1.5, 2];  x0- = [1.25, -0.5];  error [0.25, 0.5]
    loss_neg = ((0.25**2 + 0.5**2) / 2) / ((0.25 + 0.5) / 2)
    expected = (0.75 * loss_pos + 0.25 * loss_neg) / 0.5
    torch.testing.assert_close(nft_loss(v, v_old, x_t, x0, t, r, beta), torch.tensor([expected]))
    torch.testing.assert_close(
        optimality_weight(torch.tensor([-10.0, 0.0, 2.5, 5.0]), 5.0), torch.tensor([0.0, 0.5, 0.75, 1.0])
    )


def test_nft_loss_by_hand_where_the_positive_and_negative_losses_differ():
    """L+ != L- (the test above has them equal, which hides r and 1 - r swapped, or a wrong v-)."""
    x0, x_t = torch.tensor([[1.0, -1.0]]), torch.tensor([[0.5, 0.5]])
    t, r, beta = torch.tensor([0.5]), torch.tensor([0.75]), 0.5
    v, v_old = torch.tensor([[0.0, 2.0]]), torch.tensor([[0.0, 1.0]])
    # v+ = 0.5 v + 0.5 v_old = [0, 1.5];  x0+ = x_t - 0.5 v+ = [0.5, -0.25];  error [-0.5, 0.75]
    loss_pos = ((0.5**2 + 0.75**2) / 2) / ((0.5 + 0.75) / 2)  # 0.65
    # v- = 1.5 v_old - 0.5 v = [0, 0.5];  x0- = [0.5, 0.25];  error [-0.5, 1.25]
    loss_neg = ((0.5**2 + 1.25**2) / 2) / ((0.5 + 1.25) / 2)  # 1.0357
    expected = (0.75 * loss_pos + 0.25 * loss_neg) / 0.5
    torch.testing.assert_close(nft_loss(v, v_old, x_t, x0, t, r, beta), torch.tensor([expected]))


def test_nft_gradient_at_the_old_policy_is_advantage_weighted_flow_matching():
    torch.manual_seed(2)
    x0, x_t, v_old = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    t, r = torch.tensor([0.3, 0.6, 0.9]), torch.tensor([0.9, 0.5, 0.2])
    v = v_old.clone().requires_grad_(True)
    nft_loss(v, v_old, x_t, x0, t, r, 1.0).sum().backward()
    error = x_t - t[:, None] * v_old - x0
    positive_grad = 2 * error * -t[:, None] / 5 / error.abs().mean(1, keepdim=True)
    torch.testing.assert_close(v.grad, (2 * r[:, None] - 1) * positive_grad)


def test_nft_trains_on_re_noised_samples_of_signal_groups():
    policy = _policy()
    batch = _ode_batch(policy, rewards=torch.tensor([0.1, 0.4, 0.2, 0.9, 0.5, 0.5, 0.5, 0.5]))
    algorithm = build_algorithm("nft", {"timestep_fraction": 0.5, "drop_zero_advantage": True}, ODE)
    items, _ = algorithm.prepare(batch, policy)
    assert set(items.sample.tolist()) == {0, 1, 2, 3}  # the second group has no signal
    losses, diagnostics = algorithm.loss(policy, batch, items)
    assert torch.all(diagnostics["velocity_change"] < 1e-10)  # v_old is the rollout policy's velocity
    losses.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())


def test_nft_defaults_follow_the_reference_scale_and_keep_zero_advantage_items():
    policy = _policy()
    batch = _ode_batch(policy, rewards=torch.tensor([0.1, 0.4, 0.2, 0.9, 0.5, 0.5, 0.5, 0.5]))
    algorithm = build_algorithm("nft", {"timestep_fraction": 0.5, "beta": 0.5}, ODE)
    items, _ = algorithm.prepare(batch, policy)
    assert set(items.sample.tolist()) == set(range(8))  # A = 0 items trained, as the reference does
    unscaled = build_algorithm("nft", {"timestep_fraction": 0.5, "beta": 0.5, "scale_by_adv_clip": False}, ODE)
    unscaled.prepare(batch, policy)
    with torch.no_grad():  # move the policy off v_old so the loss is not trivially symmetric
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    losses, _ = algorithm.loss(policy, batch, items)
    traj = batch.trajectory
    with torch.no_grad():
        v = policy.velocity(algorithm.x_t, algorithm.t, traj.cond.select(items.sample), 2.0)
    expected = 5.0 * nft_loss(
        v, algorithm.v_old, algorithm.x_t, traj.final[items.sample], algorithm.t, algorithm.weights[items.sample], 0.5
    )  # C = adv_clip_max = 5
    torch.testing.assert_close(losses.detach(), expected)
    torch.testing.assert_close(unscaled.loss(policy, batch, items)[0].detach(), expected / 5.0)


# ---- ReFL / DRaFT ---------------------------------------------------------------------------------------------
def test_reward_loss_cap_stops_the_gradient():
    scores = torch.tensor([0.5, 2.5, 1.0], requires_grad=True)
    loss = reward_loss(scores, 2.0, 0.1)
    torch.testing.assert_close(loss.detach(), torch.tensor([0.15, 0.0, 0.1]))
    loss.sum().backward()
    torch.testing.assert_close(scores.grad, torch.tensor([-0.1, 0.0, -0.1]))
    torch.testing.assert_close(reward_loss(scores.detach(), None, 1.0), -scores.detach())


def test_refl_loss_is_the_reward_of_the_one_step_prediction():
    policy = _policy()
    batch = _ode_batch(policy)
    algorithm = build_algorithm("refl", {"step_range": [0.5, 1.0]}, ODE)
    algorithm.bind_reward(RedReward())
    items, _ = algorithm.prepare(batch, policy)
    assert len(items) == 8 and set(items.step.tolist()) <= {2, 3}
    losses, _ = algorithm.loss(policy, batch, items)
    traj = batch.trajectory
    with torch.no_grad():
        x = traj.latents[items.step, items.sample]
        sigma = traj.sigmas[items.step]
        v = policy.velocity(x, sigma, traj.cond.select(items.sample), 2.0)
        expected = -RedReward()(policy.decode(x - sigma[:, None, None, None] * v), batch.prompts).scores
    torch.testing.assert_close(losses.detach(), expected, atol=1e-5, rtol=1e-4)


def test_draft_gradient_matches_finite_differences():
    policy = _policy()
    policy.cfg_uncond_grad = True  # finite differences move both CFG branches; so must the analytic gradient
    with torch.no_grad():  # a LoRA with weight, so the derivative is far above fp32 rounding
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    batch = _ode_batch(policy, steps=3)
    algorithm = build_algorithm("draft", {"k": 2}, ODE)
    algorithm.bind_reward(RedReward())
    items, _ = algorithm.prepare(batch, policy)
    assert items.step.tolist() == [1] * 8
    param = next(p for n, p in policy.transformer.named_parameters() if "lora_A" in n)
    losses, diagnostics = algorithm.loss(policy, batch, items)
    # the final sample re-run with gradient reproduces the stored rollout's reward
    torch.testing.assert_close(-losses.detach(), batch.rewards, atol=1e-4, rtol=1e-3)
    (grad,) = torch.autograd.grad(losses.sum(), param)
    assert grad.abs().sum() > 0
    direction = torch.randn(param.shape, generator=torch.Generator().manual_seed(1))
    eps = 1e-3
    with torch.no_grad():
        param.add_(eps * direction)
        plus = algorithm.loss(policy, batch, items)[0].sum()
        param.sub_(2 * eps * direction)
        minus = algorithm.loss(policy, batch, items)[0].sum()
        param.add_(eps * direction)
    numeric = (plus - minus) / (2 * eps)
    assert float((grad * direction).sum()) == pytest.approx(float(numeric), rel=0.05)


def test_methods_that_need_reward_gradients_or_ode_rollouts_say_so():
    with pytest.raises(ConfigError, match="sampler.kind"):
        build_algorithm("mend", {}, SamplerSection(kind="flow"))
    algorithm = build_algorithm("refl", {}, ODE)
    not_differentiable = RedReward()
    not_differentiable.differentiable = False
    with pytest.raises(ConfigError, match="not differentiable"):
        algorithm.bind_reward(not_differentiable)


# ---- shift-averaged reward gradients -----------------------------------------------------------------------------
class CornerReward(Reward):
    """Reads one pixel: the kind of position-bound score a shift should average away."""

    name = "corner"
    differentiable = True

    def __call__(self, samples, prompts, meta=None):
        return RewardOutput(samples[:, 0, 4, 4])


def test_shift_average_copies_are_integer_translations_drawn_from_each_seed():
    from flowrl.rewards.augment import ShiftAverage

    shift = ShiftAverage(max_shift=2, copies=3)
    images = torch.rand(2, 3, 12, 12)
    out = shift.shifted(images, [5, 9])
    assert out.shape == (6, 3, 12, 12)
    offsets = shift.offsets([5, 9])
    assert offsets.abs().max() <= 2 and torch.equal(offsets, shift.offsets([5, 9]))
    for b in range(2):
        for c in range(3):
            dy, dx = offsets[b, c].tolist()
            # inside the border the copy is the image moved by (-dy, -dx)
            torch.testing.assert_close(out[b * 3 + c, :, 2:10, 2:10], images[b, :, 2 + dy : 10 + dy, 2 + dx : 10 + dx])
    # a clip's frames move together (video rewards with reward_shift once crashed in replicate padding)
    clips = torch.rand(2, 3, 4, 12, 12)
    moved = shift.shifted(clips, [5, 9])
    assert moved.shape == (6, 3, 4, 12, 12)
    for b in range(2):
        for c in range(3):
            dy, dx = offsets[b, c].tolist()
            torch.testing.assert_close(
                moved[b * 3 + c, ..., 2:10, 2:10], clips[b, ..., 2 + dy : 10 + dy, 2 + dx : 10 + dx]
            )


def test_refl_with_reward_shift_spreads_the_gradient_of_a_position_bound_reward():
    policy = _policy()
    batch = _ode_batch(policy)
    plain = build_algorithm("refl", {"step_range": [0.5, 1.0]}, ODE)
    shifted = build_algorithm("refl", {"step_range": [0.5, 1.0], "reward_shift": 2, "reward_shift_copies": 8}, ODE)
    images = torch.rand(8, 3, 32, 32, requires_grad=True)
    grads = []
    for algorithm in (plain, shifted):
        algorithm.bind_reward(CornerReward())
        decode = policy.decode
        policy.decode = lambda latents: images  # score fixed images so the gradient is read in pixel space
        try:
            score = algorithm.score_latents(policy, None, batch, list(range(len(batch.prompts))))
        finally:
            policy.decode = decode
        grads.append(torch.autograd.grad(score.sum(), images)[0][:, 0])
    assert int((grads[0][0] != 0).sum()) == 1  # the plain gradient is one pixel
    assert int((grads[1][0] != 0).sum()) > 1  # the shifted copies read several
    torch.testing.assert_close(grads[1].sum((1, 2)), torch.ones(8))  # still the mean of 8 unit-weight reads
    with pytest.raises(ConfigError, match="reward_shift"):
        build_algorithm("draft", {"reward_shift": -1}, ODE)


def test_method_and_pipeline_combinations_that_would_train_on_nonsense_are_refused(tiny_sd3_dir, tmp_path):
    """Diffusion-DPO noised an SD pipeline's latents as a flow's (x_t = -980 x0 + 981 eps at DDIM timestep 981) and
    regressed its noise prediction on a velocity; MEND compared z-scored batch rewards with its proposals' raw ones."""
    from run_helpers import tiny_run_config
    from tiny_pipelines import tiny_shapes_sd

    from flowrl.config import load_config
    from flowrl.errors import ConfigError
    from flowrl.train import Trainer

    tiny_shapes_sd().save_pretrained(tmp_path / "sd")
    sd = tiny_run_config(tmp_path / "sd.yaml", tmp_path / "sd", tmp_path / "runs", "dpo_sd")
    with pytest.raises(ConfigError, match="'dpo' is implemented for flow-matching pipelines"):
        Trainer(load_config(sd, ["algorithm.name=dpo", "algorithm.params={}", "sampler.kind=ddim"]), log=False)
    flow = tiny_run_config(tmp_path / "flow.yaml", tiny_sd3_dir, tmp_path / "runs", "mend_z")
    with pytest.raises(ConfigError, match="train.normalize_rewards: algorithm 'mend' compares"):
        Trainer(
            load_config(
                flow,
                ["algorithm.name=mend", "algorithm.params={}", "sampler.kind=ode", "train.normalize_rewards=batch"],
            ),
            log=False,
        )


def test_mend_refuses_stale_asynchronous_rollouts():
    """MEND regresses onto the velocities of the policy that drew the batch: under staleness those are an older
    snapshot's, and the anchors would pull the learner back toward it."""
    from conftest import REPO

    from flowrl.config import load_config
    from flowrl.errors import ConfigError
    from flowrl.train import Trainer

    stale = ["runtime.async_rollouts=true", "runtime.staleness=1", "runtime.threads=1"]
    with pytest.raises(ConfigError, match="runtime.staleness: algorithm 'mend' regresses onto the velocities"):
        Trainer(load_config(REPO / "configs" / "shapes_mend.yaml", stale))
