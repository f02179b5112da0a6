"""A multi-node launch: two torchrun "nodes" of one process each on this machine, meeting at a localhost rendezvous
(static, master address and port), train two updates exactly as one process does with the same global batch."""

import pytest
from run_helpers import SMOOTH_REWARD, assert_two_processes_train_as_one, tiny_run_config


@pytest.mark.slow
def test_two_nodes_train_as_one_process(tiny_sd3_dir, tmp_path):
    config = tiny_run_config(
        tmp_path / "n.yaml", tiny_sd3_dir, tmp_path / "runs", "nodes", updates=2, checkpoint_every=0
    )
    assert_two_processes_train_as_one(config, tmp_path / "nodes.safetensors", 29541, [SMOOTH_REWARD], nodes=2)


def test_the_shipped_launch_configs_load_in_accelerate():
    from accelerate.commands.config.config_args import load_config_from_file
    from conftest import REPO

    multinode = load_config_from_file(str(REPO / "configs/accelerate/multinode.yaml"))
    assert (multinode.num_machines, multinode.num_processes, multinode.rdzv_backend) == (2, 16, "static")
    for name in ("ddp", "fsdp2"):
        assert load_config_from_file(str(REPO / f"configs/accelerate/{name}.yaml")).num_machines == 1
