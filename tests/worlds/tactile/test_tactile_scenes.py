"""The world's pairs: splits that hold material combinations apart, faults planted at their rates and marked, and
the same pairs from the same seed."""

import itertools

import numpy as np
import pytest
import torch

from flowrl.worlds.tactile.materials import KINDS, PATCH_MM, Material, height_field
from flowrl.worlds.tactile.scenes import (
    DIRECTIONS,
    PITCHES,
    clean_pair,
    combination,
    draw_material,
    make_pairs,
    relative_depth,
    split_of,
)
from flowrl.worlds.tactile.sensor import Press, render


def test_the_eval_split_holds_a_quarter_of_the_combinations_apart():
    combos = list(itertools.product(KINDS, range(len(PITCHES)), range(len(DIRECTIONS))))
    held = [c for c in combos if split_of(Material(c[0], sum(PITCHES[c[1]]) / 2, DIRECTIONS[c[2]], 0.2, 0.5)) == "eval"]
    assert 0.15 * len(combos) <= len(held) <= 0.35 * len(combos)
    rng = np.random.default_rng(0)
    train = {combination(draw_material(rng, "train")) for _ in range(300)}
    evaluation = {combination(draw_material(rng, "eval")) for _ in range(300)}
    assert train and evaluation and not train & evaluation
    assert evaluation <= set(held)


def test_faults_are_planted_at_their_rates_and_marked():
    pairs = make_pairs(300, 16, seed=3, misaligned=0.1, duplicates=0.1, mismatched=0.1)
    counts = {fault: sum(p.fault == fault for p in pairs) for fault in ("misaligned", "duplicate", "mismatched")}
    for fault, count in counts.items():  # binomial(300, 0.1): 30 +- 5.2
        assert 14 <= count <= 46, (fault, count)
    for index, pair in enumerate(pairs):
        if pair.fault == "duplicate":
            assert pair.source < index and (pair.rgb - pairs[pair.source].rgb).abs().max() < 0.05
        if pair.fault == "mismatched":
            assert combination(pair.meta["felt"]) != combination(pair.material) or pair.meta["felt"] != pair.material


def test_a_misaligned_pair_feels_the_shifted_patch():
    pairs = make_pairs(60, 24, seed=5, misaligned=1.0, duplicates=0.0, mismatched=0.0)
    pair = pairs[0]
    assert pair.fault == "misaligned" and all(2 <= abs(s) <= 4 for s in pair.meta["shift"])
    seed, shift = pair.meta["seed"], pair.meta["shift"]
    clean = clean_pair(pair.material, 24, seed)
    shifted = torch.roll(height_field(pair.material, 24, seed), shifts=shift, dims=(0, 1))
    felt = render(shifted, PATCH_MM, Press(), generator=torch.Generator().manual_seed(seed))
    assert torch.equal(pair.tactile, felt) and not torch.equal(pair.tactile, clean.tactile)
    assert torch.equal(pair.rgb, clean.rgb)  # the image is the material's own


def test_pairs_are_reproducible_and_depth_is_relative():
    a, b = make_pairs(8, 16, seed=1), make_pairs(8, 16, seed=1)
    for x, y in zip(a, b):
        assert x.material == y.material and x.fault == y.fault
        assert torch.equal(x.rgb, y.rgb) and torch.equal(x.tactile, y.tactile)
    heights = height_field(Material("bumpy", 5, 0.0, 0.3, 0.2), 32, seed=2)
    depth = relative_depth(heights)
    assert depth.min().item() == pytest.approx(0.0) and depth.max().item() == pytest.approx(1.0)
    assert depth.flatten()[heights.flatten().argmax()] == 0  # the highest relief is the nearest
