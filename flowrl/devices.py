"""Where work runs, and how much of it at once, when a command or a config does not say."""
from __future__ import annotations

import os

import torch

# samples (or states) per no-grad call where no memory setting bounds it: sampling, evaluation batches, the old
# velocities NFT, DHO and DPO regress around (a run's train.rollout_microbatch / reward_microbatch replace it)
DEFAULT_BATCH_SIZE = 64


def default_device() -> str:
    """`cuda:LOCAL_RANK` on a GPU machine (LOCAL_RANK: this process's slot under torchrun / accelerate launch, or
    inherited from the run that started it; 0 alone), else `cpu`."""
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"


# how long a command's collectives wait (flowrl sample, eval rewards): the last one waits for the slowest share of the
# job (minutes a clip, or a VLM judge's scoring), past NCCL's 10-minute default
JOB_TIMEOUT_MINUTES = 6 * 60


def job_processes():
    """accelerate's PartialState for a command run under torchrun / accelerate launch (one process alone
    otherwise): each process on its own GPU, collectives waiting JOB_TIMEOUT_MINUTES."""
    from datetime import timedelta

    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(minutes=JOB_TIMEOUT_MINUTES))
