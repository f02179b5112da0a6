"""The shapes-editing world's rule-based auditor for the `edit_rubric` reward: the edit verifier's pieces, one
criterion each."""

from __future__ import annotations

import numpy as np

from flowrl.rewards.rubric import AUDITORS, Criterion
from flowrl.worlds.shapes.verifier import detect
from flowrl.worlds.shapes.world import render, world_sized
from flowrl.worlds.shapes_edit.task import item_scene
from flowrl.worlds.shapes_edit.verifier import _found, changed_pixels, edit_region, edited_objects, judge_edit

QUADRANTS = {"top left": (0, 0), "top right": (0, 1), "bottom left": (1, 0), "bottom right": (1, 1)}
QUADRANT_CHANGE = 0.02  # share of a quadrant's outside-the-edit pixels that must change to list it


class ShapesEditAuditor:
    """The rule-based judge of the shapes-editing world (the edit verifier's pieces, one criterion each)."""

    def scene(self, item):

        return item_scene(item)

    def requested(self, item) -> Criterion:
        spec, source, target = self.scene(item)
        return Criterion(f"requested: {item.prompt}", lambda image: judge_edit(image, spec, source, target).requested)

    def criteria(self, item) -> list[Criterion]:
        """Every unintended-change criterion the world can check for this item."""
        spec, source, target = self.scene(item)
        after = edited_objects(spec, source, target)[1]
        out = [
            Criterion(f"kept: {o.color} {o.shape}", lambda image, o=o: _found(detect(image), o))
            for o in target
            if o not in after
        ]
        out.append(Criterion("no extra objects", lambda image: len(detect(image)) <= len(target)))
        source_image = render(source)
        size = source_image.shape[0]
        fixed = None if spec.kind == "add" else ~edit_region(spec, source, target, size)  # an add's is the image's
        half = size // 2
        for name, (row, col) in QUADRANTS.items():
            quadrant = np.zeros((size, size), dtype=bool)
            quadrant[row * half : (row + 1) * half, col * half : (col + 1) * half] = True

            def unchanged(image, quadrant=quadrant):  # in the world's pixels, as the source is rendered
                image = world_sized(image)
                outside = fixed if fixed is not None else ~edit_region(spec, source, target, size, image)
                mask = quadrant & outside
                return not mask.any() or changed_pixels(image, source_image)[mask].mean() <= QUADRANT_CHANGE

            out.append(Criterion(f"unchanged: {name}", unchanged))
        return out

    def audit(self, image: np.ndarray, item) -> list[Criterion]:
        """The unintended changes this candidate shows (the criteria it fails)."""
        return [c for c in self.criteria(item) if not c.check(image)]

    def verify(self, criterion: Criterion, item) -> bool:
        """A listed issue is kept only when the exact target edit satisfies it."""

        return bool(criterion.check(render(self.scene(item)[2])))


@AUDITORS.register("shapes_edit")
def shapes_edit_auditor(judge: dict | None = None) -> ShapesEditAuditor:
    if judge is not None:
        from flowrl.errors import ConfigError

        raise ConfigError("reward edit_rubric: params.judge is for the `vlm` auditor, not the shapes_edit rules")
    return ShapesEditAuditor()
