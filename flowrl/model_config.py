"""The config sections of the model a run fine-tunes and how it samples: `pipeline` (the diffusers pipeline and
its size), `lora` (the adapter trained) and `sampler` (the SDE of training rollouts). Each field is documented by the
string under it, from which docs/guide/configuration.md is generated (flowrl/config_docs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from flowrl.errors import ConfigError
from flowrl.fk import FKConfig
from flowrl.sde import SAMPLER_KINDS


@dataclass
class PipelineSection:
    """The diffusers pipeline the run fine-tunes, the size it samples at, and pipeline-specific settings."""

    path: str = ""
    """The local diffusers pipeline folder (required); its class picks the policy adapter."""
    height: int | None = None
    """Sample height; null: the pipeline's own default. A multiple of the VAE's compression times the denoiser's
    patch side, else one error naming the field."""
    width: int | None = None
    """Sample width; null as for `height`."""
    num_frames: int | None = None
    """Frames per video (video families only); null: the pipeline's own default."""
    max_sequence_length: int | None = None
    """Text tokens per prompt; null: the pipeline's own default."""
    guidance_scale_2: float | None = None
    """Wan2.2's two experts: the CFG scale wherever the low-noise expert acts (WanPipeline's `guidance_scale_2`), in
    rollouts and evaluations; null: one scale for both. A config error on any other pipeline."""
    experts: Literal["high", "both"] = "high"
    """Wan2.2's two experts: which train. `high`: the high-noise `transformer` (steps below the boundary train
    nothing; start-up names them); `both`: `transformer_2` too, with its own adapter (or full weights), so every
    step trains. A config error on any other pipeline."""
    shift: float | None = None
    """The flow-matching schedule's shift, sigma' = s sigma / (1 + (s - 1) sigma), in place of the pipeline folder's
    scheduler config, in training, evaluation, `flowrl sample` and the demo; null: the folder's. A config error
    for a schedule shifted by the sample size (`use_dynamic_shifting`: FLUX.1-dev, FLUX.2, Qwen-Image) or a DDIM
    pipeline."""
    reference_size: int | None = None
    """Editors with reference images (FLUX.2, Qwen-Image-Edit): each image sized as the pipeline sizes it for an
    N x N area, keeping its aspect ratio (1024: the pipelines' own); null: every image takes the sample size."""
    policy: str | None = None
    """Adapter override: a registered name (a pipeline class, or `Flux2KleinEdit` / `Flux2Edit` for FLUX.2
    editing) or `package.module:Class`; null: the adapter of the pipeline's class. `flowrl sample`, the demo and
    `flowrl export` take it from the run."""
    attention: str = "sdpa"
    """The attention kernel of the denoising networks: `sdpa` (diffusers' default, torch's scaled dot-product
    attention), `xformers` (CUDA only, `pip install -e ".[gpu]"`), or a backend of diffusers' attention dispatcher
    (`native`, `_native_math`, `flash`, `_flash_3`, `sage`, `flex`, ...; `diffusers.models.attention_dispatch.
    AttentionBackendName` lists them) for families whose attention goes through it (FLUX, FLUX.2, Wan, Qwen-Image,
    Z-Image, HunyuanVideo, LTX-Video; not SD3's or the UNets' processors). On the CPU only `native`, `_native_math`,
    `_native_flash` and `flex` run."""
    vae_slicing: bool = False
    """The VAE decodes one sample at a time."""
    vae_tiling: bool = False
    """The VAE decodes in overlapping tiles (large images, video)."""

    def validate(self):
        if not self.path:
            raise ConfigError("pipeline.path: expected a local diffusers pipeline folder")
        for name in ("height", "width", "num_frames", "reference_size", "max_sequence_length"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"pipeline.{name}: expected a positive integer, got {getattr(self, name)}")
        if self.shift is not None and self.shift <= 0:
            raise ConfigError(f"pipeline.shift: expected a positive number, got {self.shift}")
        if self.attention not in ("sdpa", "xformers"):
            from flowrl.devices import attention_backends

            if self.attention not in attention_backends():
                raise ConfigError(
                    f"pipeline.attention: expected sdpa, xformers or one of diffusers' attention backends "
                    f"{attention_backends()}, got {self.attention!r}"
                )


@dataclass
class LoraSection:
    """The LoRA adapter the run trains; `lora: null` trains the full denoising network instead (then there is no
    reference policy)."""

    rank: int = 16
    """LoRA rank (>= 1)."""
    alpha: float = 32.0
    """LoRA alpha (> 0)."""
    target_modules: list[str] | None = None
    """Module names to adapt; null: the family's attention projections."""
    active_from_sigma: float | None = None
    """The adapter acts only at noise levels sigma >= this (flow samplers; null: at every step): for an SDE window
    that trains only high-noise steps, the low-noise steps keep the base network. Honoured by `flowrl train`,
    `sample`, `eval` and the demo (the checkpoint's adapter.json stores it); the diffusers LoRA files and `flowrl
    export` (which warns) apply the adapter at every step. SDE steps below it train nothing: start-up names them in
    a warning, and stops with a config error when no SDE step is left."""
    sample_from_sigma: float | None = None
    """Sampling only (the run's evaluations, `flowrl sample`, `flowrl eval`, the demo): the adapter acts at
    sigma >= this there, while training rollouts use it as `active_from_sigma` says; for a LoRA trained at every
    step whose low-noise part costs accuracy. Stored in adapter.json; null: sample as `active_from_sigma`."""

    def validate(self):
        if self.rank < 1:
            raise ConfigError(f"lora.rank: expected an integer >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ConfigError(f"lora.alpha: expected a positive number, got {self.alpha}")


@dataclass
class SamplerSection:
    """How training rollouts sample: the SDE, its steps and guidance, and which steps are stochastic."""

    kind: str = "flow"
    """One of `ode`, `flow` (Flow-GRPO), `dance` (DanceGRPO), `cps`, `sage`, `ddim` (epsilon-prediction
    pipelines)."""
    noise_level: float = 0.7
    """The SDE's noise level (for `ddim`: eta); >= 0."""
    num_steps: int = 10
    """Sampling steps of a training rollout; >= 1."""
    guidance_scale: float = 4.5
    """Classifier-free guidance scale s in v_u + s (v_c - v_u) (1: none), for every family (Z-Image's pipeline writes
    it as its guidance_scale + 1)."""
    sde_window_size: int = 0
    """0: every step is SDE; k > 0: a window of k SDE steps, the others ODE (Flow-GRPO-Fast, MixGRPO)."""
    sde_window_range: list[int] = field(default_factory=lambda: [0, 5])
    """The window's starts: [lo, hi); a window starting anywhere in it must fit in `num_steps`."""
    sde_window_schedule: Literal["random", "progressive"] = "random"
    """How the window moves over the run: `random` (its start drawn from `sde_window_range` each update) or
    `progressive` (MixGRPO: from lo, `sde_window_stride` steps later every `sde_window_shift_every` updates, back to lo
    past hi)."""
    sde_window_shift_every: int = 25
    """progressive: updates between the window's moves (>= 1; MixGRPO's 25)."""
    sde_window_stride: int = 1
    """progressive: steps the window moves at a time (>= 0; 0 keeps it at lo)."""
    ode_solver: Literal["euler", "dpm2"] = "euler"
    """The deterministic steps after the SDE window: `euler`, or `dpm2` (DPM-Solver++ 2M, MixGRPO-Flash's), second
    order on the earlier steps' x0 predictions; steps before the window stay Euler."""
    fk: FKConfig | None = None
    """FK-steered training rollouts: each prompt group is one set of FK particles, resampled while denoising. The
    group is then not an on-policy sample (biased towards the reward); metrics flag it."""

    def validate(self):
        if self.kind not in SAMPLER_KINDS:
            raise ConfigError(f"sampler.kind: expected one of {list(SAMPLER_KINDS)}, got {self.kind!r}")
        if self.num_steps < 1:
            raise ConfigError(f"sampler.num_steps: expected an integer >= 1, got {self.num_steps}")
        if self.noise_level < 0:
            raise ConfigError(f"sampler.noise_level: expected a number >= 0, got {self.noise_level}")
        lo, hi = (self.sde_window_range + [None, None])[:2]
        if len(self.sde_window_range) != 2 or not 0 <= lo < hi:
            raise ConfigError(
                f"sampler.sde_window_range: expected [lo, hi] with 0 <= lo < hi, got {self.sde_window_range}"
            )
        if self.sde_window_size < 0 or (self.sde_window_size and hi - 1 + self.sde_window_size > self.num_steps):
            raise ConfigError(
                f"sampler.sde_window_size: a window of {self.sde_window_size} steps starting in "
                f"[{lo}, {hi}) must fit in sampler.num_steps={self.num_steps}"
            )
        if self.sde_window_shift_every < 1 or self.sde_window_stride < 0:
            raise ConfigError(
                "sampler.sde_window_shift_every / sde_window_stride: expected an integer >= 1 and an integer >= 0, "
                f"got {self.sde_window_shift_every} and {self.sde_window_stride}"
            )
        for name, value, default in (
            ("sde_window_schedule", self.sde_window_schedule, "random"),
            ("ode_solver", self.ode_solver, "euler"),
        ):
            if value != default and not self.sde_window_size:
                raise ConfigError(
                    f"sampler.{name}: {value} acts on an SDE window; set sampler.sde_window_size (0: every step is "
                    f"SDE) or leave it at {default}"
                )
        if self.ode_solver != "euler" and self.kind in ("ode", "ddim"):
            raise ConfigError(
                f"sampler.ode_solver: {self.ode_solver} takes the ODE steps after a flow SDE's window; sampler.kind "
                f"{self.kind!r} has no such window (use euler)"
            )
        if self.fk is not None and (self.kind == "ode" or self.noise_level == 0):
            # copies of a particle made by a resampling stay identical under a deterministic sampler: the group
            # would train on duplicates
            raise ConfigError(
                f"sampler.fk: FK particles need a stochastic sampler; got sampler.kind {self.kind!r} "
                f"with noise_level {self.noise_level}"
            )
