"""The world's `flowrl pretrain` recipes, each into its folder under pipelines/ with a card:

- `tactile-encoder` -> shapes-tactile-encoder: the camera and tactile encoders (contrastive; curation features and
  the learned similarity);
- `tactile-depth` -> shapes-tactile-depth: the monocular depth network;
- `tactile-describer` -> shapes-tactile-describer: the description policy, fine-tuned on true descriptions;
- `tactile` -> shapes-tactile-sdxl: the visual-to-tactile generator (its card scores with the encoder when that
  folder exists, so train the encoder first).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ENCODER = "pipelines/shapes-tactile-encoder"
DEPTH = "pipelines/shapes-tactile-depth"
DESCRIBER = "pipelines/shapes-tactile-describer"
GENERATOR = "pipelines/shapes-tactile-sdxl"


def _pool(seed: int, count: int = 2048):
    from flowrl.worlds.tactile.pretrain import PairPool

    return PairPool(count, 32, seed)


def _steps(args, default: int) -> int:
    return getattr(args, "steps", None) or default


def pretrain_encoder(args) -> None:
    from flowrl.worlds.tactile.encoders import EncoderConfig, save_encoders, train_encoders

    cfg = EncoderConfig(seed=args.seed)
    cfg.steps = _steps(args, cfg.steps)
    encoders, facts = train_encoders(cfg, _pool(args.seed, cfg.pool))
    out = Path(args.out)
    save_encoders(encoders, out, facts)
    (out / "README.md").write_text(
        f"""# shapes-tactile-encoder: camera and tactile encoders of the visuo-tactile world

Two timm `test_convnext` encoders (`camera/`, `tactile/`, each loadable with
`timm.create_model("local-dir:<folder>", pretrained=True, num_classes=0)`), trained together with a symmetric InfoNCE
on {cfg.pool} clean training pairs ({cfg.steps} steps, batch {cfg.batch}, temperature {cfg.temperature};
{facts["minutes"]:.1f} minutes on the machine that made it). Curation reads pair features from them; the tactile
encoder's cosine similarity between a generated and a recorded tactile image is the learned similarity the world
reports beside SSIM.

Held-out materials ({facts["eval_pairs"]} pairs of combinations never trained on): a camera image retrieves its own
tactile image among them {100 * facts["eval_retrieval_accuracy"]:.1f}% of the time (chance
{100 / facts["eval_pairs"]:.1f}%).
"""
    )
    print(json.dumps({k: v for k, v in facts.items() if k != "config"}, indent=2))


def pretrain_depth(args) -> None:
    from flowrl.worlds.tactile.depthnet import DepthConfig, save_depth, train_depth

    cfg = DepthConfig(seed=args.seed)
    cfg.steps = _steps(args, cfg.steps)
    model, facts = train_depth(cfg, _pool(args.seed, cfg.pool))
    out = Path(args.out)
    save_depth(model, out, facts)
    (out / "README.md").write_text(
        f"""# shapes-tactile-depth: relative depth from the camera image, for the visuo-tactile world

A small convolutional encoder-decoder (flowrl's `DepthNet`, width {cfg.width}) reading relative depth (0 nearest,
[0, 1]) from the 32 px camera patch; the embedded stand-in for Depth-Anything or MiDaS. Load it with
`flowrl.worlds.tactile.depthnet.depth_estimator("{DEPTH}")` (which opens a transformers depth model's folder the
same way). Trained {cfg.steps} steps (batch {cfg.batch}, L1) on {cfg.pool} clean training pairs;
{facts["minutes"]:.1f} minutes on the machine that made it.

Held-out materials: mean absolute error {facts["eval_l1"]:.3f} against the world's relative depth, where predicting
the training mean everywhere scores {facts["eval_l1_of_the_mean"]:.3f}.
"""
    )
    print(json.dumps({k: v for k, v in facts.items() if k != "config"}, indent=2))


def pretrain_describer(args) -> None:
    from flowrl.worlds.tactile.describer import DescriberConfig, accuracy, build_describer, fine_tune, save_describer
    from flowrl.worlds.tactile.scenes import world_pairs

    cfg = DescriberConfig(seed=args.seed)
    cfg.steps = _steps(args, cfg.steps)
    out = Path(args.out)
    model, processor = build_describer(out, cfg.seed)
    facts = fine_tune(model, processor, _pool(args.seed, cfg.pool), cfg)
    held_out = world_pairs("eval")
    result = accuracy(model, processor, held_out)
    facts["eval_accuracy"], facts["eval_stderr"] = result["accuracy"], result["stderr"]
    facts["eval_examples"] = [{"true": p.description, "written": t} for p, t in zip(held_out[:4], result["texts"][:4])]
    save_describer(model, processor, out, facts)
    examples = "\n".join(f"| {e['true']} | {e['written']} |" for e in facts["eval_examples"])
    (out / "README.md").write_text(
        f"""# shapes-tactile-describer: the material-description policy of the visuo-tactile world

A tiny `Qwen2_5_VLForConditionalGeneration` with a word-level tokenizer over the description vocabulary that
writes a material's structured description (kind, pitch, direction, feel, friction) from the camera patch (shown at
56 px: four visual tokens). Fine-tuned on true descriptions for {cfg.steps} steps only (batch {cfg.batch}), on
purpose: the description policy GTPO refines starts imperfect. {facts["minutes"]:.1f} minutes on the machine that
made it.

Held-out materials ({len(held_out)} pairs): greedy descriptions name {100 * facts["eval_accuracy"]:.1f}% of the
attributes right (+- {196 * facts["eval_stderr"]:.1f}, 95%).

| true | written |
|---|---|
{examples}
"""
    )
    print(json.dumps({k: v for k, v in facts.items() if k != "config"}, indent=2))


def pretrain_generator(args) -> None:
    from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline
    from flowrl.worlds.tactile.pretrain import TactilePretrainConfig, pretrain_tactile

    out = Path(args.out)
    if getattr(args, "card_only", False):  # re-measure the trained generator in `out` and rewrite its card
        from diffusers import StableDiffusionXLControlNetPipeline

        pipe = StableDiffusionXLControlNetPipeline.from_pretrained(out).to(torch.float32)
        facts = json.loads((out / "training_facts.json").read_text())
        write_generator_card(pipe, out, facts)
        return
    cfg = TactilePretrainConfig(seed=args.seed)
    for name in ("vae_steps", "flow_steps"):
        if getattr(args, name, None) is not None:
            setattr(cfg, name, getattr(args, name))
    pipe, facts = pretrain_tactile(cfg)
    save_pipeline(pipe, out, facts)
    write_generator_card(pipe.to(torch.float32), out, facts)


def write_generator_card(pipe, out: Path, facts: dict) -> None:
    result = score_generator(pipe)
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "README.md").write_text(generator_card(facts, result))
    print(json.dumps(result, indent=2))


def score_generator(pipe) -> dict:
    """The generator on the held-out pairs with the true and with no description (the world's own depth), scored by
    SSIM and, where the encoder folder exists, the learned similarity."""
    from flowrl.worlds.tactile.metrics import generator_scores
    from flowrl.worlds.tactile.priors import timm_encoder
    from flowrl.worlds.tactile.scenes import world_pairs

    encoder = timm_encoder(Path(ENCODER) / "tactile") if (Path(ENCODER) / "tactile").is_dir() else None
    pairs = world_pairs("eval")
    return {
        "true description": generator_scores(pipe, pairs, [p.description for p in pairs], encoder=encoder),
        "no description": generator_scores(pipe, pairs, [""] * len(pairs), encoder=encoder),
    }


def generator_card(facts: dict, result: dict) -> str:
    cfg = facts.get("config", {})

    def cell(v, key):
        return f"{v[key]:.3f} +- {1.96 * v[key + '_stderr']:.3f}" if key in v else "-"

    rows = "\n".join(f"| {k} | {cell(v, 'ssim')} | {cell(v, 'learned')} | {v['n']} |" for k, v in result.items())
    return f"""# shapes-tactile-sdxl: flowrl's embedded visual-to-tactile generator

A tiny `StableDiffusionXLControlNetPipeline` with two ControlNets (the camera's RGB patch and its relative depth),
trained from scratch on the visuo-tactile world's clean training pairs; it draws the optical tactile image
(DIGIT-style) of a material from what a camera sees of it and its description. It exists so that visual-to-tactile
RL runs and is measured on a laptop CPU with no downloads.

```python
from diffusers import StableDiffusionXLControlNetPipeline

pipe = StableDiffusionXLControlNetPipeline.from_pretrained("{GENERATOR}")
tactile = pipe(
    "woven, fine pitch, diagonal, soft, low friction",
    image=[rgb, depth],
    height=32,
    width=32,
    num_inference_steps=20,
    guidance_scale=3.0,
).images[0]
```

## Training
{cfg.get("pool")} clean pairs of the training material combinations; autoencoder {cfg.get("vae_steps")} steps,
UNet + ControlNets + text encoders {cfg.get("flow_steps")} steps (batch {cfg.get("flow_batch")}, lr
{cfg.get("flow_lr")}); {facts.get("total_minutes", 0):.1f} minutes on the machine that made it.

## Held-out materials (64 pairs of combinations never trained on; the world's depth; 20 DDIM steps, CFG 3)

SSIM against the sensor's image and the learned similarity (the tactile encoder's cosine, from
`{ENCODER}`), each with its 95% interval over pairs.

| description given | SSIM | learned similarity | pairs |
|---|---|---|---|
{rows}
"""


def _commands():
    from flowrl.cli import TaskCommands

    return TaskCommands(
        pretrain={
            "tactile": pretrain_generator,
            "tactile-encoder": pretrain_encoder,
            "tactile-depth": pretrain_depth,
            "tactile-describer": pretrain_describer,
        },
        pretrain_out={
            "tactile": GENERATOR,
            "tactile-encoder": ENCODER,
            "tactile-depth": DEPTH,
            "tactile-describer": DESCRIBER,
        },
        card_only=("tactile",),
        pretrain_help=(
            "tactile -> pipelines/shapes-tactile-sdxl (visual-to-tactile SDXL ControlNet pipeline); tactile-encoder,"
            " tactile-depth, tactile-describer -> pipelines/shapes-tactile-{encoder,depth,describer} (its encoders,"
            " depth network and description policy)"
        ),
    )


COMMANDS = _commands()
