"""Typed experiment configs: YAML -> dataclasses, `key=value` overrides, one clear error per bad field.

A run's config is a `RunConfig`: one section per concern, each a dataclass whose fields are documented by the
string under each (docs/guide/configuration.md is generated from them by flowrl/config_docs.py). The model's
sections (pipeline, lora, sampler) are in flowrl/model_config.py, the training loop's own (train, optim, memory,
runtime) in flowrl/loop_config.py; reading YAML into dataclasses is flowrl/typed_yaml.py's. Algorithm parameters
are validated by the algorithm's own dataclass (flowrl/algorithms).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flowrl.errors import ConfigError
from flowrl.loop_config import (
    MOVED_FROM_TRAIN,
    DataLossSection,
    MemorySection,
    OptimSection,
    RuntimeSection,
    TrainSection,
)
from flowrl.model_config import LoraSection, PipelineSection, SamplerSection
from flowrl.rewards.base import nested_params
from flowrl.typed_yaml import apply_overrides, from_dict, merged

__all__ = [
    "DataLossSection",
    "LoraSection",
    "MemorySection",
    "OptimSection",
    "PipelineSection",
    "RunConfig",
    "RuntimeSection",
    "SamplerSection",
    "TrainSection",
    "apply_overrides",
    "config_to_dict",
    "from_dict",
    "load_config",
]


@dataclass
class RunSection:
    """Where the run's folder is, its seed, and how it resumes and logs."""

    name: str = "run"
    """The run's name; its folder is `out_dir/name`."""
    out_dir: str = "runs"
    """The folder that holds the run folders."""
    seed: int = 0
    """The run's seed (>= 0): every rollout's noise, prompt draw and shuffle derives from it."""
    deterministic: bool = False
    """Deterministic GPU kernels (`torch.use_deterministic_algorithms`, cuDNN without benchmarking,
    `CUBLAS_WORKSPACE_CONFIG=:4096:8` unless set), so two runs of one config, and a resumed run, give the same
    numbers on a GPU as they do on a CPU; slower, and an op without a deterministic kernel stops the run with
    PyTorch's error naming it. The switches are process-wide: a later run in the same Python process keeps them."""
    resume: str | None = None
    """A checkpoint folder (`runs/<name>/checkpoints/update_N`), `auto` (the newest readable checkpoint of the run
    folder) or null (also auto). Auto resumes only a run of the same settings: a run folder whose checkpoint was
    trained with others is refused, naming them (how long it trains, memory and runtime settings, logging,
    checkpoint and eval cadence may change). A checkpoint folder continues on purpose: changed settings are named
    and apply from there; rewound to an older checkpoint of the run folder, the newer ones are renamed
    `abandoned_update_N`."""
    wandb: bool = False
    """Also log metrics and eval sample grids to Weights & Biases (`pip install -e ".[wandb]"`), in the project
    `$WANDB_PROJECT` (default `flowrl`); offline into the run folder unless `WANDB_MODE` says otherwise
    (`wandb sync` uploads later)."""

    def validate(self):
        if self.seed < 0:  # seeds derive per-sample generator seeds, which torch takes only non-negative
            raise ConfigError(f"run.seed: expected an integer >= 0, got {self.seed}")
        if self.resume not in (None, "auto") and not Path(self.resume).is_dir():  # before the model loads
            raise ConfigError(
                f"run.resume: {self.resume} is not a folder; expected a checkpoint folder "
                "(runs/<name>/checkpoints/update_N) or auto"
            )
        self.check_run_folder_can_exist()

    def check_run_folder_can_exist(self):
        """A file where the run folder or a folder above it would go is named now, not as a traceback once the
        model has loaded and the run folder is made."""
        run_dir = (Path(self.out_dir) / self.name).absolute()
        existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
        if existing.is_dir():
            return
        if existing == run_dir:
            raise ConfigError(f"run.name: expected a run folder at out_dir/name, got the file {run_dir}")
        if existing == Path(self.out_dir).absolute():
            raise ConfigError(f"run.out_dir: expected a folder to hold the run folders, got the file {self.out_dir}")
        raise ConfigError(
            f"run.out_dir: expected a folder to hold the run folders; {self.out_dir} cannot be created, "
            f"{existing} is a file"
        )


@dataclass
class TaskSection:
    """The task the run trains and evaluates on (`task.name`: an embedded world's task, `prompt_file` or a dotted
    path): its condition sets, its evaluation, its pretraining data and its
    config defaults. A task's defaults are merged under the config (mappings key by key, the config's values win;
    lists such as `reward` are replaced whole); `task: shapes` is short for `task: {name: shapes}`."""

    name: str = "prompt_file"
    """A registered task (listed below) or `package.module:Class`."""
    params: dict[str, Any] = field(default_factory=dict)
    """Passed to the task, which checks them (most tasks take none)."""


@dataclass
class AlgorithmSection:
    """The RL method and its parameters. DanceGRPO and Flow-GRPO-Fast are `grpo` with options; `ddpo` needs
    `sampler.kind: ddim`; `nft`, `refl`, `draft`, `mend` and `dho` train on deterministic rollouts (`sampler.kind:
    ode`) of flow-matching pipelines; `refl`, `draft` and `mend` backpropagate through the reward and need a
    differentiable one."""

    name: str = "grpo"
    """A registered algorithm (its parameters are listed below) or `package.module:Class`."""
    params: dict[str, Any] = field(default_factory=dict)
    """The algorithm's parameters, checked by its own parameter class."""


@dataclass
class RewardTerm:
    """The reward: a list of terms, whose weighted sum is the reward (default: the task's). Each term's fields are
    below; the registered rewards and their params are listed in docs/guide/rewards.md."""

    name: str = ""
    """A registered reward or `package.module:Name` (required)."""
    weight: float = 1.0
    """The term's weight in the sum."""
    params: dict[str, Any] = field(default_factory=dict)
    """Passed to the reward, which checks them."""
    batch_size: int = 0
    """Samples per call of this reward (0: as many as it is given): for a large reward model beside small ones."""
    process: bool = False
    """Score this reward in a child process of its own (`flowrl serve-reward` on loopback, started and stopped by
    the run): no GIL shared with the rollout, memory of its own; not differentiable through it."""

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
    """Where training conditions come from. Each update draws `train.groups_per_update` conditions: a set with tags
    picks a tag, then a prompt within it (with replacement); a prompt file (or a set without tags) gives distinct
    prompts within an update."""

    source: str = "train"
    """A condition set of the task (`train`, `eval`, ...), or a prompt file: `.txt` with one prompt per line, or
    `.jsonl` with a `prompt` field per line whose other fields travel with the prompt as metadata (rewards receive
    them as `meta["conditions"]`)."""


@dataclass
class EvalSection:
    """The run's evaluations: the eval set sampled with fixed seeds before, during and after training, judged by the
    task's own evaluation (else the run's reward per tag)."""

    every: int = 0
    """Evaluate every N updates (0: only before and after training)."""
    prompts: str = "eval"
    """The eval conditions: a set of the task or a prompt file, as in `prompts.source`; every item is checked by the
    task before training (one error naming a prompt it cannot judge)."""
    num_per_prompt: int = 4
    """Samples per eval prompt (>= 1)."""
    num_steps: int = 20
    """Sampling steps of an eval sample (>= 1; ODE sampling)."""
    guidance_scale: float = 4.5
    """CFG scale of eval samples."""
    height: int | None = None
    """Height of eval samples; null: the training size (`pipeline.height`). Training at a low resolution and
    evaluating at the full one takes a family whose denoiser accepts both sizes (the DiTs' positional embeddings are
    computed per size; SD3's learned ones up to `pos_embed_max_size`)."""
    width: int | None = None
    """Width of eval samples; null: the training size (`pipeline.width`)."""
    num_frames: int | None = None
    """Frames per eval video; null: the training length (`pipeline.num_frames`)."""
    seed: int = 2024
    """The eval seed (>= 0, not `run.seed`); eval sample k of prompt p starts from the same noise in every run."""
    enabled: bool = True
    """Evaluate at all (false: no evaluations, no before / after grid)."""

    def validate(self):
        for name in ("num_per_prompt", "num_steps", "height", "width", "num_frames"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"eval.{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.every < 0 or self.seed < 0:
            name = "every" if self.every < 0 else "seed"
            raise ConfigError(f"eval.{name}: expected an integer >= 0, got {getattr(self, name)}")


@dataclass
class RunConfig:
    """A run's config: one section per concern (a YAML mapping each; `reward` a list of terms)."""

    run: RunSection = field(default_factory=RunSection)
    """The run's folder, seed, resume and logging."""
    task: TaskSection = field(default_factory=TaskSection)
    """The task the run trains and evaluates on."""
    pipeline: PipelineSection = field(default_factory=PipelineSection)
    """The diffusers pipeline fine-tuned."""
    lora: LoraSection | None = field(default_factory=LoraSection)
    """The adapter trained; null: full fine-tuning."""
    sampler: SamplerSection = field(default_factory=SamplerSection)
    """How training rollouts sample."""
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    """The RL method."""
    reward: list[RewardTerm] = field(default_factory=list)
    """The reward: a weighted sum of terms."""
    prompts: PromptsSection = field(default_factory=PromptsSection)
    """Where training conditions come from."""
    train: TrainSection = field(default_factory=TrainSection)
    """What an update is, and checkpoints."""
    optim: OptimSection = field(default_factory=OptimSection)
    """The optimizer, its schedule, clipping and EMA."""
    memory: MemorySection = field(default_factory=MemorySection)
    """Batch cuts, recomputation, offloading and precision."""
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    """Threads, processes and overlap."""
    eval: EvalSection = field(default_factory=EvalSection)
    """The run's evaluations."""

    def validate(self):
        self.run.validate()
        self.pipeline.validate()
        if self.lora is not None:
            self.lora.validate()
        self.sampler.validate()
        self.train.validate()
        self.optim.validate()
        self.memory.validate()
        self.runtime.validate()
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


def upgraded(data: dict) -> dict:
    """A saved run config (config_to_dict's, as a run folder's config.yaml and each checkpoint's run_config.yaml
    hold it) in the current layout: the fields the `train` section held before it was split moved to their sections;
    a config already in the current layout is returned as it is.

    Args:
        data: the saved config, a mapping of sections.

    Returns:
        A new mapping (`data` is not changed)."""
    train = data.get("train")
    if not isinstance(train, dict) or not MOVED_FROM_TRAIN.keys() & train.keys():
        return data
    data = {**data, "train": {k: v for k, v in train.items() if k not in MOVED_FROM_TRAIN}}
    for key, section in MOVED_FROM_TRAIN.items():
        if key in train:
            data[section] = {**(data.get(section) or {}), key: train[key]}
    return data


def load_config(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Read, override and validate a YAML config.

    Args:
        path: the YAML file.
        overrides: `section.field=value` strings, each value parsed as YAML, applied in order.

    Returns:
        The validated RunConfig, the named task's defaults under it.

    Raises:
        ConfigError: one line naming the first bad field or file.
    """
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
    train = data.get("train")
    for key in train if isinstance(train, dict) else ():
        if key in MOVED_FROM_TRAIN:  # a config written before the train section was split by concern
            raise ConfigError(
                f"train.{key}: moved to {MOVED_FROM_TRAIN[key]}.{key} (the train section is split into train, "
                "optim, memory and runtime)"
            )
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

    return merged(TASKS.get(name, "task.name").defaults, data)


def config_to_dict(config) -> dict:
    """`config` (a RunConfig or any section) as plain mappings and lists, as YAML and W&B take it."""
    return dataclasses.asdict(config)
