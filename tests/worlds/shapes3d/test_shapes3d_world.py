"""The 3D shapes world: analytic solids, meshes from SDF grids (known volumes), the grammar and its split, the
condition renders, and the geometric metrics."""

import math

import numpy as np
import pytest
import torch

from flowrl.sdf import (
    chamfer_and_fscore,
    compare,
    grid_points,
    mesh_from_grid,
    render,
    silhouette_iou,
    surface_points,
    validity,
    volume_iou,
)
from flowrl.worlds.shapes3d.geometry import Primitive, Solid, sdf_grid
from flowrl.worlds.shapes3d.prompts import (
    TAGS,
    all_specs,
    eval_prompt_set,
    is_held_out,
    parse_prompt,
    sample_solid,
    train_prompt_set,
)

VOLUMES = {
    "sphere": ((0.5, 0.5, 0.5), 4 / 3 * math.pi * 0.5**3),
    "box": ((0.3, 0.5, 0.4), 8 * 0.3 * 0.5 * 0.4),
    "cylinder": ((0.4, 0.3, 0.4), math.pi * 0.4**2 * 0.6),
    "cone": ((0.5, 0.4, 0.5), math.pi * 0.5**2 * 0.8 / 3),
}


@pytest.mark.parametrize("kind", VOLUMES)
def test_marching_cubes_on_an_analytic_sdf_gives_the_known_volume(kind):
    half, exact = VOLUMES[kind]
    mesh = mesh_from_grid(sdf_grid(Solid((Primitive(kind, (0.0, 0.0, 0.0), half),)), 64))
    assert mesh.is_watertight and len(mesh.split(only_watertight=False)) == 1
    assert mesh.volume == pytest.approx(exact, rel=0.02)


def test_sdf_signs_and_union():
    solid = Solid(
        (Primitive("box", (0.0, -0.5, 0.0), (0.2, 0.2, 0.2)), Primitive("sphere", (0.0, 0.3, 0.0), (0.2, 0.2, 0.2)))
    )
    points = torch.tensor([[0.0, -0.5, 0.0], [0.0, 0.3, 0.0], [0.0, 0.0, 0.0], [0.9, 0.9, 0.9]])
    d = solid.sdf(points)
    assert d[0] < 0 and d[1] < 0 and d[2] > 0 and d[3] > 0
    assert d[1].item() == pytest.approx(-0.2, abs=1e-6) and d[0].item() == pytest.approx(-0.2, abs=1e-6)
    assert grid_points(4).shape == (64, 3)


def test_the_grammar_round_trips_and_the_split_holds_combinations_out():
    for spec in all_specs():
        assert parse_prompt(spec.prompt()) == spec
    train = {p for prompts in train_prompt_set().values() for p in prompts}
    held = eval_prompt_set()
    assert train.isdisjoint(held) and all(is_held_out(parse_prompt(p)) for p in held)
    assert {parse_prompt(p).tag for p in held} == set(TAGS)
    assert "a sphere on top of a cone" in held and "a sphere on top of a cylinder" in train
    with pytest.raises(ValueError, match="not a prompt"):
        parse_prompt("a teapot")


def test_sampled_solids_stand_on_the_floor_inside_the_cube_and_stack_touching():
    rng = np.random.default_rng(0)
    for spec in all_specs()[::7]:
        solid = sample_solid(spec, rng)
        bottoms = [p.center[1] - p.half[1] for p in solid.parts]
        tops = [p.center[1] + p.half[1] for p in solid.parts]
        assert min(bottoms) == pytest.approx(-0.9) and max(tops) <= 0.9 + 1e-6
        if spec.tag in ("stacked", "tower"):  # parts listed bottom first, each on the one below
            for below, above in zip(solid.parts, solid.parts[1:]):
                assert above.center[1] - above.half[1] == pytest.approx(below.center[1] + below.half[1])


def test_renders_show_the_solid_and_its_silhouette_moves_with_it():
    near = Solid((Primitive("sphere", (0.0, -0.1, 0.0), (0.4, 0.4, 0.4)),))
    image, silhouette = render(near.sdf, 32)
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert image[16, 16].max() > 60 and image[0, 0].max() == 0  # lit object in the middle, black corner
    # an orthographic sphere is a disc of radius 0.4 in view units: pi 0.4^2 / (2 SPAN)^2 of the image
    assert silhouette.mean() == pytest.approx(math.pi * 0.16 / 4, rel=0.1)
    moved = Solid((Primitive("sphere", (0.5, -0.1, -0.5), (0.4, 0.4, 0.4)),))
    assert silhouette_iou(silhouette, render(moved.sdf, 32)[1]) < 0.5
    assert silhouette_iou(silhouette, silhouette) == 1.0


def test_metrics_are_perfect_on_the_truth_and_degrade_with_error():
    truth = sample_solid(parse_prompt("a sphere on top of a box"), np.random.default_rng(1))
    true_grid = sdf_grid(truth, 32)
    same = compare(true_grid, true_grid)
    # the same surface, two draws of 2,048 points: Chamfer is their sampling gap (~0.02)
    assert same["iou"] == 1.0 and same["fscore"] > 0.95 and same["chamfer"] < 0.03 and same["valid"] == 1.0
    shifted = Solid(
        tuple(Primitive(p.kind, (p.center[0] + 0.2, p.center[1], p.center[2]), p.half) for p in truth.parts)
    )
    off = compare(sdf_grid(shifted, 32), true_grid)
    assert off["iou"] < 0.7 and off["chamfer"] > 0.05 and off["fscore"] < same["fscore"]
    empty = compare(np.ones_like(true_grid), true_grid)
    assert empty["iou"] == 0.0 and empty["fscore"] == 0.0 and empty["valid"] == 0.0


def test_validity_counts_floaters():
    body = Primitive("box", (0.0, 0.0, 0.0), (0.5, 0.5, 0.5))
    speck = Primitive("sphere", (0.8, 0.8, 0.8), (0.045, 0.045, 0.045))
    v = validity(mesh_from_grid(sdf_grid(Solid((body, speck)), 64)))
    assert v["components"] == 2 and v["floaters"] == 1 and v["valid"] == 0.0
    points = surface_points(mesh_from_grid(sdf_grid(Solid((body,)), 32)))
    assert chamfer_and_fscore(points, points) == (0.0, 1.0)
    assert volume_iou(np.ones(8), -np.ones(8)) == 0.0
