"""The shapes-editing world as a task: condition items are an instruction plus the seed of its source scene, with the
rendered source image as the per-sample input `source_image` (what an editing pipeline is conditioned on);
evaluation is the edit verifier's success per kind, with the off-target pixel change beside it."""
from __future__ import annotations

import numpy as np

from ..editing.instructions import KINDS, eval_instruction_set, parse_instruction, scene_for, train_instruction_set
from ..prompt_source import text_seed
from ..shapes.world import render
from .base import TASKS, Condition, ConditionSet, GrammarTask, tag_metrics

TRAIN_SCENES_PER_INSTRUCTION = 2
EVAL_ITEMS_PER_KIND = 16  # kinds with few held-out instructions (remove) get more scenes per instruction
EVAL_SEED = 2024


def edit_item(instruction: str, scene_seed: int) -> Condition:
    spec, source, _ = scene_for(instruction, scene_seed)
    return Condition(instruction, inputs={"source_image": render(source)},
                     meta={"tag": spec.kind, "scene_seed": int(scene_seed)})


def scene_seed_of(item: Condition) -> int:
    return int(item.meta.get("scene_seed", text_seed(item.prompt)))


def item_scene(item: Condition):
    """(spec, source objects, target objects) an item names: its instruction with its scene seed."""
    return scene_for(item.prompt, scene_seed_of(item))


@TASKS.register("shapes_edit")
class ShapesEditTask(GrammarTask):
    """Sets: `train` (every training instruction with 2 scenes, drawn kind first) and `eval` (16 items per kind of
    the held-out instructions, each with its own scene)."""
    name = "shapes_edit"
    metric_name = "edit success"
    train_prompts, eval_prompts, parse = (staticmethod(train_instruction_set), staticmethod(eval_instruction_set),
                                          staticmethod(parse_instruction))

    def condition_set(self, name: str) -> ConditionSet:
        if name == "train":
            by_tag = {kind: [edit_item(text, text_seed(text) + k) for text in texts
                             for k in range(TRAIN_SCENES_PER_INSTRUCTION)]
                      for kind, texts in train_instruction_set().items()}
            return ConditionSet([c for items in by_tag.values() for c in items], by_tag)
        if name == "eval":
            texts = eval_instruction_set()
            items = []
            for index, kind in enumerate(KINDS):
                mine = [t for t in texts if parse_instruction(t).kind == kind]
                items += [edit_item(mine[k % len(mine)], EVAL_SEED + 1000 * index + k) for k in range(EVAL_ITEMS_PER_KIND)]
            return ConditionSet(items)
        return super().condition_set(name)

    def evaluate(self, samples, conditions: list[Condition]) -> dict:
        judged = judge_items(samples.to_uint8(), conditions)
        kinds = [parse_instruction(c.prompt).kind for c in conditions]
        clusters = [(c.prompt, scene_seed_of(c)) for c in conditions]
        result = tag_metrics([j.success for j in judged], kinds, KINDS, clusters=clusters)
        result["metrics"] = {name: tag_metrics([getattr(j, name) for j in judged], kinds, KINDS, clusters=clusters)
                             for name in ("requested", "preserved", "off_target")}
        return result


def judge_items(images: np.ndarray, conditions: list[Condition]) -> list:
    """The edit verifier's judgement of each edited uint8 image against its item's source and target scenes."""
    from ..editing.verifier import judge_edit

    return [judge_edit(image, *item_scene(item)) for image, item in zip(images, conditions)]
