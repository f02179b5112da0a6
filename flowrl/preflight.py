"""Pre-flight: the checks that settings of different config sections (and the launch) fit together.

Each raises one ConfigError naming the setting to change. The checks that need only the config, the launch
(processes, backend) and the algorithm run before any model loads, which takes minutes for a large pipeline:
`check_launch`, `check_reward_terms`, `check_before_loading`. The ones that need the loaded policy (its family,
prediction type and schedule) or the built reward run right after they exist: `check_loaded_policy`,
`check_resume_settings`, `check_reward_modalities`, `check_trained_steps`. The Trainer calls them in this order,
so a config with several problems is told about the same one first every time.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tqdm import tqdm

from flowrl.checkpoint import changed_settings
from flowrl.config import RunConfig, config_to_dict
from flowrl.errors import ConfigError
from flowrl.rewards import check_reward
from flowrl.sde_window import reachable_steps


def refuse_deepspeed(accelerator) -> None:
    """Refuse an accelerate launch with DeepSpeed: its backward steps the optimizer after every backward unless told
    each microbatch's place (the trainer takes several microbatches per optimizer step), its bf16 mode casts the
    trained weights the log-prob maths keeps in fp32, and its sharded optimizer state needs checkpoints of its own;
    none of it can be tested without CUDA. DDP (LoRA) and FSDP2 (full fine-tunes; tested on CPU processes) can.

    Args:
        accelerator: the run's accelerate Accelerator (or anything with a `distributed_type`).

    Raises:
        ConfigError: under DeepSpeed, naming the accelerate configs to launch with instead.
    """
    from accelerate.utils import DistributedType

    if getattr(accelerator, "distributed_type", None) == DistributedType.DEEPSPEED:
        raise ConfigError(
            "accelerate launch: DeepSpeed is not supported by flowrl's trainer (it would step the "
            "optimizer once per microbatch); launch with configs/accelerate/ddp.yaml (LoRA) or "
            "configs/accelerate/fsdp2.yaml (full fine-tunes: weights, gradients and Adam's state sharded)"
        )


def check_launch(config: RunConfig, accelerator) -> None:
    """The launch suits the config: no DeepSpeed, and an update's samples divide evenly over the processes.

    Args:
        config: the run's config.
        accelerator: the run's accelerate Accelerator.
    """
    refuse_deepspeed(accelerator)
    world = accelerator.num_processes
    global_batch = config.train.groups_per_update * config.train.group_size
    if global_batch % world:
        raise ConfigError(
            f"train.groups_per_update x train.group_size = {global_batch} samples must divide "
            f"evenly over {world} processes"
        )


def check_reward_terms(config: RunConfig) -> None:
    """The config's rewards checked without building them (`rewards.check_reward`: names, params, local folders).

    Args:
        config: the run's config.
    """
    for i, term in enumerate(config.reward):
        check_reward(term.name, term.params, f"reward[{i}]")


def check_whole_groups(config: RunConfig, algorithm, world: int) -> None:
    """Groups that must stay whole: FK's particles (a group) resample on one process, an algorithm that pairs or
    matches within a group (DPO, DHO) sees one process's rows, and a reward that scores a condition's samples
    together (a group rubric: Reward.groups_scored) must get whole groups from every cut of the rollout's samples
    (reward calls, async chunks, the term's batches); else results would depend on memory settings and the number
    of processes.

    Args:
        config: the run's config.
        algorithm: the run's Algorithm (its `needs_whole_groups`).
        world: the number of processes.
    """
    from flowrl.rewards.base import groups_scored

    train, memory = config.train, config.memory
    grouped = [i for i, term in enumerate(config.reward) if groups_scored(term.name, term.params, f"reward[{i}]")]
    names = ", ".join(config.reward[i].name for i in grouped)
    reasons = []
    if config.sampler.fk is not None:
        reasons.append("FK rollouts keep each prompt's particles on one process")
    if algorithm.needs_whole_groups:
        reasons.append(f"algorithm {config.algorithm.name!r} pairs samples within a group on one process")
    if grouped:
        reasons.append(f"reward {names} scores a group's samples together")
    if reasons and train.groups_per_update % world:
        raise ConfigError(
            f"train.groups_per_update: {'; '.join(reasons)}; expected a multiple of {world} "
            f"processes, got {train.groups_per_update}"
        )
    if not grouped:
        return
    cuts = {"memory.reward_microbatch": memory.reward_microbatch}
    if config.runtime.async_rewards:
        cuts["memory.rollout_microbatch"] = memory.rollout_microbatch
    for i in grouped:
        cuts[f"reward[{i}].batch_size"] = config.reward[i].batch_size
    for name, value in cuts.items():
        if value % train.group_size:
            raise ConfigError(
                f"{name}: reward {names} scores a group's samples together (a group rubric); expected 0 or a "
                f"multiple of train.group_size = {train.group_size}, got {value}"
            )


def check_before_loading(config: RunConfig, algorithm, world: int) -> None:
    """The checks of the config against the algorithm and the number of processes, before any model loads: whole
    groups (`check_whole_groups`), the reward scale, asynchronous rollouts and rewards, the reference policy, and
    rollout cuts.

    Args:
        config: the run's config.
        algorithm: the run's Algorithm (built from the config; no model needed).
        world: the number of processes.
    """
    check_whole_groups(config, algorithm, world)
    name, memory, runtime = config.algorithm.name, config.memory, config.runtime
    if algorithm.needs_raw_rewards and config.train.normalize_rewards != "none":
        raise ConfigError(
            f"train.normalize_rewards: algorithm {name!r} compares the batch's rewards with rewards it computes "
            f"itself, on the raw scale; expected none, got {config.train.normalize_rewards!r}"
        )
    if runtime.async_rollouts and world > 1:
        raise ConfigError("runtime.async_rollouts: runs on one process; set it to false under accelerate / torchrun")
    if runtime.async_rollouts and runtime.staleness and algorithm.refuses_stale_rollouts:
        raise ConfigError(
            f"runtime.staleness: algorithm {name!r} {algorithm.refuses_stale_rollouts}; set runtime.staleness: 0 or "
            "runtime.async_rollouts: false"
        )
    if algorithm.needs_reference and config.lora is None:
        raise ConfigError(
            f"lora: algorithm {name!r} compares against the frozen base (the LoRA-disabled policy); set a lora section"
        )
    if runtime.async_rewards and not memory.rollout_microbatch:
        raise ConfigError(
            "runtime.async_rewards: overlaps a chunk's reward with the next chunk's rollout; set "
            "memory.rollout_microbatch to a part of each process's samples"
        )
    if memory.rollout_microbatch and (config.sampler.fk is not None or algorithm.needs_step_rewards):
        raise ConfigError(
            "memory.rollout_microbatch: FK-resampled and intermediate-reward rollouts see whole groups at once; set "
            "it to 0"
        )


def check_loaded_policy(config: RunConfig, algorithm, policy) -> None:
    """The config against the loaded policy: a sampler its family has, and a flow-matching pipeline for the methods
    implemented on one.

    Args:
        config: the run's config.
        algorithm: the run's Algorithm.
        policy: the loaded FlowPolicy.
    """
    if config.sampler.kind not in policy.kinds:
        raise ConfigError(
            f"sampler.kind: a {type(policy.pipeline).__name__} samples with {list(policy.kinds)}, got "
            f"{config.sampler.kind!r}"
        )
    if (algorithm.needs_ode_rollout or algorithm.needs_flow_matching) and policy.prediction == "epsilon":
        raise ConfigError(
            f"algorithm.name: {config.algorithm.name!r} is implemented for flow-matching pipelines; "
            f"{type(policy.pipeline).__name__} predicts noise"
        )


def check_resume_settings(config: RunConfig, path: Path | None, run_dir: Path, log: bool) -> None:
    """A run folder resumed by its name (run.resume unset or auto) must hold a run of these settings: a config edited
    and run again under the same run.name would otherwise carry on from the old run's weights, its report showing
    the old model under the new config. An explicit run.resume=PATH continues on purpose: the changes are named.
    Checked after the config's own errors, so a typo'd name is said as such.

    Args:
        config: the run's config.
        path: the checkpoint the run would resume from (RunCheckpoints.resume_path), or None.
        run_dir: the run folder.
        log: whether to print the settings an explicit resume changes.
    """
    changed = changed_settings(path, config_to_dict(config)) if path is not None else []
    if not changed:
        return
    names = ", ".join(changed[:6]) + (", ..." if len(changed) > 6 else "")
    if config.run.resume in (None, "auto"):
        raise ConfigError(
            f"run.name: {run_dir} holds a run trained with other settings ({names}); give this config another "
            f"run.name, or continue that run with these settings on purpose: run.resume={path}"
        )
    if log:
        tqdm.write(f"resuming {path} with settings changed from its run's: {names}")


def check_reward_modalities(config: RunConfig, reward, modality: str) -> None:
    """Every reward term can score what the pipeline samples.

    Args:
        config: the run's config.
        reward: the built WeightedSum of the config's rewards.
        modality: the pipeline's (image, video, 3d).

    Raises:
        ConfigError: naming the first term that cannot, and how to score video frames with an image reward.
    """
    for i, (term, one) in enumerate(zip(config.reward, reward.rewards)):
        if modality not in one.modalities:
            raise ConfigError(
                f"reward[{i}].name: {term.name} scores {' and '.join(one.modalities)}, but the "
                f"pipeline samples {modality}; score frames with {{name: per_frame, params: "
                f"{{reward: {term.name}}}}}"
            )


def check_trained_steps(config: RunConfig, algorithm, policy, spec, fsdp2: bool) -> None:
    """SDE steps below the noise level where trainable weights stop acting (a gated LoRA, Wan2.2's frozen low-noise
    expert) train nothing: a warning naming them, or a ConfigError when no SDE step is left (or, under FSDP2, when
    any is: a microbatch of only such steps has no gradient through the sharded module, so its process would skip
    the gradient reduction the others run).

    Args:
        config: the run's config.
        algorithm: the run's Algorithm (methods with ODE rollouts train at their own noise levels: not checked).
        policy: the loaded FlowPolicy (its `frozen_below` and schedule).
        spec: the run's SampleSpec (the schedule may depend on the sample size).
        fsdp2: whether FSDP2 shards the trained module.
    """
    frozen = policy.frozen_below() if policy.prediction == "flow" else None
    if frozen is None or algorithm.needs_ode_rollout:
        return
    sampler = config.sampler
    sigmas = policy.sigmas(sampler.num_steps, policy.noise_shape(spec))
    steps = reachable_steps(sampler)
    below = [j for j in steps if float(sigmas[j]) < frozen[0]]
    if not below:
        return
    where = (
        f"sigma < {frozen[0]:g}, where {frozen[1]}; the steps at sigma >= {frozen[0]:g} are "
        f"{[j for j in range(sampler.num_steps) if float(sigmas[j]) >= frozen[0]]}"
    )
    if len(below) == len(steps):
        raise ConfigError(
            f"sampler: every SDE step ({list(steps)}) sits at {where}: the run would train nothing; "
            "set sampler.sde_window_size and sde_window_range on those steps"
        )
    if fsdp2:
        raise ConfigError(
            f"sampler: SDE steps {below} sit at {where}; under FSDP2 every SDE step must train: set "
            "sampler.sde_window_size and sde_window_range on the steps at or above it, or use DDP"
        )
    logging.getLogger("flowrl").warning(
        "sampler: SDE steps %s sit at %s: they train nothing (sampler."
        "sde_window_size and sde_window_range choose the SDE steps)",
        below,
        where,
    )


def check_eval_size(policy, eval_spec, condition) -> None:
    """Where the evaluations sample at another size than training (eval.height / width / num_frames): one denoiser
    call on a single latent of that size under `condition` (an eval item), so a denoiser that cannot take it (SD3's
    learned positional embedding beyond pos_embed_max_size) stops the run at start-up with one ConfigError, not at
    the first evaluation."""
    import torch

    x = torch.zeros((1, *policy.noise_shape(eval_spec)), device=policy.device)
    cond = policy.encode([condition], 1.0, eval_spec)
    try:
        with torch.no_grad():
            policy.velocity(x, torch.tensor([1.0]), cond, 1.0)
    except (RuntimeError, ValueError) as error:
        frames = f" x {eval_spec.num_frames}" if eval_spec.num_frames else ""
        size = f"{eval_spec.height} x {eval_spec.width}{frames}"
        raise ConfigError(
            f"eval.height / eval.width: {type(policy.transformer).__name__} cannot sample at {size} ({error}); "
            f"train and evaluate at sizes it takes"
        ) from None
