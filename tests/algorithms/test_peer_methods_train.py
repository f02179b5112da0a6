"""GRPO-Guard, AWM, TempFlow-weighted GRPO and MixGRPO's sampler train through the loop on a tiny pipeline: every
update changes the adapter and reports finite metrics, and MixGRPO's window moves as its schedule says."""

import pytest
import torch
from run_helpers import tiny_run_config

from flowrl.config import load_config
from flowrl.train import Trainer

RECIPES = {
    "grpo_guard": ["algorithm={name: grpo_guard, params: {timestep_fraction: 0.5}}"],
    "awm": ["algorithm={name: awm, params: {timesteps: 2}}", "sampler.kind=ode"],
    "grpo_tempflow": ["algorithm.params.step_weight=tempflow"],
    "mixgrpo": [
        "sampler.sde_window_size=2",
        "sampler.sde_window_range=[0,3]",
        "sampler.sde_window_schedule=progressive",
        "sampler.sde_window_shift_every=1",
        "sampler.ode_solver=dpm2",
    ],
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_peer_methods_train_through_the_loop(recipe, tiny_sd3_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", recipe, updates=2, checkpoint_every=0)
    trainer = Trainer(load_config(path, RECIPES[recipe]), log=False)
    before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
    windows, history = [], []
    collect = trainer.collect

    def recording_collect(update, *args, **kwargs):
        batch, metrics = collect(update, *args, **kwargs)
        windows.append(torch.nonzero(batch.trajectory.stochastic).flatten().tolist())
        return batch, metrics

    trainer.collect = recording_collect
    trainer.run(lambda update, metrics: history.append(metrics))
    after = trainer.policy.trainable_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in history)
    if recipe == "mixgrpo":
        assert windows == [[0, 1], [1, 2]]


@pytest.mark.slow
def test_grpo_guard_on_two_processes_trains_as_one(tiny_sd3_dir, tmp_path):
    """Each process recomputes its own items' rollout means (as many forwards on every process); the global update is
    one process's."""
    from run_helpers import SMOOTH_REWARD, assert_two_processes_train_as_one

    path = tiny_run_config(tmp_path / "g.yaml", tiny_sd3_dir, tmp_path / "runs", "guard", updates=2, checkpoint_every=0)
    guard = [*RECIPES["grpo_guard"], SMOOTH_REWARD]
    assert_two_processes_train_as_one(path, tmp_path / "two.safetensors", 29545, guard)
