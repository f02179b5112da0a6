"""Where work runs, and how much of it at once, when a command or a config does not say."""

from __future__ import annotations

import os

import torch

# samples (or states) per no-grad call where no memory setting bounds it: sampling, evaluation batches, the old
# velocities NFT, DHO and DPO regress around (a run's memory.rollout_microbatch / reward_microbatch replace it)
DEFAULT_BATCH_SIZE = 64


def default_device() -> str:
    """`cuda:LOCAL_RANK` on a GPU machine (LOCAL_RANK: this process's slot under torchrun / accelerate launch, or
    inherited from the run that started it; 0 alone), else `cpu`."""
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"


def chosen_device(device: str | None) -> torch.device:
    """The device a command's --device names (None: `default_device`); one UserError for a name torch does not know
    or a GPU this machine does not have, before any weights load."""
    from flowrl.errors import UserError

    device = device or default_device()
    try:
        target = torch.device(device)
    except RuntimeError:
        raise UserError(f"--device: expected cpu, cuda or cuda:N, got {device!r}") from None
    if target.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device: expected cpu, cuda or cuda:N, got {device!r}")
    if target.type == "cuda" and (target.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA devices")
    return target


def use_deterministic_kernels() -> None:
    """Bitwise-repeatable runs on a GPU (`run.deterministic`). CPU kernels already repeat; GPU ones do not: atomics
    in some backward kernels (scatter, index_add, attention's backward), cuDNN's benchmarked algorithm choice and
    cuBLAS's split-K workspaces change the rounding from run to run. PyTorch then raises an error at any op without a
    deterministic kernel rather than silently differ. cuBLAS reads CUBLAS_WORKSPACE_CONFIG when an op runs, so it is
    set here, before the run's first GPU op (a value the user set is kept)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


# how long a command's collectives wait (flowrl sample, eval rewards): the last one waits for the slowest share of the
# job (minutes a clip, or a VLM judge's scoring), past NCCL's 10-minute default
JOB_TIMEOUT_MINUTES = 6 * 60


def job_processes():
    """accelerate's PartialState for a command run under torchrun / accelerate launch (one process alone
    otherwise): each process on its own GPU, collectives waiting JOB_TIMEOUT_MINUTES."""
    from datetime import timedelta

    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(minutes=JOB_TIMEOUT_MINUTES))


def end_processes(status: int) -> None:
    """End a command run under torchrun / accelerate launch with exit status `status` (nothing to do when it made no
    process group). The group is destroyed, as accelerate's `end_training` does. With other processes, this one then
    leaves through `os._exit` once its output is flushed, not through the interpreter's shutdown: DDP's reducer keeps
    gloo's group, and its worker threads, alive past `destroy_process_group`, and a worker still releasing a finished
    collective's tensor while the interpreter shuts down is ended mid-destructor; the process then aborts ("terminate
    called without an active exception", exit -6) after its work is done. Every file a command writes is closed by
    then (metrics, TensorBoard and W&B logs are closed at the end of training)."""
    import logging
    import sys

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    alone = dist.get_world_size() == 1
    dist.destroy_process_group()
    if alone:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status)


# diffusers' attention-dispatcher backends that run without CUDA (the rest need a GPU and, for most, a kernel package)
CPU_ATTENTION_BACKENDS = ("native", "_native_math", "_native_flash", "flex")


def attention_backends() -> list[str]:
    """The backend names diffusers' attention dispatcher knows (`pipeline.attention` takes them beside sdpa and
    xformers)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [backend.value for backend in AttentionBackendName]
