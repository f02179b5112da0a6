"""How close a generated tactile image is to the one the sensor records: SSIM (kornia's, 7-pixel Gaussian window) per
image, and the generator's mean SSIM (and learned similarity) on a set of pairs under a choice of description and
depth."""

from __future__ import annotations

import numpy as np
import torch

SSIM_WINDOW = 7  # pixels: the patch is 32 px, so the 11-px default would see a third of it at once


def ssim(generated: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """[B] SSIM of images [B, 3, H, W] in [0, 1] (1: identical)."""
    from kornia.metrics import ssim as kornia_ssim

    return kornia_ssim(generated.float(), truth.float(), SSIM_WINDOW).mean(dim=(1, 2, 3))


def mean_and_stderr(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values)))


@torch.no_grad()
def draw_tactile(
    pipe,
    pairs,
    texts: list[str],
    depth: torch.Tensor | None = None,
    depth_scale: float = 1.0,
    steps: int = 20,
    guidance: float = 3.0,
    seed: int = 0,
    batch: int = 16,
) -> torch.Tensor:
    """The generator's tactile images [N, 3, H, W] for `pairs`: each drawn from its pair's camera image and relative
    depth (the pair's own, or row i of `depth` [N, H, W], e.g. a depth network's estimate; its ControlNet weighed
    `depth_scale`, 0 for none) with `texts[i]` as the description ("" for none) and its own noise (seed + i), in
    batches of `batch`."""
    pipe.set_progress_bar_config(disable=True)
    out = []
    for start in range(0, len(pairs), batch):
        chunk = pairs[start : start + batch]
        depths = torch.stack([p.depth for p in chunk]) if depth is None else depth[start : start + len(chunk)]
        out.append(
            pipe(
                list(texts[start : start + batch]),
                image=[torch.stack([p.rgb for p in chunk]), depths[:, None].expand(-1, 3, -1, -1)],
                height=chunk[0].rgb.shape[-2],
                width=chunk[0].rgb.shape[-1],
                num_inference_steps=steps,
                guidance_scale=guidance,
                controlnet_conditioning_scale=[1.0, depth_scale],
                output_type="pt",
                generator=[torch.Generator().manual_seed(seed + start + i) for i in range(len(chunk))],
            ).images
        )
    return torch.cat(out)


def generator_scores(pipe, pairs, texts: list[str], encoder=None, **drawing) -> dict:
    """Mean SSIM (and, given the tactile `encoder`, the learned similarity), each with its standard error over
    pairs, of the generator's tactile images (`draw_tactile` with `drawing`'s settings) against the pairs' true
    ones."""
    from flowrl.worlds.tactile.encoders import learned_similarity

    images = draw_tactile(pipe, pairs, texts, **drawing)
    truth = torch.stack([p.tactile for p in pairs])
    result = dict(zip(("ssim", "ssim_stderr"), mean_and_stderr(ssim(images, truth).tolist())), n=len(pairs))
    if encoder is not None:
        learned = learned_similarity(encoder, images, truth).tolist()
        result.update(zip(("learned", "learned_stderr"), mean_and_stderr(learned)))
    return result
