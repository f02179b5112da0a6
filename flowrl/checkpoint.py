"""Checkpoints that resume a run exactly: trained weights (or LoRA), optimizer, EMA, RNG states and the update.

Layout: <run>/checkpoints/update_000010/{trainable,ema}.safetensors, optimizer.pt, state.json, adapter.json, and
for LoRA runs the adapter as diffusers and peft load it (flowrl/export.py).
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

from .errors import UserError


def save_checkpoint(folder: Path, update: int, trainable: dict, optimizer_state: dict, ema: dict | None,
                    adapter: dict | None = None, keep: int = 2, write_extra=None) -> Path:
    """Write a checkpoint atomically; `write_extra(tmp_folder)` adds files (e.g. exports) before the rename."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"update_{update:06d}"
    tmp = folder / f".tmp_update_{update:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in trainable.items()}, tmp / "trainable.safetensors")
    if ema is not None:
        save_file({k: v.contiguous() for k, v in ema.items()}, tmp / "ema.safetensors")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    if adapter is not None:  # how to rebuild the LoRA adapter these weights belong to
        (tmp / "adapter.json").write_text(json.dumps(adapter))
    state = {"update": update, "python_rng": repr(random.getstate()),
             "numpy_rng": np.random.get_state()[1].tolist(), "torch_rng": torch.get_rng_state().tolist()}
    (tmp / "state.json").write_text(json.dumps(state))
    if write_extra is not None:
        write_extra(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(folder)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("update_*") if (p / "state.json").is_file())


def load_checkpoint(path: Path) -> dict:
    path = Path(path)
    if not (path / "state.json").is_file() or not (path / "trainable.safetensors").is_file():
        raise UserError(f"checkpoint {path} is incomplete or missing; expected a folder with state.json and "
                        "trainable.safetensors (runs/<name>/checkpoints/update_N)")
    state = json.loads((path / "state.json").read_text())
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    np_state = np.random.get_state()
    np.random.set_state((np_state[0], np.array(state["numpy_rng"], dtype=np.uint32), *np_state[2:]))
    random.setstate(ast.literal_eval(state["python_rng"]))
    return {"update": state["update"],
            "trainable": load_file(path / "trainable.safetensors"),
            "ema": load_file(path / "ema.safetensors") if (path / "ema.safetensors").is_file() else None,
            "optimizer": torch.load(path / "optimizer.pt", weights_only=True)}


def load_trained_weights(policy, checkpoint: str | Path, prefer_ema: bool = True) -> None:
    """Put a checkpoint's trained weights (EMA when present) into a policy, adding its LoRA adapter if needed."""
    path = Path(checkpoint)
    weights_file = path / ("ema.safetensors" if prefer_ema and (path / "ema.safetensors").is_file() else "trainable.safetensors")
    if not weights_file.is_file():
        raise UserError(f"checkpoint {path} has no trainable.safetensors; expected runs/<name>/checkpoints/update_N")
    weights = load_file(weights_file)
    if any("lora_" in k for k in weights) and not policy.has_lora:
        adapter = json.loads((path / "adapter.json").read_text()) if (path / "adapter.json").is_file() else None
        if adapter is None:
            raise UserError(f"checkpoint {path} holds LoRA weights but no adapter.json describing the adapter")
        policy.add_lora(adapter["rank"], adapter["alpha"], adapter["target_modules"])
    policy.load_trainable_state_dict(weights)
