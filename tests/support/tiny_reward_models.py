"""Tiny random instances of real reward models saved to local folders: a CLIP model with the shapes vocabulary and
a StableDiffusionSafetyChecker whose thresholds sit inside the cosines of given images."""

import torch
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

from flowrl.worlds.shapes.tokenizer import SPECIAL_TOKENS, build_tokenizer, shapes_vocabulary

VOCAB = len(shapes_vocabulary())


def save_tiny_clip(folder):
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=SPECIAL_TOKENS.index("<eos>"),
        ),
        vision_config=dict(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=24,
    )
    CLIPModel(config).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)


CLIP_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
CLIP_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)


def tiny_safety_checker(folder, images):
    """A random checker whose thresholds sit inside the cosines of `images`, so both verdicts occur."""
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig

    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vocab_size": 99,
            "bos_token_id": 0,
            "eos_token_id": 1,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=8,
    )
    model = StableDiffusionSafetyChecker(config).eval()
    with torch.no_grad():
        model.concept_embeds.normal_()
        model.special_care_embeds.normal_()
        embeds = torch.nn.functional.normalize(
            model.visual_projection(model.vision_model((images - CLIP_MEAN) / CLIP_STD)[1])
        )
        model.concept_embeds_weights.copy_(
            (embeds @ torch.nn.functional.normalize(model.concept_embeds).T).quantile(0.97, dim=0)
        )
        model.special_care_embeds_weights.copy_(
            (embeds @ torch.nn.functional.normalize(model.special_care_embeds).T).quantile(0.9, dim=0)
        )
    model.save_pretrained(folder)
    return model
