"""Where work runs when a command is not told: this process's GPU when there is one, else the CPU."""
from __future__ import annotations

import os

import torch


def default_device() -> str:
    """`cuda:LOCAL_RANK` on a GPU machine (LOCAL_RANK: this process's slot under torchrun / accelerate launch, or
    inherited from the run that started it; 0 alone), else `cpu`."""
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
