"""Components of the embedded `pipelines/shapes-wan` WanPipeline (tiny, CPU-trainable text-to-video).

Latent space: a real AutoencoderKLWan with one down stage that halves the resolution and keeps every frame
(9 x 32x32x3 -> 9 x 16x16xC; `temporal_compression: 2` would halve the frame rate as Wan does, but that VAE did not
learn to reconstruct the clips within the budget, see pretrain_wan.py); the Wan transformer patchifies by
(9, 2, 2), so a clip is 8 x 8 = 64 tokens, each a 4x4-pixel place over all nine frames (patch (1, 4, 4), 144
tokens, and (1, 2, 2), 576, cost more per step and were no better within the same training time; the
comparison is in docs/research/video.md).
A small UMT5 encoder (Wan's text encoder family) with the word-level tokenizer of the moving-shapes vocabulary stands
in for UMT5-XXL. Callers pass `max_sequence_length=16`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
from transformers import UMT5Config, UMT5EncoderModel

from flowrl.worlds.moving_shapes.prompts import motion_vocabulary
from flowrl.worlds.shapes.tokenizer import MODEL_MAX_LENGTH, SPECIAL_TOKENS, build_tokenizer

WAN_SEQUENCE_LENGTH = MODEL_MAX_LENGTH  # pass as max_sequence_length to every pipeline call
FRAMES, SIZE = 9, 32


@dataclass
class ShapesWanSize:
    num_layers: int = 6
    num_heads: int = 4
    head_dim: int = 32
    ffn_dim: int = 256
    text_hidden: int = 64
    text_layers: int = 2
    latent_channels: int = 8
    vae_base_dim: int = 16
    temporal_compression: int = 1  # 1: none (frames stay frames); 2: Wan's causal halving of the frame rate
    patch: int = 2  # the transformer's spatial patch: 16x16 latents -> (16 / patch)^2 tokens per frame
    # latent frames per token (must divide the latent frame count); 9: each of the 64 tokens is a 4x4-pixel place over
    # the whole clip, the cheapest structure tried and as accurate as patch (1, 4, 4)'s 144 tokens in less flow time
    temporal_patch: int = 9
    # SD3's time shift, for training t and the sampling schedule: nine frames of one scene are so redundant that
    # at shift 1 the structure is already fixed in the few high-noise steps the model hardly trained on (an ODE from
    # pure noise passed the verifier on no clip, one from t = 0.6 with the clip's own signal on some:
    # benchmarks/wan_denoise_from_t.py); eval accuracy rose with the shift up to 5, Wan's own (docs/research/video.md)
    flow_shift: float = 5.0

    def tokens(self) -> int:
        return self.latent_frames() // self.temporal_patch * (SIZE // 2 // self.patch) ** 2

    def latent_frames(self) -> int:
        return 1 + (FRAMES - 1) // self.temporal_compression

    def __post_init__(self):
        if self.latent_frames() % self.temporal_patch:
            raise ValueError(
                f"temporal_patch {self.temporal_patch} must divide the {self.latent_frames()} latent frames"
            )


def build_text_encoder(size: ShapesWanSize, seed: int) -> UMT5EncoderModel:
    torch.manual_seed(seed)
    config = UMT5Config(
        vocab_size=len(motion_vocabulary()),
        d_model=size.text_hidden,
        d_kv=16,
        d_ff=2 * size.text_hidden,
        num_layers=size.text_layers,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        eos_token_id=SPECIAL_TOKENS.index("<eos>"),
        decoder_start_token_id=SPECIAL_TOKENS.index("<pad>"),
    )
    return UMT5EncoderModel(config)


def build_vae(size: ShapesWanSize, seed: int) -> AutoencoderKLWan:
    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=size.vae_base_dim,
        z_dim=size.latent_channels,
        dim_mult=[1, 2],
        num_res_blocks=1,
        temperal_downsample=[size.temporal_compression == 2],
        scale_factor_temporal=size.temporal_compression,
        scale_factor_spatial=2,
        latents_mean=[0.0] * size.latent_channels,  # pretraining measures both per channel
        latents_std=[1.0] * size.latent_channels,
    )


def build_transformer(size: ShapesWanSize, seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(size.temporal_patch, size.patch, size.patch),
        num_attention_heads=size.num_heads,
        attention_head_dim=size.head_dim,
        in_channels=size.latent_channels,
        out_channels=size.latent_channels,
        text_dim=size.text_hidden,
        freq_dim=64,
        ffn_dim=size.ffn_dim,
        num_layers=size.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=64,
    )


def build_pipeline(size: ShapesWanSize | None = None, seed: int = 0) -> WanPipeline:
    """A randomly initialised shapes-wan pipeline (what `flowrl pretrain shapes-wan` starts from)."""
    size = size or ShapesWanSize()
    return WanPipeline(
        tokenizer=build_tokenizer(words=motion_vocabulary()),
        text_encoder=build_text_encoder(size, seed + 2),
        vae=build_vae(size, seed + 1),
        transformer=build_transformer(size, seed),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=size.flow_shift),
    )
