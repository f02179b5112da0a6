"""Placement and precision: after set-up every pipeline component and reward model is on the accelerator's device,
frozen weights are in `memory.weight_dtype`, trainable ones (LoRA) stay fp32, and training runs."""

import math

import pytest
import torch
from run_helpers import tiny_run_config

from flowrl.config import load_config
from flowrl.errors import ConfigError
from flowrl.train import Trainer


@pytest.mark.usefixtures("fresh_accelerator_state")
@pytest.mark.parametrize("weight_dtype", ["fp32", "bf16"])
def test_every_weight_is_placed_with_its_dtype(tiny_sd3_dir, tmp_path, weight_dtype):
    path = tiny_run_config(
        tmp_path / "c.yaml",
        tiny_sd3_dir,
        tmp_path / "runs",
        "placed",
        updates=1,
        weight_dtype=weight_dtype,
        mixed_precision="no" if weight_dtype == "fp32" else weight_dtype,
    )
    config = load_config(path, ["reward=[{name: shapes_clip}]"])  # a reward with a model of its own
    trainer = Trainer(config, log=False)
    frozen = torch.float32 if weight_dtype == "fp32" else torch.bfloat16
    device = trainer.accelerator.device
    trainable = {id(p) for p in trainer.policy.trainable_parameters()}
    assert trainable
    seen = 0
    for name, module in trainer.policy.components().items():
        for param_name, param in module.named_parameters():
            assert param.device.type == device.type, (name, param_name)
            expected = torch.float32 if id(param) in trainable else frozen
            assert param.dtype == expected, (name, param_name, param.dtype)
            seen += 1
    assert seen > 100 and set(trainer.policy.components()) >= {"transformer", "vae", "text_encoder", "text_encoder_3"}
    scorer = trainer.reward.rewards[0].model
    assert all(p.device.type == device.type for p in scorer.parameters())
    rows = []
    trainer.run(lambda update, metrics: rows.append(metrics))
    assert len(rows) == 1 and math.isfinite(rows[0]["loss"]) and math.isfinite(rows[0]["grad_norm"])


def test_a_fully_trained_denoiser_keeps_its_fp32_values_under_half_precision_frozen_weights():
    """Only frozen weights take the half-precision dtype; trainable ones keep their fp32 values exactly (casting the
    whole module and back rounded a full fine-tune's starting weights to bf16)."""
    from tiny_pipelines import tiny_shapes_sd3

    from flowrl.policies import policy_for

    policy = policy_for(tiny_shapes_sd3())
    policy.transformer.requires_grad_(True)  # a full fine-tune (lora: null)
    before = {name: param.detach().clone() for name, param in policy.transformer.named_parameters()}
    policy.place(torch.device("cpu"), torch.bfloat16)
    for name, param in policy.transformer.named_parameters():
        assert param.dtype == torch.float32 and torch.equal(param.detach(), before[name]), name
    assert {p.dtype for p in policy.pipeline.vae.parameters()} == {torch.bfloat16}


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_a_lora_run_loads_its_frozen_weights_in_their_final_dtype(tiny_sd3_dir, tmp_path, monkeypatch):
    """No fp32 copy of a large model in host memory under LoRA; a full fine-tune loads fp32 for its denoiser."""
    import flowrl.builders as builders

    loaded = []

    def recording_load(path, dtype=None):
        loaded.append(dtype)
        return load_pipeline(path, dtype)

    load_pipeline = builders.load_pipeline
    monkeypatch.setattr(builders, "load_pipeline", recording_load)
    path = tiny_run_config(
        tmp_path / "c.yaml",
        tiny_sd3_dir,
        tmp_path / "runs",
        "dtype",
        updates=1,
        weight_dtype="bf16",
        mixed_precision="bf16",
    )
    Trainer(load_config(path), log=False)
    Trainer(load_config(path, ["lora=null", "optim.lr=1.0e-5"]), log=False)
    assert loaded == [torch.bfloat16, None]


def test_reduced_precision_weights_need_autocast(tiny_sd3_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "x", weight_dtype="bf16")
    with pytest.raises(ConfigError, match="memory.weight_dtype: bf16 weights run under autocast"):
        load_config(path)
