"""Visuo-tactile pairs of the world: a material drawn per split, what a camera sees of it (colour and print that say
nothing of the material, plus the light its relief catches), its relative depth, and what the sensor feels; with
the faults real collections have (a tactile patch a few pixels off its image, near-duplicates, a few pairs whose
tactile image belongs to another material), each marked, so that curation has something to find.

Splits are by material combination (kind x pitch x direction): the eval split's combinations never occur in
training, so a model is judged on materials it has not seen together.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from flowrl.worlds.tactile.materials import KINDS, PATCH_MM, Material, height_field
from flowrl.worlds.tactile.sensor import Press, render, surface_normals

PITCHES = ((2.0, 4.0), (4.0, 8.0), (8.0, 12.0))  # coarse, medium, fine: periods across the patch
DIRECTIONS = (0.0, math.pi / 4, math.pi / 2, 3 * math.pi / 4)
EVAL_SHARE = 0.25  # of the kind x pitch x direction combinations
FAULTS = ("none", "misaligned", "duplicate", "mismatched")


def combination(material: Material) -> tuple[str, int, int]:
    """The material's (kind, pitch bucket, direction bucket): what the splits hold apart."""
    pitch = next((i for i, (lo, hi) in enumerate(PITCHES) if material.frequency < hi), len(PITCHES) - 1)
    direction = min(range(len(DIRECTIONS)), key=lambda i: _angle_gap(material.orientation, DIRECTIONS[i]))
    return material.kind, pitch, direction


def _angle_gap(a: float, b: float) -> float:
    """The gap between two texture directions (period pi)."""
    gap = (a - b) % math.pi
    return min(gap, math.pi - gap)


def split_of(material: Material) -> str:
    """ "eval" for a fixed quarter of the combinations (by a hash of the combination, so it never changes), else
    "train"."""
    key = "/".join(map(str, combination(material))).encode()
    return "eval" if zlib.crc32(key) % 1000 < EVAL_SHARE * 1000 else "train"


def draw_material(rng: np.random.Generator, split: str) -> Material:
    """A material of `split`: kind, pitch and direction uniform, then drawn again until its combination is in the
    split; amplitude 0.08-0.4 mm, roughness 0-1."""
    while True:
        kind = KINDS[rng.integers(len(KINDS))]
        lo, hi = PITCHES[rng.integers(len(PITCHES))]
        material = Material(
            kind,
            float(rng.uniform(lo, hi)),
            float(DIRECTIONS[rng.integers(len(DIRECTIONS))] + rng.uniform(-0.15, 0.15)),
            float(rng.uniform(0.08, 0.4)),
            float(rng.uniform(0.0, 1.0)),
        )
        if split_of(material) == split:
            return material


def appearance(heights: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """The camera's RGB image [3, H, W] in [0, 1]: a colour and a faint print drawn independently of the material (so
    neither tells it), lit by a low light from the upper left (a close-up under raking light, as texture is
    photographed) so that the relief shows as shading."""
    size = heights.shape[-1]
    colour = torch.tensor(rng.uniform(0.3, 0.8, size=3), dtype=torch.float32).view(3, 1, 1)
    second = (colour + torch.tensor(rng.uniform(-0.12, 0.12, size=3), dtype=torch.float32).view(3, 1, 1)).clamp(0, 1)
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    y, x = torch.meshgrid(coords, coords, indexing="ij")
    period, phase, angle = rng.uniform(0.15, 0.5), rng.uniform(0, 1), rng.uniform(0, math.pi)
    print_mask = torch.sin(2 * math.pi * ((x * math.cos(angle) + y * math.sin(angle)) / period + phase)) > 0.6
    base = torch.where(print_mask, second, colour)
    normals = surface_normals(heights, PATCH_MM)
    light = torch.tensor([-0.65, -0.65, 0.4])
    light = light / light.norm()
    lambert = torch.einsum("c,chw->hw", light, normals).clamp(0, 1)
    return (base * (0.2 + 0.8 * lambert / light[2])).clamp(0, 1)


def relative_depth(heights: torch.Tensor) -> torch.Tensor:
    """Relative depth [H, W] in [0, 1] as a monocular estimator reports it: 0 nearest the camera (the highest
    relief), 1 farthest; a flat patch is all 0.5."""
    span = heights.max() - heights.min()
    if span <= 0:
        return torch.full_like(heights, 0.5)
    return (heights.max() - heights) / span


@dataclass
class Pair:
    """One visuo-tactile pair: `rgb` [3, H, W], `tactile` [3, H, W] and `depth` [H, W] in [0, 1], the material,
    and the fault planted in it (FAULTS; "duplicate" pairs copy pair `source`); `meta`: the pair's seed, a
    misaligned pair's shift (pixels, rows and columns), a mismatched pair's felt material."""

    rgb: torch.Tensor
    tactile: torch.Tensor
    depth: torch.Tensor
    material: Material
    fault: str = "none"
    source: int | None = None
    meta: dict = field(default_factory=dict)

    @property
    def description(self) -> str:
        return self.material.description()

    @property
    def friction(self) -> float:
        return self.material.friction


def clean_pair(material: Material, size: int, seed: int, press: Press = Press()) -> Pair:
    """The faultless pair of a material: its heights drawn with `seed`, seen and felt at `size` pixels."""
    rng = np.random.default_rng(seed)
    heights = height_field(material, size, seed)
    tactile = render(heights, PATCH_MM, press, generator=torch.Generator().manual_seed(seed))
    return Pair(appearance(heights, rng), tactile, relative_depth(heights), material, meta={"seed": seed})


def make_pairs(
    count: int,
    size: int,
    seed: int,
    split: str = "train",
    misaligned: float = 0.05,
    duplicates: float = 0.05,
    mismatched: float = 0.03,
    press: Press = Press(),
) -> list[Pair]:
    """`count` pairs of `split`, with the given shares of faults planted (each marked in `Pair.fault`):
    misaligned (the tactile patch felt 2-4 pixels off the image's), duplicates (a copy of an earlier pair with
    faint noise) and mismatched (the tactile image of another material)."""
    rng = np.random.default_rng(seed)
    pairs: list[Pair] = []
    for index in range(count):
        draw = rng.uniform()
        pair_seed = int(rng.integers(2**31))
        if pairs and draw < duplicates:
            source = int(rng.integers(len(pairs)))
            original = pairs[source]
            generator = torch.Generator().manual_seed(pair_seed)
            faint = lambda t: (t + 0.004 * torch.randn(t.shape, generator=generator)).clamp(0, 1)  # noqa: E731
            pairs.append(
                replace(
                    original,
                    rgb=faint(original.rgb),
                    tactile=faint(original.tactile),
                    fault="duplicate",
                    source=source,
                    meta={},
                )
            )
            continue
        material = draw_material(rng, split)
        pair = clean_pair(material, size, pair_seed, press)
        if draw < duplicates + misaligned:
            shift = [int(rng.choice([-1, 1]) * rng.integers(2, 5)) for _ in range(2)]
            heights = torch.roll(height_field(material, size, pair_seed), shifts=shift, dims=(0, 1))
            tactile = render(heights, PATCH_MM, press, generator=torch.Generator().manual_seed(pair_seed))
            pair = replace(pair, tactile=tactile, fault="misaligned", meta={"seed": pair_seed, "shift": shift})
        elif draw < duplicates + misaligned + mismatched:
            other = draw_material(rng, split)
            pair = replace(
                pair,
                tactile=clean_pair(other, size, pair_seed + 1, press).tactile,
                fault="mismatched",
                meta={"seed": pair_seed, "felt": other},
            )
        pairs.append(pair)
    return pairs


SET_SEEDS = {"train": 0, "eval": 1}
SET_SIZES = {"train": 256, "eval": 64}
IMAGE_SIZE = 32


def world_pairs(name: str, count: int | None = None):
    """The clean pairs of set `name` (train or eval), fixed by the set's seed."""
    return make_pairs(count or SET_SIZES[name], IMAGE_SIZE, SET_SEEDS[name], name, 0.0, 0.0, 0.0)
