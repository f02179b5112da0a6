"""Conversions between the float samples policies decode and the uint8 images verifiers, files and JPEG see."""

from __future__ import annotations

import numpy as np
import torch


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] (or video [B, 3, F, H, W]) in [0, 1] -> uint8, channels last."""
    images = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return images.movedim(1, -1).cpu().numpy()


def to_pil(image: torch.Tensor):
    """One image [3, H, W] in [0, 1] -> an RGB PIL image (what pipelines' image processors and VLM readers take)."""
    from PIL import Image

    return Image.fromarray(to_uint8(image[None])[0])


def to_unit(images: np.ndarray) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, H, W] in [0, 1] (what rewards take)."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255


def as_image_batch(image) -> torch.Tensor:
    """PIL image(s), uint8 arrays [H, W, 3] / [B, H, W, 3], or float tensors [3, H, W] / [B, 3, H, W] in [0, 1] ->
    float [B, 3, H, W] in [0, 1] (condition images)."""
    if isinstance(image, torch.Tensor):
        return image if image.ndim == 4 else image[None]
    if isinstance(image, np.ndarray) and image.ndim == 4:
        return to_unit(image)
    images = image if isinstance(image, list) else [image]
    return to_unit(np.stack([np.asarray(i.convert("RGB") if hasattr(i, "convert") else i) for i in images]))


def item_image(
    item, key: str, world: str, needed_by: str, size: int | None = None, resize_to: tuple[int, int] | None = None
) -> torch.Tensor:
    """A condition item's input image (its first, where it gives several: an editor's source) as float [3, H, W] in
    [0, 1]: see `item_images`."""
    return item_images(item, key, world, needed_by, size, resize_to)[0]


def item_images(
    item, key: str, world: str, needed_by: str, size: int | None = None, resize_to: tuple[int, int] | None = None
) -> list[torch.Tensor]:
    """A condition item's input images, each float [3, H, W] in [0, 1], from, in order: its inputs[key] (one image or
    a list of them: uint8 [H, W, 3] arrays, float tensors [3, H, W] in [0, 1], or PIL images), its meta["image"] (a
    path to an image file, or a list of paths, e.g. from a .jsonl prompt file; resized to `size` when given), or the
    image the world named `world` makes for a prompt of its grammar, asked of that world's task by its registered
    name (`condition_image(item)`: the policies know no world themselves; None: no world). Several images are an
    editor's source followed by further reference images. `needed_by` names the pipeline kind in the error for a
    prompt that has none; `size` (when given) is checked; `resize_to` (height, width), when given, is the size each
    is brought to (`resized`: an editor's source at the sample size)."""
    from pathlib import Path

    from flowrl.errors import UserError

    given = item.inputs.get(key)
    if given is None and item.meta.get("image"):
        from PIL import Image

        given = []
        for path in item.meta["image"] if isinstance(item.meta["image"], list) else [item.meta["image"]]:
            if not Path(path).is_file():
                raise UserError(f"condition image {path} (meta 'image' of prompt {item.prompt!r}) does not exist")
            with Image.open(path) as opened:
                image = opened.convert("RGB")
                given.append(image.resize((size, size)) if size is not None else image.copy())
    if given is None and world is None:
        raise UserError(
            f"prompt {item.prompt!r} has no condition image; {needed_by} needs one: give it as 'image' "
            "(a file path) in a .jsonl prompt file"
        )
    if given is None:
        from flowrl.tasks.base import build_task

        try:
            given = build_task(world).condition_image(item)
        except ValueError as error:
            raise UserError(
                f"{error}; {needed_by} needs a condition image: give it as 'image' (a file path) in a "
                f".jsonl prompt file, or use prompts of the {world} world"
            ) from None
    images = []
    for image in given if isinstance(given, (list, tuple)) else [given]:
        # a copy: a task's cached renders may be read-only
        batch = as_image_batch(image if isinstance(image, torch.Tensor) else np.array(image)).float()
        if size is not None and batch.shape[-2:] != (size, size):
            raise UserError(f"condition image of {item.prompt!r} is {tuple(batch.shape[-2:])}; expected {size}x{size}")
        images.append(batch[0] if resize_to is None else resized(batch[0], *resize_to))
    return images


def resized(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """A float image [3, H, W] in [0, 1] at height x width (bicubic, antialiased when shrinking); unchanged, not
    resampled, when it already has that size."""
    if tuple(image.shape[-2:]) == (height, width):
        return image
    out = torch.nn.functional.interpolate(
        image[None].float(), size=(height, width), mode="bicubic", antialias=True, align_corners=False
    )
    return out[0].clamp(0, 1).to(image.dtype)
