import numpy as np
import pytest

from flowrl.worlds.shapes import (
    TAGS,
    dense_score,
    detect,
    eval_prompt_set,
    exact_score,
    parse_prompt,
    score,
    train_prompt_set,
)
from flowrl.worlds.shapes.prompts import HELD_OUT_COMBOS, all_prompt_specs, wide_eval_prompt_set
from flowrl.worlds.shapes.scenes import render_mixed_colors, sample_mixed_color_pairs, sample_pairs, scene_objects
from flowrl.worlds.shapes.world import MAX_SIZE, MIN_GAP, MIN_SIZE, PALETTE, ShapeObject, boxes_clash, render


def test_renderer_obeys_the_world_rules():
    rng = np.random.default_rng(0)
    for spec in [s for tag in TAGS for s in all_prompt_specs(tag)[:5]]:
        objects = scene_objects(spec, rng)
        assert 1 <= len(objects) <= 4
        for i, a in enumerate(objects):
            assert MIN_SIZE <= a.size <= MAX_SIZE
            assert 0 <= a.x0 and a.x0 + a.size <= 32 and 0 <= a.y0 and a.y0 + a.size <= 32
            for b in objects[i + 1 :]:
                assert not boxes_clash(a, b, MIN_GAP)
        colours = {tuple(c) for c in render(objects).reshape(-1, 3)}
        assert colours <= {(0, 0, 0), *PALETTE.values()}


def test_mixed_colour_renders_keep_the_layout_and_the_verifier_rejects_most():
    rng = np.random.default_rng(3)
    spec = all_prompt_specs("color_attr")[7]
    objects = scene_objects(spec, rng)
    assert (render_mixed_colors(objects, rng, keep=1.0) == render(objects)).all()
    mixed = render_mixed_colors(objects, rng, keep=0.0)
    assert ((mixed.max(axis=-1) > 0) == (render(objects).max(axis=-1) > 0)).all()  # same silhouettes
    images, prompts = sample_mixed_color_pairs(200, np.random.default_rng(4))
    off_palette = [bool({tuple(c) for c in im.reshape(-1, 3)} - {(0, 0, 0), *PALETTE.values()}) for im in images]
    assert np.mean(off_palette) > 0.5
    assert 0.2 < np.mean([score(im, p) for im, p in zip(images, prompts)]) < 0.6


def test_triangle_points_up_and_shapes_fill_as_expected():
    tri = ShapeObject("triangle", "red", 0, 0, 11).mask()[:11, :11]
    assert tri[0].sum() < tri[-1].sum()
    assert ShapeObject("square", "red", 0, 0, 9).mask().sum() == 81
    disc = ShapeObject("circle", "red", 0, 0, 11).mask().sum()
    assert 0.7 * 121 < disc < 0.85 * 121


def test_verifier_accepts_every_render_of_its_prompt():
    images, prompts = sample_pairs(600, np.random.default_rng(1))
    assert all(score(im, p) == 1.0 for im, p in zip(images, prompts))
    assert all(dense_score(im, p) == 1.0 for im, p in zip(images, prompts))


def test_verifier_rejects_mismatches():
    red_circle = render([ShapeObject("circle", "red", 4, 4, 11)])
    assert score(red_circle, "a red circle") == 1.0
    assert score(red_circle, "a blue circle") == 0.0
    assert score(red_circle, "a square") == 0.0
    assert score(red_circle, "two circles") == 0.0
    assert score(red_circle, "a circle and a circle") == 0.0  # one object does not meet two phrases
    two = render([ShapeObject("circle", "red", 2, 2, 9), ShapeObject("circle", "blue", 18, 18, 9)])
    assert score(two, "a circle and a circle") == 1.0 and score(two, "a circle and a square") == 0.0
    assert 0 < dense_score(red_circle, "a blue circle") < 1  # right shape, wrong colour
    pair = render([ShapeObject("square", "green", 2, 10, 9), ShapeObject("triangle", "blue", 20, 10, 9)])
    assert score(pair, "a green square left of a blue triangle") == 1.0
    assert score(pair, "a green square right of a blue triangle") == 0.0
    assert score(pair, "a blue triangle right of a square") == 1.0
    assert score(np.zeros((32, 32, 3), np.uint8), "a circle") == 0.0
    assert detect(np.zeros((32, 32, 3), np.uint8)) == []


def test_counting_needs_the_exact_count():
    three = render([ShapeObject("square", "red", x, 2, 7) for x in (1, 11, 21)])
    assert score(three, "three squares") == 1.0
    assert score(three, "two squares") == 0.0
    assert score(three, "four squares") == 0.0


def test_exact_objects_charges_clutter_that_the_verdict_lets_pass():
    circles = render([ShapeObject("circle", "red", 2, 2, 9), ShapeObject("circle", "blue", 18, 18, 9)])
    assert score(circles, "a circle") == 1.0  # GenEval's reading: at least one circle
    assert dense_score(circles, "a circle") == 1.0
    assert dense_score(circles, "a circle", exact_objects=True) == 0.5  # one of two constraints: not exactly one object
    assert dense_score(circles, "two circles", exact_objects=True) == 1.0
    pair = render([ShapeObject("square", "green", 2, 10, 9), ShapeObject("triangle", "blue", 20, 10, 9)])
    assert dense_score(pair, "a green square left of a blue triangle", exact_objects=True) == 1.0
    images, prompts = sample_pairs(200, np.random.default_rng(3))  # every render holds exactly its named objects
    assert all(dense_score(im, p, exact_objects=True) == 1.0 for im, p in zip(images, prompts))


def test_the_exact_verdict_refuses_clutter_and_passes_every_render():
    circles = render([ShapeObject("circle", "red", 2, 2, 9), ShapeObject("circle", "blue", 18, 18, 9)])
    assert (score(circles, "a circle"), exact_score(circles, "a circle")) == (1.0, 0.0)
    assert exact_score(circles, "two circles") == 1.0
    assert exact_score(circles, "a red circle and a blue circle") == 1.0
    assert exact_score(circles, "a red circle and a green circle") == 0.0  # unmet, whatever the count
    images, prompts = sample_pairs(200, np.random.default_rng(4))
    assert all(exact_score(im, p) == 1.0 for im, p in zip(images, prompts))


def test_prompts_parse_back_and_bad_prompts_are_named():
    for tag in TAGS:
        for spec in all_prompt_specs(tag):
            assert parse_prompt(spec.text()) == spec
    with pytest.raises(ValueError, match="a purple circle"):
        parse_prompt("a purple circle")


def test_split_holds_out_colour_shape_combinations():
    for tag, prompts in train_prompt_set().items():
        for p in prompts:
            assert not parse_prompt(p).color_shape_pairs() & HELD_OUT_COMBOS
    evals = eval_prompt_set()
    for p in evals:
        spec = parse_prompt(p)
        if spec.tag in ("colors", "color_attr", "position"):
            assert spec.color_shape_pairs() & HELD_OUT_COMBOS
    assert {parse_prompt(p).tag for p in evals} == set(TAGS)
    assert evals == eval_prompt_set()  # fixed


def test_the_wide_eval_set_extends_the_split_with_held_out_prompts_only():
    wide, evals = wide_eval_prompt_set(), eval_prompt_set()
    assert set(evals) <= set(wide) and len(set(wide)) == len(wide) and wide == wide_eval_prompt_set()
    tags = [parse_prompt(p).tag for p in wide]
    assert {t: tags.count(t) for t in TAGS} == {
        "single_object": 3,
        "colors": 3,
        "two_object": 6,
        "counting": 9,
        "color_attr": 42,
        "position": 42,
    }
    for p in wide:
        if parse_prompt(p).tag in ("colors", "color_attr", "position"):
            assert parse_prompt(p).color_shape_pairs() & HELD_OUT_COMBOS


def test_shipped_prompt_files_match_the_split():
    from conftest import REPO

    assert (REPO / "assets/shapes/eval_prompts.txt").read_text().splitlines() == eval_prompt_set()
    shipped_train = (REPO / "assets/shapes/train_prompts.txt").read_text().splitlines()
    assert shipped_train == [p for tag in TAGS for p in train_prompt_set()[tag]]


def test_dense_credit_by_hand():
    """The dense score is the share of the prompt's constraints met, counted by hand: colour (shape present, the
    coloured object present), counting (some present, 1 - |n - k| / k, exactly k) and position (two phrases of two
    constraints each, then the relation)."""
    red_circle = render([ShapeObject("circle", "red", 4, 4, 11)])
    assert dense_score(red_circle, "a blue circle") == pytest.approx(1 / 2)
    two = render([ShapeObject("circle", "red", 2, 2, 9), ShapeObject("circle", "blue", 18, 18, 9)])
    assert dense_score(two, "three circles") == pytest.approx((1 + 2 / 3 + 0) / 3)
    pair = render([ShapeObject("square", "green", 2, 10, 9), ShapeObject("triangle", "blue", 20, 10, 9)])
    assert dense_score(pair, "a green square right of a blue triangle") == pytest.approx(4 / 5)
    assert dense_score(pair, "a green square right of a blue triangle", exact_objects=True) == pytest.approx(5 / 6)
