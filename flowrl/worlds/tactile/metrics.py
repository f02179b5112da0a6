"""How close a generated tactile image is to the one the sensor records: SSIM (kornia's, 7-pixel Gaussian window) per
image, and the generator's mean SSIM on a set of pairs under a choice of description."""

from __future__ import annotations

import numpy as np
import torch

SSIM_WINDOW = 7  # pixels: the patch is 32 px, so the 11-px default would see a third of it at once


def ssim(generated: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """[B] SSIM of images [B, 3, H, W] in [0, 1] (1: identical)."""
    from kornia.metrics import ssim as kornia_ssim

    return kornia_ssim(generated.float(), truth.float(), SSIM_WINDOW).mean(dim=(1, 2, 3))


def to_uint8(image: torch.Tensor) -> np.ndarray:
    """[3, H, W] in [0, 1] -> uint8 [H, W, 3]."""
    return (image.clamp(0, 1).permute(1, 2, 0) * 255).round().byte().numpy()


@torch.no_grad()
def generator_ssim(
    pipe, pairs, texts: list[str], steps: int = 20, guidance: float = 3.0, seed: int = 0, batch: int = 16
) -> dict:
    """Mean SSIM (and its standard error over pairs) of the generator's tactile images against the pairs' true
    ones, each drawn from its pair's camera image and depth with `texts[i]` as the description ("" for none) and
    its own noise (seed + i), in batches of `batch`."""
    pipe.set_progress_bar_config(disable=True)
    scores = []
    for start in range(0, len(pairs), batch):
        chunk = pairs[start : start + batch]
        images = pipe(
            list(texts[start : start + batch]),
            image=[torch.stack([p.rgb for p in chunk]), torch.stack([p.depth.expand(3, -1, -1) for p in chunk])],
            height=chunk[0].rgb.shape[-2],
            width=chunk[0].rgb.shape[-1],
            num_inference_steps=steps,
            guidance_scale=guidance,
            output_type="pt",
            generator=[torch.Generator().manual_seed(seed + start + i) for i in range(len(chunk))],
        ).images
        scores.extend(ssim(images, torch.stack([p.tactile for p in chunk])).tolist())
    values = np.array(scores)
    return {"ssim": float(values.mean()), "stderr": float(values.std(ddof=1) / np.sqrt(len(values))), "n": len(values)}
