"""LoRA on a policy's trained networks, through peft: the adapter added (`add_lora`), switched off for the reference
policy (`adapters_off`), and the sampling-time noise-level gate (`noise_level_gated`) that leaves it on only at the
noise levels it was trained at (lora.active_from_sigma).

Every function takes the policy (a FlowPolicy): the adapter lives on each of its `trained_modules()`.
"""

from __future__ import annotations

import contextlib
import functools

import torch

# the self- and cross-attention projections of a video DiT's blocks (attn1 / attn2): Wan's and LTX-Video's LoRA targets
SELF_CROSS_ATTENTION_TARGETS = [
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
]


def add_lora(policy, rank: int, alpha: float, target_modules: list[str], init: str = "gaussian") -> None:
    """Add a trainable LoRA adapter (peft's `LoraConfig(r=rank, lora_alpha=alpha, target_modules, init_lora_weights=
    init)`) to every trained network of `policy`, whose own weights freeze; the adapter's weights are kept fp32."""
    from peft import LoraConfig

    for module in policy.trained_modules().values():
        module.requires_grad_(False)
        module.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, init_lora_weights=init))
    for param in policy.trainable_parameters():  # peft makes the adapter in the base's dtype: keep it fp32, so
        param.data = param.data.float()  # a checkpoint's weights load exactly into a half-precision base


def widest_lora_rank(policy, target_modules: list[str]) -> int:
    """The largest rank a LoRA on `target_modules` can use: the largest min(in, out) among the trained networks'
    linear and convolution layers those names select (by peft's own matching); 0 when they select no such layer (peft
    says what fits). A rank above it is a full-rank adapter on every layer, in memory that a large model cannot
    hold."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    targets = LoraConfig(target_modules=target_modules)
    widest = 0
    for module in policy.trained_modules().values():
        for name, layer in module.named_modules():
            if not check_target_module_exists(targets, name):
                continue
            if isinstance(layer, torch.nn.Linear):
                widest = max(widest, min(layer.in_features, layer.out_features))
            elif isinstance(layer, torch.nn.modules.conv._ConvNd):
                widest = max(widest, min(layer.in_channels, layer.out_channels))
    return widest


def has_lora(module: torch.nn.Module) -> bool:
    """Whether peft has added an adapter to `module`."""
    return bool(getattr(module, "_hf_peft_config_loaded", False))


def adapters_enabled(module: torch.nn.Module) -> bool:
    """Whether a peft-adapted module's adapters are switched on (peft's layers record it each)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return not next(layer.disable_adapters for layer in module.modules() if isinstance(layer, BaseTunerLayer))


def adapted_modules(policy) -> list[torch.nn.Module]:
    """The trained networks of `policy` that carry an adapter (both Wan2.2 experts when both train)."""
    return [m for m in policy.trained_modules().values() if has_lora(m)]


def switch_adapters(policy, on: bool) -> None:
    """Every adapted network's LoRA adapter on (`on`) or off."""
    for module in adapted_modules(policy):
        module.enable_adapters() if on else module.disable_adapters()


@contextlib.contextmanager
def adapters_off(policy):
    """The reference policy for the block: `policy` with every adapter switched off (already off inside a nested
    reference pass), switched back on afterwards where it was on; yields `policy`. A RuntimeError without an adapter
    (a full fine-tune keeps no reference)."""
    if not policy.has_lora:
        raise RuntimeError("the reference policy needs a LoRA adapter (full fine-tuning keeps no reference)")
    if getattr(policy, "_adapters_off", False):  # nested (a gated velocity inside a reference pass): already off
        yield policy
        return
    was_on = [module for module in adapted_modules(policy) if adapters_enabled(module)]
    switch_adapters(policy, False)
    policy._adapters_off = True
    try:
        yield policy
    finally:
        policy._adapters_off = False
        for module in was_on:  # as they were (the demo may have left a checkpoint's second expert off)
            module.enable_adapters()


def noise_level_gated(velocity):
    """Wrap a policy's `velocity(policy, latents, sigma, cond, guidance_scale) -> [B, ...]` in the noise-level gate:
    with `policy.lora_active_from_sigma` set (and an adapter on), samples below that noise level get the
    adapter-free network's output (the reference pass), the others the adapted one's; each pass runs only where
    some row needs it. Without a gate the wrapped velocity runs as it is."""

    @functools.wraps(velocity)
    def gated(policy, latents: torch.Tensor, sigma, cond, guidance_scale: float) -> torch.Tensor:
        threshold = policy.lora_active_from_sigma
        if threshold is None or not policy.has_lora or getattr(policy, "_adapters_off", False):
            return velocity(policy, latents, sigma, cond, guidance_scale)
        s = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).reshape(-1)
        active = (s >= threshold).expand(latents.shape[0]) if s.numel() == 1 else s >= threshold
        if bool(active.all()):
            return velocity(policy, latents, sigma, cond, guidance_scale)
        with policy.reference():
            base = velocity(policy, latents, sigma, cond, guidance_scale)
        if not bool(active.any()):
            return base
        tuned = velocity(policy, latents, sigma, cond, guidance_scale)
        return torch.where(active.reshape(-1, *[1] * (latents.ndim - 1)), tuned, base)

    return gated


def gate_floor(policy) -> tuple[float, str] | None:
    """The noise level below which the gate switches the adapter off, with that reason (None: no gate)."""
    if policy.lora_active_from_sigma is not None and policy.has_lora:
        return policy.lora_active_from_sigma, "lora.active_from_sigma switches the adapter off"
    return None
