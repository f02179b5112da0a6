"""The embedded visual-to-tactile generator's architecture: a diffusers `StableDiffusionXLControlNetPipeline` whose
`MultiControlNetModel` holds two ControlNets, one reading the camera's RGB patch and one its relative depth (as a
3-channel image), around a small SDXL UNet (epsilon prediction, DDIM-sampled) and two CLIP text encoders that read
the material description through a word-level tokenizer saved beside them. Saved with `save_pretrained`, it loads
unmodified with `StableDiffusionXLControlNetPipeline.from_pretrained`.

PhysTacGen (the visual-to-tactile synthesis it stands in for) conditions an SDXL ControlNet on the contact patch,
a relative-depth map and a material description; at toy width this keeps the family, the two controls and the
text path, so the loop, the rewards and the description policy drive the same classes a real checkpoint uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import (
    AutoencoderKL,
    ControlNetModel,
    MultiControlNetModel,
    StableDiffusionXLControlNetPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextModel, CLIPTextModelWithProjection

from flowrl.worlds.shapes.model_sd import ddim_scheduler
from flowrl.worlds.shapes.tokenizer import SPECIAL_TOKENS, build_tokenizer, word_clip_config
from flowrl.worlds.tactile.materials import KINDS

DESCRIPTION_WORDS = (
    *KINDS,
    *("fine", "medium", "coarse", "pitch", "horizontal", "diagonal", "vertical"),
    *("soft", "rough", "high", "low", "friction", "a", "surface"),
)
MAX_WORDS = 16  # <bos> + the longest description (8 words with its commas dropped) + <eos>, with room
CONTROLS = ("rgb", "depth")  # the MultiControlNetModel's order


@dataclass
class TactileSize:
    """Widths of the generator (the defaults are the embedded pipeline's)."""

    channels: tuple[int, int] = (32, 64)
    text_hidden: int = 32
    text_layers: int = 2
    time_embed: int = 8


def vocabulary() -> list[str]:
    return list(SPECIAL_TOKENS) + sorted(set(DESCRIPTION_WORDS) | {","})


def _text_config(size: TactileSize):
    return word_clip_config(len(vocabulary()), size.text_hidden, size.text_layers, MAX_WORDS, size.text_hidden)


def _sdxl_blocks(size: TactileSize) -> dict:
    """What the UNet and each ControlNet share: SDXL's micro-conditioning (text_time: the second encoder's pooled
    embedding plus 6 size / crop ids) and cross-attention on both encoders' hidden states side by side."""
    return dict(
        block_out_channels=size.channels,
        layers_per_block=1,
        in_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=size.time_embed,
        transformer_layers_per_block=(1, 1),
        projection_class_embeddings_input_dim=size.text_hidden + 6 * size.time_embed,
        cross_attention_dim=2 * size.text_hidden,
        norm_num_groups=16,
    )


def build_unet(size: TactileSize, seed: int) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=16, out_channels=4, up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), **_sdxl_blocks(size)
    )


def build_controlnet(size: TactileSize, seed: int) -> ControlNetModel:
    torch.manual_seed(seed)
    # one stride-2 stage in the conditioning embedding: a 32 px control image meets the 16 x 16 latent
    return ControlNetModel(conditioning_embedding_out_channels=(16, 32), **_sdxl_blocks(size))


def build_vae(seed: int) -> AutoencoderKL:
    torch.manual_seed(seed)
    return AutoencoderKL(
        block_out_channels=(32, 64),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=16,
        sample_size=32,
    )


def build_pipeline(size: TactileSize | None = None, seed: int = 0, vae: AutoencoderKL | None = None):
    """A fresh generator (untrained weights; `vae` a trained one where given)."""
    size = size or TactileSize()
    torch.manual_seed(seed + 3)
    text_encoder = CLIPTextModel(_text_config(size))
    torch.manual_seed(seed + 4)
    text_encoder_2 = CLIPTextModelWithProjection(_text_config(size))
    controlnet = MultiControlNetModel([build_controlnet(size, seed + 5 + i) for i in range(len(CONTROLS))])
    tokenizer = build_tokenizer(MAX_WORDS, vocabulary())
    return StableDiffusionXLControlNetPipeline(
        vae=vae or build_vae(seed + 1),
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=build_unet(size, seed),
        controlnet=controlnet,
        scheduler=ddim_scheduler(),
        force_zeros_for_empty_prompt=False,  # CFG's unconditional branch is the empty description, as trained
        add_watermarker=False,
    )
