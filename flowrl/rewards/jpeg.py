"""JPEG (in)compressibility (DDPO, arXiv 2305.13301): minus / plus the encoded size in kilobytes at quality 95."""

from __future__ import annotations

import io

import torch
from PIL import Image

from flowrl.images import to_uint8
from flowrl.rewards.base import Reward, RewardOutput, register_reward


def jpeg_kilobytes(samples: torch.Tensor, quality: int = 95) -> torch.Tensor:
    sizes = []
    for image in to_uint8(samples):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000.0)
    return torch.tensor(sizes)


@register_reward("jpeg_compressibility")
class JpegCompressibility(Reward):
    name = "jpeg_compressibility"

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        return RewardOutput(-jpeg_kilobytes(samples))


@register_reward("jpeg_incompressibility")
class JpegIncompressibility(Reward):
    name = "jpeg_incompressibility"

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        return RewardOutput(jpeg_kilobytes(samples))
