"""Policy adapters: one per diffusers pipeline family, chosen from the pipeline's class."""
from __future__ import annotations

from .base import Conditioning, FlowPolicy
from .flux import FluxPolicy
from .sd import SDPolicy
from .sd3 import SD3Policy
from .wan import WanPolicy

_FAMILIES = {"StableDiffusionPipeline": SDPolicy, "StableDiffusion3Pipeline": SD3Policy, "FluxPipeline": FluxPolicy, "WanPipeline": WanPolicy}


def policy_for(pipeline, **kwargs) -> FlowPolicy:
    """The adapter for a pipeline instance (ValueError naming the class when none fits)."""
    name = type(pipeline).__name__
    if name not in _FAMILIES:
        raise ValueError(f"no policy adapter for {name}; supported: {sorted(_FAMILIES)}")
    return _FAMILIES[name](pipeline, **kwargs)


def load_pipeline(path, dtype=None):
    """Load a diffusers pipeline from a local folder (never from a hub), fp32 by default on CPU."""
    from pathlib import Path

    import torch
    from diffusers import DiffusionPipeline

    from ..errors import UserError

    folder = Path(path)
    if not (folder / "model_index.json").is_file():
        raise UserError(f"pipeline folder {folder} has no model_index.json; expected a diffusers-format "
                                "pipeline saved with save_pretrained (the embedded default is pipelines/shapes-sd3)")
    pipe = DiffusionPipeline.from_pretrained(folder, dtype=dtype or torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


__all__ = ["Conditioning", "FlowPolicy", "FluxPolicy", "SDPolicy", "SD3Policy", "WanPolicy", "load_pipeline", "policy_for"]
