"""Curation finds what was planted: every near-duplicate, most misaligned and mismatched pairs, few clean ones; and
k-center picks spread-out rows."""

import torch

from flowrl.worlds.tactile.curation import curate, k_center, near_duplicates
from flowrl.worlds.tactile.scenes import make_pairs


def _pixels(pairs):
    return torch.stack([torch.cat([p.rgb.flatten(), p.tactile.flatten()]) for p in pairs])


def test_curation_removes_the_planted_faults():
    pairs = make_pairs(120, 32, seed=11, misaligned=0.1, duplicates=0.1, mismatched=0.1)
    report = curate(pairs, _pixels(pairs))
    planted = {f: {i for i, p in enumerate(pairs) if p.fault == f} for f in ("duplicate", "misaligned", "mismatched")}
    assert set(report.removed["duplicate"]) == planted["duplicate"]
    removed = set().union(*report.removed.values())
    for fault in ("misaligned", "mismatched"):
        assert len(planted[fault] & removed) >= 0.7 * len(planted[fault]), fault
    clean = {i for i, p in enumerate(pairs) if p.fault == "none"}
    assert len(clean & removed) <= 0.1 * len(clean)
    assert sorted(report.kept + sorted(removed)) == list(range(len(pairs)))


def test_near_duplicates_keep_the_first_and_k_center_spreads():
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1e-4], [-1.0, 0.0]])
    assert near_duplicates(features) == [2]
    points = torch.tensor([[0.0], [0.1], [0.2], [5.0], [10.0]])
    assert k_center(points, 3) == [0, 4, 3]
