"""Materials: heights within their amplitude, textures running the way their orientation says, friction rising with
roughness and slope, and descriptions that name what the parameters are."""

import math

import pytest
import torch

from flowrl.worlds.tactile.materials import KINDS, Material, height_field


@pytest.mark.parametrize("kind", KINDS)
def test_heights_span_zero_to_the_amplitude(kind):
    heights = height_field(Material(kind, 6, 0.3, 0.25, 0.3), 48, seed=1)
    assert heights.shape == (48, 48) and heights.dtype == torch.float32
    assert heights.min().item() == pytest.approx(0.0, abs=1e-6)
    top = 0.25 if kind != "smooth" else 0.25 * 0.3 * 0.2
    assert heights.max().item() == pytest.approx(top, rel=1e-5)


def test_ridges_run_along_their_orientation():
    across_x = height_field(Material("ridged", 5, 0.0, 0.3, 0.0), 64)  # u = x: the height varies along x only
    assert across_x.std(dim=0).max().item() < 1e-6 and across_x.std(dim=1).min().item() > 0.05
    across_y = height_field(Material("ridged", 5, math.pi / 2, 0.3, 0.0), 64)
    torch.testing.assert_close(across_y, across_x.T, atol=1e-5, rtol=0)


def test_friction_rises_with_roughness_and_slope():
    base = Material("ridged", 4, 0.0, 0.2, 0.2)
    rougher = Material("ridged", 4, 0.0, 0.2, 0.8)
    steeper = Material("ridged", 10, 0.0, 0.2, 0.2)
    assert base.friction < rougher.friction and base.friction < steeper.friction
    assert Material("smooth", 4, 0.0, 0.2, 0.0).friction == pytest.approx(0.15)
    # 0.15 + 0.45 r + 0.9 a f / 8 by hand
    assert base.friction == pytest.approx(0.15 + 0.45 * 0.2 + 0.9 * 0.2 * 4 / 8)


def test_descriptions_name_the_parameters():
    # frictions by hand: 0.15 + 0.045 + 0.9 x 0.3 x 9 / 8 = 0.499; 0.15 + 0.405 + 0.9 x 0.4 x 3 / 8 = 0.69
    assert Material("woven", 9, math.radians(45), 0.3, 0.1).description() == (
        "woven, fine pitch, diagonal, soft, low friction"
    )
    assert Material("grained", 3, math.radians(90), 0.4, 0.9).description() == (
        "grained, coarse pitch, vertical, rough, high friction"
    )
    assert Material("smooth", 3, 0.0, 0.1, 0.1).description() == "smooth, soft, low friction"
    with pytest.raises(ValueError, match="kind"):
        Material("furry", 3, 0.0, 0.1, 0.1)
