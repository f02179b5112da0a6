"""Components of the embedded `pipelines/shapes-sd3` StableDiffusion3Pipeline (tiny, CPU-trainable).

Latent space: a real AutoencoderKL that halves the resolution (32x32x3 -> 16x16x4); the SD3 transformer
patchifies the latent by 2, so an image is 64 tokens. Two small CLIP text encoders with projection and a small T5
encoder stand in for SD3's CLIP-L/G and T5-XXL; all three share a word-level tokenizer. Callers pass
`max_sequence_length=16` (the pipeline's default of 256 would pad T5 far past what the model was trained on).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from transformers import CLIPTextModelWithProjection, T5Config, T5EncoderModel

from flowrl.worlds.shapes.tokenizer import (
    MODEL_MAX_LENGTH,
    SPECIAL_TOKENS,
    build_tokenizer,
    shapes_vocabulary,
    word_clip_config,
)

T5_SEQUENCE_LENGTH = MODEL_MAX_LENGTH  # pass as max_sequence_length to every pipeline call


@dataclass
class ShapesSD3Size:
    num_layers: int = 6
    num_heads: int = 4
    head_dim: int = 32
    text_hidden: int = 64
    text_layers: int = 3
    text_projection: int = 32
    vae_channels: tuple[int, int] = (16, 32)


def build_text_encoder(size: ShapesSD3Size, seed: int) -> CLIPTextModelWithProjection:
    torch.manual_seed(seed)
    config = word_clip_config(
        len(shapes_vocabulary()), size.text_hidden, size.text_layers, projection_dim=size.text_projection
    )
    return CLIPTextModelWithProjection(config)


def build_t5_encoder(size: ShapesSD3Size, seed: int) -> T5EncoderModel:
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=len(shapes_vocabulary()),
        d_model=2 * size.text_hidden,
        d_kv=32,
        d_ff=4 * size.text_hidden,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
        feed_forward_proj="relu",
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        eos_token_id=SPECIAL_TOKENS.index("<eos>"),
        decoder_start_token_id=SPECIAL_TOKENS.index("<pad>"),
    )
    return T5EncoderModel(config)


def build_vae(size: ShapesSD3Size, seed: int) -> AutoencoderKL:
    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        sample_size=32,
        down_block_types=("DownEncoderBlock2D",) * len(size.vae_channels),
        up_block_types=("UpDecoderBlock2D",) * len(size.vae_channels),
        block_out_channels=size.vae_channels,
        layers_per_block=1,
        norm_num_groups=8,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=False,
        scaling_factor=1.0,
        shift_factor=0.0,
    )  # pretraining sets both from latent statistics


def build_transformer(size: ShapesSD3Size, seed: int) -> SD3Transformer2DModel:
    torch.manual_seed(seed)
    inner = size.num_heads * size.head_dim
    return SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=size.num_layers,
        attention_head_dim=size.head_dim,
        num_attention_heads=size.num_heads,
        joint_attention_dim=2 * size.text_hidden,
        caption_projection_dim=inner,
        pooled_projection_dim=2 * size.text_projection,
        pos_embed_max_size=8,
    )


def build_pipeline(size: ShapesSD3Size | None = None, seed: int = 0) -> StableDiffusion3Pipeline:
    """A randomly initialised shapes-sd3 pipeline (what `flowrl pretrain shapes` starts from)."""
    size = size or ShapesSD3Size()
    return StableDiffusion3Pipeline(
        transformer=build_transformer(size, seed),
        vae=build_vae(size, seed + 1),
        text_encoder=build_text_encoder(size, seed + 2),
        tokenizer=build_tokenizer(),
        text_encoder_2=build_text_encoder(size, seed + 3),
        tokenizer_2=build_tokenizer(),
        text_encoder_3=build_t5_encoder(size, seed + 4),
        tokenizer_3=build_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
    )
