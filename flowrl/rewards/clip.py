"""CLIP-family image-text rewards, differentiable in the images: the project's learned shapes scorer, PickScore
and CLIPScore. All three are a `transformers.CLIPModel` loaded from a local folder; they differ in the score:
- shapes_clip / pickscore: logit_scale * cos(image, text) (PickScore's form; Kirstain et al., arXiv 2305.01569)
- clipscore: 2.5 * max(cos, 0) (Hessel et al., arXiv 2104.08718)
(HPSv2.1, a CLIP too, scores plain cos; see learned_real.py.)
Images are resized and centre-cropped to the model's input size as CLIP's image processor does, and normalised with
the folder's preprocessor_config.json (CLIP's OpenAI statistics when absent), in torch, so gradients reach the
pixels (`clip_pixels`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from flowrl.errors import UserError
from flowrl.rewards.base import Reward, RewardOutput, register_reward

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

DEFAULT_SCORER = Path(__file__).resolve().parents[2] / "pipelines" / "shapes-scorer"


def require_local_folder(path: str | Path | None, reward: str, how_to_get: str) -> Path:
    """The folder a real-model reward loads from, or one clear error naming it and how to get the weights."""
    if path is None:
        raise UserError(f"reward {reward}: params.path is required; {how_to_get}")
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"reward {reward}: params.path {folder} does not exist; {how_to_get}")
    return folder


def image_statistics(folder: Path) -> tuple[list[float], list[float]]:
    config = folder / "preprocessor_config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        return data.get("image_mean", OPENAI_CLIP_MEAN), data.get("image_std", OPENAI_CLIP_STD)
    return OPENAI_CLIP_MEAN, OPENAI_CLIP_STD


def clip_pixels(samples: torch.Tensor, size: int, mean, std, fit: str = "crop") -> torch.Tensor:
    """[B, 3, H, W] in [0, 1] -> the CLIP vision input as CLIPImageProcessor (PickScore, CLIPScore, the safety checker)
    makes it (`fit` "crop"): the shorter side resized to `size` (bicubic, antialiased when shrinking, as PIL
    resizes), the centre `size` x `size` cropped, clamped to [0, 1] (as uint8 pixels are), normalised. `fit` "pad" is
    HPSv2's own transform (open_clip's resize_longest_max): the longer side resized to `size`, the rest padded with
    black around the centre. In torch, so gradients reach the pixels; a wide video frame is never squashed."""
    x = samples.float()
    height, width = x.shape[-2:]
    if fit == "pad":
        scale = size / max(height, width)
        shape = (round(height * scale), round(width * scale))
    elif height <= width:
        shape = (size, int(size * width / height))
    else:
        shape = (int(size * height / width), size)
    if shape != (height, width):
        x = torch.nn.functional.interpolate(x, size=shape, mode="bicubic", align_corners=False, antialias=True)
        x = x.clamp(0, 1)
    if fit == "pad":
        pad_h, pad_w = size - shape[0], size - shape[1]
        x = torch.nn.functional.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    top, left = (x.shape[-2] - size) // 2, (x.shape[-1] - size) // 2
    x = x[..., top : top + size, left : left + size]
    mean = torch.tensor(mean, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(std, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def reward_tokenizer(folder: Path, vocab_size: int, reward: str):
    """A reward folder's tokenizer; a UserError where it holds (almost) none of its text model's vocabulary:
    transformers makes an empty tokenizer of a folder without tokenizer files, which would encode every prompt
    alike and leave an image-only reward without a word said."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as error:
        raise UserError(f"reward {reward}: {folder} holds no tokenizer ({str(error)[:200]})") from None
    if len(tokenizer) < vocab_size // 2:
        raise UserError(
            f"reward {reward}: {folder}'s tokenizer has {len(tokenizer)} tokens for a text model of "
            f"{vocab_size}: save the model's own tokenizer files (tokenizer.json, or vocab and merges) "
            "in the folder"
        )
    return tokenizer


class CLIPReward(Reward):
    differentiable = True

    def __init__(self, folder: Path, score: str, name: str, fit: str = "crop"):
        from transformers import CLIPModel

        self.name, self.score, self.fit = name, score, fit
        self.model = CLIPModel.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
        self.model.requires_grad_(False)
        self.tokenizer = reward_tokenizer(folder, self.model.config.text_config.vocab_size, name)
        self.mean, self.std = image_statistics(folder)
        self.size = self.model.config.vision_config.image_size
        self.max_length = min(self.tokenizer.model_max_length, self.model.config.text_config.max_position_embeddings)

    def features(self, samples: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        tokens = self.tokenizer(
            prompts, padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(device)
        image = self.model.get_image_features(
            pixel_values=clip_pixels(samples.to(device), self.size, self.mean, self.std, self.fit)
        )
        text = self.model.get_text_features(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask)
        image, text = (getattr(f, "pooler_output", f) for f in (image, text))
        return torch.nn.functional.normalize(image, dim=-1), torch.nn.functional.normalize(text, dim=-1)

    def image_embeddings(self, samples: torch.Tensor) -> torch.Tensor:
        """L2-normalised image features [B, D] (for diversity measured in the reward model's own space)."""
        device = next(self.model.parameters()).device
        image = self.model.get_image_features(
            pixel_values=clip_pixels(samples.to(device), self.size, self.mean, self.std, self.fit)
        )
        return torch.nn.functional.normalize(getattr(image, "pooler_output", image), dim=-1)

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        image, text = self.features(samples, prompts)
        cos = (image * text).sum(-1)
        if self.score == "clipscore":
            return RewardOutput(2.5 * cos.clamp(min=0), {"cosine": cos.detach()})
        if self.score == "cosine":
            return RewardOutput(cos)
        return RewardOutput(self.model.logit_scale.exp() * cos, {"cosine": cos.detach()})


@register_reward("shapes_clip")
def shapes_clip(path: str | None = None) -> CLIPReward:
    folder = require_local_folder(
        path or DEFAULT_SCORER,
        "shapes_clip",
        "the project ships it in pipelines/shapes-scorer (`flowrl pretrain scorer` rebuilds it)",
    )
    return CLIPReward(folder, "pickscore", "shapes_clip")


@register_reward("pickscore")
def pickscore(path: str | None = None) -> CLIPReward:
    folder = require_local_folder(
        path,
        "pickscore",
        "save yuvalkirstain/PickScore_v1 (CLIPModel) together with the "
        "laion/CLIP-ViT-H-14-laion2B-s32B-b79K tokenizer and preprocessor files into one folder",
    )
    return CLIPReward(folder, "pickscore", "pickscore")


@register_reward("clipscore")
def clipscore(path: str | None = None) -> CLIPReward:
    folder = require_local_folder(
        path,
        "clipscore",
        "save a CLIPModel such as openai/clip-vit-large-patch14 with "
        "its tokenizer and preprocessor (save_pretrained) into a local folder",
    )
    return CLIPReward(folder, "clipscore", "clipscore")
