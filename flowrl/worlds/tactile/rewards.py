"""Rewards for generated tactile images ([B, 3, H, W] in [0, 1]), read against the world's pairs:

- `tactile_ssim`: SSIM against the image the sensor records of the condition's material (a verifier reward: it
  re-renders the world's truth from the condition's material and pair seed).
- `tactile_physics`: physics consistency, needing no truth: the normalised correlation, in the contact region,
  between the generated image's change from the untouched gel and the one the sensor model predicts from the
  condition's relative depth (1 = the shading the depth implies, 0 = unrelated). Differentiable in the samples.
"""

from __future__ import annotations

import torch

from flowrl.rewards.base import REWARDS, Reward, RewardOutput, condition_items
from flowrl.worlds.tactile.curation import ASSUMED_AMPLITUDE, predicted_change
from flowrl.worlds.tactile.materials import PATCH_MM, Material
from flowrl.worlds.tactile.metrics import ssim
from flowrl.worlds.tactile.scenes import clean_pair
from flowrl.worlds.tactile.sensor import BACKGROUND, Press, indentation


def _truths(items, size: int) -> torch.Tensor:
    return torch.stack([clean_pair(Material(**i.meta["material"]), size, i.meta["pair_seed"]).tactile for i in items])


@REWARDS.register("tactile_ssim")
class TactileSSIM(Reward):
    name = "tactile_ssim"

    def __call__(self, samples, prompts, meta=None):
        items = condition_items(prompts, meta)
        truth = _truths(items, samples.shape[-1]).to(samples.device)
        return RewardOutput(ssim(samples.float().clamp(0, 1), truth))


def depth_of(item) -> torch.Tensor:
    """The condition's relative depth [H, W] in [0, 1] from its uint8 depth input (3 equal channels)."""
    return torch.as_tensor(item.inputs["depth"][..., 0], dtype=torch.float32) / 255


@REWARDS.register("tactile_physics")
class TactilePhysics(Reward):
    name = "tactile_physics"
    differentiable = True

    def __call__(self, samples, prompts, meta=None):
        items = condition_items(prompts, meta)
        background = torch.tensor(BACKGROUND, device=samples.device).view(1, 3, 1, 1)
        depth = torch.stack([depth_of(i) for i in items]).to(samples.device)
        predicted = predicted_change(depth)
        touched = indentation((1 - depth) * ASSUMED_AMPLITUDE, PATCH_MM, Press())
        contact = (touched > 1e-4).float()[:, None]  # where the gel touches
        observed = samples.float() - background

        def centred(x):
            weight = contact.expand_as(x)
            mean = (x * weight).sum((1, 2, 3), keepdim=True) / weight.sum((1, 2, 3), keepdim=True).clamp(min=1)
            return (x - mean) * weight

        a, b = centred(observed), centred(predicted)
        value = (a * b).sum((1, 2, 3)) / (a.flatten(1).norm(dim=1) * b.flatten(1).norm(dim=1) + 1e-8)
        return RewardOutput(value)
