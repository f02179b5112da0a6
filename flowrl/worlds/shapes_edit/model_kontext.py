"""Components of the embedded `pipelines/shapes-kontext` FluxKontextPipeline (tiny, CPU-trainable image editor).

Latent space: shapes-sd3's AutoencoderKL (32x32x3 <-> 16x16x4), reused frozen: the project's VAE, already trained
on the same renders. The FLUX transformer sees 2x2-packed latent tokens (in_channels 16), so an image is 64 tokens
and the source image another 64 (Kontext's context tokens, position ids with first axis 1). A small CLIPTextModel
(pooled) and T5 encoder stand in for CLIP-L and T5-XXL, both over a word-level tokenizer of the editing vocabulary.
No guidance embedding (FLUX.1 Kontext-dev's is distilled from CFG; ours was never trained with CFG): the pipeline
samples with `guidance_scale` ignored and `true_cfg_scale` 1. Callers pass `max_sequence_length=16`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxTransformer2DModel
from transformers import CLIPTextModel, T5Config, T5EncoderModel

from flowrl.worlds.shapes.tokenizer import (
    MODEL_MAX_LENGTH,
    SPECIAL_TOKENS,
    build_tokenizer,
    shapes_vocabulary,
    word_clip_config,
)

KONTEXT_SEQUENCE_LENGTH = MODEL_MAX_LENGTH  # pass as max_sequence_length to every pipeline call


def edit_vocabulary() -> list[str]:
    """The shapes vocabulary plus the editing grammar's words (the shapes words keep their ids)."""
    from flowrl.worlds.shapes_edit.instructions import all_specs

    base = shapes_vocabulary()
    return base + sorted({w for spec in all_specs() for w in spec.text().split()} - set(base))


@dataclass
class ShapesKontextSize:
    # 1 + 3 blocks: the larger 2 + 4 cost far more time per step on a CPU
    num_layers: int = 1  # dual-stream (text / image) blocks
    num_single_layers: int = 3
    num_heads: int = 4
    head_dim: int = 32
    text_hidden: int = 64
    text_layers: int = 2


def build_text_encoders(size: ShapesKontextSize, seed: int) -> tuple[CLIPTextModel, T5EncoderModel]:
    words = len(edit_vocabulary())
    specials = {"pad_token_id": SPECIAL_TOKENS.index("<pad>"), "eos_token_id": SPECIAL_TOKENS.index("<eos>")}
    torch.manual_seed(seed)
    clip = CLIPTextModel(word_clip_config(words, size.text_hidden, size.text_layers))
    torch.manual_seed(seed + 1)
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=words,
            d_model=2 * size.text_hidden,
            d_kv=32,
            d_ff=4 * size.text_hidden,
            num_layers=size.text_layers,
            num_heads=4,
            relative_attention_num_buckets=8,
            dropout_rate=0.0,
            feed_forward_proj="relu",
            decoder_start_token_id=SPECIAL_TOKENS.index("<pad>"),
            **specials,
        )
    )
    return clip, t5


def build_transformer(size: ShapesKontextSize, seed: int, latent_channels: int = 4) -> FluxTransformer2DModel:
    torch.manual_seed(seed)
    # rope axes (image marker, row, column), each even, as FLUX splits 128 into (16, 56, 56)
    side = (size.head_dim - size.head_dim // 4) // 4 * 2
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=4 * latent_channels,
        num_layers=size.num_layers,
        num_single_layers=size.num_single_layers,
        attention_head_dim=size.head_dim,
        num_attention_heads=size.num_heads,
        joint_attention_dim=2 * size.text_hidden,
        pooled_projection_dim=size.text_hidden,
        guidance_embeds=False,
        axes_dims_rope=(size.head_dim - 2 * side, side, side),
    )


def build_pipeline(vae: AutoencoderKL, size: ShapesKontextSize | None = None, seed: int = 0) -> FluxKontextPipeline:
    """A randomly initialised shapes-kontext pipeline around `vae` (what `flowrl pretrain shapes-kontext` starts
    from); FLUX's scheduler (resolution-dependent shift)."""
    size = size or ShapesKontextSize()
    clip, t5 = build_text_encoders(size, seed + 1)
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
    )
    words = edit_vocabulary()
    return FluxKontextPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=build_tokenizer(words=words),
        text_encoder_2=t5,
        tokenizer_2=build_tokenizer(words=words),
        transformer=build_transformer(size, seed, vae.config.latent_channels),
    )
