"""Policy adapters: one per diffusers pipeline family, chosen from the pipeline's class (or named in the config)."""
from __future__ import annotations

from ..registry import Registry
from .base import Conditioning, FlowPolicy

# pipeline class name -> adapter module; a config's `pipeline.policy: package.module:Class` overrides the choice
POLICIES = Registry("policy", {
    "StableDiffusionPipeline": "flowrl.policies.sd", "StableDiffusion3Pipeline": "flowrl.policies.sd3",
    "FluxPipeline": "flowrl.policies.flux", "FluxKontextPipeline": "flowrl.policies.flux",
    "WanPipeline": "flowrl.policies.wan",
    "Shapes3DFlowPipeline": "flowrl.policies.shapes3d",
})


def register_policy(pipeline_class: str):
    return POLICIES.register(pipeline_class)


def policy_for(pipeline, policy: str | None = None, **kwargs) -> FlowPolicy:
    """The adapter for a pipeline instance: `policy` (a registered pipeline class name or a dotted path) or the one
    registered for the pipeline's class (ConfigError naming the class when none fits)."""
    adapter = POLICIES.get(policy or type(pipeline).__name__, "pipeline.policy")
    return adapter(pipeline, **kwargs)


# pipeline classes flowrl defines itself: importing their module registers them with diffusers
FLOWRL_PIPELINES = {"Shapes3DFlowPipeline": "flowrl.models.shapes3d"}


def load_pipeline(path, dtype=None):
    """Load a diffusers pipeline from a local folder (never from a hub), fp32 by default on CPU."""
    import importlib
    import json
    from pathlib import Path

    import torch
    from diffusers import DiffusionPipeline

    from ..errors import UserError

    folder = Path(path)
    if not (folder / "model_index.json").is_file():
        raise UserError(f"pipeline folder {folder} has no model_index.json; expected a diffusers-format "
                        "pipeline saved with save_pretrained")
    try:
        class_name = json.loads((folder / "model_index.json").read_text()).get("_class_name")
    except (OSError, ValueError):
        class_name = None
    if class_name in FLOWRL_PIPELINES:
        importlib.import_module(FLOWRL_PIPELINES[class_name])
    pipe = DiffusionPipeline.from_pretrained(folder, dtype=dtype or torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


__all__ = ["Conditioning", "FlowPolicy", "POLICIES", "load_pipeline", "policy_for", "register_policy"]
