"""Checkpoints in the formats people load without flowrl.

A LoRA checkpoint also holds its adapter as diffusers writes it (`pytorch_lora_weights.safetensors`, with the LoRA
config in the file's metadata so alpha / rank is restored: `pipe.load_lora_weights(checkpoint_dir)` gives flowrl's model
exactly, except that a LoRA gated to high noise levels (lora.sample_from_sigma / active_from_sigma) needs
`lora_gate_callback` too: such a checkpoint holds LORA_GATE_FILE saying so) and as peft writes it (`adapter_config.json`
+ `adapter_model.safetensors`: `PeftModel.from_pretrained(pipe.transformer, checkpoint_dir)`). The weights exported are
the ones flowrl samples with: the EMA when the run keeps one. Wan2.2 with both experts trained (pipeline.experts: both)
adds the low-noise expert's adapter as `pytorch_lora_weights_transformer_2.safetensors`
(`pipe.load_lora_weights(checkpoint_dir, weight_name=..., load_into_transformer_2=True)`) and in peft's layout under
`transformer_2/`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import save_file

DIFFUSERS_LORA_FILE = "pytorch_lora_weights.safetensors"
DIFFUSERS_LORA_FILE_2 = "pytorch_lora_weights_transformer_2.safetensors"  # Wan2.2's low-noise expert
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
LORA_GATE_FILE = "lora_gate.json"  # beside a gated LoRA's files: the noise level it acts from, and how to keep it


def denoiser_name(pipeline) -> str:
    """The pipeline component that is trained: 'transformer', or 'unet' for UNet pipelines."""
    return "transformer" if getattr(pipeline, "transformer", None) is not None else "unet"


def write_lora_files(policy, weights: dict, folder: Path, gate: float | None = None) -> None:
    """Write `weights` (the policy's trainable LoRA tensors by parameter name) in diffusers' and peft's layouts: the
    denoiser's in the folder, a further trained network's (Wan2.2's low-noise expert) beside it (diffusers' file
    named for it, peft's in a subfolder); with `gate` (the sigma it samples from), LORA_GATE_FILE too."""
    from peft.utils import get_peft_model_state_dict

    if gate is not None:  # loaded alone, the LoRA would act at every step: another model than flowrl samples
        (Path(folder) / LORA_GATE_FILE).write_text(
            json.dumps(
                {
                    "sample_from_sigma": gate,
                    "load": "pipe.load_lora_weights(folder); pipe.enable_lora(); pipe(prompt, callback_on_step_end="
                    "flowrl.export.lora_gate_callback(sample_from_sigma)): the adapter acts only at steps with sigma "
                    ">= sample_from_sigma, as flowrl samples it (see lora_gate_callback for the six lines to copy)",
                },
                indent=2,
            )
            + "\n"
        )

    name = denoiser_name(policy.pipeline)
    for prefix, module in policy.trained_modules().items():
        own = {
            k[len(prefix) :]: v
            for k, v in weights.items()
            if k.startswith(prefix) and (prefix or not any(k.startswith(p) for p in policy.extra_trained))
        }
        state = {k: v.contiguous() for k, v in get_peft_model_state_dict(module, state_dict=own).items()}
        config = module.peft_config["default"]
        metadata = json.loads(
            json.dumps(config.to_dict(), default=lambda v: sorted(v) if isinstance(v, set) else str(v))
        )
        # diffusers' loaders read a transformer's LoRA under the "transformer" prefix, the low-noise expert's too
        type(policy.pipeline).save_lora_weights(
            folder,
            **{f"{name}_lora_layers": state, f"{name}_lora_adapter_metadata": metadata},
            weight_name=DIFFUSERS_LORA_FILE_2 if prefix else DIFFUSERS_LORA_FILE,
        )
        peft_folder = Path(folder) / prefix.rstrip(".")
        peft_folder.mkdir(exist_ok=True)
        config.save_pretrained(peft_folder)
        save_file({f"base_model.model.{k}": v for k, v in state.items()}, peft_folder / PEFT_WEIGHTS_FILE)


def lora_gate_callback(from_sigma: float):
    """A diffusers `callback_on_step_end` that samples a LoRA as flowrl does under lora.sample_from_sigma (or
    active_from_sigma): the adapter acts at the steps whose sigma is at least `from_sigma` and is off below. Call
    `pipe.enable_lora()` before each generation; after each step the callback switches the adapters off once the next
    step's sigma falls below the gate (flow-match schedulers: sigmas fall step by step). Six lines, so it can be
    copied where flowrl is not installed:

        def gate(pipe, step, timestep, callback_kwargs):
            sigmas = pipe.scheduler.sigmas
            if step + 1 < len(sigmas) and float(sigmas[step + 1]) < from_sigma:
                pipe.disable_lora()
            return callback_kwargs
        pipe(prompt, callback_on_step_end=gate)
    """

    def gate(pipe, step, timestep, callback_kwargs):
        sigmas = pipe.scheduler.sigmas
        if step + 1 < len(sigmas) and float(sigmas[step + 1]) < from_sigma:
            pipe.disable_lora()
        return callback_kwargs

    return gate


def stored_dtype(pipeline_dir) -> str:
    """The precision a pipeline folder stores its denoiser in (the first tensor of the first weights file that
    from_pretrained loads without a variant; a `.fp16.` / `.non_ema.` variant file beside it does not count): bf16,
    fp16, else fp32."""
    from safetensors import safe_open

    for component in ("transformer", "unet"):
        files = sorted((Path(pipeline_dir) / component).glob("*.safetensors"))
        files = [f for f in files if f.name.count(".") == 1] or files  # model.safetensors, model-00001-of-00002...
        if files:
            with safe_open(files[0], "pt") as weights:
                first = next(iter(weights.keys()), None)
                stored = weights.get_slice(first).get_dtype() if first is not None else None
            return {"BF16": "bf16", "F16": "fp16"}.get(stored, "fp32")
    return "fp32"


def export_pipeline(pipeline_dir, checkpoint, out, dtype: str | None = None) -> Path:
    """The pipeline with a checkpoint's weights (EMA when present; a LoRA fused into the base weights), the trained
    network saved in `dtype` (default: the precision the folder stores its denoiser in, `stored_dtype`: a released bf16
    model is written in bf16, not doubled to fp32) with `save_pretrained` so `DiffusionPipeline.from_pretrained(out)`
    loads the tuned model without flowrl; the networks training left alone are copied from the folder as stored.

    The pipeline loads in `dtype`, not fp32 then cast: half the host memory of an fp32 load for a bf16
    model. The fp32 LoRA's update is added to each half-precision weight in fp32 and rounded once, so for base
    weights a half-precision number holds exactly (released bf16 weights exported in bf16) the result is the fp32
    fuse's, rounded (tested)."""
    from flowrl.atomic import new_folder
    from flowrl.checkpoint import trained_weights_file

    trained_weights_file(Path(checkpoint))  # a mistyped checkpoint is said before minutes of loading
    # --out must be new or empty (never the pipeline folder itself, nor an earlier export), checked before loading;
    # the folder appears whole or not at all
    with new_folder(Path(out), "--out") as work:
        write_export(pipeline_dir, checkpoint, work, dtype)
    return Path(out)


def write_export(pipeline_dir, checkpoint, out: Path, dtype: str | None) -> None:
    """export_pipeline's work, into the folder `out`."""
    import shutil

    import torch

    from flowrl.checkpoint import load_trained_weights, run_sampling_settings
    from flowrl.policies import WEIGHT_DTYPES, load_pipeline, policy_for

    if dtype is None:
        dtype = stored_dtype(pipeline_dir)
        print(
            f"exporting in {dtype}, the precision {pipeline_dir} stores its denoiser in (--dtype chooses)",
            file=sys.stderr,
        )
    pipeline = load_pipeline(pipeline_dir, WEIGHT_DTYPES[dtype])
    settings = run_sampling_settings(str(checkpoint))[0]
    run_policy = settings.get("policy")  # the adapter the run trained through
    policy = policy_for(pipeline, run_policy, "pipeline.policy of the checkpoint's run")
    load_trained_weights(policy, checkpoint)
    if policy.lora_active_from_sigma is not None:
        print(
            f"warning: {checkpoint} samples with its LoRA only at sigma >= {policy.lora_active_from_sigma} "
            "(lora.active_from_sigma / sample_from_sigma); the exported pipeline applies the tuned weights at every "
            "step (to keep the gate: the checkpoint's LoRA with load_lora_weights and "
            "flowrl.export.lora_gate_callback, docs/guide/cli.md)",
            file=sys.stderr,
        )
    if policy.has_lora:
        for module in policy.trained_modules().values():
            module.fuse_lora(lora_scale=1.0)
            module.unload_lora()
    if settings.get("shift") is not None:  # the run's schedule travels with the model: its scheduler's shift
        config = pipeline.scheduler.config
        key = "flow_shift" if "flow_shift" in config else "shift"  # UniPC's (Wan) or flow-match Euler's
        pipeline.scheduler = type(pipeline.scheduler).from_config(config, **{key: settings["shift"]})
        print(f"the exported scheduler's {key} is the run's pipeline.shift, {settings['shift']}", file=sys.stderr)
    pipeline.to(dtype=WEIGHT_DTYPES[dtype])  # a full fine-tune's trained fp32 weights, to the export dtype
    pipeline.save_pretrained(out)
    # the networks training left alone (VAE, text encoders, a frozen expert) are the source folder's files, as
    # stored: a Wan VAE kept in fp32 beside a bf16 transformer is not rounded to bf16 by the export
    trained = {id(module) for module in policy.trained_modules().values()}
    for name, component in pipeline.components.items():
        source = Path(pipeline_dir) / name
        if (
            isinstance(component, torch.nn.Module)
            and id(component) not in trained
            and source.is_dir()
            and (out / name).is_dir()
        ):
            shutil.rmtree(out / name)
            shutil.copytree(source, out / name)
