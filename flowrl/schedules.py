"""Schedules shared by training and the pretraining recipes: learning-rate decay, flow-matching noise levels."""

from __future__ import annotations

import math

import torch


def cosine_decay(step: int, total: int) -> float:
    """0.5 (1 + cos(pi step / total)): 1 at step 0, 0 at step `total`."""
    return 0.5 * (1 + math.cos(math.pi * step / total))


NOISE_LEVEL_SAMPLINGS = ("logit_normal", "uniform")


def sample_noise_levels(kind: str, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flow-matching noise levels t in (0, 1) for one batch: "logit_normal" (SD3's sigmoid of a standard normal,
    weighted to the middle of the path) or "uniform" (rectified flow's original)."""
    if kind == "logit_normal":
        return torch.sigmoid(torch.randn(batch, generator=generator))
    if kind == "uniform":
        return torch.rand(batch, generator=generator)
    raise ValueError(f"noise-level sampling must be one of {NOISE_LEVEL_SAMPLINGS}, got {kind!r}")
