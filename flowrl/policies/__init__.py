"""Policy adapters: one per diffusers pipeline family, chosen from the pipeline's class (or named in the config)."""

from __future__ import annotations

from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.policies.placement import WEIGHT_DTYPES, place_for_sampling, sampling_placement
from flowrl.registry import Registry

# pipeline class name -> adapter module; a config's `pipeline.policy: package.module:Class` overrides the choice
POLICIES = Registry(
    "policy",
    {
        "StableDiffusionPipeline": "flowrl.policies.sd",
        "StableDiffusionXLControlNetPipeline": "flowrl.policies.sdxl_controlnet",
        "StableDiffusion3Pipeline": "flowrl.policies.sd3",
        "FluxPipeline": "flowrl.policies.flux",
        "FluxKontextPipeline": "flowrl.policies.flux",
        "Flux2KleinPipeline": "flowrl.policies.flux2",
        "Flux2KleinEdit": "flowrl.policies.flux2",
        "Flux2Pipeline": "flowrl.policies.flux2",
        "Flux2Edit": "flowrl.policies.flux2",
        "WanPipeline": "flowrl.policies.wan",
        "WanImageToVideoPipeline": "flowrl.policies.wan_i2v",
        "QwenImagePipeline": "flowrl.policies.qwen_image",
        "QwenImageEditPipeline": "flowrl.policies.qwen_image_edit",
        "QwenImageEditPlusPipeline": "flowrl.policies.qwen_image_edit",
        "ZImagePipeline": "flowrl.policies.z_image",
        "HunyuanVideoPipeline": "flowrl.policies.hunyuan_video",
        "HunyuanSkyreelsImageToVideoPipeline": "flowrl.policies.hunyuan_video",
        "LTXPipeline": "flowrl.policies.ltx",
        "LTXImageToVideoPipeline": "flowrl.policies.ltx",
        "Shapes3DFlowPipeline": "flowrl.worlds.shapes3d.policy",
    },
)


def register_policy(pipeline_class: str):
    return POLICIES.register(pipeline_class)


def policy_for(pipeline, policy: str | None = None, where: str = "pipeline.policy", **kwargs) -> FlowPolicy:
    """The adapter for a pipeline instance: `policy` (a registered pipeline class name or a dotted path) or the one
    registered for the pipeline's class (ConfigError naming `where` and the class when none fits)."""
    adapter = POLICIES.get(policy or type(pipeline).__name__, where)
    return adapter(pipeline, **kwargs)


# pipeline classes flowrl defines itself: importing their module registers them with diffusers
FLOWRL_PIPELINES = {"Shapes3DFlowPipeline": "flowrl.worlds.shapes3d.pipeline"}


def load_pipeline(path, dtype=None):
    """Load a diffusers pipeline from a local folder (never from a hub), fp32 by default on CPU."""
    import importlib
    import json
    from pathlib import Path

    import torch
    from diffusers import DiffusionPipeline

    from flowrl.errors import UserError

    folder = Path(path)
    if not (folder / "model_index.json").is_file():
        raise UserError(
            f"pipeline folder {folder} has no model_index.json; expected a diffusers-format "
            "pipeline saved with save_pretrained"
        )
    try:
        class_name = json.loads((folder / "model_index.json").read_text()).get("_class_name")
    except (OSError, ValueError):
        class_name = None
    if class_name in FLOWRL_PIPELINES:
        importlib.import_module(FLOWRL_PIPELINES[class_name])
    else:
        import diffusers

        if isinstance(class_name, str) and not hasattr(diffusers, class_name):  # newer than this diffusers
            raise UserError(
                f"pipeline folder {folder} holds a {class_name}, which diffusers {diffusers.__version__} "
                "here does not have: upgrade it (pip install -U diffusers)"
            )
    pipe = DiffusionPipeline.from_pretrained(folder, dtype=dtype or torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


__all__ = [
    "Conditioning",
    "FlowPolicy",
    "POLICIES",
    "WEIGHT_DTYPES",
    "load_pipeline",
    "place_for_sampling",
    "policy_for",
    "register_policy",
    "sampling_placement",
]
