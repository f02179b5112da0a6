"""Conversions between the float samples policies decode and the uint8 images verifiers, files and JPEG see."""
from __future__ import annotations

import numpy as np
import torch


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] (or video [B, 3, F, H, W]) in [0, 1] -> uint8, channels last."""
    images = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return images.movedim(1, -1).cpu().numpy()


def to_unit(images: np.ndarray) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, H, W] in [0, 1] (what rewards take)."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255


def as_image_batch(image) -> torch.Tensor:
    """PIL image(s), uint8 arrays [H, W, 3] / [B, H, W, 3], or float tensors [3, H, W] / [B, 3, H, W] in [0, 1] ->
    float [B, 3, H, W] in [0, 1] (condition images)."""
    if isinstance(image, torch.Tensor):
        return image if image.ndim == 4 else image[None]
    if isinstance(image, np.ndarray) and image.ndim == 4:
        return to_unit(image)
    images = image if isinstance(image, list) else [image]
    return to_unit(np.stack([np.asarray(i.convert("RGB") if hasattr(i, "convert") else i) for i in images]))
