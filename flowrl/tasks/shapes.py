"""The shapes world as a task: GenEval-style prompt splits, the rule-based verifier's per-tag accuracy, rendered
(image, prompt) pairs as pretraining data, and the defaults of the embedded shapes pipelines."""
from __future__ import annotations

import numpy as np

from ..eval.shapes import shapes_accuracy
from ..shapes.prompts import eval_prompt_set, parse_prompt, train_prompt_set
from .base import TASKS, Condition, ConditionSet, Task, tagged_set

SHAPES_DEFAULTS = {
    "pipeline": {"path": "pipelines/shapes-sd3", "height": 32, "width": 32, "max_sequence_length": 16},
    "reward": [{"name": "shapes", "weight": 1.0, "params": {"dense": True}}],
    "prompts": {"source": "train"},
    "eval": {"prompts": "eval"},
}


def conditions(prompts: list[str]) -> list[Condition]:
    return [Condition(p) for p in prompts]


@TASKS.register("shapes")
class ShapesTask(Task):
    name = "shapes"
    metric_name = "shapes verifier accuracy"
    set_names = ("train", "eval")
    defaults = SHAPES_DEFAULTS

    def condition_set(self, name: str) -> ConditionSet:
        if name == "train":  # every GenEval tag gets the same share
            return tagged_set(train_prompt_set())
        if name == "eval":
            return ConditionSet(conditions(eval_prompt_set()))
        return super().condition_set(name)

    def check(self, item: Condition) -> None:
        parse_prompt(item.prompt)  # ValueError naming the prompt when it is not in the grammar

    @classmethod
    def commands(cls):
        from .shapes_cli import COMMANDS

        return COMMANDS

    def evaluate(self, samples, items: list[Condition]) -> dict:
        return shapes_accuracy(samples.to_uint8(), [c.prompt for c in items])

    def data_batch(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
        from ..shapes.scenes import sample_pairs

        return sample_pairs(count, rng)
