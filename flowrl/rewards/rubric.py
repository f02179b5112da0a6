"""ARRO-style group rubric reward for editing (methods.md section 6, the reading given there; no public code).

An auditor lists, per candidate edit, the checkable issues it finds: the requested change not made is always a
criterion; unintended changes are "kept: <object>" (a bystander lost, moved or recoloured), "no extra objects" and
"unchanged: <quadrant>" (pixels outside the edited region changed there). The group rubric merges the issues of
every candidate of a group (a group = the samples of one condition item in a reward call), keeps only verified ones
(criteria the exact target edit satisfies: a judge's spurious claim is dropped), and scores every candidate against
the same rubric: R_i = sum_k w_k s_ik, s_ik in {0, 1}, the requested change weighted `requested_weight` and the rest
sharing 1 - requested_weight equally (all of it to the requested change when nothing else is listed). The rubric is
built once per group. `mode: sample` scores each candidate against its own verified issues only (the per-sample
audit the issue compares against). The auditor is rule-based on the shapes-editing world, or a VLM
(`params.judge`: a local folder or an OpenAI-compatible endpoint, flowrl/rewards/rubric_vlm.py) with the same
`audit` / `requested` / `verify` methods and, optionally, one audit pass per group. A group's rubric sees the
samples of the group that are in one call: a run refuses training cuts that would split a group
(Trainer.check_whole_groups); evaluations keep a condition's samples in one call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..errors import ConfigError
from ..images import to_uint8
from .base import Reward, RewardOutput, condition_items, register_reward

QUADRANTS = {"top left": (0, 0), "top right": (0, 1), "bottom left": (1, 0), "bottom right": (1, 1)}
QUADRANT_CHANGE = 0.02  # share of a quadrant's outside-the-edit pixels that must change to list it


@dataclass(frozen=True)
class Criterion:
    name: str  # what is checked, e.g. "requested: make the red circle blue", "kept: green square"
    check: Callable[[np.ndarray], bool]  # True when the edited uint8 image satisfies it


class ShapesEditAuditor:
    """The rule-based judge of the shapes-editing world (the edit verifier's pieces, one criterion each)."""

    def scene(self, item):
        from ..tasks.shapes_edit import item_scene

        return item_scene(item)

    def requested(self, item) -> Criterion:
        from ..editing.verifier import judge_edit

        spec, source, target = self.scene(item)
        return Criterion(f"requested: {item.prompt}", lambda image: judge_edit(image, spec, source, target).requested)

    def criteria(self, item) -> list[Criterion]:
        """Every unintended-change criterion the world can check for this item."""
        from ..editing.verifier import _found, changed_pixels, edit_region, edited_objects
        from ..shapes.verifier import detect
        from ..shapes.world import render, world_sized

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
        from ..shapes.world import render

        return bool(criterion.check(render(self.scene(item)[2])))


@register_reward("edit_rubric")
class EditRubricReward(Reward):
    name = "edit_rubric"

    @classmethod
    def groups_scored(cls, params: dict) -> bool:
        return params.get("mode", "group") == "group"

    def __init__(
        self,
        mode: Literal["group", "sample"] = "group",
        requested_weight: float = 0.5,
        auditor=None,
        judge: dict | None = None,
    ):
        if mode not in ("group", "sample"):
            raise ConfigError(f"reward edit_rubric: params.mode: expected group or sample, got {mode!r}")
        if not 0 < requested_weight <= 1:
            raise ConfigError(
                f"reward edit_rubric: params.requested_weight: expected a number in (0, 1], got {requested_weight}"
            )
        self.mode, self.requested_weight = mode, requested_weight
        self.scores_groups = mode == "group"
        if judge is not None:  # a VLM auditor (flowrl/rewards/rubric_vlm.py) instead of the shapes world's rules
            from .rubric_vlm import build_vlm_auditor

            auditor = build_vlm_auditor(judge)
        self.auditor = auditor or ShapesEditAuditor()
        self.rubrics_built = 0  # group rubrics built so far (one per group and call)
        # an editor given its source at the sample size (stretched to it) is judged against that; one given it at
        # its own aspect (pipeline.reference_size) against the source as it is
        self.sources_at_sample_size = True

    def bind_policy(self, policy) -> None:
        self.sources_at_sample_size = getattr(policy, "reference_size", None) is None

    def rubric(self, item, issues: list[Criterion]) -> list[tuple[Criterion, float]]:
        """[(criterion, weight)]: the requested change plus the verified, de-duplicated issues."""
        seen, kept = set(), []
        for issue in issues:
            if issue.name not in seen and self.auditor.verify(issue, item):
                seen.add(issue.name)
                kept.append(issue)
        first = self.requested_weight if kept else 1.0
        return [(self.auditor.requested(item), first)] + [(c, (1 - first) / len(kept)) for c in kept]

    @staticmethod
    def score(image: np.ndarray, rubric: list[tuple[Criterion, float]]) -> float:
        return float(sum(weight for criterion, weight in rubric if criterion.check(image)))

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        items = condition_items(prompts, meta)
        images = to_uint8(samples)
        if hasattr(self.auditor, "sample_size"):  # a VLM judge sees each source as the editor was given it
            self.auditor.sample_size = tuple(images.shape[1:3]) if self.sources_at_sample_size else None
        scores, sizes = np.zeros(len(items)), np.zeros(len(items))
        groups: dict = {}
        for i, item in enumerate(items):
            groups.setdefault(item.key(), []).append(i)
        # one audit pass over a whole group when the judge offers it, else one per candidate
        one_pass = self.mode == "group" and getattr(self.auditor, "group_audit", False)
        audits = (
            {}
            if one_pass
            else {i: self.auditor.audit(image, item) for i, (image, item) in enumerate(zip(images, items))}
        )
        for members in groups.values():
            if self.mode == "group":
                issues = (
                    self.auditor.audit_group([images[i] for i in members], items[members[0]])
                    if one_pass
                    else [c for i in members for c in audits[i]]
                )
                rubric = self.rubric(items[members[0]], issues)
                self.rubrics_built += 1
                for i in members:
                    scores[i], sizes[i] = self.score(images[i], rubric), len(rubric)
            else:
                for i in members:
                    rubric = self.rubric(items[i], audits[i])
                    scores[i], sizes[i] = self.score(images[i], rubric), len(rubric)
        return RewardOutput(
            torch.tensor(scores, dtype=torch.float32), {"rubric_size": torch.tensor(sizes, dtype=torch.float32)}
        )
