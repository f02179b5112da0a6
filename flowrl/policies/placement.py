"""Where a policy's weights sit and in which precision, and what it trades for memory: placement on a device
(`place`), text encoders kept on the host except while they encode (offload), VAE slicing and tiling, gradient
checkpointing, the attention kernel and the decode split (`set_memory_options`); and the placement of a policy that
only samples (`sampling_placement`, `place_for_sampling`)."""

from __future__ import annotations

import contextlib
import functools

import torch

WEIGHT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}  # memory.weight_dtype's names


def place(policy, device, frozen_dtype: torch.dtype = torch.float32, text_encoders_on_host: bool = False) -> None:
    """Every component of `policy` on `device` (the text encoders stay on the host with `text_encoders_on_host`, as
    offload_text_encoders keeps them: FLUX.2's 24B text encoder never reaches a GPU that could not hold it beside the
    denoiser); frozen weights in `frozen_dtype` (bf16 / fp16 halve their memory), trainable ones (LoRA, or the whole
    denoiser) kept fp32 as the optimizer and the log-prob maths need."""
    trainable = policy.trainable_parameters()
    kept = [param.data for param in trainable]  # their fp32 values, not rounded through half precision
    on_host = {id(module) for module in policy.text_encoders()} if text_encoders_on_host else set()
    for module in policy.components().values():
        if frozen_dtype != torch.float32:  # (casting an fp32 module to fp32 only makes diffusers warn)
            module.to(dtype=frozen_dtype)  # on the host first: no fp32 copy of a frozen weight reaches the device
        if id(module) not in on_host:
            module.to(device)
    for param, data in zip(trainable, kept):
        param.data = data.to(device=device, dtype=torch.float32)


def text_encoders(policy) -> list[torch.nn.Module]:
    """The pipeline's text encoders (components named text_encoder*), in the pipeline's order."""
    return [m for name, m in policy.components().items() if name.startswith("text_encoder")]


@contextlib.contextmanager
def text_encoders_on_device(policy):
    """The text encoders on the policy's device for the block (offload_text_encoders keeps them on the host
    otherwise). Callers hold the policy's `_encode_lock`: a sharing copy moves the same modules."""
    offload = getattr(policy, "offload_text_encoders", False)
    if offload:
        for module in policy.text_encoders():
            module.to(policy.device)
    try:
        yield
    finally:
        if offload:
            for module in policy.text_encoders():
                module.to("cpu")


def set_memory_options(
    policy,
    gradient_checkpointing: bool = False,
    vae_slicing: bool = False,
    vae_tiling: bool = False,
    offload_text_encoders: bool = False,
    embedding_cache: bool = False,
    decode_microbatch: int = 0,
    attention: str = "sdpa",
) -> None:
    """Trade time for memory on a placed policy (docs/guide/configuration.md, train and pipeline sections):
    `attention` "sdpa", "xformers" (CUDA only) or a backend of diffusers' dispatcher (`set_attention_backend`);
    gradient checkpointing in every trained network; the VAE's slicing and tiling; text encoders on the host except
    while encoding; an embedding cache of every prompt's encoding (`policy.embedding_cache`,
    flowrl/policies/embedding_cache.py); `decode_microbatch` samples per VAE decode (0: all). A ConfigError names the
    setting a pipeline cannot honour."""
    from flowrl.errors import ConfigError

    if attention not in ("sdpa", "xformers"):
        set_attention_backend(policy, attention)
    if attention == "xformers":  # torch SDPA (diffusers' default) otherwise
        if policy.device.type != "cuda":
            raise ConfigError("pipeline.attention: xformers runs on CUDA only; use sdpa on this device")
        try:
            policy.pipeline.enable_xformers_memory_efficient_attention()
        except (ImportError, ModuleNotFoundError, ValueError) as error:
            raise ConfigError(
                f'pipeline.attention: xformers is not usable here ({error}); pip install -e ".[gpu]"'
            ) from None
    if gradient_checkpointing:
        if not getattr(policy.transformer, "_supports_gradient_checkpointing", False):
            raise ConfigError(f"memory.gradient_checkpointing: {type(policy.transformer).__name__} does not support it")
        for module in policy.trained_modules().values():
            module.enable_gradient_checkpointing()
    vae = getattr(policy.pipeline, "vae", None)
    for flag, method in ((vae_slicing, "enable_slicing"), (vae_tiling, "enable_tiling")):
        if flag:
            if not hasattr(vae, method):
                raise ConfigError(f"pipeline.vae_{method[7:]}: {type(vae).__name__} has no {method}()")
            getattr(vae, method)()
    policy.offload_text_encoders = offload_text_encoders
    policy.embedding_cache = {} if embedding_cache else None
    policy.decode_microbatch = decode_microbatch
    if offload_text_encoders:
        for module in policy.text_encoders():
            module.to("cpu")


def denoisers(policy) -> list[torch.nn.Module]:
    """The pipeline's denoising networks: transformer (and Wan2.2's transformer_2) or unet."""
    names = ("transformer", "transformer_2", "unet")
    return [module for name, module in policy.components().items() if name in names and module is not None]


def set_attention_backend(policy, backend: str) -> None:
    """Route the denoisers' attention through diffusers' dispatcher backend `backend`; one ConfigError when it cannot
    run on the policy's device, its kernel package is missing, or no attention of the pipeline goes through the
    dispatcher (SD3's joint attention and the UNets' processors call torch directly)."""
    from flowrl.devices import CPU_ATTENTION_BACKENDS
    from flowrl.errors import ConfigError

    if policy.device.type != "cuda" and backend not in CPU_ATTENTION_BACKENDS:
        raise ConfigError(
            f"pipeline.attention: {backend} runs on CUDA only; on {policy.device.type} use sdpa or one of "
            f"{list(CPU_ATTENTION_BACKENDS)}"
        )
    networks = denoisers(policy)
    routed = [
        module
        for network in networks
        for module in network.modules()
        if hasattr(getattr(module, "processor", None), "_attention_backend")
    ]
    if not routed:
        names = ", ".join(type(network).__name__ for network in networks)
        raise ConfigError(
            f"pipeline.attention: {names} computes attention without diffusers' dispatcher, so {backend} cannot "
            "apply; use sdpa or xformers"
        )
    try:
        for network in networks:
            network.set_attention_backend(backend)
    except (ImportError, ModuleNotFoundError, RuntimeError, ValueError) as error:
        raise ConfigError(f"pipeline.attention: {backend} is not usable here ({error})") from None


def enable_context_parallel(policy, ulysses_degree: int = 1, ring_degree: int = 1) -> None:
    """Share every sample's tokens among the processes of the initialised process group through diffusers'
    `ContextParallelConfig` (Ulysses: each process holds 1 / degree of the sequence outside attention and of the heads
    inside it; ring: of the keys and values, passed around), on every denoiser: the processes then compute the same
    velocities as one process does, each doing a share of the work. The processes must all hold the same inputs.
    Ring attention needs a backend that returns the softmax's log-sum-exp (flash, _flash_3, sage, _native_cudnn; not
    torch's native SDPA), and on the CPU only Ulysses with `native` runs."""
    from diffusers import ContextParallelConfig

    from flowrl.errors import ConfigError

    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        raise ConfigError("context parallelism: needs a process group (launch with torchrun or accelerate launch)")
    world = torch.distributed.get_world_size()
    if ulysses_degree * ring_degree != world:
        raise ConfigError(
            f"context parallelism: ulysses degree {ulysses_degree} x ring degree {ring_degree} must be the number "
            f"of processes, {world}"
        )
    config = ContextParallelConfig(
        ulysses_degree=ulysses_degree if ulysses_degree > 1 else None,
        ring_degree=ring_degree if ring_degree > 1 else None,
    )
    for network in denoisers(policy):
        network.enable_parallelism(config=config)


COMPILE_BACKEND = "inductor"  # torch.compile's backend for runtime.compile


def compile_denoisers(policy) -> None:
    """torch.compile every denoiser's forward in place (`nn.Module.compile`: the module, its parameters and their
    names stay as they are, so checkpoints, adapters and DDP see the same model)."""
    for network in denoisers(policy):
        network.compile(backend=COMPILE_BACKEND)


def sampling_placement(device: str | None = None, weight_dtype: str | None = None) -> tuple[torch.device, torch.dtype]:
    """Where a policy that only samples (`flowrl sample`, the demo) runs, as a run would place it: `device` (None:
    the GPU when there is one, else the CPU), frozen weights in `weight_dtype` (None: bf16 on a GPU, as the real
    configs train; fp32 on the CPU, where half-precision matmuls are slow). Checked before any weights load."""
    from flowrl.devices import chosen_device
    from flowrl.errors import UserError

    target = chosen_device(device)
    if weight_dtype is not None and weight_dtype not in WEIGHT_DTYPES:
        raise UserError(f"--weight-dtype: expected one of {list(WEIGHT_DTYPES)}, got {weight_dtype!r}")
    return target, WEIGHT_DTYPES[weight_dtype or ("bf16" if target.type == "cuda" else "fp32")]


def place_for_sampling(policy, placement: tuple[torch.device, torch.dtype], text_encoders_on_host: bool = False):
    """Place the policy (after any checkpoint or adapter is loaded; the text encoders left on the host where they are
    to be offloaded) and return what to sample under: a new autocast context per call, since half-precision weights
    run under autocast, as in a run."""
    device, dtype = placement
    for name, param in policy.named_trained_parameters().items():
        # place() keeps trainable weights fp32: so does every adapter (the demo holds one per checkpoint, all but
        # the active one frozen by peft; both Wan2.2 experts' when both trained), while the frozen weights take the
        # sampling dtype
        if "lora_" in name:
            param.requires_grad_(True)
    policy.place(device, dtype, text_encoders_on_host)
    return functools.partial(torch.autocast, device.type, dtype=dtype, enabled=dtype != torch.float32)
