"""The tactile rewards on the world's own pairs: the sensor's image scores SSIM 1 and agrees with its depth; another
material's image, or noise, scores lower; the physics reward has gradients."""

import torch

from flowrl.rewards import build_reward
from flowrl.tasks.base import build_task


def test_truth_scores_highest_and_the_physics_reward_is_differentiable():
    from flowrl.worlds.tactile.scenes import world_pairs

    items = build_task("tactile").condition_set("eval").items[:8]
    pairs = world_pairs("eval", 8)
    truth = torch.stack([p.tactile for p in pairs])
    shuffled = truth.roll(1, dims=0)  # each condition given another material's image
    meta = {"conditions": items}
    prompts = [i.prompt for i in items]
    ssim = build_reward("tactile_ssim")
    assert torch.allclose(ssim(truth, prompts, meta).scores, torch.ones(8), atol=1e-5)
    assert (ssim(shuffled, prompts, meta).scores < 0.9).all()
    physics = build_reward("tactile_physics")
    true_agreement = physics(truth, prompts, meta).scores
    assert true_agreement.mean() > physics(shuffled, prompts, meta).scores.mean() + 0.2
    samples = truth.clone().requires_grad_(True)
    physics(samples, prompts, meta).scores.sum().backward()
    assert samples.grad.abs().sum() > 0
