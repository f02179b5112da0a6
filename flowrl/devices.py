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
