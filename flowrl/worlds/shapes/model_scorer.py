"""The shapes world's learned image-text scorer: a tiny transformers `CLIPModel` (the PickScore analogue).

Vision: 32x32 images in 4x4 patches (64 tokens); text: the project's word-level tokenizer, 16 tokens. Its score
is PickScore's form, `logit_scale * cos(image, text)`; the sigmoid of `score + score_bias` (the bias is kept in the
model config) is the probability that the verifier accepts the pair, which is what pretraining fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

from flowrl.worlds.shapes.tokenizer import MODEL_MAX_LENGTH, SPECIAL_TOKENS, build_tokenizer, shapes_vocabulary


@dataclass
class ScorerSize:
    hidden: int = 64
    layers: int = 3
    heads: int = 4
    projection: int = 64
    patch: int = 4


def build_scorer(size: ScorerSize | None = None, seed: int = 0) -> CLIPModel:
    size = size or ScorerSize()
    torch.manual_seed(seed)
    common = dict(
        hidden_size=size.hidden,
        intermediate_size=2 * size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
    )
    text = dict(
        common,
        vocab_size=len(shapes_vocabulary()),
        max_position_embeddings=MODEL_MAX_LENGTH,
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        bos_token_id=SPECIAL_TOKENS.index("<bos>"),
        eos_token_id=SPECIAL_TOKENS.index("<eos>"),
    )
    vision = dict(common, image_size=32, patch_size=size.patch, num_channels=3)
    config = CLIPConfig(
        text_config=text, vision_config=vision, projection_dim=size.projection, logit_scale_init_value=2.3026
    )
    config.score_bias = -5.0  # pairs mostly disagree; pretraining learns the bias
    return CLIPModel(config)


def scorer_image_processor() -> CLIPImageProcessor:
    """Preprocessing the reward adapter reads back: 32 px, mean/std 0.5 (images in [0, 1] -> [-1, 1])."""
    return CLIPImageProcessor(
        size={"shortest_edge": 32},
        crop_size={"height": 32, "width": 32},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


def scorer_tokenizer():
    return build_tokenizer()
