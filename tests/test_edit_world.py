"""The shapes-editing world (issue 19, part 1): the instruction grammar and its held-out split, source / target scenes,
the edit verifier (rendered targets pass, sources and near-misses fail, off-target change measured), the task and
the verifier reward."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from flowrl.editing.instructions import (KINDS, all_specs, eval_instruction_set, is_held_out, parse_instruction,
                                         sample_scene, train_instruction_set)
from flowrl.editing.verifier import judge_edit
from flowrl.samples import ImageSamples
from flowrl.shapes.world import ShapeObject, render


def test_grammar_round_trips_and_the_split_holds_out_result_objects():
    specs = all_specs()
    assert all(parse_instruction(s.text()) == s for s in specs) and {s.kind for s in specs} == set(KINDS)
    with pytest.raises(ValueError, match="make the purple circle"):
        parse_instruction("make the purple circle blue")
    train = [t for texts in train_instruction_set().values() for t in texts]
    evals = eval_instruction_set()
    assert not any(is_held_out(parse_instruction(t)) for t in train)
    assert all(is_held_out(parse_instruction(t)) for t in evals)
    assert {parse_instruction(t).kind for t in evals} == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_rendered_targets_pass_and_unedited_sources_fail(kind):
    rng = np.random.default_rng(1)
    specs = [s for s in all_specs() if s.kind == kind][::5]
    for spec in specs:
        source, target = sample_scene(spec, rng)
        keys = [(o.color, o.shape) for o in source]
        assert len(set(keys)) == len(keys) and len({(o.color, o.shape) for o in target}) == len(target)
        good = judge_edit(render(target), spec, source, target)
        assert good.success and good.dense == 1.0 and good.off_target == 0.0
        unedited = judge_edit(render(source), spec, source, target)
        assert not unedited.success and not unedited.requested and unedited.off_target == 0.0


def test_near_misses_fail_for_the_right_reason():
    spec = parse_instruction("make the red circle blue")
    source = [ShapeObject("circle", "red", 2, 2, 10), ShapeObject("square", "green", 18, 18, 10)]
    target = [ShapeObject("circle", "blue", 2, 2, 10), source[1]]
    wrong_colour = judge_edit(render([ShapeObject("circle", "yellow", 2, 2, 10), source[1]]), spec, source, target)
    assert not wrong_colour.requested and wrong_colour.preserved
    lost_bystander = judge_edit(render(target[:1]), spec, source, target)
    assert lost_bystander.requested and not lost_bystander.preserved and lost_bystander.off_target > 0
    extra = judge_edit(render(target + [ShapeObject("triangle", "yellow", 20, 2, 9)]), spec, source, target)
    assert extra.requested and not extra.preserved and 0 < extra.dense < 1 and extra.off_target > 0
    noisy = render(target).copy()
    noisy[28:30, 2:4] = 255  # a stray speck outside the edit: below the detector's size, but off-target change
    speck = judge_edit(noisy, spec, source, target)
    assert speck.success and speck.off_target == pytest.approx(4 / (32 * 32 - 144), rel=0.3)
    move = parse_instruction("move the red circle right")
    moved_target = [replace(source[0], x0=source[0].x0 + 8), source[1]]
    short = judge_edit(render([replace(source[0], x0=source[0].x0 + 2), source[1]]), move, source, moved_target)
    assert not short.requested


def test_task_items_carry_their_source_image_and_evaluate_the_verifier():
    from flowrl.editing.instructions import scene_for
    from flowrl.rewards import build_reward
    from flowrl.tasks.base import build_task
    from flowrl.tasks.shapes_edit import scene_seed_of

    task = build_task("shapes_edit")
    items = task.condition_set("eval").items
    assert len(items) == 16 * len(KINDS)
    scenes = [scene_for(i.prompt, scene_seed_of(i)) for i in items]
    assert all(np.array_equal(i.inputs["source_image"], render(source)) for i, (_, source, _) in zip(items, scenes))
    targets = ImageSamples(torch.from_numpy(np.stack([render(t) for _, _, t in scenes])).permute(0, 3, 1, 2) / 255)
    sources = ImageSamples(torch.from_numpy(np.stack([i.inputs["source_image"] for i in items])).permute(0, 3, 1, 2) / 255)
    assert task.evaluate(targets, items)["overall"] == 1.0 and task.evaluate(sources, items)["overall"] == 0.0
    assert task.evaluate(targets, items)["metrics"]["off_target"]["overall"] == 0.0
    reward = build_reward("shapes_edit")
    on_targets = reward(targets.tensor, [i.prompt for i in items], {"conditions": items})
    on_sources = reward(sources.tensor, [i.prompt for i in items], {"conditions": items})
    assert on_targets.scores.min() == 1.0 and on_sources.scores.max() < 1.0
    assert on_targets.info["accuracy"].mean() == 1.0 and on_sources.info["accuracy"].mean() == 0.0
    assert len(task.condition_set("train").by_tag) == len(KINDS)
