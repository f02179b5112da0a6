"""ARRO-style group rubric reward for editing: no arXiv id given by the source and no public code read, so this is
flowrl's reading of the method's description (an agentic judge audits each edit for unimplemented requested
changes and unintended ones; a group-level rubric merges and verifies those issues and scores every candidate).

An auditor lists, per candidate edit, the checkable issues it finds: the requested change not made is always a
criterion; unintended changes are "kept: <object>" (a bystander lost, moved or recoloured), "no extra objects" and
"unchanged: <quadrant>" (pixels outside the edited region changed there). The group rubric merges the issues of
every candidate of a group (a group = the samples of one condition item in a reward call; paraphrases of one issue,
which a VLM's audits of different candidates give, are merged by `issue_key`), keeps only verified ones
(criteria the exact target edit satisfies: a judge's spurious claim is dropped), and scores every candidate against
the same rubric: R_i = sum_k w_k s_ik, s_ik in {0, 1}, the requested change weighted `requested_weight` and the rest
sharing 1 - requested_weight equally (all of it to the requested change when nothing else is listed). The rubric is
built once per group. `mode: sample` scores each candidate against its own verified issues only (the per-sample
audit ARRO's group rubric is compared against). The auditor is rule-based on the shapes-editing world, or a VLM
(`params.judge`: a local folder or an OpenAI-compatible endpoint, `vlm`, flowrl.rewards.rubric_vlm) with the same
`audit` / `requested` / `verify` methods and, optionally, one audit pass per group. A group's rubric sees the
samples of the group that are in one call: a run refuses training cuts that would split a group
(preflight.check_whole_groups); evaluations keep a condition's samples in one call.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from flowrl.errors import ConfigError
from flowrl.images import to_uint8
from flowrl.registry import Registry
from flowrl.rewards.base import Reward, RewardOutput, condition_items, register_reward


@dataclass(frozen=True)
class Criterion:
    name: str  # what is checked, e.g. "requested: make the red circle blue", "kept: green square"
    check: Callable[[np.ndarray], bool]  # True when the edited uint8 image satisfies it


# words that say an issue's status, not what it is about: "green square kept" and "the green square is still there"
# name one criterion
STATUS_WORDS = frozenset(
    "a an the is are was were be been being still there kept keep keeps remains remain remained present stays stay "
    "stayed intact preserved unchanged".split()
)


def issue_key(name: str) -> frozenset[str]:
    """What an issue is about, for merging the paraphrases that candidates' audits give of one issue: its words,
    lower-cased, without punctuation, order and status words."""
    return frozenset(re.findall(r"[a-z0-9]+", name.lower())) - STATUS_WORDS


# Auditors by name: a factory taking the reward's `judge` dict (None for a rule-based auditor) and returning an object
# with `audit(image, item)`, `requested(item)` and `verify(criterion, item)` (optionally `audit_group`)
AUDITORS = Registry(
    "edit_rubric auditor", {"shapes_edit": "flowrl.worlds.shapes_edit.auditor", "vlm": "flowrl.rewards.rubric_vlm"}
)


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
        if auditor is None or isinstance(auditor, str):  # a VLM judge, else the shapes-editing world's rules
            name = auditor or ("vlm" if judge is not None else "shapes_edit")
            auditor = AUDITORS.get(name, "reward edit_rubric: params.auditor")(judge)
        self.auditor = auditor
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
            key = issue_key(issue.name)
            if key not in seen and self.auditor.verify(issue, item):
                seen.add(key)
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
