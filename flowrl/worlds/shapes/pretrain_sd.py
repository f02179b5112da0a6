"""Pretrain `pipelines/shapes-sd`, the epsilon-prediction default DDPO fine-tunes, on rendered shapes scenes.

It reuses the trained AutoencoderKL of shapes-sd3 (same latent space, no second VAE stage) and trains a fresh
UNet2DConditionModel and CLIP text encoder jointly with the DDPM noise-prediction loss
(x_t = sqrt(a_t) x0 + sqrt(1 - a_t) eps, t uniform over the 1000 training steps, target eps), with caption
dropout for CFG and an EMA of the weights, in the same loop as shapes-sd3 (`train_denoiser`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from flowrl.worlds.shapes.model_sd import ShapesSDSize, build_pipeline
from flowrl.worlds.shapes.pretrain_sd3 import CARD_EVAL, PretrainConfig, images_to_tensor, train_denoiser


@dataclass
class ShapesSDPretrainConfig(PretrainConfig):
    flow_steps: int = 2000  # denoiser steps (the field name is shared with the flow recipe)
    vae_steps: int = 0  # the VAE comes from shapes-sd3


def pretrain_shapes_sd(
    cfg: ShapesSDPretrainConfig, vae_from: str | Path = "pipelines/shapes-sd3", size: ShapesSDSize | None = None
):
    from diffusers import AutoencoderKL

    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    size = size or ShapesSDSize()
    vae = AutoencoderKL.from_pretrained(Path(vae_from) / "vae", dtype=torch.float32, local_files_only=True)
    pipe = build_pipeline(vae, size, seed=cfg.seed)
    alphas = pipe.scheduler.alphas_cumprod.float()

    def batch_loss(images, prompts):
        with torch.no_grad():
            x0 = vae.encode(images_to_tensor(images)).latent_dist.sample(generator) * vae.config.scaling_factor
        t = torch.randint(0, len(alphas), (len(x0),), generator=generator)
        noise = torch.randn(x0.shape, generator=generator)
        a = alphas[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        embeds = pipe.text_encoder(
            pipe.tokenizer(
                prompts, padding="max_length", max_length=pipe.tokenizer.model_max_length, return_tensors="pt"
            ).input_ids
        )[0]
        return (pipe.unet(xt, t, encoder_hidden_states=embeds).sample - noise).pow(2).mean()

    start = time.time()
    loss = train_denoiser([pipe.unet, pipe.text_encoder], batch_loss, cfg, rng, "pretrain unet")
    facts = {
        "config": asdict(cfg),
        "size": asdict(size),
        "vae_from": str(vae_from),
        "unet_final_loss": loss,
        "total_minutes": (time.time() - start) / 60,
    }
    pipe.to(torch.float16)
    return copy.deepcopy(pipe), facts


def card_text(facts: dict, result: dict, table: str) -> str:
    cfg, size = facts.get("config", {}), facts.get("size", {})
    return f"""# shapes-sd: flowrl's embedded epsilon-prediction pipeline (the DDPO default)

A tiny `StableDiffusionPipeline` (diffusers format, fp16 safetensors) trained from scratch on the shapes world.
Where `pipelines/shapes-sd3` is a rectified-flow model, this one predicts noise and samples with DDIM, the setting
DDPO was defined in.

```python
from diffusers import StableDiffusionPipeline

pipe = StableDiffusionPipeline.from_pretrained("pipelines/shapes-sd")
image = pipe(
    "a red circle left of a blue square", height=32, width=32, num_inference_steps=20, guidance_scale=4.5
).images[0]
```

## Components
- unet: `UNet2DConditionModel`, channels {size.get("channels")}, cross-attention at 8x8, on a 16x16x4 latent.
- text encoder: `CLIPTextModel` (hidden {size.get("text_hidden")}, {size.get("text_layers")} layers) with the \
project's word-level tokenizer.
- vae: the `AutoencoderKL` of {facts.get("vae_from")} (shared latent space; SD pipelines apply no latent shift).
- scheduler: `DDIMScheduler` (scaled-linear betas 0.00085..0.012, 1000 training steps, epsilon prediction).

## How it was trained
`flowrl pretrain shapes-sd` (seed {cfg.get("seed")}), on 2 CPU cores: {cfg.get("flow_steps")} steps, batch \
{cfg.get("flow_batch")} fresh renders,
DDPM noise-prediction loss with t uniform, AdamW lr {cfg.get("flow_lr")} (warm-up {cfg.get("warmup_steps")}, cosine), \
{cfg.get("caption_dropout")} caption
dropout, EMA {cfg.get("ema_decay")} (saved weights are the EMA); UNet and text encoder train jointly. Final loss
{facts.get("unet_final_loss", float("nan")):.4f}; {facts.get("total_minutes", float("nan")):.1f} minutes.

## Measured scores
Shapes verifier accuracy on the eval split (36 prompts, colour-shape combinations held out of RL training),
{CARD_EVAL["num_per_prompt"]} images per prompt, seed {CARD_EVAL["seed"]}, deterministic DDIM {CARD_EVAL["num_steps"]} \
steps, CFG {CARD_EVAL["guidance_scale"]}; overall = mean of the six tags.

```
{table}
```
![samples](samples.png)
"""
