"""What the Trainer builds from a config: the policy (pipeline, adapter, placement, memory options), the rewards and
the optimizer, with the small settings that make them fit a multi-process launch (FSDP2's precision, DDP's buffers).
"""

from __future__ import annotations

import torch

from flowrl.algorithms.base import ALGORITHMS
from flowrl.config import RunConfig
from flowrl.errors import ConfigError
from flowrl.loop_config import OptimSection
from flowrl.policies import WEIGHT_DTYPES, load_pipeline, policy_for
from flowrl.policies.base import SampleSpec
from flowrl.policies.lora import widest_lora_rank
from flowrl.policies.placement import compile_denoisers
from flowrl.preflight import check_reward_modalities
from flowrl.rewards import WeightedSum, build_reward
from flowrl.rewards.base import REWARDS


def build_policy(config: RunConfig):
    """The config's pipeline loaded into its policy adapter, with the pipeline section's settings and the trained
    weights chosen: a LoRA adapter (every loaded weight frozen), or the full denoiser (`lora: null`).

    Under LoRA every loaded weight stays frozen, so it loads in its final dtype (a large model never sits in host
    memory in fp32: FLUX with T5-XXL would take ~67 GB per process); a full fine-tune loads fp32 for its trainable
    denoiser.

    Args:
        config: the run's config.

    Returns:
        The FlowPolicy, on the host, not yet placed (`placed_policy` places it).
    """
    dtype = WEIGHT_DTYPES[config.memory.weight_dtype] if config.lora is not None else None
    pipeline = config.pipeline
    policy = policy_for(
        load_pipeline(pipeline.path, dtype), pipeline.policy, max_sequence_length=pipeline.max_sequence_length
    )
    policy.set_guidance_scale_2(pipeline.guidance_scale_2, "pipeline.guidance_scale_2")
    policy.set_trained_experts(pipeline.experts, "pipeline.experts")
    policy.set_shift(pipeline.shift, "pipeline.shift")
    policy.set_reference_size(pipeline.reference_size, "pipeline.reference_size")
    if config.lora is not None:
        targets = config.lora.target_modules or policy.lora_targets
        if not targets:
            raise ConfigError(
                f"lora.target_modules: {type(policy).__name__} names no default LoRA targets; list the "
                "denoiser's module names to adapt (e.g. [attn.to_q, attn.to_k, attn.to_v])"
            )
        widest = widest_lora_rank(policy, targets)  # 0: no linear or convolution layer named; peft says what fits
        if widest and config.lora.rank > widest:
            raise ConfigError(
                f"lora.rank: expected at most {widest} (the widest adapted layer's smaller side; a larger rank is a "
                f"full-rank adapter everywhere), got {config.lora.rank}"
            )
        policy.add_lora(config.lora.rank, config.lora.alpha, targets)
        policy.lora_active_from_sigma = config.lora.active_from_sigma
    else:
        for module in policy.trained_modules().values():
            module.requires_grad_(True)
    return policy


def uncond_grad_of(config: RunConfig) -> bool:
    """Whether the gradient flows through CFG's unconditional branch.

    Args:
        config: the run's config.

    Returns:
        train.cfg_uncond_grad when set, else the algorithm's own rule: a method that backpropagates a reward through
        the sampler keeps it (its gradient is the guided output's), a likelihood-ratio method drops it (Flow-GRPO).
    """
    if config.train.cfg_uncond_grad is not None:
        return config.train.cfg_uncond_grad
    return bool(ALGORITHMS.get(config.algorithm.name, "algorithm.name").needs_reward_gradient)


def placed_policy(config: RunConfig, device):
    """`build_policy` made ready to run: the learner's policy, and the asynchronous rollout worker's copy.

    Args:
        config: the run's config (its memory section: frozen-weight dtype, offloading, checkpointing, cuts).
        device: the torch device it runs on.

    Returns:
        The FlowPolicy on `device`, with the CFG gradient rule and memory options set.
    """
    policy = build_policy(config)
    policy.cfg_uncond_grad = uncond_grad_of(config)
    memory = config.memory
    policy.place(device, WEIGHT_DTYPES[memory.weight_dtype], text_encoders_on_host=memory.offload_text_encoders)
    policy.set_memory_options(
        memory.gradient_checkpointing,
        config.pipeline.vae_slicing,
        config.pipeline.vae_tiling,
        memory.offload_text_encoders,
        memory.embedding_cache,
        memory.decode_microbatch,
        config.pipeline.attention,
    )
    if config.runtime.compile:
        compile_denoisers(policy)
    return policy


def build_term(term, where: str):
    """One configured reward term, built here or served by a child process of its own (`process: true`).

    Args:
        term: the RewardTerm.
        where: its place in the config for errors (`reward[i]`).

    Returns:
        The Reward.
    """
    if not term.process:
        return build_reward(term.name, where=where, **term.params)
    from flowrl.rewards.remote import ProcessReward

    REWARDS.get(term.name, f"{where}.name")  # a bad name fails here; bad params fail in the child, quoted
    return ProcessReward(term.name, term.params)


def build_rewards(config: RunConfig, modality: str | None = None) -> WeightedSum:
    """The weighted sum of the config's reward terms.

    Args:
        config: the run's config.
        modality: the pipeline's (image, video, 3d); every term must score it (checked when given).

    Returns:
        The WeightedSum, on the host.

    Raises:
        ConfigError: for two terms of one name (each term's scores are logged and normalised under its name), or a
            term that cannot score `modality`.
    """
    terms = [build_term(t, f"reward[{i}]") for i, t in enumerate(config.reward)]
    names = [term.name for term in terms]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(
                f"reward[{i}]: a second term named {name!r} (reward[{names.index(name)}] is one): its "
                "scores would overwrite the first's; give one a params.name of its own (remote) or "
                "combine them in one term"
            )
    reward = WeightedSum(terms, [t.weight for t in config.reward], [t.batch_size for t in config.reward])
    if modality is not None:
        check_reward_modalities(config, reward, modality)
    return reward


def build_optimizer(optim: OptimSection, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer named by optim.optimizer.

    Args:
        optim: the config's optim section (lr, betas, weight decay).
        params: the trained parameters.

    Returns:
        AdamW, bitsandbytes' AdamW8bit, or SGD (momentum = adam_betas[0]).
    """
    if optim.optimizer == "sgd":
        return torch.optim.SGD(params, lr=optim.lr, momentum=optim.adam_betas[0], weight_decay=optim.weight_decay)
    if optim.optimizer == "adamw_8bit":
        try:
            import bitsandbytes
        except ImportError:
            raise ConfigError(
                "optim.optimizer: adamw_8bit needs bitsandbytes (pip install bitsandbytes; CUDA)"
            ) from None
        return bitsandbytes.optim.AdamW8bit(
            params, lr=optim.lr, betas=tuple(optim.adam_betas), weight_decay=optim.weight_decay
        )
    return torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.adam_betas), weight_decay=optim.weight_decay)


def sample_spec(config: RunConfig, policy) -> SampleSpec:
    """The size a run samples at.

    Args:
        config: the run's config (pipeline.height, width, num_frames).
        policy: the loaded FlowPolicy.

    Returns:
        The configured sample size and frames, the pipeline's own defaults where the config leaves them out.
    """
    pipeline = config.pipeline
    return policy.sample_spec(pipeline.height, pipeline.width, pipeline.num_frames)


def eval_spec(config: RunConfig, policy) -> SampleSpec:
    """The size a run's evaluations sample at: eval.height / width / num_frames, the training size where null."""
    pipeline, evaluation = config.pipeline, config.eval
    if evaluation.num_frames is not None and policy.modality != "video":
        raise ConfigError(
            f"eval.num_frames: {type(policy.pipeline).__name__} samples {policy.modality}, not video; leave it out"
        )
    return policy.sample_spec(
        evaluation.height or pipeline.height,
        evaluation.width or pipeline.width,
        evaluation.num_frames or pipeline.num_frames,
        (
            "eval.height" if evaluation.height else "pipeline.height",
            "eval.width" if evaluation.width else "pipeline.width",
        ),
    )


def adapter_description(config: RunConfig, policy) -> dict | None:
    """What rebuilds the run's LoRA adapter (a checkpoint's adapter.json).

    Args:
        config: the run's config.
        policy: the run's FlowPolicy (its default targets when the config names none).

    Returns:
        rank, alpha, target modules and the two noise-level gates; None for a full fine-tune.
    """
    if config.lora is None:
        return None
    return {
        "rank": config.lora.rank,
        "alpha": config.lora.alpha,
        "target_modules": config.lora.target_modules or policy.lora_targets,
        "active_from_sigma": config.lora.active_from_sigma,
        "sample_from_sigma": config.lora.sample_from_sigma,
    }


def fsdp2_precision(accelerator) -> None:
    """Under FSDP2 with bf16 / fp16 compute: gradients accumulated and reduced in fp32, and the forward's inputs
    left as the policy makes them. accelerate's own policy reduces in the compute dtype (so microbatch gradients
    add up in bf16, where DDP adds in fp32) and casts every float input (the timestep sigma x 1000, which families
    such as HunyuanVideo take in fp32, would round to bf16's spacing of 4 above 512).

    Args:
        accelerator: the run's Accelerator, before `prepare` (its FSDP plugin is changed in place).
    """
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(accelerator.mixed_precision))
    if compute is None or plugin is None or not getattr(accelerator, "is_fsdp2", False):
        return
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin.mixed_precision_policy = MixedPrecisionPolicy(
        param_dtype=compute, reduce_dtype=torch.float32, cast_forward_inputs=False
    )


def without_buffer_broadcast(model) -> None:
    """A DDP wrapper that leaves buffers alone: DDP re-broadcasts them from rank 0 before every forward with grad,
    so processes running unequal numbers of forwards (a gated LoRA takes one or two passes per microbatch, by its
    items' noise levels) would pair one's broadcast with another's gradient all-reduce: a hang, or mixed data. The
    denoisers' buffers (RoPE tables, positional embeddings) are constants, so nothing needs broadcasting.

    Args:
        model: the prepared module (changed in place when it is a DistributedDataParallel).
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.broadcast_buffers = False
