"""Pretraining-data regularization (train.data_loss): the flow-matching loss on renders, its wiring and errors."""

import pytest
import torch
from tiny_pipelines import tiny_shapes_sd

from flowrl.config import DataLossSection
from flowrl.data_loss import DataLoss
from flowrl.errors import ConfigError
from flowrl.policies import load_pipeline, policy_for
from flowrl.tasks import build_task


def test_data_loss_batches_are_seeded_and_descending_it_fits_them(tiny_sd3_dir):
    torch.manual_seed(0)
    policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    data = DataLoss(DataLossSection(weight=1.0, batch=4), policy, build_task("shapes"), seed=3)
    first, again, other = data.batch(5, 0, 0), data.batch(5, 0, 0), data.batch(6, 0, 0)
    assert first[1] == again[1] and (first[0] == again[0]).all()
    assert first[1] != other[1]
    params = policy.trainable_parameters()
    optimizer = torch.optim.Adam(params, lr=5e-2)
    losses = []
    for _ in range(10):  # the same batch and noise every time: descending the loss must fit it
        loss = data(5, 0, 0)
        optimizer.zero_grad()
        loss.backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


def test_data_loss_on_a_noise_prediction_pipeline_is_a_config_error():
    with pytest.raises(ConfigError, match="train.data_loss"):
        DataLoss(DataLossSection(), policy_for(tiny_shapes_sd()), build_task("shapes"), seed=0)


def test_bad_data_loss_fields_are_named():
    with pytest.raises(ConfigError, match="train.data_loss"):
        DataLossSection(weight=-1.0).validate()


def test_a_run_with_the_data_loss_resumes_exactly(tiny_sd3_dir, tmp_path):
    from run_helpers import tiny_run_config, train_and_collect

    extra = ["train.data_loss={weight: 0.5, batch: 4}"]
    straight = tiny_run_config(tmp_path / "a.yaml", tiny_sd3_dir, tmp_path / "runs", "straight", updates=2)
    expected = train_and_collect(straight, extra)
    without = train_and_collect(straight, ["run.name=plain"])
    assert any(not torch.equal(expected[k], without[k]) for k in expected)  # the data loss took part
    split = tiny_run_config(tmp_path / "b.yaml", tiny_sd3_dir, tmp_path / "runs", "split", updates=2)
    train_and_collect(split, extra + ["train.updates=1"])
    resumed = train_and_collect(split, extra)
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name
