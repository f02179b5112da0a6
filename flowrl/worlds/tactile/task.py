"""The visuo-tactile world as a task: its train and eval pairs as conditions (the material's description as the
prompt, the camera image and relative depth as inputs, the pair's material and seed to re-render the truth); its
`flowrl pretrain` recipes are in `recipes`."""

from __future__ import annotations

from dataclasses import asdict

from flowrl.tasks.base import TASKS, Condition, ConditionSet, Task, tag_metrics
from flowrl.worlds.tactile.scenes import world_pairs


@TASKS.register("tactile")
class TactileTask(Task):
    """Sets: `train` (256 pairs of the training material combinations) and `eval` (64 pairs of the held-out ones).
    Each condition's prompt is the material's true description; its inputs the camera image and the depth (uint8
    [H, W, 3])."""

    name = "tactile"
    metric_name = "SSIM"
    set_names = ("train", "eval")
    defaults = {"pipeline": {"path": "pipelines/shapes-tactile-sdxl"}}

    def condition_set(self, name: str) -> ConditionSet:
        if name not in self.set_names:
            return super().condition_set(name)
        from flowrl.images import to_uint8

        items = [
            Condition(
                pair.description,
                inputs={"rgb": to_uint8(pair.rgb[None])[0], "depth": to_uint8(pair.depth.expand(1, 3, -1, -1))[0]},
                meta={"material": asdict(pair.material), "pair_seed": pair.meta["seed"], "tag": pair.material.kind},
            )
            for pair in world_pairs(name)
        ]
        return ConditionSet(items)

    def evaluate(self, samples, conditions: list[Condition]) -> dict:
        """SSIM of each generated tactile image against the sensor's image of its condition's material, by kind."""
        from flowrl.images import to_unit
        from flowrl.worlds.tactile.materials import KINDS
        from flowrl.worlds.tactile.rewards import TactileSSIM

        images = to_unit(samples.to_uint8())
        prompts = [item.prompt for item in conditions]
        values = TactileSSIM()(images, prompts, {"conditions": conditions}).scores.tolist()
        tags = [item.meta["material"]["kind"] for item in conditions]
        clusters = [(item.prompt, item.meta["pair_seed"]) for item in conditions]
        return tag_metrics(values, tags, KINDS, clusters=clusters)

    @classmethod
    def commands(cls):
        from flowrl.worlds.tactile.recipes import COMMANDS

        return COMMANDS
