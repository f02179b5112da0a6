"""Run a tiny config under torchrun (gloo on CPU) and save, from rank 0, the trained weights to the output file and
the run's StageTrace beside it (OUTPUT.trace): argv is the config, the output file, then any overrides.
FLOWRL_TEST_FSDP2=1 shards the denoiser with FSDP2, as `accelerate launch --config_file configs/accelerate/fsdp2.yaml`
does on GPUs."""

import os
import sys

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.utils import DistributedType
from run_helpers import traced_run
from safetensors.torch import save_file

from flowrl.devices import end_processes

if __name__ == "__main__":
    torch.set_num_threads(1)
    config_path, out_file = sys.argv[1], sys.argv[2]
    if os.environ.get("FLOWRL_TEST_FSDP2") == "1":
        # configs/accelerate/fsdp2.yaml's plugin; accelerate resolves cpu=True to plain gloo DDP (MULTI_CPU) and drops
        # the plugin, so it is put back: prepare() then shards with FSDP2 on the CPU as it does on GPUs
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, reshard_after_forward=True, auto_wrap_policy="transformer_based_wrap"
        )
        accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
        accelerator.state.distributed_type, accelerator.state.fsdp_plugin = DistributedType.FSDP, plugin
        assert accelerator.is_fsdp2
    else:
        accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, accelerator.num_processes
    weights, trace = traced_run(config_path, sys.argv[3:], accelerator=accelerator)
    if accelerator.is_main_process:
        save_file(weights, out_file)
        save_file(trace, f"{out_file}.trace")
    accelerator.wait_for_everyone()
    end_processes(0)
