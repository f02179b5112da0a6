"""Pretrain `pipelines/shapes-sd3` from scratch on rendered shapes scenes.

Two stages, both seeded: (1) the AutoencoderKL learns to reconstruct renders (L1 + a small KL term), and its
latent statistics set `scaling_factor` / `shift_factor`; (2) the SD3 transformer and the three text encoders
learn rectified-flow matching (x_t = (1-t) x0 + t eps, target eps - x0, t logit-normal) on VAE latents with
10% of captions dropped for classifier-free guidance. An EMA of the flow weights is what gets saved.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from flowrl.policies.sd3 import encode_images
from flowrl.schedules import cosine_decay, sample_noise_levels
from flowrl.worlds.shapes.model_sd3 import T5_SEQUENCE_LENGTH, ShapesSD3Size, build_pipeline
from flowrl.worlds.shapes.protocol import PROTOCOL
from flowrl.worlds.shapes.scenes import sample_pairs


@dataclass
class PretrainConfig:
    seed: int = 0
    vae_steps: int = 800
    vae_batch: int = 64
    vae_lr: float = 1e-3
    vae_kl_weight: float = 1e-6
    flow_steps: int = 3000
    flow_batch: int = 64
    flow_lr: float = 8e-4
    warmup_steps: int = 300
    caption_dropout: float = 0.1
    ema_decay: float = 0.999
    threads: int = 2
    # how the noise level t is drawn: "logit_normal" (SD3's, weighted to the middle of the path) or "uniform"
    # (rectified flow's original, 1.5x the weight on t > 0.7, where layouts and object counts are decided; it made a
    # worse base here, docs/research/benchmarks.md)
    t_sampling: str = "logit_normal"


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, H, W] in [-1, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def train_vae(vae, cfg: PretrainConfig, rng: np.random.Generator, pairs=sample_pairs) -> dict:
    """Train the autoencoder on fresh images (`pairs(n, rng)[0]`, uint8 [n, H, W, 3]: the shapes world's renders by
    default): L1 plus a small KL; then set its latent shift and scale from 1024 encodings."""
    optimizer = torch.optim.AdamW(vae.parameters(), lr=cfg.vae_lr, weight_decay=0.0)
    vae.train()
    bar = tqdm(range(cfg.vae_steps), desc="pretrain vae", mininterval=5)
    for step in bar:
        images = images_to_tensor(pairs(cfg.vae_batch, rng)[0])
        posterior = vae.encode(images).latent_dist
        reconstruction = vae.decode(posterior.sample()).sample
        l1 = (reconstruction - images).abs().mean()
        loss = l1 + cfg.vae_kl_weight * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = cfg.vae_lr * cosine_decay(step, cfg.vae_steps)
        optimizer.step()
        if step % 50 == 0:
            bar.set_postfix(l1=f"{l1.item():.4f}")
    vae.eval()
    with torch.no_grad():
        latents = torch.cat([vae.encode(images_to_tensor(pairs(256, rng)[0])).latent_dist.sample() for _ in range(4)])
    shift, scale = latents.mean().item(), 1.0 / latents.std().item()
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    return {"vae_final_l1": l1.item(), "latent_shift": shift, "latent_scale": scale}


def encode_captions(pipe, prompts: list[str]):
    """Prompt embeddings with gradients flowing into the text encoders (the pipeline's own encode path)."""
    embeds, _, pooled, _ = pipe.encode_prompt(
        prompts, prompts, prompts, do_classifier_free_guidance=False, max_sequence_length=T5_SEQUENCE_LENGTH
    )
    return embeds, pooled


def train_denoiser(
    modules, batch_loss, cfg, rng: np.random.Generator, desc: str, pairs=sample_pairs, progress=None, streams=None
) -> float:
    """The shared pretraining loop: fresh renders each step (`pairs(n, rng)`: the shapes world's by default), caption
    dropout for CFG, AdamW with warm-up and cosine decay, gradient clipping, and an EMA of the weights that replaces
    them at the end. Returns the last loss.

    `batch_loss(images, prompts)` maps what `pairs` gives (a uint8 batch of renders by default; latents from
    shapes-wan's LatentPool) and its (possibly dropped) captions to a scalar loss.

    `progress` (a PretrainProgress): the loop saves its state as stage `desc` and, run again, continues from it to
    the same weights; `streams`: name -> whatever else the loop draws from or changes (state_dict / load_state_dict:
    a GeneratorState, a latent pool), saved with it.
    """
    params = [p for m in modules for p in m.parameters()]
    ema = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=cfg.flow_lr, weight_decay=0.01)
    streams = streams or {}

    def state(step: int, loss: float) -> dict:
        return {
            "step": step,
            "loss": loss,
            "modules": [m.state_dict() for m in modules],
            "ema": ema,
            "optimizer": optimizer.state_dict(),
            "rng": rng.bit_generator.state,
            "streams": {name: s.state_dict() for name, s in streams.items()},
        }

    start, saved = 0, progress.load(desc) if progress is not None else None
    if saved is not None:
        for m, weights in zip(modules, saved["modules"]):
            m.load_state_dict(weights)
        ema = saved["ema"]
        optimizer.load_state_dict(saved["optimizer"])
        rng.bit_generator.state = saved["rng"]
        for name, s in streams.items():
            s.load_state_dict(saved["streams"][name])
        if saved["step"] == cfg.flow_steps:  # an earlier piece finished this stage (its weights are the EMA's)
            for m in modules:
                m.eval()
            return saved["loss"]
        start = saved["step"]
    for m in modules:
        m.train()
    bar = tqdm(range(start, cfg.flow_steps), desc=desc, mininterval=5, initial=start, total=cfg.flow_steps)
    for step in bar:
        images, prompts = pairs(cfg.flow_batch, rng)
        prompts = ["" if rng.random() < cfg.caption_dropout else p for p in prompts]
        loss = batch_loss(images, prompts)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        warm = min(1.0, (step + 1) / cfg.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = cfg.flow_lr * warm * cosine_decay(step, cfg.flow_steps)
        optimizer.step()
        decay = min(cfg.ema_decay, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema, [p.detach() for p in params], 1 - decay)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
        if progress is not None and progress.due() and step + 1 < cfg.flow_steps:
            progress.save(desc, state(step + 1, loss.item()))
    with torch.no_grad():
        for p, e in zip(params, ema):
            p.copy_(e)
    for m in modules:
        m.eval()
    if progress is not None:
        progress.save(desc, state(cfg.flow_steps, loss.item()))
    return loss.item()


def train_flow(pipe, cfg: PretrainConfig, rng: np.random.Generator, generator: torch.Generator) -> dict:
    vae = pipe.vae

    def batch_loss(images, prompts):
        x0 = encode_images(vae, images, generator)
        t = sample_noise_levels(cfg.t_sampling, cfg.flow_batch, generator)
        noise = torch.randn(x0.shape, generator=generator)
        xt = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * noise
        embeds, pooled = encode_captions(pipe, prompts)
        velocity = pipe.transformer(
            hidden_states=xt, encoder_hidden_states=embeds, pooled_projections=pooled, timestep=t * 1000
        ).sample
        return (velocity - (noise - x0)).pow(2).mean()

    modules = [pipe.transformer, pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3]
    return {"flow_final_loss": train_denoiser(modules, batch_loss, cfg, rng, "pretrain flow")}


def pretrain_shapes_sd3(cfg: PretrainConfig, size: ShapesSD3Size | None = None):
    """Train a shapes-sd3 pipeline from scratch; returns (pipeline, training facts for the model card)."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    size = size or ShapesSD3Size()
    pipe = build_pipeline(size, seed=cfg.seed)
    start = time.time()
    facts = {"config": asdict(cfg), "size": asdict(size)}
    facts.update(train_vae(pipe.vae, cfg, rng))
    facts["vae_minutes"] = (time.time() - start) / 60
    facts.update(train_flow(pipe, cfg, rng, generator))
    facts["total_minutes"] = (time.time() - start) / 60
    pipe.to(torch.float16)
    pipe = copy.deepcopy(pipe)  # detach from autograd state before saving
    return pipe, facts


def save_pipeline(pipe, out_dir, facts: dict) -> None:
    """Write the pipeline in diffusers format (fp16 safetensors) plus the training facts beside it."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    pipe.save_pretrained(out, safe_serialization=True)
    from transformers import PreTrainedModel

    for name, component in pipe.components.items():
        if isinstance(component, PreTrainedModel):
            load_in_fp32_by_default(out / name)
    (out / "training_facts.json").write_text(json.dumps(facts, indent=2) + "\n")


def load_in_fp32_by_default(folder) -> None:
    """Mark a saved transformers model's config to load in fp32 unless `torch_dtype` says otherwise, as diffusers
    loads its own models: transformers 5 loads the stored dtype (fp16 here), and a pipeline mixing fp16 text encoders
    with fp32 denoiser and VAE fails on its first call (`XPipeline.from_pretrained(folder)`, as the cards show)."""
    import json
    from pathlib import Path

    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = "float32"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


CARD_EVAL = PROTOCOL  # the model card reports the runs' eval protocol


def evaluate_and_write_card(out_dir, card_text=None) -> dict:
    """Evaluate the saved pipeline on the shapes eval split (the protocol RL runs use) and write its README
    with `card_text(facts, result, table)` (the shapes-sd3 card by default)."""
    import json
    from pathlib import Path

    from flowrl.inference import generate
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.report import image_grid
    from flowrl.tasks.base import format_metrics
    from flowrl.worlds.shapes.evaluation import shapes_accuracy
    from flowrl.worlds.shapes.prompts import eval_prompt_set

    out = Path(out_dir)
    policy = policy_for(load_pipeline(out), max_sequence_length=T5_SEQUENCE_LENGTH)
    prompts = eval_prompt_set()
    e = CARD_EVAL
    images, records = generate(
        policy, prompts, e["num_per_prompt"], e["seed"], e["num_steps"], e["guidance_scale"], desc="card eval"
    )
    result = shapes_accuracy(images, [r["prompt"] for r in records])
    rows = list(range(0, len(images), e["num_per_prompt"] * 3))[:12]
    columns = [images[[r + k for r in rows]] for k in range(e["num_per_prompt"])]
    image_grid(
        columns,
        [f"seed {k}" for k in range(e["num_per_prompt"])],
        [prompts[r // e["num_per_prompt"]] for r in rows],
        out / "samples.png",
        scale=3,
    )
    facts_path = out / "training_facts.json"
    facts = json.loads(facts_path.read_text()) if facts_path.is_file() else {}
    (out / "eval.json").write_text(json.dumps({"protocol": e, **result}, indent=2) + "\n")
    (out / "README.md").write_text((card_text or _card_text)(facts, result, format_metrics(result, "accuracy")))
    return result


def _card_text(facts: dict, result: dict, table: str) -> str:
    cfg, size = facts.get("config", {}), facts.get("size", {})
    return f"""# shapes-sd3: flowrl's embedded default pipeline

A tiny `StableDiffusion3Pipeline` (diffusers format, fp16 safetensors) trained from scratch on the shapes world
(32x32 renders of coloured circles, squares and triangles with GenEval-style prompts). It exists so that RL
fine-tuning can be run and measured on a laptop CPU with no downloads. It follows prompts imperfectly on purpose:
that is the room RL has to improve it.

```python
from diffusers import StableDiffusion3Pipeline

pipe = StableDiffusion3Pipeline.from_pretrained("pipelines/shapes-sd3")
image = pipe(
    "a red circle left of a blue square",
    height=32,
    width=32,
    num_inference_steps=20,
    guidance_scale=4.5,
    max_sequence_length=16,
).images[0]
```
Pass `max_sequence_length=16`: the T5 branch was trained on 16 tokens (the pipeline's default is 256).

## Components
- transformer: `SD3Transformer2DModel`, {size.get("num_layers")} joint blocks, {size.get("num_heads")} heads x \
{size.get("head_dim")}, patch 2 on a 16x16x4 latent (64 image tokens).
- vae: `AutoencoderKL`, blocks {size.get("vae_channels")}, 4 latent channels, downsampling 2 (32x32x3 <-> 16x16x4);
  scaling_factor {facts.get("latent_scale", float("nan")):.4f}, shift_factor \
{facts.get("latent_shift", float("nan")):.4f} measured on renders.
- text encoders: two `CLIPTextModelWithProjection` (hidden {size.get("text_hidden")}, {size.get("text_layers")} \
layers) and a 2-layer `T5EncoderModel`,
  all with a word-level tokenizer built locally from the shapes vocabulary (`flowrl/worlds/shapes/tokenizer.py`).
- scheduler: `FlowMatchEulerDiscreteScheduler` (shift 1).

## How it was trained
`flowrl pretrain shapes` (seed {cfg.get("seed")}), on 2 CPU cores:
1. VAE: {cfg.get("vae_steps")} steps, batch {cfg.get("vae_batch")}, L1 reconstruction + {cfg.get("vae_kl_weight")} x \
KL; final L1 {facts.get("vae_final_l1", float("nan")):.4f}
   ({facts.get("vae_minutes", float("nan")):.1f} min).
2. Flow matching: {cfg.get("flow_steps")} steps, batch {cfg.get("flow_batch")}, AdamW lr {cfg.get("flow_lr")} (warm-up \
{cfg.get("warmup_steps")}, cosine),
   logit-normal t, {cfg.get("caption_dropout")} caption dropout for CFG, EMA {cfg.get("ema_decay")} (saved weights are \
the EMA);
   the transformer and all three text encoders train jointly on freshly rendered scenes. Final loss \
{facts.get("flow_final_loss", float("nan")):.4f}.
Total {facts.get("total_minutes", float("nan")):.1f} minutes.

## Measured scores
Shapes verifier accuracy on the eval split (`flowrl/worlds/shapes/prompts.py`: 36 prompts, colour-shape combinations \
held
out of RL training), {CARD_EVAL["num_per_prompt"]} images per prompt, seed {CARD_EVAL["seed"]}, ODE (Euler) \
{CARD_EVAL["num_steps"]} steps, CFG {CARD_EVAL["guidance_scale"]}.
Overall is the mean of the six tag accuracies, as in GenEval.

```
{table}
```
![samples](samples.png)
"""


def source_vae(pipeline_dir) -> str:
    """The pipeline folder whose trained VAE a recipe reuses (shapes-sd, shapes-kontext take shapes-sd3's), checked
    before training: one error naming it, not a loader's traceback (the default path is relative to the checkout)."""
    from pathlib import Path

    from flowrl.errors import UserError

    if not (Path(pipeline_dir) / "vae" / "config.json").is_file():
        raise UserError(
            f"--pipeline {pipeline_dir}: no vae/ folder there; this recipe reuses the VAE of a shapes-sd3 "
            f"pipeline (run from the checkout's root, or pass --pipeline)"
        )
    return str(pipeline_dir)
