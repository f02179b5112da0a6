"""The epsilon-prediction adapter (StableDiffusionPipeline + DDIM) that DDPO trains."""

import pytest
import torch
from tiny_pipelines import tiny_shapes_sd

from flowrl.algorithms import RolloutBatch, build_algorithm
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators

PROMPTS = ["a red circle", "two squares"]


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction", "sample"])
def test_deterministic_ddim_rollout_reproduces_the_pipeline(prediction):
    """For each prediction type a scheduler config can name (SD 2.x's 768 models predict v)."""
    from diffusers import DDIMScheduler

    pipe = tiny_shapes_sd()
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, prediction_type=prediction)
    policy = policy_for(pipe)
    shape = policy.noise_shape(SampleSpec(32, 32))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    traj = rollout(
        policy, policy.encode(PROMPTS, 3.0), sample_generators([1, 2]), shape, 4, "ode", 0.0, 3.0, initial_noise=noise
    )
    expected = pipe(
        PROMPTS,
        num_inference_steps=4,
        guidance_scale=3.0,
        latents=noise,
        height=32,
        width=32,
        negative_prompt=[""] * 2,
        output_type="latent",
        eta=0.0,
    ).images
    torch.testing.assert_close(traj.final, expected.float(), atol=1e-4, rtol=1e-4)


def test_stochastic_ddim_step_is_the_schedulers_step_with_its_log_density():
    pipe = tiny_shapes_sd()
    policy = policy_for(pipe)
    shape = policy.noise_shape(SampleSpec(32, 32))
    cond = policy.encode(PROMPTS, 1.0)
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(3))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(4))
    points = policy.sigmas(4)
    scheduler = pipe.scheduler
    scheduler.set_timesteps(4)
    for i in range(4):
        ours, mean, std, log_prob, _ = policy.step("ddim", x, points[i], points[i + 1], cond, 1.0, 1.0, noise=noise)
        eps = policy.velocity(x, points[i], cond, 1.0)
        theirs = scheduler.step(eps, int(scheduler.timesteps[i]), x, eta=1.0, variance_noise=noise).prev_sample
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        normal = torch.distributions.Normal(mean, std)
        torch.testing.assert_close(log_prob, normal.log_prob(ours).flatten(1).mean(1), atol=1e-5, rtol=1e-5)


def test_ddpo_ratio_is_one_on_policy_and_it_needs_ddim():
    policy = policy_for(tiny_shapes_sd())
    policy.add_lora(4, 8, policy.lora_targets)
    prompts = ["a red circle"] * 3 + ["a square"] * 3
    traj = rollout(
        policy,
        policy.encode(prompts, 2.0),
        sample_generators(range(6)),
        policy.noise_shape(SampleSpec(32, 32)),
        4,
        "ddim",
        1.0,
        2.0,
    )
    assert traj.stochastic.all() and torch.isfinite(traj.log_probs).all()
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.2, 0.9, 0.4])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    batch = RolloutBatch(traj, rewards, groups, list(range(6)), rewards, groups, torch.arange(6), prompts)
    algorithm = build_algorithm("ddpo", {}, SamplerSection(kind="ddim", noise_level=1.0))
    items, _ = algorithm.prepare(batch, policy)
    losses, diagnostics = algorithm.loss(policy, batch, items)
    # the rollout ran the UNet on 6 samples per step, the loss on all 24 (sample, step) rows at once: on one thread
    # the convolutions then reduce in another order, so the ratio is 1 to float32 rounding (2.4e-7 measured), not bit
    # for bit; a stale or misaligned log-density would be off by orders of magnitude more
    torch.testing.assert_close(diagnostics["ratio"], torch.ones_like(diagnostics["ratio"]), rtol=0, atol=1e-6)
    losses.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    with pytest.raises(ConfigError, match="ddim"):
        build_algorithm("ddpo", {}, SamplerSection(kind="flow"))
