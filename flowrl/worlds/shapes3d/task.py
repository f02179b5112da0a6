"""The 3D shapes world as a task: condition items (a prompt and the seed of the solid whose render conditions the
pipeline), evaluation of generated fields against those solids, and the `flowrl pretrain shapes3d` recipe of the
embedded image-to-3D pipeline."""

from __future__ import annotations

from flowrl.tasks.base import TASKS, ConditionSet, GrammarTask, tag_metrics
from flowrl.worlds.shapes3d.prompts import TAGS, eval_prompt_set, parse_prompt, train_prompt_set


@TASKS.register("shapes3d")
class Shapes3DTask(GrammarTask):
    """Sets: `train` (every training prompt with 4 solids, drawn tag first) and `eval` (16 items per tag of the
    held-out prompts, each with its own solid). Evaluation: volume IoU (the overall), with Chamfer, F-score and
    validity per tag under 'metrics'."""

    name = "shapes3d"
    metric_name = "volume IoU"
    train_prompts, eval_prompts, parse = (
        staticmethod(train_prompt_set),
        staticmethod(eval_prompt_set),
        staticmethod(parse_prompt),
    )
    defaults = {"pipeline": {"path": "pipelines/shapes3d-flow"}}

    def condition_set(self, name: str) -> ConditionSet:
        from flowrl.worlds.shapes3d.conditions import eval_conditions, train_conditions

        if name == "train":
            by_tag = train_conditions()
            return ConditionSet([c for items in by_tag.values() for c in items], by_tag)
        if name == "eval":
            return ConditionSet(eval_conditions())
        return super().condition_set(name)

    def condition_image(self, item):
        """The condition image (uint8 [32, 32, 3]) of a prompt of the grammar: the render of the solid it names
        (ValueError for a prompt outside the grammar)."""
        from flowrl.worlds.shapes3d.conditions import world_image

        return world_image(item)

    def evaluate(self, samples, conditions) -> dict:
        from flowrl.worlds.shapes3d.conditions import solid_of
        from flowrl.worlds.shapes3d.metrics import evaluate_fields

        tags = [parse_prompt(item.prompt).tag for item in conditions]
        report = evaluate_fields(samples.grids(), [solid_of(item) for item in conditions], tags)
        # the headline with its standard errors, each condition (its solid) the sampling unit
        solids = [(item.prompt, item.meta.get("solid_seed")) for item in conditions]
        ious = [r["iou"] for r in report.pop("rows")]
        return {**tag_metrics(ious, tags, TAGS, clusters=solids), "metrics": report}

    @classmethod
    def commands(cls):
        return COMMANDS


IMAGE_PIPELINE = "pipelines/shapes3d-flow"
TEXT_PIPELINE = "pipelines/shapes3d-text"


def pretrain_shapes3d(args) -> None:
    """`flowrl pretrain shapes3d`: the embedded image-to-3D flow pipeline and its card."""
    _pretrain(args, condition="image")


def pretrain_shapes3d_text(args) -> None:
    """`flowrl pretrain shapes3d-text`: the embedded text-to-3D flow pipeline (on shapes3d-flow's autoencoder, so
    both share one latent space) and its card."""
    _pretrain(args, condition="text")


def _pretrain(args, condition: str) -> None:
    import json
    from pathlib import Path

    import torch

    from flowrl.errors import UserError
    from flowrl.pretrain_progress import recipe_progress
    from flowrl.report import save_json
    from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline
    from flowrl.worlds.shapes3d.pretrain import Shapes3DPretrainConfig, evaluate_3d
    from flowrl.worlds.shapes3d.pretrain import pretrain_shapes3d as train

    out = Path(args.out)
    cfg = Shapes3DPretrainConfig(seed=args.seed, condition=condition)
    if condition == "text":
        if getattr(args, "vae_steps", None) is not None:
            raise UserError(
                "--vae-steps: the shapes3d-text recipe trains no autoencoder (it reuses shapes3d-flow's); leave it out"
            )
        cfg.autoencoder = IMAGE_PIPELINE
        if not (Path(IMAGE_PIPELINE) / "autoencoder").is_dir():
            raise UserError(
                f"{IMAGE_PIPELINE}/autoencoder not found: the text recipe reuses shapes3d-flow's autoencoder"
            )
    for name in ("vae_steps", "flow_steps"):  # the shapes recipes' flags: --vae-steps sets the autoencoder's
        if getattr(args, name, None) is not None:
            setattr(cfg, "ae_steps" if name == "vae_steps" else name, getattr(args, name))
    recipe = "shapes3d-text" if condition == "text" else "shapes3d"
    pipe, facts = train(cfg, progress=recipe_progress(args, recipe, cfg))
    save_pipeline(pipe, out, facts)
    pipe.to(torch.float32)
    result = evaluate_3d(pipe, eval_prompt_set())
    save_json(out / "eval.json", result)  # (a Chamfer NaN as null)
    (out / "README.md").write_text(card_text(facts, result))
    print(json.dumps(result, indent=2))


def card_text(facts: dict, result: dict) -> str:
    cfg, size = facts.get("config", {}), facts.get("size", {})
    text = cfg.get("condition") == "text"
    rows = "\n".join(
        f"{tag:<14}"
        + "".join(f"{m[k]:>10.3f}" for k in ("iou", "chamfer", "fscore", "valid"))
        + f"{result['counts'][tag]:>6}"
        for tag, m in result["tags"].items()
    )
    o = result["overall"]
    name, recipe, kind, folder = (
        ("shapes3d-text", "shapes3d-text", "text-to-3D", TEXT_PIPELINE)
        if text
        else ("shapes3d-flow", "shapes3d", "image-to-3D", IMAGE_PIPELINE)
    )
    condition = "a prompt of the world's grammar, read word by word" if text else "a 32x32 render from a fixed view"
    call = (
        'out = pipe(prompt="a cone on top of a box", num_inference_steps=20, guidance_scale=3.0)'
        if text
        else "out = pipe(image, num_inference_steps=20, guidance_scale=3.0)   # image: PIL / uint8 [32, 32, 3]"
    )
    autoencoder = (
        f"- autoencoder: shapes3d-flow's, reused unchanged (`{cfg.get('autoencoder')}`): both pipelines share one "
        "latent space."
        if text
        else f"""- autoencoder: `ShapeAutoencoder` ({size.get("num_tokens")} latent tokens x \
{size.get("latent_channels")} channels; width {size.get("ae_width")}, {size.get("ae_decoder_layers")} decoder blocks): \
{cfg.get("surface_points")} surface
  points in, an SDF queried at any point out; final L1 {facts.get("ae_final_l1", float("nan")):.4f} (truncated SDF), \
sign right at
  {100 * facts.get("ae_sign_accuracy", float("nan")):.1f}% of query points."""
    )
    context = (
        "cross-attention to the prompt's word embeddings after one self-attention block"
        if text
        else "cross-attention to the image's 4x4 patches"
    )
    autoencoder_training = (
        "no autoencoder training"
        if text
        else f"autoencoder {cfg.get('ae_steps')} steps of {cfg.get('ae_batch')} solids "
        f"({facts.get('ae_minutes', float('nan')):.1f} min)"
    )
    return f"""# {name}: flowrl's embedded {kind} flow pipeline

A tiny {kind} flow model shaped like Hunyuan3D-2 / 3DShape2VecSet, trained from scratch on the 3D shapes world
(solids of one to three primitives; the condition is {condition}). It exists so that 3D RL
(DHO, GRPO, NFT) runs and is measured on a laptop CPU with no downloads.

```python
import flowrl.worlds.shapes3d.pipeline  # registers the pipeline class with diffusers
from diffusers import DiffusionPipeline

pipe = DiffusionPipeline.from_pretrained("{folder}")
{call}
out.meshes[0].export("shape.glb")
```

## Components
{autoencoder}
- transformer: `ShapeFlowTransformer` ({size.get("layers")} blocks, width {size.get("width")}, adaLN on t, \
{context}).
- scheduler: `FlowMatchEulerDiscreteScheduler` (shift 1); CFG against the {
        "empty prompt" if text else "all-zero image"
    }.

## How it was trained
`flowrl pretrain {recipe}` (seed {cfg.get("seed")}), on 2 CPU cores: {autoencoder_training}; a pool
of {cfg.get("flow_pool")} encoded training solids with their {"prompts" if text else "renders"} \
({facts.get("pool_minutes", float("nan")):.1f} min); flow matching
{cfg.get("flow_steps")} steps of {cfg.get("flow_batch")}, logit-normal t, 10% unconditional, EMA {
        cfg.get("ema_decay")
    } \
({facts.get("flow_minutes", float("nan")):.1f} min). Total {facts.get("total_minutes", float("nan")):.1f} minutes.

## Measured scores
The eval split's held-out combinations, 4 solids per prompt (seed 2024), 20 Euler steps, CFG 3, SDF on a 32^3 grid:
volume IoU, Chamfer (L2, mean of both directions), F-score at 0.05, valid (watertight, no floaters).{
        " A prompt does not say its solid's 10% size jitter or its small shift, so IoU 1 is out of reach."
        if text
        else ""
    }

```
tag                  iou   chamfer    fscore     valid     n
{rows}
overall       {o["iou"]:>10.3f}{o["chamfer"]:>10.3f}{o["fscore"]:>10.3f}{o["valid"]:>10.3f}
```
"""


def _commands():
    from flowrl.cli import TaskCommands

    return TaskCommands(
        pretrain={"shapes3d": pretrain_shapes3d, "shapes3d-text": pretrain_shapes3d_text},
        pretrain_out={"shapes3d": IMAGE_PIPELINE, "shapes3d-text": TEXT_PIPELINE},
        pretrain_help=(
            "shapes3d -> pipelines/shapes3d-flow (image-to-3D flow pipeline); shapes3d-text -> pipelines/shapes3d-text"
            " (text-to-3D, on shapes3d-flow's autoencoder)"
        ),
    )


COMMANDS = _commands()
