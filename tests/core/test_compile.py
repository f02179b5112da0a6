"""runtime.compile: the compiled denoiser gives the eager rollout, log-probs and gradients to float tolerance, and
keeps its parameter names (checkpoints and adapters load as before)."""

import pytest
import torch
from run_helpers import tiny_run_config

from flowrl.config import load_config
from flowrl.errors import ConfigError
from flowrl.train import Trainer


def _update(path, overrides):
    trainer = Trainer(load_config(path, overrides), log=False)
    batch, _ = trainer.collect(0)
    items, _ = trainer.algorithm.prepare(batch, trainer.policy)
    losses, _ = trainer.algorithm.loss(trainer.policy, batch, items)
    losses.sum().backward()
    grads = torch.cat([p.grad.flatten() for p in trainer.policy.trainable_parameters()])
    return trainer, batch, grads


def test_a_compiled_update_gives_the_eager_numbers(tiny_sd3_dir, tmp_path):
    """Inductor (the default backend) for the rollout; the backward through it compiles too (~40 s on 2 cores)."""
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "compile", updates=1)
    eager_trainer, eager, eager_grads = _update(path, [])
    trainer, compiled, grads = _update(path, ["runtime.compile=true"])
    assert hasattr(trainer.policy.transformer, "_compiled_call_impl") and trainer.policy.transformer._compiled_call_impl
    torch.testing.assert_close(compiled.trajectory.latents, eager.trajectory.latents, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(compiled.trajectory.log_probs, eager.trajectory.log_probs, atol=1e-4, rtol=1e-4)
    assert eager_grads.abs().sum() > 0
    torch.testing.assert_close(grads, eager_grads, atol=1e-4, rtol=1e-3)
    assert trainer.policy.trainable_state_dict().keys() == eager_trainer.policy.trainable_state_dict().keys()


def test_compile_is_refused_beside_asynchronous_rollouts(tiny_sd3_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "compile")
    with pytest.raises(ConfigError, match=r"^runtime.compile: not with runtime.async_rollouts"):
        load_config(path, ["runtime.compile=true", "runtime.async_rollouts=true"])
