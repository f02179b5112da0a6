"""`pipeline.attention` routes the denoisers' attention through diffusers' dispatcher: the CPU backends give today's
velocities, a GPU-only backend and a pipeline without dispatched attention are refused with one error."""

import pytest
import torch
from run_helpers import tiny_run_config

from flowrl.builders import placed_policy, sample_spec
from flowrl.config import load_config
from flowrl.errors import ConfigError


@pytest.fixture(autouse=True)
def restore_default_backend():
    """The dispatcher's active backend is process-wide: put diffusers' default back for the tests after these."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    yield
    _AttentionBackendRegistry.set_active_backend(AttentionBackendName.NATIVE)


def _velocity(config_path, attention: str) -> torch.Tensor:
    config = load_config(config_path, [f"pipeline.attention={attention}", "pipeline.num_frames=5"])
    policy = placed_policy(config, torch.device("cpu"))
    cond = policy.encode(["a red circle", "a blue square"], 2.0)
    shape = policy.noise_shape(sample_spec(config, policy))
    x = torch.randn((2, *shape), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return policy.velocity(x, torch.tensor([0.9, 0.4]), cond, 2.0)


def test_the_cpu_backends_give_the_default_velocities(tiny_wan_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_wan_dir, tmp_path / "runs", "attn")
    default = _velocity(path, "sdpa")
    assert default.abs().sum() > 0
    for backend in ("native", "_native_math"):
        torch.testing.assert_close(_velocity(path, backend), default, atol=1e-5, rtol=1e-5)


def test_the_backend_reaches_every_dispatched_attention(tiny_wan_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_wan_dir, tmp_path / "runs", "attn")
    policy = placed_policy(load_config(path, ["pipeline.attention=_native_math"]), torch.device("cpu"))
    backends = {
        str(module.processor._attention_backend)
        for module in policy.transformer.modules()
        if hasattr(getattr(module, "processor", None), "_attention_backend")
    }
    assert backends == {"AttentionBackendName._NATIVE_MATH"}


def test_a_gpu_only_backend_is_refused_on_the_cpu(tiny_wan_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_wan_dir, tmp_path / "runs", "attn")
    with pytest.raises(ConfigError, match=r"pipeline.attention: _flash_3 runs on CUDA only"):
        placed_policy(load_config(path, ["pipeline.attention=_flash_3"]), torch.device("cpu"))


def test_an_unknown_backend_is_refused_when_the_config_loads(tiny_wan_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_wan_dir, tmp_path / "runs", "attn")
    with pytest.raises(ConfigError, match=r"pipeline.attention: expected sdpa, xformers or one of .*'flash'"):
        load_config(path, ["pipeline.attention=flash4"])


def test_a_pipeline_without_dispatched_attention_is_refused(tiny_sd3_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "attn")
    with pytest.raises(ConfigError, match=r"SD3Transformer2DModel computes attention without diffusers' dispatcher"):
        placed_policy(load_config(path, ["pipeline.attention=native"]), torch.device("cpu"))
