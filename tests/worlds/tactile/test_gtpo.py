"""GTPO against hand computations: attribute rewards, group-normalised advantages and the clipped token objective
(with a token whose ratio leaves the clip range and so carries no gradient)."""

import math

import pytest
import torch

from flowrl.worlds.tactile.gtpo import attribute_accuracy, description_rewards, gtpo_loss
from flowrl.worlds.tactile.materials import Material


def test_attribute_rewards_by_hand():
    woven = Material("woven", 9, math.radians(45), 0.3, 0.1)  # woven, fine pitch, diagonal, soft, low friction
    assert attribute_accuracy(woven.description(), woven) == 1.0
    assert attribute_accuracy("woven, coarse pitch, diagonal, rough", woven) == pytest.approx(2 / 5)
    smooth = Material("smooth", 3, 0.0, 0.1, 0.1)  # smooth, soft, low friction: three attributes
    assert attribute_accuracy("smooth, fine pitch, rough, low friction", smooth) == pytest.approx(2 / 3)
    rewards = description_rewards(["woven", "smooth"], [woven, smooth], torch.tensor([0.5, 0.25]), ssim_weight=2.0)
    torch.testing.assert_close(rewards, torch.tensor([1 / 5 + 1.0, 1 / 3 + 0.5]))


def test_clipped_token_objective_by_hand():
    # two groups of two descriptions; rewards 1, 0 | 0.5, 0.5: advantages (std within the group, + 1e-4)
    rewards, groups = torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1])
    a = 0.5 / (0.5 + 1e-4)  # |r - mean| / (std + eps) in group 0; group 1 has none
    old = torch.zeros(4, 3)
    new = torch.tensor([[0.1, 0.5, 0.0], [0.0, -0.5, 0.3], [0.2, 0.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    loss = gtpo_loss(new, old, mask, rewards, groups, clip_range=0.2)
    # per token max(-A r, -A clip(r, 0.8, 1.2)). Row 0 (A = +a): r = e^0.1 inside the range; e^0.5 = 1.65 above it,
    # so -1.2 a is taken and the token has no gradient. Row 1 (A = -a): r = 1; e^-0.5 = 0.61 below the range, so
    # 0.8 a, no gradient; e^0.3 = 1.35 above it, where the pessimistic term is the unclipped a 1.35 (gradient kept).
    # Rows 2-3: A = 0. Eight valid tokens.
    expected = (-a * math.exp(0.1) - a * 1.2 + a * 1.0 + a * 0.8 + a * math.exp(0.3)) / 8
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    grad = new.grad
    assert grad[0, 0].item() == pytest.approx(-a * math.exp(0.1) / 8, rel=1e-6)
    assert grad[0, 1].item() == 0.0 and grad[1, 1].item() == 0.0  # clipped
    assert grad[1, 0].item() == pytest.approx(a / 8, rel=1e-6)
    assert grad[1, 2].item() == pytest.approx(a * math.exp(0.3) / 8, rel=1e-6)
    assert grad[0, 2].item() == 0.0 and torch.all(grad[2:] == 0)  # masked token; zero advantages
