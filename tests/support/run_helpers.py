"""Helpers shared by the tests: small run configs on the tiny pipeline, the CLI run in-process, two-process runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from flowrl.config import load_config
from flowrl.pretrain_progress import PretrainProgress


def by_section(**fields) -> dict:
    """Fields of the training loop's sections (train, optim, memory, runtime) as config sections, each field in the
    section that holds it: by_section(updates=2, lr=1e-3) == {"train": {"updates": 2}, "optim": {"lr": 1e-3}}."""
    from flowrl.loop_config import MOVED_FROM_TRAIN

    sections = {}
    for key, value in fields.items():
        sections.setdefault(MOVED_FROM_TRAIN.get(key, "train"), {})[key] = value
    return sections


def tiny_run_config(path: Path, pipeline_dir: Path, out_dir: Path, name: str, **train) -> Path:
    """A small run of the shapes task on `pipeline_dir`; `train`: fields of the train, optim, memory or runtime
    sections, each put in its own section (by_section)."""
    data = {
        "run": {"name": name, "out_dir": str(out_dir), "seed": 0},
        "task": {"name": "shapes"},
        "pipeline": {"path": str(pipeline_dir), "height": 32, "width": 32, "max_sequence_length": 16},
        "lora": {"rank": 4, "alpha": 8},
        "sampler": {"kind": "flow", "noise_level": 0.7, "num_steps": 4, "guidance_scale": 2.0},
        "algorithm": {"name": "grpo", "params": {"clip_range": 1e-3, "timestep_fraction": 0.5}},
        "reward": [{"name": "jpeg_compressibility"}],
        "prompts": {"source": "train"},
        **by_section(
            **{
                "updates": 3,
                "groups_per_update": 2,
                "group_size": 4,
                "lr": 1e-3,
                "microbatch_size": 4,
                "optimizer_steps_per_update": 2,
                "ema_decay": 0.5,
                "checkpoint_every": 1,
                "threads": 1,
                **train,
            }
        ),
        "eval": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def train_and_collect(config_path: Path, overrides=(), accelerator=None) -> dict[str, torch.Tensor]:
    from flowrl.train import Trainer

    trainer = Trainer(load_config(config_path, list(overrides)), accelerator=accelerator, log=False)
    trainer.run()
    return {k: v.cpu() for k, v in trainer.policy.trainable_state_dict().items()}


@dataclass
class CliResult:
    """What `run_flowrl` saw, named as subprocess.run(capture_output=True, text=True) names it."""

    returncode: int
    stdout: str
    stderr: str


def run_flowrl(*args) -> CliResult:
    """`flowrl ARGS` run by its entry point, `flowrl.cli.main`, in this process: its exit status and what it
    printed. A new interpreter costs ~4 s of imports before the command does anything, most of a small CLI test's
    time. For commands that need no process of their own: a SIGKILL, torchrun, an environment or a bit-exact
    comparison with a child process's numbers still take `python -m flowrl` (as do the entry point's own tests).
    An exception the CLI does not turn into an exit status propagates (the test fails on it, with its traceback).
    The process-wide settings a command may change (torch's thread count, deterministic kernels, the working
    directory) are restored."""
    import contextlib
    import io
    import os

    from flowrl.cli import main

    out, err = io.StringIO(), io.StringIO()
    threads, deterministic, here = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(), os.getcwd()
    os.chdir(Path(__file__).resolve().parents[2])  # the repository, as the tests run `python -m flowrl` from it
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exit:  # argparse's usage errors; read as the interpreter reads sys.exit's argument
                code = 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 1
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return CliResult(code, out.getvalue(), err.getvalue())


def gloo_env(**extra) -> dict[str, str]:
    """The environment of a test's child processes: CPU processes over gloo, as the multi-process tests mean, also on
    a GPU machine (GPUs hidden: two processes on one GPU cannot form an NCCL group), one thread each."""
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}


def child_env(**extra) -> dict[str, str]:
    """gloo_env with the repository and tests/support importable: a child process finds flowrl, the toy rewards and
    the test workers' helpers."""
    import os

    repo = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(repo), str(repo / "tests" / "support"), os.environ.get("PYTHONPATH", "")])
    return gloo_env(PYTHONPATH=path, **extra)


def torchrun(args, port: int, timeout: float = 600, **env):
    """`python -m torch.distributed.run --nproc_per_node=2 --master_port=PORT ARGS` from the repository root on
    child_env (`env`: more variables), its output captured as text: the finished subprocess.CompletedProcess.
    `port`: one per test, so tests in parallel do not collide. ARGS: a script and its arguments, or "-m", a module
    and its."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}"]
    return subprocess.run(
        [*launcher, *map(str, args)], cwd=repo, env=child_env(**env), capture_output=True, text=True, timeout=timeout
    )


def train_on_two_processes(
    config_path, out_file: Path, port: int, overrides=(), fsdp2=False, nodes: int = 1
) -> dict[str, torch.Tensor]:
    """Rank 0's weights after training `config_path` (with `overrides`) under torchrun on 2 gloo processes, through
    tests/support/distributed_worker.py, on master port `port` (one per test, so tests in parallel do not collide); the
    denoiser sharded by FSDP2 with `fsdp2`, else wrapped in DDP. `nodes` 2: two torchrun launches of one process
    each, node ranks 0 and 1 meeting at a localhost rendezvous, as two machines launch a multi-node run."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    repo = Path(__file__).resolve().parents[2]
    env = child_env(FLOWRL_TEST_FSDP2="1" if fsdp2 else "0")
    worker = [str(repo / "tests/support/distributed_worker.py"), str(config_path), str(out_file), *overrides]
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--master_port={port}"]
    if nodes == 1:
        launches = [[*launcher, "--nproc_per_node=2", *worker]]
    else:
        launches = [
            [*launcher, "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1", "--master_addr=127.0.0.1", *worker]
            for rank in range(2)
        ]
    logs = [Path(f"{out_file}.launch{i}.log") for i in range(len(launches))]  # files: no pipe fills and blocks
    running = [
        subprocess.Popen(args, cwd=repo, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        for args, log in zip(launches, logs)
    ]
    try:
        for process, log in zip(running, logs):
            process.wait(timeout=600)
            assert process.returncode == 0, log.read_text()[-3000:]
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
    return load_file(out_file)


def assert_same_weights(single: dict, double: dict, names=None, tolerance: float = 1e-4) -> None:
    """Two runs' trained weights hold the same names, and those `names` (default: all) agree to `tolerance` relative
    to the largest of them."""
    assert single.keys() == double.keys()
    names = list(single) if names is None else names
    moved = max((single[k] - double[k]).abs().max().item() for k in names)
    scale = max(single[k].abs().max().item() for k in names)
    assert moved <= tolerance * scale, (moved, scale)


class StopsAfterSaving(PretrainProgress):
    """Progress that stops the run (as a kill would) right after it saves `stage` at `step`."""

    def __init__(self, *args, stage: str, step: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_at = (stage, step)

    def save(self, stage, state):
        super().save(stage, state)
        if (stage, state.get("step")) == self.stop_at:
            raise KeyboardInterrupt


def stopped_then_continued(recipe, folder: Path, settings: dict, stage: str, step: int):
    """`recipe(progress)` stopped right after saving `stage` at `step` (saving every step), then run again on the
    progress it left in `folder`: (the names of the stage files saved before the stop, what the second run returns)."""
    import pytest

    with pytest.raises(KeyboardInterrupt):
        recipe(StopsAfterSaving(folder, settings, every_seconds=0, stage=stage, step=step))
    saved = {p.name for p in folder.glob("*.pt")}
    return saved, recipe(PretrainProgress(folder, settings))
