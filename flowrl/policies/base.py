"""The policy contract: a diffusers flow pipeline seen as a stochastic policy over denoising steps.

A family adapter (SD3, FLUX, Wan) says how to encode prompts, call the transformer for a velocity (with
classifier-free guidance where the family uses it), lay out initial noise, and decode. Everything else (LoRA
through peft, the reference policy as the adapter switched off, step schedules) lives here once.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from dataclasses import dataclass, field

import torch

from flowrl.policies.input_images import InputImages
from flowrl.sampling import SDE_KINDS
from flowrl.sharding import like, whole


@dataclass
class Conditioning:
    """Encoded conditions, batch-first so they can be indexed like the samples they condition.

    `tensors` / `negative` hold the model inputs of the conditional / unconditional (CFG) branch, including encoded
    per-sample inputs such as a source image's latents; `items` are the condition items themselves (prompt, inputs,
    metadata), which rewards receive as metadata.
    """

    tensors: dict[str, torch.Tensor]
    negative: dict[str, torch.Tensor] = field(default_factory=dict)  # unconditional branch for CFG
    prompts: list[str] = field(default_factory=list)
    items: list = field(default_factory=list)

    def select(self, index) -> Conditioning:
        index = torch.as_tensor(index, dtype=torch.long)
        rows = index.tolist()
        pick = {k: v[index] for k, v in self.tensors.items()}
        neg = {k: v[index] for k, v in self.negative.items()}
        return Conditioning(
            pick,
            neg,
            [self.prompts[i] for i in rows] if self.prompts else [],
            [self.items[i] for i in rows] if self.items else [],
        )

    def add_inputs(self, inputs: dict[str, torch.Tensor]) -> None:
        """Per-sample inputs (a source's latents, a first frame's condition) that both CFG branches see."""
        for branch in (self.tensors, self.negative) if self.negative else (self.tensors,):
            branch.update(inputs)

    def to(self, device) -> Conditioning:
        return Conditioning(
            {k: v.to(device) for k, v in self.tensors.items()},
            {k: v.to(device) for k, v in self.negative.items()},
            self.prompts,
            self.items,
        )

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]


@dataclass(frozen=True)
class SampleSpec:
    """What one sample is: its size, and its frame count for video families (None elsewhere)."""

    height: int
    width: int
    num_frames: int | None = None


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

# the prefix of Wan2.2's low-noise expert's parameter names in checkpoints when it trains (pipeline.experts: both)
LOW_NOISE_EXPERT = "transformer_2."


@contextlib.contextmanager
def untiled(vae):
    """The VAE with tiling off (pipeline.vae_tiling tiles decoding): conditions are encoded whole, as the pipelines
    encode them."""
    tiling = getattr(vae, "use_tiling", False)
    vae.use_tiling = False
    try:
        yield vae
    finally:
        vae.use_tiling = tiling


def _adapters_enabled(module: torch.nn.Module) -> bool:
    """Whether a peft-adapted module's adapters are switched on (peft's layers record it each)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return not next(layer.disable_adapters for layer in module.modules() if isinstance(layer, BaseTunerLayer))


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
    """Base adapter. Subclasses implement `encode`, `_forward`, `noise_shape`, `decode` and `_raw_sigmas`.

    `transformer` is the denoising network being trained (the UNet for epsilon-prediction pipelines).
    """

    family = "flow"  # the model family (sd3, flux, wan, sd); `prediction` is what the network predicts
    prediction = "flow"  # "flow": velocity v = eps - x0; "epsilon": noise (DDIM sampling)
    kinds = SDE_KINDS  # sampler kinds this family's `step` understands
    modality = "image"  # what `decode` returns: image or video
    fps = 8  # video families: frames per second their clips play at (MP4s, GIFs, VBench's frame intervals)
    text_length_tokenizer = "tokenizer"  # the tokenizer `max_sequence_length` governs (T5 / umT5)
    lora_targets: list[str] | None = None  # the denoiser's modules a LoRA adapts by default (lora.target_modules)
    # Flow-GRPO trains the guided output with the unconditional branch detached; True keeps its gradient too
    # (at w = 4.5 the two gradients differ by ~70% relative). Set from train.cfg_uncond_grad by the loop.
    cfg_uncond_grad = False
    # The LoRA acts only at sigma >= this (None: everywhere). Set from lora.active_from_sigma by the loop: a window-
    # trained LoRA left on at the low-noise steps it was never trained on costs accuracy (docs/benchmarks.md).
    lora_active_from_sigma: float | None = None
    _adapters_off = False

    def __init__(self, pipeline, max_sequence_length: int | None = None):
        self.pipeline = pipeline
        self.transformer = getattr(pipeline, "transformer", None) or pipeline.unet
        self.model = self.transformer  # what is called: the transformer, or its distributed wrapper
        self.distributed = False  # whether `model` is a distributed wrapper (set by the training loop)
        # further trained networks beside `transformer` (Wan2.2's low-noise expert with pipeline.experts: both), by
        # the prefix their parameter names take in checkpoints
        self.extra_trained: dict[str, torch.nn.Module] = {}
        self.max_sequence_length = max_sequence_length or declared_text_length(pipeline, self.text_length_tokenizer)
        self.scheduler = self.sampling_scheduler(pipeline.scheduler)
        self._sigma_cache: dict[int, torch.Tensor] = {}
        self._encode_lock = threading.Lock()  # shared with a sharing_copy: offloading moves the shared text encoders
        # nothing trains until asked (diffusers loads every module trainable): `add_lora` makes an adapter trainable,
        # a full fine-tune (train.build_policy) the denoiser, and place() keeps just those in fp32
        self.transformer.requires_grad_(False)
        for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
            module = getattr(pipeline, name, None)
            if module is not None:
                module.requires_grad_(False)

    def trained_modules(self) -> dict[str, torch.nn.Module]:
        """Every network that trains, by the prefix of its parameter names in checkpoints: "" for `transformer`
        (the names stay as they always were), e.g. "transformer_2." for Wan2.2's low-noise expert."""
        return {"": self.transformer, **self.extra_trained}

    def train_networks_named(self, names, where: str) -> None:
        """Train every network a checkpoint's weight `names` belong to (Wan2.2's low-noise expert, when a run trained
        it too), before its weights or adapter are loaded; `where` names the checkpoint in errors."""
        if any(n.startswith(LOW_NOISE_EXPERT) for n in names) and not self.extra_trained:
            self.set_trained_experts("both", f"{where} (Wan2.2's two experts trained)")

    def distributed_module(self) -> torch.nn.Module:
        """The module a distributed wrapper (DDP, FSDP2) wraps; `model` becomes the wrapper."""
        return self.transformer

    def set_trained_experts(self, experts: str, where: str) -> None:
        """pipeline.experts: "high" trains the denoiser; only Wan2.2's two experts take "both"."""
        if experts != "high":
            from flowrl.errors import ConfigError

            raise ConfigError(
                f"{where}: {experts!r} needs a Wan2.2 pipeline with two experts (transformer_2 and a "
                f"boundary_ratio); {type(self.pipeline).__name__} has one network: use high"
            )

    def components(self) -> dict[str, torch.nn.Module]:
        """The pipeline's modules (denoiser, VAE, text encoders, ...) by name."""
        return {
            name: module for name, module in self.pipeline.components.items() if isinstance(module, torch.nn.Module)
        }

    def place(self, device, frozen_dtype: torch.dtype = torch.float32, text_encoders_on_host: bool = False) -> None:
        """Every component on `device` (the text encoders stay on the host with `text_encoders_on_host`, as
        offload_text_encoders keeps them: FLUX.2's 24B text encoder never reaches a GPU that could not hold it beside
        the denoiser); frozen weights in `frozen_dtype` (bf16 / fp16 halve their memory), trainable ones (LoRA, or
        the whole denoiser) kept fp32 as the optimizer and the log-prob maths need."""
        trainable = self.trainable_parameters()
        kept = [param.data for param in trainable]  # their fp32 values, not rounded through half precision
        on_host = {id(module) for module in self.text_encoders()} if text_encoders_on_host else set()
        for module in self.components().values():
            if frozen_dtype != torch.float32:  # (casting an fp32 module to fp32 only makes diffusers warn)
                module.to(dtype=frozen_dtype)  # on the host first: no fp32 copy of a frozen weight reaches the device
            if id(module) not in on_host:
                module.to(device)
        for param, data in zip(trainable, kept):
            param.data = data.to(device=device, dtype=torch.float32)

    def text_encoders(self) -> list[torch.nn.Module]:
        return [m for name, m in self.components().items() if name.startswith("text_encoder")]

    def sharing_copy(self) -> FlowPolicy:
        """A second policy for another thread (the asynchronous rollout worker) that shares this one's frozen weights
        and buffers (under LoRA the denoiser's base weights, and the VAE and text encoders: only read, by no-grad
        passes), its embedding cache and its encoding lock, and owns copies of the trainable weights, so a snapshot
        loads into it while this one trains. A full fine-tune's denoiser is trainable, so it is copied."""
        shared = {
            id(t): t
            for module in self.components().values()
            for t in [*module.parameters(), *module.buffers()]
            if not t.requires_grad
        }
        for value in (getattr(self, "embedding_cache", None), self._encode_lock):
            if value is not None:
                shared[id(value)] = value
        return copy.deepcopy(self, shared)

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
        """Trade time for memory (see docs/configuration.md, train and pipeline sections)."""
        from flowrl.errors import ConfigError

        if attention == "xformers":  # torch SDPA (diffusers' default) otherwise
            if self.device.type != "cuda":
                raise ConfigError("pipeline.attention: xformers runs on CUDA only; use sdpa on this device")
            try:
                self.pipeline.enable_xformers_memory_efficient_attention()
            except (ImportError, ModuleNotFoundError, ValueError) as error:
                raise ConfigError(
                    f'pipeline.attention: xformers is not usable here ({error}); pip install -e ".[gpu]"'
                ) from None
        if gradient_checkpointing:
            if not getattr(self.transformer, "_supports_gradient_checkpointing", False):
                raise ConfigError(
                    f"train.gradient_checkpointing: {type(self.transformer).__name__} does not support it"
                )
            for module in self.trained_modules().values():
                module.enable_gradient_checkpointing()
        vae = getattr(self.pipeline, "vae", None)
        for flag, method in ((vae_slicing, "enable_slicing"), (vae_tiling, "enable_tiling")):
            if flag:
                if not hasattr(vae, method):
                    raise ConfigError(f"pipeline.vae_{method[7:]}: {type(vae).__name__} has no {method}()")
                getattr(vae, method)()
        self.offload_text_encoders = offload_text_encoders
        self.embedding_cache = {} if embedding_cache else None
        self.decode_microbatch = decode_microbatch
        if offload_text_encoders:
            for module in self.text_encoders():
                module.to("cpu")

    def net(self):
        """The network to call: the distributed wrapper when gradients flow, the bare module otherwise (rollouts
        and evaluation need no gradient synchronisation)."""
        return self.model if torch.is_grad_enabled() else self.transformer

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    # ---- family-specific -------------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        raise NotImplementedError

    def encode_inputs(self, cond: Conditioning, items: list, spec: SampleSpec | None = None) -> Conditioning:
        """Add encoded per-sample inputs (a source image, control maps) to `cond`, for samples of size `spec` when
        the caller knows it; families that take none ignore them."""
        return cond

    def encode(self, conditions: list, guidance_scale: float, spec: SampleSpec | None = None) -> Conditioning:
        """Encode condition items (tasks.Condition, or plain prompt strings) for sampling at `guidance_scale`, for
        samples of size `spec` (an editor's sources take that size)."""
        from flowrl.tasks.base import Condition

        items = [c if isinstance(c, Condition) else Condition(c) for c in conditions]
        cond = self._encode_prompts_cached([c.prompt for c in items], guidance_scale)
        cond.items = items
        return self.encode_inputs(cond, items, spec)

    def _encode_prompts_cached(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        """encode_prompts, with the text encoders on the device only while they run (offload) and each distinct
        prompt encoded once per (prompt, CFG) (embedding cache)."""
        cache = getattr(self, "embedding_cache", None)
        key = self.uses_cfg(guidance_scale)
        with self._encode_lock:
            missing = list(dict.fromkeys(p for p in prompts if cache is None or (p, key) not in cache))
            fresh = None
            if missing:
                with self.text_encoders_on_device():
                    fresh = self.encode_prompts(missing if cache is not None else prompts, guidance_scale)
            if cache is None:
                return fresh
            for row, prompt in enumerate(missing):  # kept in host memory: a real prompt file's T5 embeddings grow
                entry = fresh.select([row]).to("cpu")  # without bound: 1-4 MB a prompt for T5 families, ~8 MB for
                if entry.negative:  # FLUX.2 klein 4B
                    entry.negative = self._shared_negative(cache, key, entry.negative)
                cache[(prompt, key)] = entry
            rows = [cache[(p, key)] for p in prompts]
        return Conditioning(
            {k: torch.cat([r.tensors[k] for r in rows]) for k in rows[0].tensors},
            {k: torch.cat([r.negative[k] for r in rows]) for k in rows[0].negative},
            list(prompts),
        ).to(self.device)

    @staticmethod
    def _shared_negative(cache: dict, key, negative: dict) -> dict:
        """The cached unconditional branch: every shipped family's is one prompt ("" or " ") for all prompts, so an
        equal one is kept once (the first copy), not once a prompt, which would double the cache's host memory."""
        first = cache.setdefault(("unconditional branch", key), negative)
        same = first.keys() == negative.keys() and all(
            first[k].shape == negative[k].shape and torch.equal(first[k], negative[k]) for k in first
        )
        return first if same else negative

    @contextlib.contextmanager
    def text_encoders_on_device(self):
        """The text encoders on the policy's device for the block (offload_text_encoders keeps them on the host
        otherwise). Callers hold `_encode_lock`: a sharing copy moves the same modules."""
        offload = getattr(self, "offload_text_encoders", False)
        if offload:
            for module in self.text_encoders():
                module.to(self.device)
        try:
            yield
        finally:
            if offload:
                for module in self.text_encoders():
                    module.to("cpu")

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

    def text_length(self) -> int:
        """The length every prompt's embeddings are padded to, so rows encoded apart (the embedding cache, the two CFG
        branches) stack: pipeline.max_sequence_length, else the pipeline's own default (512 for Qwen-Image, Z-Image
        and FLUX.2). Qwen-Image and Z-Image mask the padding (their `_forward` hands the transformer only the tokens
        the mask keeps); FLUX.2 attends it whole, as its pipeline does."""
        import inspect

        if self.max_sequence_length is not None:
            return self.max_sequence_length
        return inspect.signature(type(self.pipeline).__call__).parameters["max_sequence_length"].default

    def decode_in_chunks(self, latents: torch.Tensor) -> torch.Tensor:
        """`decode` over `decode_microbatch` samples at a time (0: all at once)."""
        chunk = getattr(self, "decode_microbatch", 0)
        if chunk <= 0 or chunk >= len(latents):
            return self.decode(latents)
        return torch.cat([self.decode(part) for part in latents.split(chunk)])

    def _forward(
        self, latents: torch.Tensor, sigma: torch.Tensor, tensors: dict, guidance_scale: float
    ) -> torch.Tensor:
        raise NotImplementedError

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        """Shape of one sample's latents (no batch dimension) for `spec`."""
        raise NotImplementedError

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
        """Latents -> samples in [0, 1], differentiable: images [B, 3, H, W] or video [B, 3, F, H, W] (the VAE's
        layout); `decode_samples` wraps them as a typed batch."""
        raise NotImplementedError

    def decode_samples(self, latents: torch.Tensor):
        from flowrl.samples import as_samples

        return as_samples(self.decode(latents), fps=self.fps, modality=self.modality)

    def _raw_sigmas(self, scheduler, num_steps: int, noise_shape: tuple[int, ...]) -> None:
        scheduler.set_timesteps(num_steps)

    sampler_scheduler = "FlowMatchEulerDiscreteScheduler"  # the scheduler whose steps `step` takes

    def sampling_scheduler(self, shipped):
        """The scheduler flowrl's steps follow. A pipeline shipped with another one (UniPC, DPM-Solver, ...) is
        switched to the family's own, on the shipped config, with a logged note: never silently."""
        import diffusers

        if type(shipped).__name__ == self.sampler_scheduler:
            return copy.deepcopy(shipped)
        import inspect

        cls = getattr(diffusers, self.sampler_scheduler)
        accepted = inspect.signature(cls.__init__).parameters
        switched = cls.from_config({k: v for k, v in self.scheduler_config(shipped.config).items() if k in accepted})
        logging.getLogger("flowrl").warning(
            "%s ships %s; flowrl samples and trains with %s steps on its config (outputs differ from the "
            "pipeline's own sampler by the solver's order)",
            type(self.pipeline).__name__,
            type(shipped).__name__,
            self.sampler_scheduler,
        )
        return switched

    def scheduler_config(self, config) -> dict:
        """The shipped scheduler's config as the sampling scheduler reads it (UniPC's flow_shift is Euler's shift)."""
        config = dict(config)
        if "flow_shift" in config and config.get("use_flow_sigmas", True):
            config["shift"] = config["flow_shift"]
        return config

    # ---- shared ------------------------------------------------------------------------------------------
    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0

    def velocity(self, latents: torch.Tensor, sigma, cond: Conditioning, guidance_scale: float) -> torch.Tensor:
        """Velocity (eps - x0 convention) in fp32, guided as v_u + w (v_c - v_u) when CFG is on; the unconditional
        branch carries no gradient unless `cfg_uncond_grad` (values are the same either way). With
        `lora_active_from_sigma`, samples below that noise level get the adapter-free network's output."""
        threshold = self.lora_active_from_sigma
        if threshold is None or not self.has_lora or self._adapters_off:
            return self._guided_velocity(latents, sigma, cond, guidance_scale)
        s = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).reshape(-1)
        active = (s >= threshold).expand(latents.shape[0]) if s.numel() == 1 else s >= threshold
        if bool(active.all()):
            return self._guided_velocity(latents, sigma, cond, guidance_scale)
        with self.reference():
            base = self._guided_velocity(latents, sigma, cond, guidance_scale)
        if not bool(active.any()):
            return base
        tuned = self._guided_velocity(latents, sigma, cond, guidance_scale)
        return torch.where(active.reshape(-1, *[1] * (latents.ndim - 1)), tuned, base)

    def _guided_velocity(self, latents, sigma, cond: Conditioning, guidance_scale: float) -> torch.Tensor:
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
        """Unguided model outputs (fp32) of the same latents under each conditioning branch, in one batched call:
        what CFG and negative (concept) guidance combine."""
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device)
        sigma = sigma.expand(latents.shape[0]) if sigma.ndim == 0 else sigma
        x, n = latents.to(self.dtype), len(branches)
        tensors = {k: torch.cat([branch[k] for branch in branches]) for k in branches[0]}
        out = self._forward(torch.cat([x] * n), torch.cat([sigma] * n), tensors, guidance_scale).float()
        return list(out.chunk(n))

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
        """One sampler step between schedule points: (next sample, mean, std, log_prob, x0 prediction).

        `guide(x, sigma, cond, guidance_scale, v) -> v` may replace the model output before the step is taken
        (in-generation steering); it sees the same quantity the sampler uses (velocity here, epsilon for DDIM).
        """
        from flowrl.sampling import sde_step, x0_prediction

        v = self.velocity(x, sigma, cond, guidance_scale)
        if guide is not None:
            v = guide(x, sigma, cond, guidance_scale, v)
        out = sde_step(kind, v, x, sigma, sigma_next, noise_level, noise=noise, prev_sample=prev_sample)
        return (*out, x0_prediction(v, x, sigma))

    def sigmas(self, num_steps: int, noise_shape: tuple[int, ...] = ()) -> torch.Tensor:
        """The pipeline's own sigma schedule for `num_steps` (N + 1 values ending at 0), fp32."""
        key = (num_steps, tuple(noise_shape))
        if key not in self._sigma_cache:
            scheduler = copy.deepcopy(self.scheduler)  # set_timesteps mutates scheduler state
            self._raw_sigmas(scheduler, num_steps, noise_shape)
            self._sigma_cache[key] = scheduler.sigmas.float().cpu()
        return self._sigma_cache[key]

    def add_lora(self, rank: int, alpha: float, target_modules: list[str], init: str = "gaussian") -> None:
        from peft import LoraConfig

        for module in self.trained_modules().values():
            module.requires_grad_(False)
            module.add_adapter(
                LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, init_lora_weights=init)
            )
        for param in self.trainable_parameters():  # peft makes the adapter in the base's dtype: keep it fp32, so
            param.data = param.data.float()  # a checkpoint's weights load exactly into a half-precision base

    @property
    def has_lora(self) -> bool:
        return bool(getattr(self.transformer, "_hf_peft_config_loaded", False))

    @contextlib.contextmanager
    def reference(self):
        """The reference policy: the same network with its LoRA adapter switched off."""
        if not self.has_lora:
            raise RuntimeError("the reference policy needs a LoRA adapter (full fine-tuning keeps no reference)")
        if self._adapters_off:  # nested (a gated velocity inside a reference pass): already off
            yield self
            return
        was_on = [module for module in self._adapted_modules() if _adapters_enabled(module)]
        self.switch_adapters(False)
        self._adapters_off = True
        try:
            yield self
        finally:
            self._adapters_off = False
            for module in was_on:  # as they were (the demo may have left a checkpoint's second expert off)
                module.enable_adapters()

    def switch_adapters(self, on: bool) -> None:
        """Every trained network's LoRA adapter on or off (both Wan2.2 experts when both train and have one)."""
        for module in self._adapted_modules():
            module.enable_adapters() if on else module.disable_adapters()

    def _adapted_modules(self) -> list[torch.nn.Module]:
        return [m for m in self.trained_modules().values() if getattr(m, "_hf_peft_config_loaded", False)]

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

    def set_guidance_scale_2(self, value: float | None, where: str) -> None:
        """A second CFG scale for the low-noise part of the schedule: only Wan2.2's two experts take one."""
        if value is not None:
            from flowrl.errors import ConfigError

            raise ConfigError(
                f"{where}: only a Wan2.2 pipeline with two experts takes a second guidance scale; "
                f"{type(self.pipeline).__name__} has one network"
            )

    def frozen_below(self) -> tuple[float, str] | None:
        """The noise level below which no trainable weight acts, with the reason (None: they act at every level)."""
        if self.lora_active_from_sigma is not None and self.has_lora:
            return self.lora_active_from_sigma, "lora.active_from_sigma switches the adapter off"
        return None

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
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

    def to_images(self, decoded: torch.Tensor) -> torch.Tensor:
        """VAE output in [-1, 1] -> [0, 1] fp32."""
        return (decoded.float() / 2 + 0.5).clamp(0, 1)
