"""The policy contract: a diffusers flow pipeline seen as a stochastic policy over denoising steps.

A family adapter (SD3, FLUX, Wan, ...) subclasses `FlowPolicy` and says how to encode prompts (`encode_prompts`),
call the network for an unguided output (`_forward`), lay out initial noise (`noise_shape`) and decode (`decode`).
The base holds what every family shares, once: guided velocities (classifier-free guidance), the sampler step and
its sigma schedule, sample sizes, the trainable parameters and the reference policy (the adapter switched off).

What the loop adds around the contract lives in small helpers beside it: LoRA and its noise-level gate (lora.py),
placement and memory options (placement.py), the embedding cache (embedding_cache.py), the asynchronous worker's
sharing copy (sharing.py), the sampling scheduler (scheduler.py); input images for editors and image-to-video
(input_images.py); Wan2.2's two experts in the Wan adapter (wan.py).
"""

from __future__ import annotations

import copy
import threading

import torch

import flowrl.policies.lora as lora
import flowrl.policies.placement as placement
import flowrl.policies.sharing as sharing
from flowrl.policies.conditioning import Conditioning, SampleSpec
from flowrl.policies.embedding_cache import encode_prompts_cached
from flowrl.policies.input_images import InputImages
from flowrl.policies.scheduler import sampling_scheduler
from flowrl.sde import SDE_KINDS
from flowrl.sharding import like, whole

# the prefix of Wan2.2's low-noise expert's parameter names in checkpoints when it trains (pipeline.experts: both)
LOW_NOISE_EXPERT = "transformer_2."

__all__ = ["LOW_NOISE_EXPERT", "Conditioning", "FlowPolicy", "SampleSpec", "declared_text_length"]


def declared_text_length(pipeline, tokenizer: str) -> int | None:
    """The text length the tokenizer that `max_sequence_length` governs (`tokenizer`: SD3's T5 is tokenizer_3) declares
    (`model_max_length`) where it is below the pipeline's own default, else None (the default stands; also without
    that tokenizer). The embedded pipelines' tokenizers declare the 16 tokens their text encoders were trained on,
    where SD3's default would pad every prompt to 256; real T5 / umT5 tokenizers declare 512, above every default."""
    import inspect

    default = inspect.signature(type(pipeline).__call__).parameters.get("max_sequence_length")
    length = getattr(getattr(pipeline, tokenizer, None), "model_max_length", None)
    if default is None or not isinstance(default.default, int) or not isinstance(length, int):
        return None
    return length if length < default.default else None


class FlowPolicy(InputImages):
    """Base adapter. Subclasses implement `encode_prompts`, `_forward`, `noise_shape`, `decode` and `_raw_sigmas`.

    `transformer` is the denoising network being trained (the UNet for epsilon-prediction pipelines).
    """

    family = "flow"  # the model family (sd3, flux, wan, sd); `prediction` is what the network predicts
    prediction = "flow"  # "flow": velocity v = eps - x0; "epsilon": noise (DDIM sampling)
    kinds = SDE_KINDS  # sampler kinds this family's `step` understands
    sampler_scheduler = "FlowMatchEulerDiscreteScheduler"  # the scheduler whose steps `step` takes
    modality = "image"  # what `decode` returns: image or video
    fps = 8  # video families: frames per second their clips play at (MP4s, GIFs, VBench's frame intervals)
    text_length_tokenizer = "tokenizer"  # the tokenizer `max_sequence_length` governs (T5 / umT5)
    lora_targets: list[str] | None = None  # the denoiser's modules a LoRA adapts by default (lora.target_modules)
    # Flow-GRPO trains the guided output with the unconditional branch detached; True keeps its gradient too
    # (they differ markedly at usual guidance scales). Set from train.cfg_uncond_grad by the loop.
    cfg_uncond_grad = False
    # The LoRA acts only at sigma >= this (None: everywhere; lora.noise_level_gated). Set from lora.active_from_sigma
    # by the loop: a window-trained LoRA left on at the low-noise steps it was never trained on costs accuracy.
    lora_active_from_sigma: float | None = None

    def __init__(self, pipeline, max_sequence_length: int | None = None):
        """Adapt a loaded diffusers `pipeline`; `max_sequence_length` pads every prompt's text to that many tokens
        (None: the shorter of the pipeline's default and what its tokenizer declares). Every network is frozen."""
        self.pipeline = pipeline
        self.transformer = getattr(pipeline, "transformer", None) or pipeline.unet
        self.model = self.transformer  # what is called: the transformer, or its distributed wrapper
        self.distributed = False  # whether `model` is a distributed wrapper (set by the training loop)
        # further trained networks beside `transformer` (Wan2.2's low-noise expert with pipeline.experts: both), by
        # the prefix their parameter names take in checkpoints
        self.extra_trained: dict[str, torch.nn.Module] = {}
        self.max_sequence_length = max_sequence_length or declared_text_length(pipeline, self.text_length_tokenizer)
        self.scheduler = sampling_scheduler(pipeline.scheduler, self.sampler_scheduler, type(pipeline).__name__)
        self._sigma_cache: dict[int, torch.Tensor] = {}
        self._encode_lock = threading.Lock()  # shared with a sharing_copy: offloading moves the shared text encoders
        # nothing trains until asked (diffusers loads every module trainable): `add_lora` makes an adapter trainable,
        # a full fine-tune (builders.build_policy) the denoiser, and place() keeps just those in fp32
        self.transformer.requires_grad_(False)
        for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
            module = getattr(pipeline, name, None)
            if module is not None:
                module.requires_grad_(False)

    # ---- the networks ------------------------------------------------------------------------------------
    def trained_modules(self) -> dict[str, torch.nn.Module]:
        """Every network that trains, by the prefix of its parameter names in checkpoints: "" for `transformer`
        (the names stay as they always were), e.g. "transformer_2." for Wan2.2's low-noise expert."""
        return {"": self.transformer, **self.extra_trained}

    def distributed_module(self) -> torch.nn.Module:
        """The module a distributed wrapper (DDP, FSDP2) wraps; `model` becomes the wrapper."""
        return self.transformer

    def components(self) -> dict[str, torch.nn.Module]:
        """The pipeline's modules (denoiser, VAE, text encoders, ...) by name."""
        return {
            name: module for name, module in self.pipeline.components.items() if isinstance(module, torch.nn.Module)
        }

    def net(self):
        """The network to call: the distributed wrapper when gradients flow, the bare module otherwise (rollouts
        and evaluation need no gradient synchronisation)."""
        return self.model if torch.is_grad_enabled() else self.transformer

    @property
    def device(self) -> torch.device:
        """The denoiser's device."""
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the denoiser is called in (its first parameter's)."""
        return next(self.transformer.parameters()).dtype

    # ---- encoding ----------------------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        """Family-specific: `prompts` encoded for sampling at `guidance_scale`, one row each, with the unconditional
        branch in `negative` where `uses_cfg(guidance_scale)`."""
        raise NotImplementedError

    def encode_inputs(self, cond: Conditioning, items: list, spec: SampleSpec | None = None) -> Conditioning:
        """Add encoded per-sample inputs (a source image, control maps) of condition `items` to `cond`, for samples of
        size `spec` when the caller knows it, and return it; families that take none return `cond` as it is."""
        return cond

    def encode(self, conditions: list, guidance_scale: float, spec: SampleSpec | None = None) -> Conditioning:
        """Encode condition items (tasks.Condition, or plain prompt strings) for sampling at `guidance_scale`, for
        samples of size `spec` (an editor's sources take that size): one row per item, on the policy's device, through
        the embedding cache when it is on."""
        from flowrl.tasks.base import Condition

        items = [c if isinstance(c, Condition) else Condition(c) for c in conditions]
        cond = encode_prompts_cached(self, [c.prompt for c in items], guidance_scale)
        cond.items = items
        return self.encode_inputs(cond, items, spec)

    def text_length(self) -> int:
        """The length every prompt's embeddings are padded to, so rows encoded apart (the embedding cache, the two CFG
        branches) stack: pipeline.max_sequence_length, else the pipeline's own default (512 for Qwen-Image, Z-Image
        and FLUX.2). Qwen-Image and Z-Image mask the padding (their `_forward` hands the transformer only the tokens
        the mask keeps); FLUX.2 attends it whole, as its pipeline does."""
        import inspect

        if self.max_sequence_length is not None:
            return self.max_sequence_length
        return inspect.signature(type(self.pipeline).__call__).parameters["max_sequence_length"].default

    # ---- the velocity ------------------------------------------------------------------------------------
    def uses_cfg(self, guidance_scale: float) -> bool:
        """Whether sampling at `guidance_scale` runs the unconditional branch too (classifier-free guidance)."""
        return guidance_scale > 1.0

    @lora.noise_level_gated
    def velocity(self, latents: torch.Tensor, sigma, cond: Conditioning, guidance_scale: float) -> torch.Tensor:
        """The model output at noise level `sigma` (a number, or one per row) for `latents` [B, ...] under `cond` (B
        rows): the velocity (eps - x0 convention; epsilon for DDIM families) in fp32, guided as v_u + w (v_c - v_u)
        when CFG is on. The unconditional branch carries no gradient unless `cfg_uncond_grad` (values are the same
        either way). With `lora_active_from_sigma`, samples below that noise level get the adapter-free network's
        output (lora.noise_level_gated)."""
        if not self.uses_cfg(guidance_scale):
            return self.branch_outputs(latents, sigma, [cond.tensors], guidance_scale)[0]
        uncond, text = self.branch_outputs(latents, sigma, [cond.negative, cond.tensors], guidance_scale)
        if not self.cfg_uncond_grad:
            uncond = uncond.detach()
        return self.combine_guidance(uncond, text, self.guidance_scales(latents, sigma, guidance_scale))

    def guidance_scales(self, latents: torch.Tensor, sigma, guidance_scale: float):
        """The CFG scale each sample is guided with: `guidance_scale` for all (Wan2.2's two experts give each sample
        its own expert's, as a [B, 1, ...] tensor)."""
        return guidance_scale

    def combine_guidance(self, uncond: torch.Tensor, text: torch.Tensor, guidance_scale: float) -> torch.Tensor:
        """Classifier-free guidance's combination of the two branches: v_u + w (v_c - v_u) (a family whose pipeline
        combines them otherwise, e.g. Qwen-Image's norm rescale, overrides it)."""
        return uncond + guidance_scale * (text - uncond)

    def branch_outputs(
        self, latents: torch.Tensor, sigma, branches: list[dict], guidance_scale: float
    ) -> list[torch.Tensor]:
        """Unguided model outputs (fp32) of the same latents under each conditioning branch (tensors by name), in one
        batched call, in `branches`' order: what CFG and negative (concept) guidance combine."""
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device)
        sigma = sigma.expand(latents.shape[0]) if sigma.ndim == 0 else sigma
        x, n = latents.to(self.dtype), len(branches)
        tensors = {k: torch.cat([branch[k] for branch in branches]) for k in branches[0]}
        out = self._forward(torch.cat([x] * n), torch.cat([sigma] * n), tensors, guidance_scale).float()
        return list(out.chunk(n))

    def _forward(
        self, latents: torch.Tensor, sigma: torch.Tensor, tensors: dict, guidance_scale: float
    ) -> torch.Tensor:
        """Family-specific: the network's output for `latents` in the model dtype at per-row `sigma` [B] under
        conditioning `tensors` (batch-first, B rows)."""
        raise NotImplementedError

    # ---- the sampler -------------------------------------------------------------------------------------
    def step(
        self,
        kind: str,
        x: torch.Tensor,
        sigma,
        sigma_next,
        cond: Conditioning,
        guidance_scale: float,
        noise_level: float,
        noise: torch.Tensor | None = None,
        prev_sample: torch.Tensor | None = None,
        guide=None,
    ):
        """One sampler step of `kind` (flowrl.sde) from `x` at `sigma` to `sigma_next` under `cond`, with SDE
        `noise_level`: (next sample, mean, std, log_prob, x0 prediction). `noise` is the step's Gaussian noise (None:
        drawn); with `prev_sample` the step scores that sample instead of drawing one.

        `guide(x, sigma, cond, guidance_scale, v) -> v` may replace the model output before the step is taken
        (in-generation steering); it sees the same quantity the sampler uses (velocity here, epsilon for DDIM).
        """
        from flowrl.sde import sde_step, x0_prediction

        v = self.velocity(x, sigma, cond, guidance_scale)
        if guide is not None:
            v = guide(x, sigma, cond, guidance_scale, v)
        out = sde_step(kind, v, x, sigma, sigma_next, noise_level, noise=noise, prev_sample=prev_sample)
        return (*out, x0_prediction(v, x, sigma))

    def sigmas(self, num_steps: int, noise_shape: tuple[int, ...] = ()) -> torch.Tensor:
        """The pipeline's own sigma schedule for `num_steps` (N + 1 values ending at 0), fp32, for samples of latent
        shape `noise_shape` (a schedule shifted by the sample size depends on it)."""
        key = (num_steps, tuple(noise_shape))
        if key not in self._sigma_cache:
            scheduler = copy.deepcopy(self.scheduler)  # set_timesteps mutates scheduler state
            self._raw_sigmas(scheduler, num_steps, noise_shape)
            self._sigma_cache[key] = scheduler.sigmas.float().cpu()
        return self._sigma_cache[key]

    def _raw_sigmas(self, scheduler, num_steps: int, noise_shape: tuple[int, ...]) -> None:
        """Set `scheduler`'s timesteps for `num_steps` as the pipeline does (families that shift by size override)."""
        scheduler.set_timesteps(num_steps)

    def set_shift(self, value: float | None, where: str) -> None:
        """Sample on a flow-matching schedule shifted by `value` in place of the folder's shift (None: keep it); a
        ConfigError naming `where` for a scheduler without one, or one shifted by the image size."""
        if value is None:
            return
        from flowrl.errors import ConfigError

        config = self.scheduler.config
        if self.prediction != "flow" or "shift" not in config:
            raise ConfigError(
                f"{where}: {type(self.pipeline).__name__} samples with {type(self.scheduler).__name__}, "
                "which takes no shift"
            )
        if config.get("use_dynamic_shifting"):
            raise ConfigError(
                f"{where}: {type(self.pipeline).__name__}'s scheduler shifts its schedule by the sample "
                "size (use_dynamic_shifting); a fixed shift does not apply"
            )
        self.scheduler = type(self.scheduler).from_config(config, shift=value)
        self._sigma_cache.clear()

    # ---- sample shape and decoding -----------------------------------------------------------------------
    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        """Family-specific: the shape of one sample's latents (no batch dimension) for `spec`."""
        raise NotImplementedError

    def video_noise_shape(self, spec: SampleSpec, temporal: int, spatial: int) -> tuple[int, ...]:
        """[C, F, H, W] of a video sample's latents: the transformer's in_channels, the VAE's temporal (causal: the
        first frame alone) and spatial compressions; a ValueError when the spec gives no frame count."""
        if spec.num_frames is None:
            raise ValueError(
                f"a {type(self.pipeline).__name__} samples video: the sample spec needs num_frames "
                "(pipeline.num_frames)"
            )
        if (spec.num_frames - 1) % temporal:  # the clip would come out shorter than asked (and be recorded as asked)
            from flowrl.errors import UserError

            below = (spec.num_frames - 1) // temporal * temporal + 1
            raise UserError(
                f"num_frames (pipeline.num_frames / --num-frames): {spec.num_frames} frames; "
                f"{type(self.pipeline).__name__}'s VAE takes 1 + {temporal} k frames: {below} or "
                f"{below + temporal}"
            )
        return (
            self.transformer.config.in_channels,
            (spec.num_frames - 1) // temporal + 1,
            spec.height // spatial,
            spec.width // spatial,
        )

    def default_spec(self) -> SampleSpec:
        """The pipeline's own default size, as its __call__ would choose it (the denoiser's sample size times the
        VAE's scale factor)."""
        size = self.transformer.config.sample_size * self.pipeline.vae_scale_factor
        return SampleSpec(size, size)

    @property
    def size_multiple(self) -> int:
        """Pixels a sample's height and width must be multiples of: the VAE's compression times the denoiser's patch
        side (SD3: 8 x 2; SD's UNet: 8; a pipeline naming neither: no constraint). Families override it."""
        patch = getattr(self.transformer, "config", {}).get("patch_size", 1)
        return getattr(self.pipeline, "vae_scale_factor", 1) * (patch if isinstance(patch, int) else 1)

    def sample_spec(
        self,
        height: int | None,
        width: int | None,
        num_frames: int | None,
        names: tuple[str, str] = ("pipeline.height", "pipeline.width"),
    ) -> SampleSpec:
        """The size asked for, the pipeline's own default where None. A side that is not a multiple of
        `size_multiple` is a UserError naming its setting (`names`): the pipelines round such sizes down (a sample
        drawn at one size and recorded at another) or refuse them, and an editor's source would not pack."""
        from flowrl.errors import UserError

        default = self.default_spec()
        spec = SampleSpec(height or default.height, width or default.width, num_frames or default.num_frames)
        step = self.size_multiple
        for name, side in zip(names, (spec.height, spec.width)):
            if side % step:
                below = max(side // step * step, step)
                raise UserError(
                    f"{name}: {side} pixels; {type(self.pipeline).__name__} needs a multiple of {step} "
                    f"(its VAE's compression times the denoiser's patch): {below} or {below + step}"
                )
        return spec

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Family-specific: latents -> samples in [0, 1], differentiable: images [B, 3, H, W] or video
        [B, 3, F, H, W] (the VAE's layout); `decode_samples` wraps them as a typed batch."""
        raise NotImplementedError

    def decode_samples(self, latents: torch.Tensor):
        """`decode(latents)` as a typed sample batch (flowrl.sample_io: images, videos or 3D shapes)."""
        from flowrl.sample_io import as_samples

        return as_samples(self.decode(latents), fps=self.fps, modality=self.modality)

    def decode_in_chunks(self, latents: torch.Tensor) -> torch.Tensor:
        """`decode` over `decode_microbatch` samples at a time (0: all at once), concatenated."""
        chunk = getattr(self, "decode_microbatch", 0)
        if chunk <= 0 or chunk >= len(latents):
            return self.decode(latents)
        return torch.cat([self.decode(part) for part in latents.split(chunk)])

    def to_images(self, decoded: torch.Tensor) -> torch.Tensor:
        """VAE output in [-1, 1] -> [0, 1] fp32."""
        return (decoded.float() / 2 + 0.5).clamp(0, 1)

    # ---- trainable weights -------------------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters that train (the optimizer's), in `named_trainable_parameters`' order."""
        return list(self.named_trainable_parameters().values())

    def named_trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The parameters that train (requires_grad), by their names in checkpoints, in trainable_parameters' order."""
        return {n: p for n, p in self.named_trained_parameters().items() if p.requires_grad}

    def named_trained_parameters(self) -> dict[str, torch.nn.Parameter]:
        """Every parameter of the trained networks (frozen ones too) by its name in checkpoints."""
        return {
            prefix + n: p for prefix, module in self.trained_modules().items() for n, p in module.named_parameters()
        }

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the trained weights, whole (FSDP2's shards gathered: every process calls this)."""
        return {n: whole(p.detach()).clone() for n, p in self.named_trainable_parameters().items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a checkpoint's weights `state` (names as `trainable_state_dict` gives them) into the trained networks;
        a UserError for a name this pipeline lacks or a weight of another shape (a checkpoint of another model)."""
        from flowrl.errors import UserError

        params = self.named_trained_parameters()
        missing = [n for n in state if n not in params]
        if missing:
            raise UserError(
                f"checkpoint has parameters this pipeline lacks (a checkpoint of another model?), e.g. {missing[:3]}"
            )
        unfit = [n for n in state if tuple(state[n].shape) != tuple(params[n].shape)]  # (DTensor: the whole shape)
        if unfit:
            raise UserError(
                f"checkpoint weights of another shape than this pipeline's (a checkpoint of another "
                f"model?), e.g. {unfit[0]}: {tuple(state[unfit[0]].shape)} here {tuple(params[unfit[0]].shape)}"
            )
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(like(value, params[name]))  # this process's shard of it under FSDP2

    # ---- LoRA and the reference policy (flowrl/policies/lora.py) -----------------------------------------
    def add_lora(self, rank: int, alpha: float, target_modules: list[str], init: str = "gaussian") -> None:
        """Add a trainable LoRA adapter of `rank` and `alpha` on `target_modules` (peft's init `init`) to every
        trained network; their own weights freeze."""
        lora.add_lora(self, rank, alpha, target_modules, init)

    @property
    def has_lora(self) -> bool:
        """Whether the denoiser carries a LoRA adapter."""
        return lora.has_lora(self.transformer)

    def reference(self):
        """The reference policy, as a context manager yielding this policy: the same network with its LoRA adapter
        switched off for the block (a RuntimeError without an adapter)."""
        return lora.adapters_off(self)

    def switch_adapters(self, on: bool) -> None:
        """Every trained network's LoRA adapter on or off (both Wan2.2 experts when both train and have one)."""
        lora.switch_adapters(self, on)

    def frozen_below(self) -> tuple[float, str] | None:
        """The noise level below which no trainable weight acts, with the reason (None: they act at every level)."""
        return lora.gate_floor(self)

    # ---- options only Wan2.2's two experts take (WanPolicy implements them; one network refuses them) ---------
    def train_networks_named(self, names, where: str) -> None:
        """Train every network a checkpoint's weight `names` belong to (Wan2.2's low-noise expert, when a run trained
        it too), before its weights or adapter are loaded; `where` names the checkpoint in errors."""
        if any(n.startswith(LOW_NOISE_EXPERT) for n in names) and not self.extra_trained:
            self.set_trained_experts("both", f"{where} (Wan2.2's two experts trained)")

    def set_trained_experts(self, experts: str, where: str) -> None:
        """pipeline.experts: "high" trains the denoiser; only Wan2.2's two experts take "both" (a ConfigError naming
        `where` here)."""
        if experts != "high":
            from flowrl.errors import ConfigError

            raise ConfigError(
                f"{where}: {experts!r} needs a Wan2.2 pipeline with two experts (transformer_2 and a "
                f"boundary_ratio); {type(self.pipeline).__name__} has one network: use high"
            )

    def set_guidance_scale_2(self, value: float | None, where: str) -> None:
        """A second CFG scale for the low-noise part of the schedule: only Wan2.2's two experts take one (a
        ConfigError naming `where` here for any value but None)."""
        if value is not None:
            from flowrl.errors import ConfigError

            raise ConfigError(
                f"{where}: only a Wan2.2 pipeline with two experts takes a second guidance scale; "
                f"{type(self.pipeline).__name__} has one network"
            )

    # ---- placement, memory and threads (placement.py, embedding_cache.py, sharing.py) -----------------------
    def place(self, device, frozen_dtype: torch.dtype = torch.float32, text_encoders_on_host: bool = False) -> None:
        """Every component on `device` (text encoders on the host with `text_encoders_on_host`), frozen weights in
        `frozen_dtype`, trainable ones fp32 (placement.place)."""
        placement.place(self, device, frozen_dtype, text_encoders_on_host)

    def text_encoders(self) -> list[torch.nn.Module]:
        """The pipeline's text encoders."""
        return placement.text_encoders(self)

    def text_encoders_on_device(self):
        """A context manager: the text encoders on the device for the block when they are offloaded (callers hold
        `_encode_lock`; placement.text_encoders_on_device)."""
        return placement.text_encoders_on_device(self)

    def set_memory_options(
        self,
        gradient_checkpointing=False,
        vae_slicing=False,
        vae_tiling=False,
        offload_text_encoders=False,
        embedding_cache=False,
        decode_microbatch=0,
        attention: str = "sdpa",
    ) -> None:
        """Trade time for memory: the train and pipeline sections' memory options (placement.set_memory_options)."""
        placement.set_memory_options(
            self,
            gradient_checkpointing,
            vae_slicing,
            vae_tiling,
            offload_text_encoders,
            embedding_cache,
            decode_microbatch,
            attention,
        )

    def sharing_copy(self) -> FlowPolicy:
        """A copy for the asynchronous rollout worker's thread sharing this policy's frozen weights, embedding cache
        and encoding lock, owning its trainable weights (sharing.sharing_copy)."""
        return sharing.sharing_copy(self)
