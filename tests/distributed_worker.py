"""Run a tiny config under torchrun (gloo on CPU) and save the trained weights from rank 0: argv is the config, the
output file, then any overrides."""
import sys

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from run_helpers import train_and_collect

if __name__ == "__main__":
    torch.set_num_threads(1)
    config_path, out_file = sys.argv[1], sys.argv[2]
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, accelerator.num_processes
    weights = train_and_collect(config_path, sys.argv[3:], accelerator=accelerator)
    if accelerator.is_main_process:
        save_file(weights, out_file)
    accelerator.wait_for_everyone()
