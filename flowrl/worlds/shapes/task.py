"""The shapes world as a task: GenEval-style prompt splits, the rule-based verifier's per-tag accuracy, rendered
(image, prompt) pairs as pretraining data, and the defaults of the embedded shapes pipelines."""

from __future__ import annotations

import numpy as np

from flowrl.tasks.base import TASKS, Condition, GrammarTask
from flowrl.worlds.shapes.evaluation import shapes_accuracy
from flowrl.worlds.shapes.prompts import eval_prompt_set, parse_prompt, train_prompt_set

SHAPES_DEFAULTS = {
    "pipeline": {"path": "pipelines/shapes-sd3", "height": 32, "width": 32, "max_sequence_length": 16},
    "reward": [{"name": "shapes", "weight": 1.0, "params": {"dense": True}}],
    "prompts": {"source": "train"},
    "eval": {"prompts": "eval"},
}


def conditions(prompts: list[str]) -> list[Condition]:
    return [Condition(p) for p in prompts]


@TASKS.register("shapes")
class ShapesTask(GrammarTask):
    name = "shapes"
    metric_name = "shapes verifier accuracy"
    defaults = SHAPES_DEFAULTS
    train_prompts, eval_prompts, parse = (
        staticmethod(train_prompt_set),
        staticmethod(eval_prompt_set),
        staticmethod(parse_prompt),
    )

    @classmethod
    def commands(cls):
        from flowrl.worlds.shapes.commands import COMMANDS

        return COMMANDS

    def evaluate(self, samples, items: list[Condition]) -> dict:
        return shapes_accuracy(samples.to_uint8(), [c.prompt for c in items])

    def data_batch(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
        from flowrl.worlds.shapes.scenes import sample_pairs

        return sample_pairs(count, rng)
