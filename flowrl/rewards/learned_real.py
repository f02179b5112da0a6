"""Adapters for published learned rewards, each loaded from a local folder (nothing is fetched from a hub).

- hpsv2: HPSv2.1 (Wu et al., arXiv 2306.09341), a fine-tuned CLIP ViT-H/14; score = cos(image, text), the image
  letterboxed (longer side to 224, black around) as HPSv2's own scoring transform does. Expects the
  checkpoint converted to a transformers `CLIPModel` folder (with tokenizer and preprocessor files).
- aesthetic: the LAION aesthetic predictor v2 ("improved aesthetic predictor"): an MLP on the L2-normalised CLIP
  ViT-L/14 image embedding. Expects `<path>/clip` (a transformers CLIPModel folder) and `<path>/mlp.pth` or
  `<path>/mlp.safetensors` (the published sac+logos+ava1-l14-linearMSE weights, keys layers.{0,2,4,6,7}.*).
- imagereward: ImageReward (Xu et al., arXiv 2304.05977): BLIP's image encoder, its text encoder cross-attending to
  the image, and an MLP on the first text token; standardised with the published mean 0.16717 and std 1.03334.
  Expects `<path>/blip` (a transformers BlipForImageTextRetrieval folder with tokenizer and preprocessor) and
  `<path>/mlp.pth|safetensors` (keys layers.*). The original ImageReward.pt must be converted to that layout.
All are differentiable in the pixels (ReFL, DRaFT and MEND can use them).
"""

from __future__ import annotations

from pathlib import Path

import torch

from flowrl.errors import UserError
from flowrl.rewards.base import Reward, RewardOutput, register_reward
from flowrl.rewards.clip import CLIPReward, clip_pixels, image_statistics, require_local_folder, reward_tokenizer

IMAGEREWARD_MEAN, IMAGEREWARD_STD = 0.16717362830052426, 1.0333394966054072


class ScoreMLP(torch.nn.Module):
    """The head shared by the LAION aesthetic predictor and ImageReward: d -> 1024 -> 128 -> 64 -> 16 -> 1."""

    def __init__(self, dim: int):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(dim, 1024),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(1024, 128),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(128, 64),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(64, 16),
            torch.nn.Linear(16, 1),
        )

    def forward(self, x):
        return self.layers(x).squeeze(-1)


def model_subfolder(folder: Path, name: str, reward: str, what: str) -> Path:
    """PATH/name, or one clear error saying what belongs there."""
    sub = folder / name
    if not sub.is_dir():
        raise UserError(f"reward {reward}: {sub} does not exist; expected the {what} folder beside the MLP weights")
    return sub


def load_mlp(folder: Path, dim: int, reward: str) -> ScoreMLP:
    from safetensors.torch import load_file

    for name in ("mlp.safetensors", "mlp.pth"):
        file = folder / name
        if file.is_file():
            state = (
                load_file(file)
                if file.suffix == ".safetensors"
                else torch.load(file, map_location="cpu", weights_only=True)
            )
            mlp = ScoreMLP(dim)
            try:
                mlp.load_state_dict(state)
            except RuntimeError as error:
                raise UserError(
                    f"reward {reward}: {file} does not fit a {dim}-input score MLP: {str(error)[:200]}"
                ) from None
            return mlp.eval().requires_grad_(False)
    raise UserError(f"reward {reward}: {folder} has no mlp.safetensors or mlp.pth (the score head's weights)")


@register_reward("hpsv2")
def hpsv2(path: str | None = None) -> CLIPReward:
    folder = require_local_folder(
        path,
        "hpsv2",
        "convert HPS_v2.1_compressed.pt (open_clip ViT-H-14) to a "
        "transformers CLIPModel folder with the ViT-H-14 tokenizer and preprocessor files",
    )
    return CLIPReward(folder, "cosine", "hpsv2", fit="pad")  # HPSv2 scores the whole image, letterboxed


class AestheticReward(Reward):
    name = "aesthetic"
    differentiable = True

    def __init__(self, folder: Path):
        from transformers import CLIPModel

        clip_folder = model_subfolder(folder, "clip", "aesthetic", "CLIP ViT-L/14 CLIPModel")
        self.clip = CLIPModel.from_pretrained(clip_folder, dtype=torch.float32, local_files_only=True).eval()
        self.clip.requires_grad_(False)
        self.mean, self.std = image_statistics(clip_folder)
        self.size = self.clip.config.vision_config.image_size
        self.mlp = load_mlp(folder, self.clip.config.projection_dim, "aesthetic")

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        device = next(self.clip.parameters()).device  # the reward model's (Reward.to), not the samples'
        pixels = clip_pixels(samples.to(device), self.size, self.mean, self.std)
        features = self.clip.get_image_features(pixel_values=pixels)
        features = getattr(features, "pooler_output", features)
        return RewardOutput(self.mlp(torch.nn.functional.normalize(features, dim=-1)))


@register_reward("aesthetic")
def aesthetic(path: str | None = None) -> AestheticReward:
    return AestheticReward(
        require_local_folder(
            path,
            "aesthetic",
            "put openai/clip-vit-large-patch14 (save_pretrained) in PATH/clip and the LAION "
            "sac+logos+ava1-l14-linearMSE.pth weights as PATH/mlp.pth",
        )
    )


class ImageRewardReward(Reward):
    name = "imagereward"
    differentiable = True

    def __init__(self, folder: Path):
        from transformers import BlipForImageTextRetrieval

        blip_folder = model_subfolder(folder, "blip", "imagereward", "BlipForImageTextRetrieval")
        blip = BlipForImageTextRetrieval.from_pretrained(blip_folder, dtype=torch.float32, local_files_only=True)
        self.vision, self.text = blip.vision_model.eval(), blip.text_encoder.eval()
        self.vision.requires_grad_(False)
        self.text.requires_grad_(False)
        self.tokenizer = reward_tokenizer(blip_folder, blip.config.text_config.vocab_size, "imagereward")
        self.mean, self.std = image_statistics(blip_folder)
        self.size = blip.config.vision_config.image_size
        self.mlp = load_mlp(folder, blip.config.text_config.hidden_size, "imagereward")

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        device = next(self.vision.parameters()).device  # the reward model's (Reward.to), not the samples'
        pixels = clip_pixels(samples.to(device), self.size, self.mean, self.std)
        image = self.vision(pixel_values=pixels).last_hidden_state
        tokens = self.tokenizer(
            prompts,
            padding="max_length",
            truncation=True,
            max_length=min(35, self.tokenizer.model_max_length),
            return_tensors="pt",
        ).to(device)
        text = self.text(
            input_ids=tokens.input_ids,
            attention_mask=tokens.attention_mask,
            encoder_hidden_states=image,
            encoder_attention_mask=torch.ones(image.shape[:2], dtype=torch.long, device=device),
        ).last_hidden_state
        return RewardOutput((self.mlp(text[:, 0]) - IMAGEREWARD_MEAN) / IMAGEREWARD_STD)


@register_reward("imagereward")
def imagereward(path: str | None = None) -> ImageRewardReward:
    return ImageRewardReward(
        require_local_folder(
            path,
            "imagereward",
            "`flowrl convert-reward imagereward ImageReward.pt PATH --tokenizer BERT_TOKENIZER_DIR` "
            "writes PATH/blip and PATH/mlp.safetensors",
        )
    )
