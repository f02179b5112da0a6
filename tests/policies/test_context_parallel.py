"""Context parallelism on Wan through diffusers' ContextParallelConfig: two CPU processes sharing every clip's tokens
(Ulysses) give the velocities, rollout and log-probs one process gives."""

import pytest
import torch
from conftest import REPO
from run_helpers import torchrun
from safetensors.torch import load_file

from flowrl.errors import ConfigError


@pytest.mark.slow
def test_two_processes_sharing_a_clips_tokens_give_one_processs_numbers(tmp_path):
    out = tmp_path / "cp.safetensors"
    result = torchrun([REPO / "tests/support/context_parallel_worker.py", out], port=29543)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = load_file(out)
    assert saved["alone.log_probs"].abs().sum() > 0
    # each process ran the blocks on half of every clip's tokens
    assert torch.equal(saved["shared.tokens"] * 2, saved["alone.tokens"])
    for name in ("velocity", "latents", "log_probs", "rescored"):
        torch.testing.assert_close(saved[f"shared.{name}"], saved[f"alone.{name}"], atol=1e-5, rtol=1e-5)


def test_context_parallelism_needs_a_process_group():
    from tiny_pipelines import tiny_wan

    from flowrl.policies import policy_for
    from flowrl.policies.placement import enable_context_parallel

    with pytest.raises(ConfigError, match="context parallelism: needs a process group"):
        enable_context_parallel(policy_for(tiny_wan(), max_sequence_length=16), ulysses_degree=2)
