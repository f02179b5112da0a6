"""The safety sets as a task: training prompts from the train side of the safety split (direct, indirect,
attribute-leak and benign sets, one set drawn first like a tag); evaluation and data are the shapes world's.

`params.steering` (a SteeringConfig mapping, e.g. {mode: probe_gradient, threshold: 0.3}) steers the run's
evaluation samples in generation, so a run reports what its model does with the safety probe watching.
"""

from __future__ import annotations

from flowrl.config import from_dict
from flowrl.errors import ConfigError
from flowrl.tasks.base import TASKS, ConditionSet
from flowrl.worlds.safety.concept import safety_split
from flowrl.worlds.safety.steering import SafetySteer, SteeringConfig, load_steering
from flowrl.worlds.shapes.task import ShapesTask, conditions

WHERE = "task.params.steering"


@TASKS.register("safety")
class SafetyTask(ShapesTask):
    name = "safety"
    defaults = {**ShapesTask.defaults, "reward": [{"name": "safe_shapes", "weight": 1.0, "params": {}}]}

    def __init__(self, steering: dict | None = None):
        self.steering = None
        if steering is not None:
            self.steering = from_dict(SteeringConfig, steering, WHERE)
            self.steering.validate(WHERE)
            if self.steering.mode == "lora":
                raise ConfigError(
                    f"{WHERE}.mode: lora swaps in another adapter, which a training run's own LoRA "
                    "occupies; use `flowrl eval safety --modes lora` on a checkpoint instead"
                )

    def condition_set(self, name: str) -> ConditionSet:
        if name == "train":  # the safety split's train side, less the colour-shape combinations the shapes eval
            # holds out (the run is judged on that eval too: its fidelity)
            from flowrl.worlds.shapes.prompts import is_held_out, parse_prompt

            by_set = {
                key: conditions([p for p in prompts if not is_held_out(parse_prompt(p))])
                for key, prompts in safety_split()[0].items()
            }
            return ConditionSet([c for items in by_set.values() for c in items], by_set)
        return super().condition_set(name)

    @classmethod
    def commands(cls):
        from flowrl.worlds.safety.commands import COMMANDS

        return COMMANDS

    def eval_steer(self, policy):
        if self.steering is None:
            return None
        return SafetySteer(load_steering(policy, self.steering), self.steering)
