"""Components of the embedded `pipelines/shapes-sd` StableDiffusionPipeline: the epsilon-prediction, DDIM-sampled
default that DDPO fine-tunes (the flow default is shapes-sd3).

A small `UNet2DConditionModel` on a 16x16x4 latent (cross-attention at 8x8), one `CLIPTextModel`, the project's
word-level tokenizer, and the AutoencoderKL of shapes-sd3 (shared, so both defaults see the same latent space;
SD pipelines decode latents / scaling_factor with no shift, and the shapes-sd3 shift is ~0.03, so it is dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from transformers import CLIPTextModel

from flowrl.worlds.shapes.tokenizer import (
    build_tokenizer,
    shapes_vocabulary,
    word_clip_config,
)


@dataclass
class ShapesSDSize:
    channels: tuple[int, int] = (32, 64)
    head_dim: int = 8
    text_hidden: int = 64
    text_layers: int = 3


def build_unet(size: ShapesSDSize, seed: int) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=size.channels,
        # cross-attention at 8x8 only: at 16x16 it costs most of the step on a CPU
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=size.text_hidden,
        attention_head_dim=size.head_dim,
        norm_num_groups=16,
    )


def build_text_encoder(size: ShapesSDSize, seed: int) -> CLIPTextModel:
    torch.manual_seed(seed)
    return CLIPTextModel(word_clip_config(len(shapes_vocabulary()), size.text_hidden, size.text_layers))


def ddim_scheduler() -> DDIMScheduler:
    return DDIMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type="epsilon",
    )


def build_pipeline(vae: AutoencoderKL, size: ShapesSDSize | None = None, seed: int = 0) -> StableDiffusionPipeline:
    """A shapes-sd pipeline with a fresh UNet and text encoder around a trained VAE."""
    size = size or ShapesSDSize()
    vae.register_to_config(shift_factor=None)
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=build_text_encoder(size, seed + 2),
        tokenizer=build_tokenizer(),
        unet=build_unet(size, seed),
        scheduler=ddim_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
