"""Typed experiment configs: YAML -> dataclasses, `key=value` overrides, one clear error per bad field.

Every field is checked against its annotation (int, float, str, bool, Literal, X | None, list[X], nested
dataclass); unknown keys are errors that list the known ones. Algorithm parameters are validated by the
algorithm's own dataclass (see algorithms/).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from flowrl.errors import ConfigError
from flowrl.fk import FKConfig
from flowrl.rewards.base import nested_params
from flowrl.sampling import SAMPLER_KINDS


@dataclass
class RunSection:
    name: str = "run"
    out_dir: str = "runs"
    seed: int = 0
    # deterministic GPU kernels, so two runs (and a resumed one) give the same numbers on a GPU too; slower, and some
    # ops have no such kernel (PyTorch names them in an error); CPU runs repeat either way
    deterministic: bool = False
    resume: str | None = None  # a checkpoint dir, or "auto" (the newest in the run dir), or None (also auto)
    wandb: bool = False  # also log to Weights & Biases (offline unless WANDB_MODE is set; needs `pip install wandb`)
    wandb_project: str = "flowrl"

    def validate(self):
        if self.seed < 0:  # seeds derive per-sample generator seeds, which torch takes only non-negative
            raise ConfigError(f"run.seed: expected an integer >= 0, got {self.seed}")
        if self.resume not in (None, "auto") and not Path(self.resume).is_dir():  # before the model loads
            raise ConfigError(
                f"run.resume: {self.resume} is not a folder; expected a checkpoint folder "
                "(runs/<name>/checkpoints/update_N) or auto"
            )


@dataclass
class TaskSection:
    """The world the run trains and evaluates in: its sets, evaluation, data and config defaults (flowrl/tasks)."""

    name: str = "prompt_file"  # a registered task (shapes, safety, prompt_file) or package.module:Class
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class PipelineSection:
    path: str = ""  # a local diffusers pipeline folder
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None  # video families only
    max_sequence_length: int | None = None  # text tokens (None: the pipeline's own default)
    # Wan2.2's two experts: the CFG scale of the low-noise one (WanPipeline's guidance_scale_2), in training and
    # evaluation; None: one scale (sampler.guidance_scale / eval.guidance_scale) for both
    guidance_scale_2: float | None = None
    # Wan2.2's two experts: which train. high: the high-noise `transformer` (steps below the boundary train nothing);
    # both: `transformer_2` too, with its own adapter (or full weights), so every step trains
    experts: Literal["high", "both"] = "high"
    # the flow-matching schedule's shift, sigma' = s sigma / (1 + (s - 1) sigma), in place of the pipeline folder's
    # scheduler config (DanceGRPO samples HunyuanVideo at 5 where the release says 7); None: the folder's. Not for
    # schedules shifted by the image size (use_dynamic_shifting: FLUX.1-dev, FLUX.2, Qwen-Image)
    shift: float | None = None
    # editors with reference images (FLUX.2, Qwen-Image-Edit): each image sized as the pipeline sizes it for an area
    # of this side squared (1024: the pipelines' own; FLUX.2 shrinks larger images to it, Qwen-Image-Edit brings
    # every image to it), keeping its aspect ratio; None: every image takes the sample size
    reference_size: int | None = None
    policy: str | None = None  # adapter override: a pipeline class name or package.module:Class
    attention: Literal["sdpa", "xformers"] = "sdpa"  # xformers: pip install -e ".[gpu]", CUDA only
    vae_slicing: bool = False  # decode one sample at a time inside the VAE
    vae_tiling: bool = False  # decode in overlapping tiles (large images / videos)

    def validate(self):
        if not self.path:
            raise ConfigError("pipeline.path: expected a local diffusers pipeline folder")
        for name in ("height", "width", "num_frames", "reference_size", "max_sequence_length"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"pipeline.{name}: expected a positive integer, got {getattr(self, name)}")
        if self.shift is not None and self.shift <= 0:
            raise ConfigError(f"pipeline.shift: expected a positive number, got {self.shift}")


@dataclass
class LoraSection:
    rank: int = 16
    alpha: float = 32.0
    target_modules: list[str] | None = None  # None: the family's attention projections
    # the adapter acts only at noise levels sigma >= this (flow samplers; None: at every step). For an SDE window
    # that trains only high-noise steps, so the LoRA leaves the low-noise steps it never learned on to the base.
    active_from_sigma: float | None = None
    # sampling only (the run's evaluations, `flowrl sample`, `flowrl eval`, the demo): the adapter acts at sigma >= this
    # there, while training rollouts use it as active_from_sigma says. For a LoRA trained at every step whose
    # low-noise part costs accuracy (the main job: docs/benchmarks.md). None: sample as active_from_sigma.
    sample_from_sigma: float | None = None

    def validate(self):
        if self.rank < 1:
            raise ConfigError(f"lora.rank: expected an integer >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ConfigError(f"lora.alpha: expected a positive number, got {self.alpha}")


@dataclass
class SamplerSection:
    kind: str = "flow"
    noise_level: float = 0.7
    num_steps: int = 10
    guidance_scale: float = 4.5
    sde_window_size: int = 0  # 0: every step is SDE; k > 0: a window of k SDE steps (Flow-GRPO-Fast / MixGRPO)
    sde_window_range: list[int] = field(default_factory=lambda: [0, 5])  # the window start is drawn from [lo, hi)
    # FK-steered training rollouts: each prompt group is one set of FK particles, resampled while denoising.
    # The group is then not an on-policy sample (biased towards the reward); metrics flag it.
    fk: FKConfig | None = None

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
        if self.fk is not None and (self.kind == "ode" or self.noise_level == 0):
            # copies of a particle made by a resampling stay identical under a deterministic sampler: the group
            # would train on duplicates
            raise ConfigError(
                f"sampler.fk: FK particles need a stochastic sampler; got sampler.kind {self.kind!r} "
                f"with noise_level {self.noise_level}"
            )


@dataclass
class AlgorithmSection:
    name: str = "grpo"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardTerm:
    name: str = ""  # a registered reward or package.module:Name
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 0  # samples per call of this reward (0: as many as it is given)
    process: bool = False  # score in a child process of its own (no GIL shared with the rollout; own memory)

    def validate(self, where: str):
        if not self.name:
            raise ConfigError(f"{where}.name: expected a registered reward or package.module:Name")
        for at, key, _ in nested_params(self.params, f"{where}.params"):  # YAML 1.1: a bare `yes:` key is a boolean
            if not isinstance(key, str):
                raise ConfigError(
                    f"{at}: a key reads as {key!r}: YAML takes a bare yes / no as a boolean; quote it ('yes': [...])"
                )
        if self.batch_size < 0:
            raise ConfigError(
                f"{where}.batch_size: expected an integer >= 0 (0: as many as it is given), got {self.batch_size}"
            )


@dataclass
class PromptsSection:
    source: str = "train"  # a condition set of the task, or a prompt file (.txt, or .jsonl with a 'prompt' field)


@dataclass
class DataLossSection:
    """Pretraining-data regularization (flowrl/data_loss.py): weight x flow-matching loss on a batch of the task's
    pretraining data."""

    weight: float = 1.0
    batch: int = 32

    def validate(self):
        if self.weight < 0 or self.batch < 1:
            raise ConfigError(
                f"train.data_loss: expected weight >= 0 and batch >= 1, got {self.weight} and {self.batch}"
            )


@dataclass
class TrainSection:
    updates: int = 40
    groups_per_update: int = 8  # prompts per update (global, over all processes)
    group_size: int = 8  # samples per prompt
    optimizer_steps_per_update: int = 1
    lr: float = 3e-4
    lr_schedule: Literal["constant", "cosine"] = "constant"  # cosine: from lr down to 0 at the last update
    weight_decay: float = 1e-4
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0
    microbatch_size: int = 16  # samples per forward/backward in the update phase
    rollout_microbatch: int = 0  # samples per rollout call (0: all of a process's samples at once)
    decode_microbatch: int = 0  # samples per VAE decode (0: all at once)
    reward_microbatch: int = 0  # samples per reward call (0: all at once)
    async_rewards: bool = False  # score each rollout chunk in a worker thread while the next chunk samples
    async_rollouts: bool = False  # sample in a worker thread on a weight snapshot while the learner trains
    staleness: int = 1  # with async_rollouts: update u's batch is sampled with the weights of update max(0, u - S)
    gradient_checkpointing: bool = False  # recompute the denoiser's activations in backward (memory for time)
    offload_text_encoders: bool = False  # keep text encoders on the CPU, on the device only while encoding
    embedding_cache: bool = False  # encode each distinct prompt once per run (repeated prompts skip the encoders)
    optimizer: Literal["adamw", "adamw_8bit", "sgd"] = "adamw"  # adamw_8bit: bitsandbytes (CUDA)
    max_failed_reward_share: float = 0.25  # samples without a finite reward (NaN, inf, raised) beyond this: stop
    ema_decay: float = 0.0  # 0 disables EMA of the trained weights
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    weight_dtype: Literal["fp32", "fp16", "bf16"] = "fp32"  # frozen weights (base model, VAE, text encoders)
    # gradient through CFG's unconditional branch; None: the method's own (`uncond_grad_of`): none for likelihood
    # ratio methods (Flow-GRPO's SD3 script detaches it), kept where the method differentiates the sampler
    # (DRaFT, ReFL, MEND: the guided output whole, as AlignProp and DRaFT do)
    cfg_uncond_grad: bool | None = None
    normalize_rewards: Literal["none", "batch", "group"] = "none"  # standardize each reward term before weighting
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    threads: int = 0  # torch CPU threads; 0 keeps torch's default
    # several processes: how long a collective waits for the others. The main process judges each evaluation's
    # samples (a VLM reward can take long) and writes checkpoints and reports while the others wait in the next
    # collective, which may take longer than torch's 10-minute NCCL default
    collective_timeout_minutes: int = 180
    data_loss: DataLossSection | None = None  # regularize with the pretraining data's loss (ImageReward's ReFL)

    def validate(self):
        for name in (
            "updates",
            "groups_per_update",
            "optimizer_steps_per_update",
            "microbatch_size",
            "collective_timeout_minutes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.staleness < 0:
            raise ConfigError(
                f"train.staleness: expected an integer >= 0 (0: rollouts use the newest weights), got {self.staleness}"
            )
        for name in ("rollout_microbatch", "decode_microbatch", "reward_microbatch"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}: expected an integer >= 0 (0: all at once), got {getattr(self, name)}")
        if self.group_size < 2:
            raise ConfigError(
                f"train.group_size: expected an integer >= 2 (group advantages need it), got {self.group_size}"
            )
        if self.lr <= 0:
            raise ConfigError(f"train.lr: expected a positive number, got {self.lr}")
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay: expected a number >= 0, got {self.weight_decay}")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"train.adam_betas: expected two numbers in [0, 1), got {self.adam_betas}")
        if self.threads < 0:
            raise ConfigError(f"train.threads: expected an integer >= 0 (0: torch's default), got {self.threads}")
        if self.grad_clip <= 0:  # 0 would zero every gradient, a negative norm flip its sign
            raise ConfigError(f"train.grad_clip: expected a positive gradient norm, got {self.grad_clip}")
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"train.ema_decay: expected a number in [0, 1), got {self.ema_decay}")
        if self.data_loss is not None:
            self.data_loss.validate()
        if self.weight_dtype != "fp32" and self.mixed_precision != self.weight_dtype:
            raise ConfigError(
                f"train.weight_dtype: {self.weight_dtype} weights run under autocast; expected "
                f"train.mixed_precision: {self.weight_dtype}, got {self.mixed_precision!r}"
            )


@dataclass
class EvalSection:
    every: int = 0  # evaluate every N updates (0: only before and after training)
    prompts: str = "eval"  # a condition set of the task, or a prompt file
    num_per_prompt: int = 4
    num_steps: int = 20
    guidance_scale: float = 4.5
    seed: int = 2024
    enabled: bool = True

    def validate(self):
        for name in ("num_per_prompt", "num_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"eval.{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.every < 0 or self.seed < 0:
            name = "every" if self.every < 0 else "seed"
            raise ConfigError(f"eval.{name}: expected an integer >= 0, got {getattr(self, name)}")


@dataclass
class RunConfig:
    run: RunSection = field(default_factory=RunSection)
    task: TaskSection = field(default_factory=TaskSection)
    pipeline: PipelineSection = field(default_factory=PipelineSection)
    lora: LoraSection | None = field(default_factory=LoraSection)
    sampler: SamplerSection = field(default_factory=SamplerSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    reward: list[RewardTerm] = field(default_factory=list)
    prompts: PromptsSection = field(default_factory=PromptsSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)

    def validate(self):
        self.run.validate()
        self.pipeline.validate()
        if self.lora is not None:
            self.lora.validate()
        self.sampler.validate()
        self.train.validate()
        self.eval.validate()
        for name in ("active_from_sigma", "sample_from_sigma"):
            gate = getattr(self.lora, name) if self.lora is not None else None
            if gate is None:
                continue
            if not 0 < gate <= 1:
                raise ConfigError(f"lora.{name}: expected a noise level in (0, 1], got {gate}")
            if self.sampler.kind == "ddim":
                raise ConfigError(f"lora.{name}: flow samplers only (sigma in [0, 1]); sampler.kind is ddim")
        from flowrl.tasks.base import build_task, check_source

        task = build_task(self.task.name, self.task.params)  # the task checks its own params
        check_source(task, self.prompts.source, "prompts.source")
        if self.eval.enabled:
            check_source(task, self.eval.prompts, "eval.prompts")
            if self.eval.seed == self.run.seed:  # both derive sample seeds as (seed, index, index)
                raise ConfigError(
                    f"eval.seed: {self.eval.seed} is run.seed too, so evaluation image k of prompt p "
                    "would start from the noise of training update p's k-th sample; pick another"
                )
        if self.sampler.fk is not None:
            self.sampler.fk.validate("sampler.fk")
            if self.sampler.fk.num_particles != self.train.group_size:
                raise ConfigError(
                    f"sampler.fk.num_particles: the FK particles of a prompt are its training group; "
                    f"expected train.group_size = {self.train.group_size}, got {self.sampler.fk.num_particles}"
                )
        if not self.reward:
            raise ConfigError("reward: expected at least one reward term (a list of {name, weight, params})")
        for i, term in enumerate(self.reward):
            term.validate(f"reward[{i}]")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value, tp, where: str):
    """Check / coerce `value` to annotation `tp`; ConfigError naming `where` otherwise."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, where)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value is False and "no" in args:  # YAML 1.1 reads a bare `no` as false (mixed_precision: no)
            value = "no"
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None and math.isfinite(number):  # (a range check `x <= 0` lets NaN through)
            return number
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    raise ConfigError(f"{where}: unsupported field type {tp}")


def from_dict(cls, data, where: str = ""):
    """Build dataclass `cls` from a mapping, checking every field; `where` prefixes field names in errors."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(f"{where + '.' if where else ''}{key}: unknown field; known fields: {', '.join(names)}")
    kwargs = {k: _convert(v, hints[k], f"{where + '.' if where else ''}{k}") for k, v in data.items()}
    return cls(**kwargs)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` strings (value parsed as YAML) to a nested mapping."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. train.lr=1e-4")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = node[part]
        node[parts[-1]] = value
    return data


def load_config(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Read, override and validate a YAML config."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; expected a YAML file such as configs/shapes_grpo.yaml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {error.start}); expected a YAML file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of sections at the top level")
    if isinstance(
        data.get("task"), str
    ):  # `task: shapes` is short for `task: {name: shapes}`; overrides may add params
        data["task"] = {"name": data["task"]}
    data = apply_overrides(data, list(overrides))
    config = from_dict(RunConfig, with_task_defaults(data))
    config.validate()
    return config


def with_task_defaults(data: dict) -> dict:
    """The config with the named task's defaults under it: mappings merge key by key, the config's values win,
    lists (such as `reward`) are replaced whole."""
    task = data.get("task")
    name = task.get("name") if isinstance(task, dict) else task
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"task.name: expected a registered task's name or package.module:Class, got {name!r}")
    if isinstance(task, str):  # `task: shapes` is short for `task: {name: shapes}`
        data = {**data, "task": {"name": task}}
    if not name:
        return data
    from flowrl.tasks.base import TASKS

    return _merge(TASKS.get(name, "task.name").defaults, data)


def _merge(base: dict, top: dict) -> dict:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def config_to_dict(config) -> dict:
    return dataclasses.asdict(config)
