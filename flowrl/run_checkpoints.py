"""A run folder's checkpoints as the Trainer keeps them: save, find the one to resume from, set aside a corrupt one or
the newer ones a rewind abandons, restore weights, optimizer, EMA and loss scale. The checkpoint format itself (files,
atomic writes, RNG states) is flowrl/checkpoint.py's.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from flowrl.builders import adapter_description
from flowrl.checkpoint import (
    RUN_CONFIG,
    CorruptCheckpoint,
    checkpoint_update,
    list_checkpoints,
    load_checkpoint,
    sampling_gate,
    save_checkpoint,
)
from flowrl.config import RunConfig, config_to_dict
from flowrl.errors import ConfigError
from flowrl.export import write_lora_files
from flowrl.faults import fault_point
from flowrl.sharding import gathered, gathered_optimizer_state, like, sharded_optimizer_state


class RunCheckpoints:
    """The checkpoints of a Trainer's run folder (`<run dir>/checkpoints/update_N`).

    Args:
        trainer: the Trainer whose policy, optimizer, EMA, rollout worker and processes are saved and restored.

    Attributes:
        folder: the checkpoints' folder.
        saved_update: the update the run folder's newest checkpoint holds, once known (None before).
        saved_snapshots: the rollout worker's weight snapshots the resumed checkpoint carried (version -> weights).
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.folder = Path(trainer.run_dir) / "checkpoints"
        self.saved_update: int | None = None
        self.saved_snapshots: dict[int, dict] = {}

    def save(self) -> Path | None:
        """Write a checkpoint of the trainer's current update from the main process (under FSDP2 every process calls
        this, to gather the shards): trained weights, optimizer, EMA, RNG states, the run's config, the rollout
        worker's snapshots and, for a LoRA, the adapter as diffusers and peft load it.

        Returns:
            The checkpoint folder on the main process; None on the others.
        """
        trainer = self.trainer
        update = trainer.state.update
        self.saved_update = update  # on every process (not read from disk, which the main one writes)
        if not (trainer.is_main or trainer.sharded()):
            return None
        keep, named = trainer.is_main, trainer.policy.named_trainable_parameters()  # in the order of the EMA
        trainable = gathered(named, keep)
        ema = gathered(dict(zip(named, trainer.state.ema)), keep) if trainer.state.ema is not None else None
        optimizer_state = gathered_optimizer_state(trainer.optimizer.state_dict(), keep)
        if not keep:
            return None
        adapter = adapter_description(trainer.config, trainer.policy)

        def export(folder):
            (folder / RUN_CONFIG).write_text(yaml.safe_dump(config_to_dict(trainer.config), sort_keys=False))
            if trainer.worker is not None:  # the weights the batches after this update are sampled with
                trainer.worker.write_snapshots(folder, update)
            if trainer.policy.has_lora:  # the weights flowrl samples with, loadable by diffusers and peft
                write_lora_files(trainer.policy, ema or trainable, folder, sampling_gate(adapter))
            fault_point("checkpoint", update)  # files written, state.json not yet

        scaler = getattr(trainer.accelerator, "scaler", None)  # fp16's loss scale: a resume starts where it stood
        return save_checkpoint(
            self.folder,
            update,
            trainable,
            optimizer_state,
            ema,
            adapter,
            keep=trainer.config.train.keep_checkpoints,
            write_extra=export,
            grad_scaler=scaler.state_dict() if scaler is not None else None,
        )

    def resume_path(self) -> Path | None:
        """The checkpoint a run would resume from, without reading it.

        Returns:
            run.resume's folder when it names one, else the run folder's newest checkpoint, else None.
        """
        requested = self.trainer.config.run.resume
        if requested and requested != "auto":
            return Path(requested)
        found = list_checkpoints(self.folder)
        return found[-1] if found else None

    def resume(self) -> Path | None:
        """Restore the checkpoint to resume from: the one named in run.resume (the run folder's newer ones then set
        aside), or the newest readable one of the run folder (a corrupt newest one is reported, renamed
        corrupt_update_N and the one before it used).

        Returns:
            The checkpoint restored, or None when there is none (a fresh start).
        """
        trainer = self.trainer
        requested = trainer.config.run.resume
        if requested and requested != "auto":
            self.restore(Path(requested))
            self.set_aside_newer(Path(requested))
            return Path(requested)
        for path in reversed(list_checkpoints(self.folder)):
            error = None
            try:
                self.restore(path)
            except CorruptCheckpoint as failure:
                error = failure
            # every process takes the checkpoint or sets it aside together (one that read it whole while another
            # did not would train on while the other waits)
            if trainer.global_sum(int(error is not None)) == 0:
                return path
            aside = path.with_name(f"corrupt_{path.name}")  # kept for inspection; pruning and resumes skip it
            trainer.accelerator.wait_for_everyone()  # every process is done reading it before the main one moves it
            if trainer.is_main:
                shutil.rmtree(aside, ignore_errors=True)
                path.rename(aside)
                tqdm.write(
                    f"{error or 'another process could not read it'}; moved to {aside.name}, trying the "
                    "checkpoint before it"
                )
        return None

    def set_aside_newer(self, path: Path) -> None:
        """Rewound to an older checkpoint of this run folder, the newer ones belong to the line abandoned: renamed to
        abandoned_update_N (kept for inspection), or a later auto resume would pick them up again while this line's
        metrics rows past `path` are gone.

        Args:
            path: the checkpoint resumed from (nothing is moved when it is another run's).
        """
        resumed = checkpoint_update(path)
        if Path(path).resolve().parent != self.folder.resolve() or resumed is None:
            return
        newer = [
            p
            for p in list_checkpoints(self.folder)  # by update number, never the resumed folder
            if (checkpoint_update(p) or 0) > resumed and p.resolve() != Path(path).resolve()
        ]
        self.trainer.accelerator.wait_for_everyone()  # every process has read its checkpoint before any is moved
        if self.trainer.is_main:
            for old in newer:
                aside, n = old.with_name(f"abandoned_{old.name}"), 1
                while aside.exists():  # an earlier rewind's: kept too
                    aside, n = old.with_name(f"abandoned{n}_{old.name}"), n + 1
                old.rename(aside)
                tqdm.write(
                    f"resumed from {Path(path).name}: {old.name} (a later checkpoint of the line left) moved "
                    f"to {aside.name}"
                )

    def restore(self, path: Path) -> None:
        """Load a checkpoint into the trainer: trained weights, optimizer state (with this config's weight decay and
        betas), EMA, loss scale, RNG states and the update number.

        Args:
            path: the checkpoint folder.

        Raises:
            CorruptCheckpoint: when its files cannot be read (nothing is changed then).
            ConfigError: when it trained other weights than this config does.
        """
        trainer, optim = self.trainer, self.trainer.config.optim
        saved = load_checkpoint(path)
        ours = set(trainer.policy.named_trainable_parameters())  # names, no copies
        theirs = set(saved["trainable"])
        if ours != theirs:  # another adapter, or another choice of what trains (pipeline.experts, lora vs full)
            only = sorted(theirs - ours)[:1] or sorted(ours - theirs)[:1]
            raise ConfigError(
                f"run.resume: checkpoint {path} trained other weights than this config does (e.g. "
                f"{only[0]} is in {'the checkpoint' if theirs - ours else 'this run'} only): resume "
                "with the run's own lora and pipeline.experts settings, or start a new run.name"
            )
        trainer.policy.load_trainable_state_dict(saved["trainable"])
        in_order = [p for group in trainer.optimizer.param_groups for p in group["params"]]
        trainer.optimizer.load_state_dict(sharded_optimizer_state(saved["optimizer"], in_order))
        for group in trainer.optimizer.param_groups:  # the saved groups carry their run's hyperparameters: this
            group["weight_decay"] = optim.weight_decay  # config's apply (lr is set every update)
            if "betas" in group:
                group["betas"] = tuple(optim.adam_betas)
            if "momentum" in group:  # (SGD's momentum is adam_betas[0], as build_optimizer sets it)
                group["momentum"] = optim.adam_betas[0]
        if trainer.state.ema is not None:  # the saved EMA, or (a run saved without one) the restored weights
            with torch.no_grad():
                for e, (name, p) in zip(trainer.state.ema, trainer.policy.named_trainable_parameters().items()):
                    e.copy_(like(saved["ema"][name], e) if saved["ema"] is not None else p.detach())
        scaler = getattr(trainer.accelerator, "scaler", None)
        if scaler is not None and saved["grad_scaler"]:
            scaler.load_state_dict(saved["grad_scaler"])
        trainer.state.update = saved["update"]
        if Path(path).resolve().parent == self.folder.resolve():  # the run folder holds it (not another run's)
            self.saved_update = saved["update"]
        from flowrl.async_rollouts import read_snapshots

        self.saved_snapshots = read_snapshots(path)


@contextmanager
def swap_in_ema(params: list[torch.Tensor], ema: list[torch.Tensor] | None):
    """The EMA weights in place of the trained ones inside the block (for evaluation), the trained ones back after.

    Args:
        params: the trained parameters.
        ema: their EMA, in the same order; None (no EMA) leaves the weights as they are.
    """
    if ema is None:
        yield
        return
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        torch._foreach_copy_(params, ema)
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_(params, saved)


def write_config(config: RunConfig, run_dir: Path) -> None:
    """Write the run's config into its folder (config.yaml, all fields, as `flowrl sample --checkpoint` reads it).

    Args:
        config: the run's config.
        run_dir: the run folder (created if missing).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
