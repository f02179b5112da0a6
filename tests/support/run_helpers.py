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
    return traced_run(config_path, overrides, accelerator)[0]


def traced_run(config_path: Path, overrides=(), accelerator=None) -> tuple[dict[str, torch.Tensor], dict]:
    """Train `config_path` (with `overrides`): (the trained weights, the run's StageTrace as a dict of tensors)."""
    from flowrl.train import Trainer

    trainer = Trainer(load_config(config_path, list(overrides)), accelerator=accelerator, log=False)
    trace = StageTrace(trainer)
    trainer.run()
    return {k: v.cpu() for k, v in trainer.policy.trainable_state_dict().items()}, trace.tensors


class StageTrace:
    """What a run computes at each stage, gathered over its processes, in the order it computes them, so that two
    runs can be compared where they first part. `tensors` names each "NNN stage" (NNN: the order): per update
    `latents` (every step of every sample's trajectory), `log_probs`, `rewards` (every sample's) and `advantages` (the
    algorithm's, where it keeps them), then per optimizer step `grads` (the trained parameters' gradients, flattened,
    before clipping) and `weights` (after the step)."""

    def __init__(self, trainer):
        self.tensors: dict[str, torch.Tensor] = {}
        self.trainer = trainer
        collect, prepare = trainer.collect, trainer.algorithm.prepare
        clip, step = trainer.accelerator.clip_grad_norm_, trainer.optimizer.step

        def traced_collect(*args, **kwargs):
            batch, metrics = collect(*args, **kwargs)
            self.add("latents", self.gathered(batch.trajectory.latents.transpose(0, 1)))
            self.add("log_probs", self.gathered(batch.trajectory.log_probs.transpose(0, 1)))
            self.add("rewards", batch.global_rewards)
            return batch, metrics

        def traced_prepare(*args, **kwargs):
            out = prepare(*args, **kwargs)
            if isinstance(getattr(trainer.algorithm, "advantages", None), torch.Tensor):
                self.add("advantages", self.gathered(trainer.algorithm.advantages))
            return out

        def traced_clip(params, *args, **kwargs):
            self.add("grads", flat(p.grad for p in params))
            return clip(params, *args, **kwargs)

        def traced_step(*args, **kwargs):
            out = step(*args, **kwargs)
            self.add("weights", flat(trainer.params))
            return out

        trainer.collect, trainer.algorithm.prepare = traced_collect, traced_prepare
        trainer.accelerator.clip_grad_norm_, trainer.optimizer.step = traced_clip, traced_step

    def gathered(self, local: torch.Tensor) -> torch.Tensor:
        """Every process's rows in process order (the global order); as objects, since groups dropped for a failed
        reward can leave the processes unequal shares."""
        from accelerate.utils import gather_object

        local = local.detach().cpu().contiguous()
        return torch.cat(gather_object([local])) if self.trainer.world > 1 else local

    def add(self, stage: str, value: torch.Tensor) -> None:
        self.tensors[f"{len(self.tensors):03d} {stage}"] = value.detach().float().cpu().clone()


def flat(tensors) -> torch.Tensor:
    """Tensors (FSDP2's sharded ones gathered whole) as one flat float vector."""
    from flowrl.sharding import whole

    return torch.cat([whole(t).detach().float().flatten().cpu() for t in tensors])


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


# Math-library settings under which a process computes with other kernels than the default ones, so that its floats
# round otherwise, as another CPU's do: MKL's matrix products on its code path for any x86 CPU, oneDNN's convolutions
# on SSE4.1 (each library ignores what does not apply to it, e.g. on a CPU without MKL)
OTHER_KERNELS = {"MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}


def train_on_two_processes(
    config_path, out_file: Path, port: int, overrides=(), fsdp2=False, nodes: int = 1, other_kernels=False
) -> dict[str, torch.Tensor]:
    """Rank 0's weights after training `config_path` (with `overrides`) under torchrun on 2 gloo processes, through
    tests/support/distributed_worker.py, on master port `port` (one per test, so tests in parallel do not collide); the
    denoiser sharded by FSDP2 with `fsdp2`, else wrapped in DDP. `nodes` 2: two torchrun launches of one process
    each, node ranks 0 and 1 meeting at a localhost rendezvous, as two machines launch a multi-node run.
    `other_kernels`: the processes compute with OTHER_KERNELS. The run's StageTrace lies beside `out_file`
    (two_process_trace)."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    repo = Path(__file__).resolve().parents[2]
    env = child_env(FLOWRL_TEST_FSDP2="1" if fsdp2 else "0", **(OTHER_KERNELS if other_kernels else {}))
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


# How far two runs of the same updates may part at each stage: the largest difference of a stage's values over the
# largest value. Rollouts and rewards: float32 rounding (1.2e-7 an operation) grown over a rollout's steps and layers,
# with a margin of ~50 over what kernels that round otherwise give (OTHER_KERNELS); a sample drawn from another seed or
# condition parts them by O(1). Advantages and gradients: the group standardisation divides a reward's difference by
# its group's spread, ~1/1000 of the rewards' size on these tiny untrained models, so the rewards' tolerance grows
# 1000-fold; a process's samples counted twice or not at all, or a wrong loss scale, parts them by O(1). Weights: an
# Adam step moves each weight by ~lr whatever its gradient, so a gradient element near zero whose sign differs parts
# the runs by 2 lr (2e-3 at the tests' lr 1e-3: a reward that rounds, such as the JPEG size, does that); 1e-4 is that
# signature's twentieth, and ~20 times what kernels that round otherwise give with a smooth reward.
STAGE_TOLERANCES = {
    "latents": 1e-5,
    "log_probs": 1e-5,
    "rewards": 1e-5,
    "advantages": 1e-2,
    "grads": 1e-2,
    "weights": 1e-4,
}


def two_process_trace(out_file: Path) -> dict[str, torch.Tensor]:
    """The StageTrace that train_on_two_processes saved beside `out_file`."""
    from safetensors.torch import load_file

    return load_file(f"{out_file}.trace")


def assert_trains_as_one(one: dict, two: dict) -> None:
    """Two runs' StageTraces (traced_run's, two_process_trace's) hold the same stages in the same order, every
    gradient is nonzero (the runs train), and each stage agrees within STAGE_TOLERANCES; a failure names the first
    stage where they part and every stage's figure."""
    assert one.keys() == two.keys(), (sorted(one), sorted(two))
    assert all(one[key].abs().max() > 0 for key in one if key.endswith("grads")), "a step trained nothing"
    parted = {key: (one[key] - two[key]).abs().max().item() / max(one[key].abs().max().item(), 1e-30) for key in one}
    over = [key for key, part in parted.items() if part > STAGE_TOLERANCES[key.split()[1]]]
    assert not over, f"first parts at {over[0]}: " + ", ".join(f"{k} {v:.1e}" for k, v in parted.items())


# a smooth reward for runs compared value for value: mean brightness (a reward that rounds, such as the JPEG size,
# turns a last-bit difference of a rollout into another reward)
SMOOTH_REWARD = "reward=[{name: toy_rewards:Brightness}]"


def assert_two_processes_train_as_one(config_path, out_file: Path, port: int, overrides=(), **launch) -> dict:
    """`config_path` (with `overrides`) trained in this process and on two processes computing with OTHER_KERNELS
    (train_on_two_processes, with `launch`: fsdp2, nodes) agree at every stage (assert_trains_as_one) and in the
    trained weights (assert_same_weights). Returns this process's trained weights."""
    single, one = traced_run(config_path, [*overrides, "run.name=single"])
    double = train_on_two_processes(
        config_path, out_file, port, [*overrides, "run.name=two"], other_kernels=True, **launch
    )
    assert_trains_as_one(one, two_process_trace(out_file))
    assert_same_weights(single, double)
    return single


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
