"""Checkpoints that resume a run exactly: trained weights (or LoRA), optimizer, EMA, RNG states and the update.

Layout: <run>/checkpoints/update_000010/{trainable,ema}.safetensors, optimizer.pt, state.json, adapter.json,
run_config.yaml (the run's config, which sampling commands read), and for LoRA runs the adapter as diffusers and peft
load it (flowrl/export.py). The Trainer's use of them (save, resume, set aside) is flowrl/run_checkpoints.py's.
A checkpoint is written to a temporary folder and renamed, so an interruption never leaves a half-written one.
optimizer.pt holds only tensors and plain values and loads with weights_only=True.
"""

from __future__ import annotations

import ast
import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from flowrl.errors import UserError


def save_checkpoint(
    folder: Path,
    update: int,
    trainable: dict,
    optimizer_state: dict,
    ema: dict | None,
    adapter: dict | None = None,
    keep: int = 2,
    write_extra=None,
    grad_scaler: dict | None = None,
) -> Path:
    """Write a checkpoint atomically; `write_extra(tmp_folder)` adds files (e.g. exports) before the rename;
    `grad_scaler` is fp16 training's loss-scale state (its scale and growth tracker)."""
    final = folder / f"update_{update:06d}"
    tmp = folder / f".tmp_update_{update:06d}"
    try:
        _write(tmp, update, trainable, optimizer_state, ema, adapter, write_extra, grad_scaler)
    except OSError as error:  # a full disk, a vanished mount: keep what was there, name the problem
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"could not write checkpoint {final} ({error}); the previous checkpoints are intact") from None
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    older = [p for p in list_checkpoints(folder) if p.name < final.name]  # never the one just written
    for old in older[: max(0, len(older) - (keep - 1))] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write(
    tmp: Path,
    update: int,
    trainable: dict,
    optimizer_state: dict,
    ema: dict | None,
    adapter: dict | None,
    write_extra,
    grad_scaler: dict | None = None,
) -> None:
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in trainable.items()}, tmp / "trainable.safetensors")
    if ema is not None:
        save_file({k: v.contiguous() for k, v in ema.items()}, tmp / "ema.safetensors")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    if adapter is not None:  # how to rebuild the LoRA adapter these weights belong to
        (tmp / "adapter.json").write_text(json.dumps(adapter))
    _, keys, position, has_gauss, gauss = np.random.get_state()  # the whole state: the key and where in it
    state = {
        "update": update,
        "python_rng": repr(random.getstate()),
        "numpy_rng": keys.tolist(),
        "numpy_rng_position": [int(position), int(has_gauss), float(gauss)],
        "torch_rng": torch.get_rng_state().tolist(),
    }
    if grad_scaler:
        state["grad_scaler"] = grad_scaler
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # the GPU's generator: dropout in a trained model
        state["cuda_rng"] = torch.cuda.get_rng_state().tolist()
    if write_extra is not None:
        write_extra(tmp)
    (tmp / "state.json").write_text(json.dumps(state))  # last: a folder without it is never taken for a checkpoint


def checkpoint_update(path) -> int | None:
    """The update a checkpoint folder holds (its state.json), None for none or an unreadable one."""
    try:
        return int(json.loads((Path(path) / "state.json").read_text())["update"]) if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def list_checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("update_*") if (p / "state.json").is_file())


class CorruptCheckpoint(UserError):
    """A checkpoint folder whose files cannot be read back."""


def load_checkpoint(path: Path) -> dict:
    """Read every file of a checkpoint, then restore the RNG states (so a corrupt one changes nothing)."""
    path = Path(path)
    if not (path / "state.json").is_file():
        raise UserError(
            f"checkpoint {path} is incomplete or missing; expected a folder with state.json and "
            "trainable.safetensors (runs/<name>/checkpoints/update_N)"
        )
    if not (path / "trainable.safetensors").is_file():
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt (trainable.safetensors is missing)")
    try:
        state = json.loads((path / "state.json").read_text())
        saved = {
            "update": state["update"],
            "trainable": load_file(path / "trainable.safetensors"),
            "ema": load_file(path / "ema.safetensors") if (path / "ema.safetensors").is_file() else None,
            "optimizer": torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu"),
            "grad_scaler": state.get("grad_scaler"),
        }
        rng = (
            torch.tensor(state["torch_rng"], dtype=torch.uint8),
            np.array(state["numpy_rng"], dtype=np.uint32),
            ast.literal_eval(state["python_rng"]),
        )
        cuda_rng = torch.tensor(state["cuda_rng"], dtype=torch.uint8) if "cuda_rng" in state else None
    except Exception as error:  # truncated or garbled files: whatever the reader raised
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt ({type(error).__name__}: {error})") from None
    torch.set_rng_state(rng[0])
    position = state.get("numpy_rng_position")  # (checkpoints before it kept only the key: its position stays)
    np.random.set_state(("MT19937", rng[1], *(position or np.random.get_state()[2:])))
    random.setstate(rng[2])
    if cuda_rng is not None and torch.cuda.is_available():  # a GPU run's checkpoint resumed on a CPU needs none
        torch.cuda.set_rng_state(cuda_rng)
    return saved


def sampling_gate(adapter: dict) -> float | None:
    """The noise level from which a LoRA acts when sampling (None: every step), from its adapter.json fields."""
    gate = adapter.get("sample_from_sigma")
    return adapter.get("active_from_sigma") if gate is None else gate


def trained_weights_file(path: Path, prefer_ema: bool = True) -> Path:
    """A checkpoint's trained weights (its EMA when present and preferred); one error where there are none (checked
    before a large pipeline loads)."""
    weights_file = path / (
        "ema.safetensors" if prefer_ema and (path / "ema.safetensors").is_file() else "trainable.safetensors"
    )
    if not weights_file.is_file():
        raise UserError(f"checkpoint {path} has no trainable.safetensors; expected runs/<name>/checkpoints/update_N")
    return weights_file


def read_trained_weights(path: Path, prefer_ema: bool = True) -> dict:
    """A checkpoint's trained weights (trained_weights_file's choice); one error for a file that cannot be read."""
    weights_file = trained_weights_file(path, prefer_ema)
    try:
        return load_file(weights_file)
    except Exception as error:  # safetensors' own error type: a truncated or foreign file
        raise CorruptCheckpoint(
            f"checkpoint {path}: {weights_file.name} cannot be read as safetensors "
            f"({str(error)[:120]}); a copy cut short?"
        ) from None


def load_trained_weights(policy, checkpoint: str | Path, prefer_ema: bool = True) -> None:
    """Put a checkpoint's trained weights (EMA when present) into a policy, adding its LoRA adapter if needed (with
    its sampling gate: what `flowrl sample`, `eval` and the demo draw from a checkpoint)."""
    path = Path(checkpoint)
    weights = read_trained_weights(path, prefer_ema)
    policy.train_networks_named(weights, f"checkpoint {path}")
    if any("lora_" in k for k in weights) and not policy.has_lora:
        adapter = json.loads((path / "adapter.json").read_text()) if (path / "adapter.json").is_file() else None
        if adapter is None:
            raise UserError(f"checkpoint {path} holds LoRA weights but no adapter.json describing the adapter")
        try:
            policy.add_lora(adapter["rank"], adapter["alpha"], adapter["target_modules"])
        except ValueError as error:  # peft: no module matches the targets
            raise UserError(
                f"checkpoint {path}: its LoRA does not fit this pipeline (a checkpoint of another model?): "
                f"{str(error)[:200]}"
            ) from None
        policy.lora_active_from_sigma = sampling_gate(adapter)
    policy.load_trainable_state_dict(weights)


RUN_CONFIG = "run_config.yaml"  # in each checkpoint: the run's config, so a copied checkpoint samples as its run did


# what a resumed run may change: how long it trains, how it uses memory, how it logs, checkpoints and evaluates
# along the way; everything its samples and updates depend on must be as the checkpoint's run had it
RESUMABLE_CHANGES = frozenset(
    (
        "run.resume",
        "run.name",
        "run.out_dir",
        "run.wandb",
        "run.deterministic",
        "pipeline.attention",
        "pipeline.vae_slicing",
        "pipeline.vae_tiling",
        "train.updates",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.max_failed_reward_share",
        "memory.microbatch_size",
        "memory.rollout_microbatch",
        "memory.decode_microbatch",
        "memory.reward_microbatch",
        "memory.gradient_checkpointing",
        "memory.offload_text_encoders",
        "memory.embedding_cache",
        "runtime.async_rewards",
        "runtime.async_rollouts",
        "runtime.staleness",  # (switched on, a resume needs the checkpoint's snapshots: said)
        "runtime.threads",
        "runtime.compile",
        "runtime.collective_timeout_minutes",
        "eval.enabled",
        "eval.every",
    )
)


def changed_settings(checkpoint: Path, config: dict) -> list[str]:
    """The settings (`section.field`, or a top-level key such as `reward`) whose values differ between the config a
    checkpoint's run kept (RUN_CONFIG) and `config` (config_to_dict's), beyond RESUMABLE_CHANGES; settings only one
    of them has (a field added to flowrl since) are not compared; [] when the checkpoint kept no config. A config
    saved before the train section was split is read in the current layout (config.upgraded)."""
    import yaml

    from flowrl.config import upgraded

    file = Path(checkpoint) / RUN_CONFIG
    try:
        saved = yaml.safe_load(file.read_text()) if file.is_file() else None
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(saved, dict):
        return []

    def flat(tree: dict) -> dict:
        return {
            f"{name}.{field}" if isinstance(section, dict) else name: value
            for name, section in tree.items()
            for field, value in (section.items() if isinstance(section, dict) else [(None, section)])
        }

    ours, theirs = flat(yaml.safe_load(yaml.safe_dump(config, sort_keys=False))), flat(upgraded(saved))
    return sorted(k for k in ours.keys() & theirs.keys() if ours[k] != theirs[k] and k not in RESUMABLE_CHANGES)


def run_config_file(checkpoint: str | Path) -> Path | None:
    """The config of the run a checkpoint belongs to: the copy in the checkpoint (written since flowrl kept one there),
    else the run dir's config.yaml (runs/<name>/checkpoints/update_N); None when neither is there."""
    path = Path(checkpoint)
    for candidate in (
        path / RUN_CONFIG,
        path.parent.parent / "config.yaml" if path.parent.name == "checkpoints" else None,
    ):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def run_sampling_settings(checkpoint: str | None) -> tuple[dict, Path | None]:
    """What the run a checkpoint belongs to evaluated with, from its config (`run_config_file`): eval steps, guidance
    and seed, the frozen weights' precision, the pipeline's size, text length, second guidance scale, shift,
    reference image size, adapter override and memory settings; ({}, None) where no run config is found. A config
    saved before the train section was split is read in the current layout (config.upgraded)."""
    import yaml

    from flowrl.config import upgraded

    config_file = run_config_file(checkpoint) if checkpoint else None
    if config_file is None:
        return {}, None
    try:
        config = yaml.safe_load(config_file.read_text())
    except (OSError, yaml.YAMLError):
        return {}, None
    if not isinstance(config, dict):  # an empty or truncated file: the built-in defaults
        return {}, None
    config = upgraded(config)
    ev, pipe, memory = config.get("eval") or {}, config.get("pipeline") or {}, config.get("memory") or {}
    # eval.seed: flowrl sample derives each sample's seed as the run's evaluations do, so the run's eval prompts
    # with its seed redraw its evaluation images; weight_dtype: the frozen weights' precision it sampled in
    settings = {
        "steps": ev.get("num_steps"),
        "guidance": ev.get("guidance_scale"),
        "seed": ev.get("seed"),
        "weight_dtype": memory.get("weight_dtype"),
        "height": ev.get("height") or pipe.get("height"),  # the evaluations' size where they had their own
        "width": ev.get("width") or pipe.get("width"),
        "num_frames": ev.get("num_frames") or pipe.get("num_frames"),
        "max_sequence_length": pipe.get("max_sequence_length"),
        "guidance_2": pipe.get("guidance_scale_2"),
        "shift": pipe.get("shift"),
        "reference_size": pipe.get("reference_size"),
        # how it fitted in memory (settings that are off stay unsaid): flowrl sample's batch is the run's
        # rollout batch, as its evaluations sampled
        "batch_size": memory.get("rollout_microbatch") or None,
        "vae_tiling": pipe.get("vae_tiling") or None,
        "vae_slicing": pipe.get("vae_slicing") or None,
        "decode_microbatch": memory.get("decode_microbatch") or None,
        "offload_text_encoders": memory.get("offload_text_encoders") or None,
        "policy": pipe.get("policy"),
    }
    return {k: v for k, v in settings.items() if v is not None}, config_file
