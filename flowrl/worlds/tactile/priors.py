"""Pretrained priors read from local folders: relative depth of a camera image (Depth-Anything through transformers,
or MiDaS through controlnet-aux) and image features for curation (any timm backbone, e.g. DINOv2, from a local
folder). Nothing is downloaded: a folder that is not a model of the expected kind is a UserError naming it.

Depth estimators report relative inverse depth (larger is nearer); `relative_depth` turns it into the world's
convention, relative depth in [0, 1] with 0 nearest.
"""

from __future__ import annotations

from pathlib import Path

import torch

from flowrl.errors import UserError


def _normalised_nearest_zero(disparity: torch.Tensor) -> torch.Tensor:
    """[B, H, W] relative inverse depth -> relative depth in [0, 1], 0 at each image's nearest point."""
    flat = disparity.flatten(1)
    low, high = flat.min(1).values.view(-1, 1, 1), flat.max(1).values.view(-1, 1, 1)
    span = (high - low).clamp(min=1e-8)
    return (high - disparity) / span


class DepthPrior:
    """Relative depth from a transformers depth-estimation model in `path` (Depth-Anything and others
    `AutoModelForDepthEstimation` loads)."""

    def __init__(self, path: str | Path):
        from transformers import AutoModelForDepthEstimation

        path = Path(path)
        if not (path / "config.json").is_file():
            raise UserError(f"{path}: not a transformers depth model folder (no config.json)")
        try:
            self.model = AutoModelForDepthEstimation.from_pretrained(path, local_files_only=True).eval()
        except (OSError, ValueError) as error:
            raise UserError(f"{path}: could not load a depth-estimation model ({str(error)[:200]})") from None
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)  # ImageNet statistics, as DPT models use
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

    @torch.no_grad()
    def __call__(self, rgb: torch.Tensor, size: int | None = None) -> torch.Tensor:
        """Relative depth [B, H, W] (0 nearest) of images [B, 3, H, W] in [0, 1], read at `size` pixels (a
        multiple of the model's patch; default: the images' own size rounded up to 14) and resized back."""
        height, width = rgb.shape[-2:]
        side = size or 14 * -(-max(height, width) // 14)
        scaled = torch.nn.functional.interpolate(rgb.float(), size=(side, side), mode="bilinear", align_corners=False)
        disparity = self.model(pixel_values=(scaled - self.mean) / self.std).predicted_depth
        disparity = torch.nn.functional.interpolate(disparity[:, None], size=(height, width), mode="bilinear")[:, 0]
        return _normalised_nearest_zero(disparity)


def midas_depth(path: str | Path):
    """A MiDaS detector from controlnet-aux reading `path/dpt_hybrid-midas-501f0c75.pt` (no download); call it
    on a uint8 image to get its depth image. Needs `pip install controlnet-aux`."""
    try:
        from controlnet_aux import MidasDetector
    except ImportError:
        raise UserError("MiDaS depth needs controlnet-aux: pip install controlnet-aux") from None
    weights = Path(path) / "dpt_hybrid-midas-501f0c75.pt"
    if not weights.is_file():
        raise UserError(f"{weights}: not found (MiDaS's weights, as controlnet-aux names them)")
    return MidasDetector.from_pretrained(str(path))


def timm_encoder(folder: str | Path) -> torch.nn.Module:
    """A timm backbone with its classifier removed from a local folder holding timm's config.json and weights
    (as `timm.models.save_for_hf` writes them, or a downloaded model's folder): pooled features per image."""
    import timm

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder}: not a timm model folder (no config.json)")
    return timm.create_model(f"local-dir:{folder}", pretrained=True, num_classes=0).eval()


@torch.no_grad()
def encode(encoder: torch.nn.Module, images: torch.Tensor, size: int | None = None) -> torch.Tensor:
    """Features [B, D] of images [B, 3, H, W] in [0, 1], resized to the encoder's input size (or `size`) and
    normalised by its data config's mean and std."""
    config = getattr(encoder, "pretrained_cfg", {}) or {}
    side = size or config.get("input_size", (3, images.shape[-2], images.shape[-1]))[-1]
    mean = torch.tensor(config.get("mean", (0.485, 0.456, 0.406))).view(1, 3, 1, 1)
    std = torch.tensor(config.get("std", (0.229, 0.224, 0.225))).view(1, 3, 1, 1)
    scaled = torch.nn.functional.interpolate(images.float(), size=(side, side), mode="bilinear", align_corners=False)
    return encoder((scaled - mean) / std)
