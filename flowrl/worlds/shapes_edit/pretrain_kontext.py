"""Pretrain `pipelines/shapes-kontext` on the shapes-editing world's instructions.

Each step draws fresh (source, instruction, target) triples: a kind uniformly, one of its RL training instructions
(or, with `pretrain_held_out`, any instruction of the grammar, as shapes-sd3's base learns every prompt and only RL
holds the eval ones out), and a new scene for it; the exact target is rendered. Rectified flow on the target's
latents (x_t = (1-t) x0 + t eps, target eps - x0, logit-normal t) with the source's latents as Kontext's clean
context tokens; the FLUX transformer and both text encoders train jointly, the VAE (shapes-sd3's) stays frozen. No
caption dropout: the editor is sampled without CFG. EMA weights are saved (the shared loop, the shapes world's
pretrain_sd3.train_denoiser).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from flowrl.images import to_unit
from flowrl.policies.flux import kontext_source_latents, kontext_velocity
from flowrl.policies.sd3 import encode_images
from flowrl.schedules import sample_noise_levels
from flowrl.worlds.shapes.pretrain_sd3 import train_denoiser
from flowrl.worlds.shapes.world import render
from flowrl.worlds.shapes_edit.instructions import (
    KINDS,
    all_instruction_set,
    parse_instruction,
    sample_scene,
    train_instruction_set,
)
from flowrl.worlds.shapes_edit.model_kontext import KONTEXT_SEQUENCE_LENGTH, ShapesKontextSize, build_pipeline

DEFAULT_VAE = "pipelines/shapes-sd3"


@dataclass
class KontextPretrainConfig:
    seed: int = 0
    flow_steps: int = 2000  # the card records the run's wall time
    flow_batch: int = 64
    flow_lr: float = 1e-3
    warmup_steps: int = 200
    caption_dropout: float = 0.0
    # the held-out instructions in pretraining too, the image world's protocol (its base is pretrained on every
    # prompt; the eval split is held out of RL only). Off, every eval edit draws a colour-shape pair the editor never
    # produced, and edit GRPO left recolour and add near zero held out. On, the base edits the held-out instructions
    # better, but edit GRPO then learnt nothing on them, so the shipped editor keeps it off (docs/research/editing.md)
    pretrain_held_out: bool = False
    ema_decay: float = 0.998  # a horizon of ~500 steps: a third of this short run
    threads: int = 2


def edit_triples(count: int, rng: np.random.Generator, held_out: bool = False) -> tuple[np.ndarray, list[str]]:
    """`count` fresh training triples: uint8 [count, 2, 32, 32, 3] (source, target) and their instructions, drawn
    from the RL training instructions or (`held_out`) from every instruction."""
    instructions = all_instruction_set() if held_out else train_instruction_set()
    pairs, texts = [], []
    for _ in range(count):
        kind = KINDS[rng.integers(len(KINDS))]
        text = instructions[kind][rng.integers(len(instructions[kind]))]
        source, target = sample_scene(parse_instruction(text), rng)
        pairs.append(np.stack([render(source), render(target)]))
        texts.append(text)
    return np.stack(pairs), texts


def train_editor(pipe, cfg: KontextPretrainConfig, rng: np.random.Generator, generator: torch.Generator) -> dict:
    vae, transformer = pipe.vae, pipe.transformer

    def batch_loss(pairs, instructions):
        with torch.no_grad():
            context = kontext_source_latents(vae, to_unit(pairs[:, 0]))
            x0 = encode_images(vae, pairs[:, 1], generator)
        t = sample_noise_levels("logit_normal", len(x0), generator)
        noise = torch.randn(x0.shape, generator=generator)
        xt = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * noise
        embeds, pooled, _ = pipe.encode_prompt(
            instructions, instructions, device="cpu", max_sequence_length=KONTEXT_SEQUENCE_LENGTH
        )
        velocity = kontext_velocity(pipe, transformer, xt, context, t, embeds, pooled)
        return (velocity - (noise - x0)).pow(2).mean()

    modules = [transformer, pipe.text_encoder, pipe.text_encoder_2]

    def triples(count, rng):
        return edit_triples(count, rng, cfg.pretrain_held_out)

    return {"flow_final_loss": train_denoiser(modules, batch_loss, cfg, rng, "pretrain editor", pairs=triples)}


def pretrain_shapes_kontext(
    cfg: KontextPretrainConfig, vae_dir: str = DEFAULT_VAE, size: ShapesKontextSize | None = None
):
    """Train a shapes-kontext editor from scratch around a trained VAE; returns (pipeline, training facts)."""
    from diffusers import AutoencoderKL

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    size = size or ShapesKontextSize()
    vae = AutoencoderKL.from_pretrained(
        vae_dir, subfolder="vae", torch_dtype=torch.float32, local_files_only=True
    ).requires_grad_(False)
    pipe = build_pipeline(vae, size, seed=cfg.seed)
    facts = {"config": asdict(cfg), "size": asdict(size), "vae_from": vae_dir}
    start = time.time()
    facts.update(train_editor(pipe, cfg, rng, generator))
    facts["total_minutes"] = (time.time() - start) / 60
    pipe.to(torch.float16)
    return copy.deepcopy(pipe), facts


CARD_EVAL = {"num_per_item": 4, "seed": 2024, "num_steps": 20}


def evaluate_editor(
    pipe_dir,
    num_per_item: int = CARD_EVAL["num_per_item"],
    seed: int = CARD_EVAL["seed"],
    num_steps: int = CARD_EVAL["num_steps"],
) -> tuple[dict, np.ndarray, list]:
    """Edit success on the shapes_edit task's eval items (held-out result combinations; what RL runs report), with
    requested / preserved / off-target beside it; returns (result, edited images, their items)."""
    from flowrl.inference import generate_samples
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.policies.base import SampleSpec
    from flowrl.tasks.base import build_task

    task = build_task("shapes_edit")
    items = task.condition_set("eval").items
    policy = policy_for(load_pipeline(pipe_dir), max_sequence_length=KONTEXT_SEQUENCE_LENGTH)
    samples, _ = generate_samples(
        policy, items, num_per_item, seed, num_steps, spec=SampleSpec(32, 32), desc="card eval"
    )
    expanded = [item for item in items for _ in range(num_per_item)]
    return task.evaluate(samples, expanded), samples.to_uint8(), expanded


def write_card(out_dir, facts: dict, result: dict, images: np.ndarray, items: list) -> None:
    import json
    from pathlib import Path

    from flowrl.report import image_grid
    from flowrl.tasks.base import format_metrics

    out = Path(out_dir)
    per_item = CARD_EVAL["num_per_item"]
    rows = [index * per_item for index in range(0, len(items) // per_item, 8)][:10]
    columns = [np.stack([items[r].inputs["source_image"] for r in rows])]
    columns += [images[[r + k for r in rows]] for k in range(per_item)]
    image_grid(
        columns,
        ["source"] + [f"edit, seed {k}" for k in range(per_item)],
        [items[r].prompt for r in rows],
        out / "samples.png",
        scale=3,
    )
    (out / "eval.json").write_text(json.dumps({"protocol": CARD_EVAL, **result}, indent=2) + "\n")
    (out / "README.md").write_text(card_text(facts, result, format_metrics(result, "success")))


def card_text(facts: dict, result: dict, table: str) -> str:
    cfg, size = facts.get("config", {}), facts.get("size", {})
    held_out = cfg.get("pretrain_held_out", False)  # cards written before the option pretrained without them
    pretrained_on = "every instruction of the grammar" if held_out else "the RL training instructions only"
    held_out_note = (
        "; pretraining saw them, as shapes-sd3's base saw every prompt"
        if held_out
        else "; nor did pretraining, so the editor never produced that pair"
    )
    extra = "\n".join(
        f"{name:<14} "
        + "  ".join(f"{tag} {value:.3f}" for tag, value in m["tags"].items())
        + f"  overall {m['overall']:.3f}"
        for name, m in result["metrics"].items()
    )
    return f"""# shapes-kontext: flowrl's embedded instruction-based image editor

A tiny `FluxKontextPipeline` (diffusers format, fp16 safetensors) trained from scratch on the shapes-editing world:
a 32x32 scene of coloured circles, squares and triangles plus an instruction ("make the red circle blue", "move the
square left", "remove the triangle", "add a yellow circle above the red square", "replace the circle with a
triangle"). It exists so that edit RL runs and is measured on a laptop CPU with no downloads. It edits imperfectly
on purpose: that is the room RL has to improve it.

```python
from diffusers import FluxKontextPipeline

pipe = FluxKontextPipeline.from_pretrained("pipelines/shapes-kontext")
edited = pipe(
    image=source,
    prompt="make the red circle blue",
    height=32,
    width=32,
    max_area=32 * 32,
    _auto_resize=False,
    num_inference_steps=20,
    max_sequence_length=16,
).images[0]
```
`source` is a 32x32 RGB image; `_auto_resize=False` and `max_area` keep it at 32x32 (Kontext otherwise resizes to
its preferred ~1 MP resolutions); the text encoders were trained on 16 tokens. No guidance embedding and no CFG.

## Components
- transformer: `FluxTransformer2DModel`, {size.get("num_layers")} dual-stream + {size.get("num_single_layers")} \
single-stream blocks, {size.get("num_heads")} heads x {size.get("head_dim")}, no guidance
  embedding; 64 image tokens (16x16x4 latents packed 2x2) plus 64 context tokens of the source.
- vae: shapes-sd3's `AutoencoderKL` (32x32x3 <-> 16x16x4), frozen.
- text encoders: `CLIPTextModel` (hidden {size.get("text_hidden")}, pooled) and `T5EncoderModel` (d_model \
{2 * size.get("text_hidden", 0)}), {size.get("text_layers")} layers each,
  with a word-level tokenizer of the editing vocabulary (`flowrl/worlds/shapes_edit/model_kontext.py`).
- scheduler: `FlowMatchEulerDiscreteScheduler` with FLUX's resolution-dependent shift.

## How it was trained
`flowrl pretrain shapes-kontext` (seed {cfg.get("seed")}), on 2 CPU cores: {cfg.get("flow_steps")} steps of \
{cfg.get("flow_batch")} fresh (source,
instruction, target) triples of {pretrained_on} (kind drawn uniformly), rectified flow on the target
with the source as context, AdamW lr {cfg.get("flow_lr")} (warm-up {cfg.get("warmup_steps")}, cosine), logit-normal t, \
EMA {cfg.get("ema_decay")}; the
transformer and both text encoders train jointly. Final loss {facts.get("flow_final_loss", float("nan")):.4f}. Total \
{facts.get("total_minutes", float("nan")):.1f} minutes.

## Measured scores
Edit success (the edit verifier: the requested change made and nothing else changed) on the `shapes_edit` task's
eval items: instructions held out of RL training (their resulting object is a colour-shape combination RL
never trains on{held_out_note}), 16 scenes per kind, {CARD_EVAL["num_per_item"]} edits per item (seed \
{CARD_EVAL["seed"]}), ODE (Euler) {CARD_EVAL["num_steps"]} steps. Intervals are 95%:
`95% +-` with the scene as the sampling unit (other scenes), `draw +-` with the scenes fixed (another draw of
seeds). Overall is the mean over the five kinds.

```
{table}
```
Beside it (means per kind; off-target = share of pixels outside the edited region changed from the source):
```
{extra}
```
![samples](samples.png)
"""
