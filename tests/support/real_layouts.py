"""Tiny random pipelines with the layouts of the released models flowrl's configs/real/ target, built offline:
SD3.5-Medium (dual-attention first layer, QK RMS-norm, 16-channel VAE at 8x, shift 3), FLUX.1-dev (guidance
embedding, 16-channel VAE packed 2x2, dynamic shifting), Wan2.1 (UMT5-style T5, UniPC with flow sigmas),
SD 1.5 (UNet, 4-channel VAE at 8x, PNDM) and Qwen-Image (Qwen2.5-VL text encoder, Wan-style VAE, exponential shift).
Sizes are toy; the classes, configs and code paths are the real ones."""

from __future__ import annotations

import torch
from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    PNDMScheduler,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    UNet2DConditionModel,
    UniPCMultistepScheduler,
)
from tiny_pipelines import (
    tiny_flux2_dev,
    tiny_flux2_klein,
    tiny_hunyuan_video,
    tiny_ltx,
    tiny_qwen_image,
    tiny_qwen_image_edit,
    tiny_wan,
    tiny_wan_i2v,
    tiny_z_image,
)
from transformers import CLIPTextConfig, CLIPTextModel

from flowrl.worlds.shapes.model_sd3 import ShapesSD3Size, build_t5_encoder, build_text_encoder
from flowrl.worlds.shapes.tokenizer import MODEL_MAX_LENGTH, SPECIAL_TOKENS, build_tokenizer, shapes_vocabulary

TEXT = ShapesSD3Size(text_hidden=32, text_layers=1, text_projection=16)


def _vae(latent_channels: int, shift: float, scale: float, seed: int) -> AutoencoderKL:
    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=latent_channels,
        sample_size=64,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        norm_num_groups=4,
        shift_factor=shift,
        scaling_factor=scale,
        mid_block_add_attention=False,
    )


def sd35_medium(seed: int = 0) -> StableDiffusion3Pipeline:
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=64,
        caption_projection_dim=16,
        pooled_projection_dim=32,
        pos_embed_max_size=16,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        vae=_vae(16, 0.0609, 1.5305, seed + 1),
        text_encoder=build_text_encoder(TEXT, seed + 2),
        tokenizer=build_tokenizer(),
        text_encoder_2=build_text_encoder(TEXT, seed + 3),
        tokenizer_2=build_tokenizer(),
        text_encoder_3=build_t5_encoder(TEXT, seed + 4),
        tokenizer_3=build_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )


def flux_dev(seed: int = 0) -> FluxPipeline:
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        out_channels=None,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=64,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=[4, 4, 8],
    )
    clip = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=1,
            eos_token_id=SPECIAL_TOKENS.index("<eos>"),
            pad_token_id=0,
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=1,
            vocab_size=len(shapes_vocabulary()),
            max_position_embeddings=MODEL_MAX_LENGTH,
            projection_dim=32,
        )
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    return FluxPipeline(
        scheduler=scheduler,
        text_encoder=clip,
        tokenizer=build_tokenizer(),
        text_encoder_2=build_t5_encoder(TEXT, seed + 4),
        tokenizer_2=build_tokenizer(),
        transformer=transformer,
        vae=_vae(16, 0.1159, 0.3611, seed + 1),
    )


def wan21(seed: int = 0):
    pipe = tiny_wan(seed)
    pipe.scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0, num_train_timesteps=1000
    )
    return pipe


def sd15(seed: int = 0) -> StableDiffusionPipeline:
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        norm_num_groups=8,
        cross_attention_dim=32,
        attention_head_dim=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )
    clip = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=1,
            eos_token_id=SPECIAL_TOKENS.index("<eos>"),
            pad_token_id=0,
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=1,
            vocab_size=len(shapes_vocabulary()),
            max_position_embeddings=MODEL_MAX_LENGTH,
        )
    )
    scheduler = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        set_alpha_to_one=False,
        skip_prk_steps=True,
        steps_offset=1,
    )
    return StableDiffusionPipeline(
        vae=_vae(4, None, 0.18215, seed + 1),
        text_encoder=clip,
        tokenizer=build_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def wan22_a14b(seed: int = 0):
    """Wan2.2-T2V-A14B's layout: two experts split at boundary 0.875, UniPC with the release's flow_shift 12 (a
    3-step schedule puts steps 0 and 1 on the high-noise expert, step 2 on the low-noise one)."""
    from tiny_pipelines import tiny_wan22

    pipe = tiny_wan22(seed, boundary_ratio=0.875)
    pipe.scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=12.0, num_train_timesteps=1000
    )
    return pipe


def flux_kontext_dev(seed: int = 0):
    """FLUX.1 Kontext-dev's layout: FLUX.1-dev's components in a FluxKontextPipeline."""
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(**flux_dev(seed).components)


LAYOUTS = {
    "sd35_medium": sd35_medium,
    "flux_dev": flux_dev,
    "flux_kontext_dev": flux_kontext_dev,
    "wan21": wan21,
    "wan22_a14b": wan22_a14b,
    "wan21_i2v": tiny_wan_i2v,
    "wan22_i2v_a14b": lambda seed=0: tiny_wan_i2v(seed, two_experts=True),  # boundary 0.9
    "sd15": sd15,
    "qwen_image": tiny_qwen_image,
    "z_image": tiny_z_image,
    "flux2_klein_base": tiny_flux2_klein,
    "flux2_dev": tiny_flux2_dev,
    "hunyuan_video": tiny_hunyuan_video,
    "ltx": tiny_ltx,
    "skyreels_i2v": lambda seed=0: tiny_hunyuan_video(seed, skyreels_i2v=True),
    "qwen_image_edit_plus": lambda seed=0: tiny_qwen_image_edit(seed, plus=True),
}  # -2511's layout
