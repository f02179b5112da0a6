"""Checkpoints people load without flowrl: a LoRA run's checkpoint loads with diffusers' `load_lora_weights` and
peft's `PeftModel.from_pretrained` and gives flowrl's model exactly (scale included)."""
import torch

from flowrl.checkpoint import load_trained_weights
from flowrl.policies import load_pipeline, policy_for
from flowrl.policies.base import SampleSpec
from run_helpers import tiny_run_config, train_and_collect


def _velocity(policy, seed=0):
    x = torch.randn(2, *policy.noise_shape(SampleSpec(32, 32)), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return policy.velocity(x, 0.6, policy.encode(["a red circle", "two squares"], 2.0), 2.0)


def test_lora_checkpoint_loads_with_diffusers_and_peft(tiny_sd3_dir, tmp_path):
    from peft import PeftModel

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "export", updates=2,
                           lr=3e-2)
    train_and_collect(path)
    checkpoint = tmp_path / "runs" / "export" / "checkpoints" / "update_000002"
    flowrl_policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    base = _velocity(flowrl_policy)
    load_trained_weights(flowrl_policy, checkpoint)  # the EMA weights, as flowrl samples
    expected = _velocity(flowrl_policy)
    assert (expected - base).abs().max() > 1e-3  # training moved the model, so the check can fail

    pipe = load_pipeline(tiny_sd3_dir)
    pipe.load_lora_weights(checkpoint)  # no weight_name: diffusers picks pytorch_lora_weights.safetensors
    torch.testing.assert_close(_velocity(policy_for(pipe, max_sequence_length=16)), expected, rtol=0, atol=0)

    pipe = load_pipeline(tiny_sd3_dir)
    pipe.transformer = PeftModel.from_pretrained(pipe.transformer, checkpoint).base_model.model
    torch.testing.assert_close(_velocity(policy_for(pipe, max_sequence_length=16)), expected, rtol=0, atol=0)
