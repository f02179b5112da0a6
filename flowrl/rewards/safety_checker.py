"""A real NSFW image classifier as label source and reward: diffusers' StableDiffusionSafetyChecker loaded from a
local folder (e.g. a copy of CompVis/stable-diffusion-safety-checker; nothing is downloaded).

The checker embeds the image with a CLIP vision tower and compares it (cosine) with 17 concept and 3
special-care embeddings, each with its own threshold; an image is flagged when any concept's cosine exceeds its
threshold, with thresholds lowered by 0.01 once a special-care concept fires. `margins` is that decision as one
number per image (the largest cosine - threshold), so margin > 0 exactly when the checker flags the image.
"""

from __future__ import annotations

import torch

from flowrl.rewards.base import Reward, RewardOutput, register_reward
from flowrl.rewards.clip import clip_pixels, image_statistics, require_local_folder

HOW_TO_GET = (
    "expected a local folder with the StableDiffusionSafetyChecker config.json and weights "
    "(e.g. a downloaded copy of CompVis/stable-diffusion-safety-checker)"
)
SPECIAL_CARE_ADJUSTMENT = 0.01


class SafetyChecker:
    def __init__(self, path):
        from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker

        folder = require_local_folder(path, "safety_checker", HOW_TO_GET)
        if not (folder / "config.json").is_file():
            from flowrl.errors import UserError

            raise UserError(f"safety checker folder {folder} has no config.json; {HOW_TO_GET}")
        self.model = StableDiffusionSafetyChecker.from_pretrained(folder, local_files_only=True).eval()
        self.mean, self.std = image_statistics(folder)
        self.size = self.model.config.vision_config.image_size

    @torch.no_grad()
    def margins(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] -> [B] largest (cosine - threshold) over the concepts."""
        m = self.model
        weight = next(m.parameters())  # on the device Reward.to put the checker on
        pixels = clip_pixels(images.to(weight.device), self.size, self.mean, self.std).to(weight.dtype)
        embeds = torch.nn.functional.normalize(m.visual_projection(m.vision_model(pixels)[1]).float(), dim=-1)
        special = embeds @ torch.nn.functional.normalize(m.special_care_embeds.float(), dim=-1).T
        concepts = embeds @ torch.nn.functional.normalize(m.concept_embeds.float(), dim=-1).T
        special_care = (special - m.special_care_embeds_weights.float() > 0).any(dim=1, keepdim=True)
        adjusted = concepts - m.concept_embeds_weights.float() + SPECIAL_CARE_ADJUSTMENT * special_care
        return adjusted.max(dim=1).values

    def is_unsafe(self, images: torch.Tensor) -> torch.Tensor:
        return self.margins(images) > 0


@register_reward("safety_checker")
class SafetyCheckerReward(Reward):
    """1 for images the checker passes, 0 for flagged ones; the margin is kept in info for plots."""

    name = "safety_checker"

    def __init__(self, path: str | None = None):
        self.checker = SafetyChecker(path)

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        margins = self.checker.margins(samples)
        return RewardOutput((margins <= 0).float(), {"unsafe_margin": margins})
