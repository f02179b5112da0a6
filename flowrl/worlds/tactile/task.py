"""The visuo-tactile world as a task: its train and eval pairs as conditions (the material's description as the
prompt, the camera image and relative depth as inputs, the pair's material and seed to re-render the truth) and the
`flowrl pretrain tactile` recipe of the embedded generator with its card."""

from __future__ import annotations

from dataclasses import asdict

from flowrl.tasks.base import TASKS, Condition, ConditionSet, Task

SET_SEEDS = {"train": 0, "eval": 1}
SET_SIZES = {"train": 256, "eval": 64}
IMAGE_SIZE = 32


def world_pairs(name: str, count: int | None = None):
    """The clean pairs of set `name` (train or eval), fixed by the set's seed."""
    from flowrl.worlds.tactile.scenes import make_pairs

    return make_pairs(count or SET_SIZES[name], IMAGE_SIZE, SET_SEEDS[name], name, 0.0, 0.0, 0.0)


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
        from flowrl.worlds.tactile.metrics import to_uint8

        items = [
            Condition(
                pair.description,
                inputs={"rgb": to_uint8(pair.rgb), "depth": to_uint8(pair.depth.expand(3, -1, -1))},
                meta={"material": asdict(pair.material), "pair_seed": pair.meta["seed"]},
            )
            for pair in world_pairs(name)
        ]
        return ConditionSet(items)

    @classmethod
    def commands(cls):
        return COMMANDS


def pretrain_tactile(args) -> None:
    """`flowrl pretrain tactile`: the embedded visual-to-tactile generator and its card."""
    import json
    from pathlib import Path

    import torch

    from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline
    from flowrl.worlds.tactile.metrics import generator_ssim
    from flowrl.worlds.tactile.pretrain import TactilePretrainConfig
    from flowrl.worlds.tactile.pretrain import pretrain_tactile as train

    out = Path(args.out)
    cfg = TactilePretrainConfig(seed=args.seed)
    for name in ("vae_steps", "flow_steps"):
        if getattr(args, name, None) is not None:
            setattr(cfg, name, getattr(args, name))
    pipe, facts = train(cfg)
    save_pipeline(pipe, out, facts)
    pipe.to(torch.float32)
    pairs = world_pairs("eval")
    result = {
        "true description": generator_ssim(pipe, pairs, [p.description for p in pairs]),
        "no description": generator_ssim(pipe, pairs, [""] * len(pairs)),
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "README.md").write_text(card_text(facts, result))
    print(json.dumps(result, indent=2))


def card_text(facts: dict, result: dict) -> str:
    cfg = facts.get("config", {})
    rows = "\n".join(f"| {k} | {v['ssim']:.3f} +- {1.96 * v['stderr']:.3f} | {v['n']} |" for k, v in result.items())
    return f"""# shapes-tactile-sdxl: flowrl's embedded visual-to-tactile generator

A tiny `StableDiffusionXLControlNetPipeline` with two ControlNets (the camera's RGB patch and its relative depth),
trained from scratch on the visuo-tactile world's clean training pairs; it draws the optical tactile image
(DIGIT-style) of a material from what a camera sees of it and its description. It exists so that visual-to-tactile
RL runs and is measured on a laptop CPU with no downloads.

```python
from diffusers import StableDiffusionXLControlNetPipeline
pipe = StableDiffusionXLControlNetPipeline.from_pretrained("pipelines/shapes-tactile-sdxl")
tactile = pipe("woven, fine pitch, diagonal, soft, low friction", image=[rgb, depth], height=32, width=32,
               num_inference_steps=20, guidance_scale=3.0).images[0]
```

## Training
{cfg.get("pool")} clean pairs of the training material combinations; autoencoder {cfg.get("vae_steps")} steps,
UNet + ControlNets + text encoders {cfg.get("flow_steps")} steps (batch {cfg.get("flow_batch")}, lr
{cfg.get("flow_lr")}); {facts.get("total_minutes", 0):.1f} minutes on the machine that made it.

## Held-out materials (64 pairs of combinations never trained on; 20 DDIM steps, CFG 3)

| description given | SSIM against the sensor's image (95%) | pairs |
|---|---|---|
{rows}
"""


def _commands():
    from flowrl.cli import TaskCommands

    return TaskCommands(
        pretrain={"tactile": pretrain_tactile},
        pretrain_out={"tactile": "pipelines/shapes-tactile-sdxl"},
        pretrain_help="tactile -> pipelines/shapes-tactile-sdxl (visual-to-tactile SDXL ControlNet pipeline)",
    )


COMMANDS = _commands()
