"""Curating visuo-tactile pairs before training: near-duplicates, tactile images that sit off their camera image
(misaligned) or belong to another material (mismatched), and a diverse subset.

The checks take features from any encoder (`features` [N, D]: DINOv2 through timm for real data, pixels or a
trained encoder for the world) and, for alignment, a physics check: the tactile image the sensor model predicts
from the pair's relative depth (relief read as 1 - depth at an assumed amplitude) against the recorded one,
normalised cross-correlation over small shifts. A recorded image that agrees best at a shift is misaligned; one
that agrees nowhere is mismatched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flowrl.worlds.tactile.materials import PATCH_MM
from flowrl.worlds.tactile.sensor import BACKGROUND, Press, render

ASSUMED_AMPLITUDE = 0.25  # mm: the relief relative depth is read as (relative depth has no scale)
AGREEMENT_FLOOR = 0.45  # below this best correlation a pair is mismatched; the world's clean pairs' 10th percentile
# is about 0.5, mismatched ones' 90th about 0.48 (seed 7, 200 pairs)
DUPLICATE_SIMILARITY = 0.999  # cosine similarity of features above which a later pair repeats an earlier one


@dataclass
class CurationReport:
    """The pairs kept (indices, in order) and those removed, by reason."""

    kept: list[int]
    removed: dict[str, list[int]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {reason: len(rows) for reason, rows in self.removed.items()}


def _centred(image: torch.Tensor) -> torch.Tensor:
    return image - image.mean()


def predicted_change(depth: torch.Tensor, press: Press = Press()) -> torch.Tensor:
    """The change from the untouched gel [..., 3, H, W] the sensor model predicts from relative depth [..., H, W]
    (relief read as 1 - depth at ASSUMED_AMPLITUDE)."""
    background = torch.tensor(BACKGROUND, device=depth.device).view(3, 1, 1)
    return render((1 - depth) * ASSUMED_AMPLITUDE, PATCH_MM, press) - background


def physics_agreement(
    rgb_depth: torch.Tensor, tactile: torch.Tensor, max_shift: int = 4, press: Press = Press()
) -> tuple[float, tuple[int, int]]:
    """(best normalised cross-correlation, the shift in pixels (rows, columns) where it peaks) between the tactile
    change image (against the untouched gel) and the one predicted from relative depth [H, W]."""
    predicted = _centred(predicted_change(rgb_depth, press))
    observed = _centred(tactile - torch.tensor(BACKGROUND).view(3, 1, 1))
    scale = observed.std() * observed.numel()
    best, where = -2.0, (0, 0)
    for dy in range(-max_shift, max_shift + 1):
        for dx in range(-max_shift, max_shift + 1):
            shifted = _centred(torch.roll(predicted, (dy, dx), dims=(-2, -1)))
            value = (observed * shifted).sum() / (scale * shifted.std() + 1e-8)
            if value.item() > best:
                best, where = value.item(), (dy, dx)
    return best, where


def near_duplicates(features: torch.Tensor, threshold: float = DUPLICATE_SIMILARITY) -> list[int]:
    """Indices of pairs whose features repeat an earlier kept pair's (cosine similarity >= threshold)."""
    unit = torch.nn.functional.normalize(features.float().flatten(1), dim=1)
    kept = torch.zeros(len(unit), dtype=torch.bool)
    kept[0] = True
    dropped: list[int] = []
    for i in range(1, len(unit)):
        if (unit[:i][kept[:i]] @ unit[i]).max() >= threshold:
            dropped.append(i)
        else:
            kept[i] = True
    return dropped


def k_center(features: torch.Tensor, k: int, first: int = 0) -> list[int]:
    """A diverse subset of k rows by greedy farthest-point selection (a 2-approximation of the k-center problem),
    starting from row `first`."""
    points = features.float().flatten(1)
    chosen = [first]
    distance = (points - points[first]).norm(dim=1)
    while len(chosen) < min(k, len(points)):
        nxt = int(distance.argmax())
        chosen.append(nxt)
        distance = torch.minimum(distance, (points - points[nxt]).norm(dim=1))
    return chosen


def curate(pairs, features: torch.Tensor, floor: float = AGREEMENT_FLOOR, keep: int | None = None) -> CurationReport:
    """Drop near-duplicates, misaligned pairs (physics agreement peaking away from no shift) and mismatched ones
    (agreement below `floor`), then keep a diverse `keep` of the rest (k-center on `features`; all when None)."""
    removed = {"duplicate": near_duplicates(features)}
    removed["mismatched"], removed["misaligned"] = [], []
    gone = set(removed["duplicate"])
    for index, pair in enumerate(pairs):
        if index in gone:
            continue
        value, shift = physics_agreement(pair.depth, pair.tactile)
        if value < floor:
            removed["mismatched"].append(index)
        elif shift != (0, 0):
            removed["misaligned"].append(index)
    gone |= set(removed["mismatched"]) | set(removed["misaligned"])
    rest = [i for i in range(len(pairs)) if i not in gone]
    if keep is not None and keep < len(rest):
        picked = k_center(features[rest], keep)
        removed["redundant"] = sorted(set(rest) - {rest[i] for i in picked})
        rest = sorted(rest[i] for i in picked)
    return CurationReport(rest, removed)
