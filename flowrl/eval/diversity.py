"""Distances between samples: how far a tuned model moved from its base, and how varied its samples are.

Pixel distances are root-mean-square differences of images in [0, 1] (so 0 = identical, ~0.5 = unrelated).
"""
from __future__ import annotations

import numpy as np


def _unit(images: np.ndarray) -> np.ndarray:
    return images.astype(np.float64) / 255.0 if images.dtype == np.uint8 else images.astype(np.float64)


def paired_pixel_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over pairs of the RMS pixel difference between a[i] and b[i] (e.g. same-seed base and tuned samples)."""
    a, b = _unit(a), _unit(b)
    return float(np.sqrt(((a - b) ** 2).reshape(len(a), -1).mean(1)).mean())


def within_prompt_pixel_distance(images: np.ndarray, num_per_prompt: int) -> float:
    """Mean RMS pixel difference over all pairs of samples of the same prompt (images grouped consecutively)."""
    x = _unit(images).reshape(-1, num_per_prompt, images[0].size)
    total, count = 0.0, 0
    for i in range(num_per_prompt):
        for j in range(i + 1, num_per_prompt):
            total += np.sqrt(((x[:, i] - x[:, j]) ** 2).mean(1)).sum()
            count += len(x)
    return float(total / max(count, 1))
