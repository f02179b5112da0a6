"""The moving-shapes world: the grammar round-trips, the split holds out what it says, rendered clips satisfy their
prompts, and the video verifier passes each rendered clip and fails its one-attribute negatives."""

import numpy as np
import pytest

from flowrl.worlds.moving_shapes.prompts import (
    HELD_OUT_SHAPE_DIRECTIONS,
    TAGS,
    ClipSpec,
    Mover,
    all_specs,
    eval_prompt_set,
    is_held_out,
    parse_prompt,
    train_prompt_set,
)
from flowrl.worlds.moving_shapes.verifier import judge_clip
from flowrl.worlds.moving_shapes.world import (
    FRAMES,
    MAX_SIZE,
    Track,
    fits,
    in_frame_starts,
    render_clip,
    render_shape_labels,
    sample_clip,
    sample_pairs,
    sample_tracks,
)
from flowrl.worlds.shapes.prompts import HELD_OUT_COMBOS
from flowrl.worlds.shapes.world import SHAPES

OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}


def negative(spec: ClipSpec) -> ClipSpec:
    """The spec with one attribute changed so that a clip of it must fail the original prompt."""
    m = spec.movers[0]
    if spec.tag == "object":
        other = next(c for c in ("red", "green", "blue", "yellow") if c != m.color)
        return ClipSpec("object", (Mover(m.shape, other),))
    if spec.tag == "motion":
        return ClipSpec("motion", (Mover(m.shape, m.color, (OPPOSITE[m.motion[0]],)),))
    if spec.tag == "static":
        return ClipSpec("motion", (Mover(m.shape, m.color, ("right",)),))
    if spec.tag == "two_objects":
        b = spec.movers[1]
        return ClipSpec("two_objects", (m, Mover(b.shape, b.color, (OPPOSITE[b.motion[0]],))))
    if spec.tag == "dynamic_attribute":  # the reverse change
        return ClipSpec("dynamic_attribute", (Mover(m.shape, m.start_color, ("still",), start_color=m.color),))
    if spec.tag == "motion_order":
        return ClipSpec("motion_order", (Mover(m.shape, m.color, m.motion[::-1]),))
    return ClipSpec("relative_motion", spec.movers, "away from" if spec.relation == "toward" else "toward")


@pytest.mark.parametrize("tag", TAGS)
def test_every_prompt_parses_back_to_its_spec(tag):
    for spec in all_specs(tag):
        assert parse_prompt(spec.text()) == spec


def test_bad_prompts_are_named():
    for prompt in [
        "a purple circle",
        "a red circle moving sideways",
        "a red circle moving left and a red circle moving up",
        "a circle turning from red to red",
    ]:
        with pytest.raises(ValueError, match="prompt"):
            parse_prompt(prompt)


def test_the_split_holds_out_combinations_never_seen_in_training():
    train = [p for prompts in train_prompt_set().values() for p in prompts]
    evaluation = eval_prompt_set()
    assert not set(train) & set(evaluation)
    assert all(is_held_out(parse_prompt(p)) for p in evaluation)
    for prompt in train:
        spec = parse_prompt(prompt)
        assert not spec.color_shape_pairs() & HELD_OUT_COMBOS
        assert not spec.shape_directions() & HELD_OUT_SHAPE_DIRECTIONS
    assert {parse_prompt(p).tag for p in evaluation} == set(TAGS)


@pytest.mark.parametrize("frames", [FRAMES, 5, 17])
@pytest.mark.parametrize("tag", TAGS)
def test_rendered_clips_pass_and_one_attribute_negatives_fail(tag, frames):
    """At any 1 + 4k frames (a 17-frame clip once moved objects out of the frame; at 5 frames a 6 px move sat on
    the verifier's threshold)."""
    rng = np.random.default_rng(7)
    specs = all_specs(tag)
    for _ in range(12 if frames == FRAMES else 6):
        spec = specs[rng.integers(len(specs))]
        tracks = sample_clip(spec, rng, frames)
        assert fits(tracks, frames)
        assert judge_clip(render_clip(tracks, frames), spec.text()) == (1.0, 1.0), spec.text()
        bad = negative(spec)
        verdict, dense = judge_clip(render_clip(sample_clip(bad, rng, frames), frames), spec.text())
        assert verdict == 0.0 and dense < 1.0, (spec.text(), bad.text())


def test_an_empty_clip_meets_nothing_and_a_frozen_clip_is_not_motion():
    empty = np.zeros((FRAMES, 32, 32, 3), dtype=np.uint8)
    assert judge_clip(empty, "a red circle moving left") == (0.0, 0.0)
    rng = np.random.default_rng(0)
    moving = render_clip(sample_clip(parse_prompt("a red circle moving left"), rng))
    frozen = np.repeat(moving[:1], FRAMES, axis=0)  # the first frame held: the right object, no motion
    assert judge_clip(frozen, "a red circle moving left") == (0.0, 0.5)
    assert judge_clip(frozen, "a still red circle") == (1.0, 1.0)


def test_pretraining_pairs_are_clips_with_their_prompts():
    clips, prompts = sample_pairs(6, np.random.default_rng(3))
    assert clips.shape == (6, FRAMES, 32, 32, 3) and clips.dtype == np.uint8
    assert all(judge_clip(c, p)[0] == 1.0 for c, p in zip(clips, prompts))


def test_in_frame_starts_are_exactly_the_corners_that_keep_an_object_in_every_frame():
    """Drawing among them replaces rejecting clips that leave the frame; every placement of the largest objects
    must succeed (at 1,000 rejection tries, two 13-px movers sometimes failed to place)."""
    for motion in [("right",), ("up",), ("still",), ("left", "down")]:
        mover = Mover("square", "red", motion)
        xs, ys = in_frame_starts(mover, MAX_SIZE, FRAMES, 32)
        for x0 in range(32 - MAX_SIZE + 1):
            for y0 in range(32 - MAX_SIZE + 1):
                inside = fits([Track(mover, float(x0), float(y0), MAX_SIZE)], FRAMES)
                assert inside == (x0 in xs and y0 in ys), (motion, x0, y0)
    moving_right = in_frame_starts(Mover("circle", "red", ("right",)), MAX_SIZE, FRAMES, 32)
    assert moving_right[0] == tuple(range(32 - MAX_SIZE - 12 + 1))  # 12 px travelled
    spec = ClipSpec("two_objects", (Mover("triangle", "yellow", ("right",)), Mover("triangle", "green", ("up",))))
    rng = np.random.default_rng(0)
    assert all(fits(sample_clip(spec, rng), FRAMES) for _ in range(20))


def test_shape_labels_cover_exactly_the_objects_with_their_shapes():
    clips, prompts = sample_pairs(5, np.random.default_rng(4))
    tracks, same_prompts = sample_tracks(5, np.random.default_rng(4))
    labels = np.stack([render_shape_labels(t) for t in tracks])
    assert np.array_equal(clips, np.stack([render_clip(t) for t in tracks])) and prompts == same_prompts  # same draws
    assert labels.shape == clips.shape[:-1]
    assert np.array_equal(labels > 0, clips.max(-1) > 0)
    for clip_labels, prompt in zip(labels, prompts):
        named = {1 + SHAPES.index(m.shape) for m in parse_prompt(prompt).movers}
        assert set(np.unique(clip_labels)) - {0} == named


def test_sub_prompts_hold_on_renders_and_near_misses_are_judged_by_the_verifier():
    from flowrl.worlds.moving_shapes.prompts import perturb, sub_prompts
    from flowrl.worlds.moving_shapes.verifier import detections

    rng = np.random.default_rng(11)
    for tag in TAGS:
        specs = all_specs(tag)
        for _ in range(4):
            spec = specs[rng.integers(len(specs))]
            found = detections(render_clip(sample_clip(spec, rng)))
            assert all(judge_clip(found, q)[0] == 1.0 for q in sub_prompts(spec)), spec.text()
            miss = perturb(spec, rng)
            assert miss != spec and parse_prompt(miss.text()) == miss
            assert judge_clip(found, miss)[0] == 0.0, (spec.text(), miss.text())


def test_question_labels_and_the_qa_model_round_trip(tmp_path):
    import torch

    from flowrl.rewards import build_reward
    from flowrl.worlds.moving_shapes.model_qa import build_model, load_model, save_model, tokenize
    from flowrl.worlds.moving_shapes.pretrain_qa import labelled_questions, to_video

    clips, questions, labels = labelled_questions(6, np.random.default_rng(0))
    assert len(clips) == len(questions) == len(labels) and 0 < labels.mean() < 1
    model, tokenizer = build_model(0)
    save_model(model, tokenizer, tmp_path / "qa")
    loaded, tok = load_model(tmp_path / "qa")
    video = to_video(clips[:4])
    expected = model.half().float()(video, *tokenize(tokenizer, questions[:4]))  # saved in fp16
    torch.testing.assert_close(loaded(video, *tokenize(tok, questions[:4])), expected)
    reward = build_reward("moving_shapes_qa", path=str(tmp_path / "qa"))
    pixels = video.clone().requires_grad_(True)
    prompts = [
        "a red circle moving left",
        "a square turning from red to blue",
        "a still blue square",
        "a red circle moving toward a blue square",
    ]
    out = reward(pixels, prompts)
    assert out.scores.shape == (4,) and ((out.scores > 0) & (out.scores < 1)).all()
    out.scores.sum().backward()
    assert pixels.grad.abs().sum() > 0  # differentiable in the pixels, as TVRL's credit maps need
