"""Checks every policy adapter must pass, shared by the family tests."""

import torch


def assert_lora_trains_every_adapter_and_reference_is_base(policy, x, sigma, cond, guidance_scale):
    """A LoRA on the policy's targets, moved off zero: it changes the velocity, the reference (adapter off) gives the
    base's exactly, and every adapter parameter gets a gradient (DDP stops on a trainable parameter without one)."""
    base = policy.velocity(x, sigma, cond, guidance_scale)
    policy.add_lora(4, 8, policy.lora_targets)
    trainable = policy.trainable_parameters()
    assert trainable and all("lora_" in name for name in policy.trainable_state_dict())
    with torch.no_grad():
        for p in trainable:
            p.add_(0.05 * torch.randn_like(p))
    tuned = policy.velocity(x, sigma, cond, guidance_scale)
    with policy.reference():
        torch.testing.assert_close(policy.velocity(x, sigma, cond, guidance_scale), base)
    assert not torch.allclose(tuned, base)
    tuned.sum().backward()
    assert all(p.grad is not None for p in trainable)
