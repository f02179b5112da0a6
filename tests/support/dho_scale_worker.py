"""One of two gloo processes for DHO's scale test, apart from the test module so the spawned processes import only
flowrl.algorithms.dho."""

from datetime import timedelta

import torch.distributed as dist

from flowrl.algorithms.dho import homing_scale


def scale_of_one_half(rank, port, final, out):
    """Process `rank` of two: homing_scale of its half of `final`, written to out[rank]."""
    dist.init_process_group(
        "gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}", timeout=timedelta(seconds=60)
    )
    half = len(final) // 2
    out[rank] = homing_scale(final[rank * half : (rank + 1) * half])
    dist.destroy_process_group()
