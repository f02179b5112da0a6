"""Procedural materials as height fields: five kinds of texture with frequency, orientation, amplitude and roughness,
a friction coefficient derived from them, and the structured description a model should write for each.

Heights are in millimetres over a square patch `PATCH_MM` wide; a field of `size` pixels samples it on a regular
grid, so the same material looks alike at every resolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

KINDS = ("ridged", "woven", "bumpy", "grained", "smooth")
PATCH_MM = 8.0  # the sensed patch's width (a DIGIT's gel is about 16 x 20 mm; its contact patch smaller)


@dataclass(frozen=True)
class Material:
    """One material: `kind` (KINDS), `frequency` (texture periods across the patch, 2-12), `orientation`
    (radians, the direction the texture runs), `amplitude` (texture height in mm, 0.05-0.5) and `roughness` (the
    share of fine random relief, 0-1)."""

    kind: str
    frequency: float
    orientation: float
    amplitude: float
    roughness: float

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")

    @property
    def friction(self) -> float:
        """The friction coefficient the world assigns: rises with roughness and with the texture's mean slope
        (amplitude x frequency / patch width, in mm per mm), from 0.15 for a flat smooth surface, clipped to 1.2."""
        slope = 0.0 if self.kind == "smooth" else self.amplitude * self.frequency / PATCH_MM
        return min(1.2, 0.15 + 0.45 * self.roughness + 0.9 * slope)

    def description(self) -> str:
        """The true structured description: kind, pitch, direction, feel and friction, in words."""
        pitch = "fine pitch" if self.frequency >= 8 else "medium pitch" if self.frequency >= 4 else "coarse pitch"
        degrees = math.degrees(self.orientation) % 180
        direction = (
            "horizontal"
            if degrees < 22.5 or degrees >= 157.5
            else "diagonal"
            if degrees < 67.5 or degrees >= 112.5
            else "vertical"
        )
        feel = "rough" if self.roughness >= 0.5 else "soft"
        friction = "high friction" if self.friction >= 0.6 else "low friction"
        parts = [self.kind] + ([] if self.kind == "smooth" else [pitch, direction]) + [feel, friction]
        return ", ".join(parts)


def _grid(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel centres in patch units [0, 1): (x, y), each [size, size], y down the rows."""
    coords = (torch.arange(size, dtype=torch.float64) + 0.5) / size
    y, x = torch.meshgrid(coords, coords, indexing="ij")
    return x, y


def _smooth_noise(size: int, cells: int, generator: torch.Generator) -> torch.Tensor:
    """Value noise in [-1, 1]: a cells x cells random lattice, bicubically upsampled to size x size."""
    lattice = torch.rand(1, 1, cells + 1, cells + 1, generator=generator, dtype=torch.float64) * 2 - 1
    return torch.nn.functional.interpolate(lattice, size=(size, size), mode="bicubic", align_corners=True)[0, 0]


def height_field(material: Material, size: int, seed: int = 0) -> torch.Tensor:
    """The material's surface heights in mm, [size, size] float32, from 0 up to its amplitude (the fine roughness
    included); `seed` draws the random parts (bump jitter, grain, roughness)."""
    generator = torch.Generator().manual_seed(seed)
    x, y = _grid(size)
    c, s = math.cos(material.orientation), math.sin(material.orientation)
    u, v = x * c + y * s, -x * s + y * c  # along and across the texture's direction
    f, kind = material.frequency, material.kind
    if kind == "ridged":
        base = torch.sin(math.pi * f * u).abs() ** 0.5  # rounded ridges, f of them across the patch
    elif kind == "woven":
        base = 0.5 + 0.5 * torch.sin(2 * math.pi * f * u) * torch.sin(2 * math.pi * f * v)
    elif kind == "bumpy":
        cells = max(2, round(f))
        jitter = (torch.rand(2, cells + 2, cells + 2, generator=generator, dtype=torch.float64) - 0.5) * 0.5
        base = torch.zeros_like(x)
        radius = 0.3 / cells
        for i in range(-1, cells + 1):
            for j in range(-1, cells + 1):
                cu, cv = (i + 0.5 + jitter[0, i + 1, j + 1]) / cells, (j + 0.5 + jitter[1, i + 1, j + 1]) / cells
                base = torch.maximum(base, torch.exp(-((u - cu) ** 2 + (v - cv) ** 2) / (2 * radius**2)))
    elif kind == "grained":
        wobble = _smooth_noise(size, 4, generator)
        base = 0.5 + 0.5 * torch.cos(2 * math.pi * f * v + 3.0 * wobble)
    else:  # smooth
        base = torch.zeros_like(x)
    fine = _smooth_noise(size, max(4, size // 3), generator) * 0.5 + 0.5
    heights = (1 - material.roughness) * base + material.roughness * fine if kind != "smooth" else fine
    heights = heights - heights.min()
    peak = heights.max()
    scale = material.amplitude if kind != "smooth" else material.amplitude * material.roughness * 0.2
    return (heights / peak * scale if peak > 0 else heights).float()
