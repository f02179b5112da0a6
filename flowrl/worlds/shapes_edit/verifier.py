"""The edit verifier: did the edit make the requested change, and nothing else? Judged on the edited image against
the exact source and target scenes, with the image world's detector.

- requested: the edited object is where the target scene has it (its shape and colour detected within
  `NEAR` px of the target's pixel centroid); for remove, no detection of it near where it was; for add, a detection
  of the new colour and shape anywhere in the instruction's relation to the referenced object, as the image
  world's verifier reads a relation (the instruction names neither the new object's place nor its size, so the
  place the scene generator drew for the target is one of many right answers, not the answer).
- preserved: every other object of the target scene is detected (shape and colour) within `NEAR` px of its place,
  and nothing more is detected than the target holds.
- success = requested and preserved; dense = 0.5 requested + 0.5 x the share of the other objects kept (minus a
  share per extra detection), for RL.
- off-target change: the share of pixels outside the edited region (the edited object's source and target masks,
  grown by 1 px; for an add that was made, the added object's detected pixels instead of the target's box) whose
  colour moved by more than `CHANGE` (max over channels) from the source: what the minimal-change principle says
  should stay 0.
- fidelity: how much of the image matches the exact target render: 1 - (pixels off the target's colour by more
  than `CHANGE`) / (pixels that are foreground in the target or in the edit); 1 for the exact target, 0 for an
  empty image. A graded reward signal (`shapes_edit`'s `fidelity_weight`): two failed edits that the binary checks
  score alike differ in how close they came. For add it compares with the generator's placement (one right
  answer of many), so it marks down an add made elsewhere.
- EditScore's analogues (its scores are 0-10; Overall = sqrt(SC x PQ)): semantic consistency SC = 10 x dense (the
  instruction followed, nothing else touched) and perceptual quality PQ = 10 x the share of clean pixels (within
  `CHANGE` of the background or a palette colour: renders are flat colours, so blur, smears and mixed colours are
  what a quality judge would mark down).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from flowrl.worlds.shapes.verifier import Detection, detect, detected_mask, relation_holds
from flowrl.worlds.shapes.world import PALETTE, ShapeObject, render, world_sized
from flowrl.worlds.shapes_edit.instructions import EditSpec

NEAR = 3.0
CHANGE = 40


@dataclass
class EditJudgement:
    requested: bool
    preserved: bool
    dense: float
    off_target: float
    quality: float  # share of clean pixels
    fidelity: float = 0.0  # share of the foreground union matching the exact target render

    @property
    def success(self) -> bool:
        return self.requested and self.preserved

    @property
    def sc(self) -> float:
        return 10 * self.dense

    @property
    def pq(self) -> float:
        return 10 * self.quality

    @property
    def editscore(self) -> float:
        return float(np.sqrt(self.sc * self.pq))


def pixel_centroid(obj: ShapeObject) -> tuple[float, float]:
    """(x, y) mean of the object's rendered pixels, where the detector puts it (a triangle's sits ~1-2 px below its
    box centre)."""
    ys, xs = np.nonzero(obj.mask())
    return float(xs.mean()), float(ys.mean())


def _found(objects: list[Detection], obj: ShapeObject) -> bool:
    cx, cy = pixel_centroid(obj)
    return any(
        d.shape == obj.shape and d.color == obj.color and np.hypot(d.cx - cx, d.cy - cy) <= NEAR for d in objects
    )


def edited_objects(spec: EditSpec, source: list[ShapeObject], target: list[ShapeObject]) -> tuple[list, list]:
    """(the edited object in the source, in the target): None where it does not exist (add; remove)."""
    key = (spec.color, spec.shape)
    before = [o for o in source if (o.color, o.shape) == key]
    if spec.kind == "add":
        return [], [target[-1]]
    if spec.kind == "remove":
        return before, []
    after = [t for s, t in zip(source, target) if (s.color, s.shape) == key]
    return before, after


def added_object(found: list[Detection], spec: EditSpec, source: list[ShapeObject]) -> Detection | None:
    """For an add: a detection of the new colour and shape in the instruction's relation to the referenced object
    (the image world's relation rule, against the referenced object's place in the source); None otherwise."""
    ref = next(o for o in source if (o.color, o.shape) == (spec.color, spec.shape))
    anchor = Detection(ref.shape, ref.color, *pixel_centroid(ref), 0)
    return next(
        (
            d
            for d in found
            if d.shape == spec.new_shape and d.color == spec.new_color and relation_holds(d, anchor, spec.relation)
        ),
        None,
    )


def edit_region(
    spec: EditSpec,
    source: list[ShapeObject],
    target: list[ShapeObject],
    size: int,
    edited: np.ndarray | None = None,
    found: list[Detection] | None = None,
) -> np.ndarray:
    """Where the edit may change pixels: the edited object's source and target masks, grown by 1 px. For an add
    judged on `edited` (uint8 at the world's size; `found`: its detections, when the caller has them) that made it,
    the added object's detected pixels stand for the target's box: the editor chose its place."""
    before, after = edited_objects(spec, source, target)
    region = np.zeros((size, size), dtype=bool)
    added = None
    if spec.kind == "add" and edited is not None:
        added = added_object(detect(edited) if found is None else found, spec, source)
    if added is not None:
        region |= detected_mask(edited, added)
        after = []
    for obj in before + after:
        region |= obj.mask(size)
    return ndimage.binary_dilation(region, iterations=1)


def changed_pixels(edited: np.ndarray, source_image: np.ndarray) -> np.ndarray:
    """[H, W] bool: pixels whose colour moved by more than CHANGE (max over channels) from the source."""
    return np.abs(edited.astype(np.int16) - source_image.astype(np.int16)).max(-1) > CHANGE


CLEAN_COLOURS = np.array([(0, 0, 0), *PALETTE.values()], dtype=np.int16)


def clean_share(image: np.ndarray) -> float:
    """The share of pixels within CHANGE (max over channels) of the background or a palette colour."""
    distance = np.abs(image.astype(np.int16)[..., None, :] - CLEAN_COLOURS).max(-1).min(-1)
    return float((distance <= CHANGE).mean())


def fidelity(edited: np.ndarray, target_image: np.ndarray) -> float:
    """1 - mismatched pixels / foreground union (target's or edit's): agreement with the exact target render."""
    mismatch = changed_pixels(edited, target_image)
    foreground = (target_image.max(-1) > CHANGE) | (edited.max(-1) > CHANGE)
    return float(1.0 - (mismatch & foreground).sum() / max(1, foreground.sum()))


def judge_edit(
    edited: np.ndarray, spec: EditSpec, source: list[ShapeObject], target: list[ShapeObject]
) -> EditJudgement:
    """Judge an edited uint8 image [H, W, 3] of `source` under `spec` (target = the exact target scene), at the
    world's size (`world_sized`)."""
    edited = world_sized(edited)
    found = detect(edited)
    before, after = edited_objects(spec, source, target)
    if spec.kind == "remove":
        requested = not any(_found(found, o) for o in before)
    elif spec.kind == "add":
        requested = added_object(found, spec, source) is not None
    else:
        requested = all(_found(found, o) for o in after)
    others = [o for o in target if o not in after]
    kept = [_found(found, o) for o in others]
    extra = max(0, len(found) - len(target))
    preserved = all(kept) and extra == 0
    share = (sum(kept) / len(kept)) if kept else 1.0
    dense = 0.5 * float(requested) + 0.5 * max(0.0, share - extra / max(1, len(target)))
    outside = ~edit_region(spec, source, target, edited.shape[0], edited, found)
    off_target = float(changed_pixels(edited, render(source))[outside].mean()) if outside.any() else 0.0
    return EditJudgement(
        requested, preserved, dense, off_target, clean_share(edited), fidelity(edited, render(target, edited.shape[0]))
    )
