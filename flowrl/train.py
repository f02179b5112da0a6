"""The one training loop: rollout -> reward -> (gathered) advantages -> algorithm loss -> optimizer step.

Runs unchanged on one CPU, on several processes (`accelerate launch` / torchrun: prompt groups are sharded
across ranks, rewards gathered before advantages, gradients averaged by DDP), with exact resume from the newest
checkpoint of the run dir or from `run.resume=PATH`.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from flowrl.algorithms import RolloutBatch, WorkItems, build_algorithm
from flowrl.algorithms.base import ALGORITHMS, drop_groups
from flowrl.checkpoint import (
    RUN_CONFIG,
    CorruptCheckpoint,
    changed_settings,
    checkpoint_update,
    list_checkpoints,
    load_checkpoint,
    sampling_gate,
    save_checkpoint,
)
from flowrl.config import RunConfig, config_to_dict
from flowrl.devices import use_deterministic_kernels
from flowrl.errors import ConfigError, UserError
from flowrl.export import write_lora_files
from flowrl.policies import WEIGHT_DTYPES, load_pipeline, policy_for
from flowrl.policies.base import SampleSpec
from flowrl.prompt_source import PromptSource, derived_seed
from flowrl.rewards import WeightedSum, build_reward, check_reward, latent_scorer
from flowrl.rewards.base import REWARDS, RewardOutput, score_robustly, standardized_sum
from flowrl.rollout import (
    join_trajectories,
    per_sample_noise,
    rollout,
    rollout_chunks,
    rollout_in_chunks,
    sample_generators,
)
from flowrl.schedules import cosine_decay
from flowrl.sharding import gathered, gathered_optimizer_state, is_sharded, like, sharded_optimizer_state
from flowrl.tasks.base import build_task


def fault_point(phase: str, update: int) -> None:
    """Fault injection for the kill tests: FLOWRL_KILL_AT=phase@update (rollout, update, checkpoint; sample@N after
    `flowrl sample`'s N-th batch) kills this process with SIGKILL there, as a crash or an OOM killer would."""
    if os.environ.get("FLOWRL_KILL_AT") == f"{phase}@{update}":
        os.kill(os.getpid(), signal.SIGKILL)


class RewardFailure(UserError):
    """Too many samples of an update got no finite reward (train.max_failed_reward_share)."""


@dataclass
class RunState:
    update: int = 0
    ema: list[torch.Tensor] | None = None


def build_policy(config: RunConfig):
    # under LoRA every loaded weight stays frozen: load it in its final dtype, so a large model never sits in host
    # memory in fp32 (FLUX with T5-XXL: ~67 GB per process); a full fine-tune loads fp32 for its trainable denoiser
    dtype = WEIGHT_DTYPES[config.train.weight_dtype] if config.lora is not None else None
    policy = policy_for(
        load_pipeline(config.pipeline.path, dtype),
        config.pipeline.policy,
        max_sequence_length=config.pipeline.max_sequence_length,
    )
    policy.set_guidance_scale_2(config.pipeline.guidance_scale_2, "pipeline.guidance_scale_2")
    policy.set_trained_experts(config.pipeline.experts, "pipeline.experts")
    policy.set_shift(config.pipeline.shift, "pipeline.shift")
    policy.set_reference_size(config.pipeline.reference_size, "pipeline.reference_size")
    if config.lora is not None:
        targets = config.lora.target_modules or policy.lora_targets
        if not targets:
            raise ConfigError(
                f"lora.target_modules: {type(policy).__name__} names no default LoRA targets; list the "
                "denoiser's module names to adapt (e.g. [attn.to_q, attn.to_k, attn.to_v])"
            )
        policy.add_lora(config.lora.rank, config.lora.alpha, targets)
        policy.lora_active_from_sigma = config.lora.active_from_sigma
    else:
        for module in policy.trained_modules().values():
            module.requires_grad_(True)
    return policy


def fsdp2_precision(accelerator) -> None:
    """Under FSDP2 with bf16 / fp16 compute: gradients accumulated and reduced in fp32, and the forward's inputs
    left as the policy makes them. accelerate's own policy reduces in the compute dtype (so microbatch gradients
    add up in bf16, where DDP adds in fp32) and casts every float input (the timestep sigma x 1000, which families
    such as HunyuanVideo take in fp32, would round to bf16's spacing of 4 above 512)."""
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
    denoisers' buffers (RoPE tables, positional embeddings) are constants, so nothing needs broadcasting."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.broadcast_buffers = False


def uncond_grad_of(config: RunConfig) -> bool:
    """train.cfg_uncond_grad, else the algorithm's own rule: a method that backpropagates a reward through the
    sampler keeps the unconditional branch's gradient (its gradient is the guided output's), a likelihood ratio
    method drops it (Flow-GRPO)."""
    if config.train.cfg_uncond_grad is not None:
        return config.train.cfg_uncond_grad
    return bool(ALGORITHMS.get(config.algorithm.name, "algorithm.name").needs_reward_gradient)


def placed_policy(config: RunConfig, device):
    """`build_policy` made ready to run: on `device` with the configured frozen-weight dtype, CFG gradient rule and
    memory options (the learner's policy, and the asynchronous rollout worker's copy)."""
    policy = build_policy(config)
    policy.cfg_uncond_grad = uncond_grad_of(config)
    t = config.train
    policy.place(device, WEIGHT_DTYPES[t.weight_dtype], text_encoders_on_host=t.offload_text_encoders)
    policy.set_memory_options(
        t.gradient_checkpointing,
        config.pipeline.vae_slicing,
        config.pipeline.vae_tiling,
        t.offload_text_encoders,
        t.embedding_cache,
        t.decode_microbatch,
        config.pipeline.attention,
    )
    return policy


def build_term(term, where: str):
    """One configured reward: built here, or served by a child process of its own (`process: true`)."""
    if not term.process:
        return build_reward(term.name, where=where, **term.params)
    from flowrl.rewards.remote import ProcessReward

    REWARDS.get(term.name, f"{where}.name")  # a bad name fails here; bad params fail in the child, quoted
    return ProcessReward(term.name, term.params)


def build_rewards(config: RunConfig, modality: str | None = None):
    """The weighted sum of the config's rewards; each must accept `modality` (the pipeline's) when given."""
    terms = [build_term(t, f"reward[{i}]") for i, t in enumerate(config.reward)]
    names = [term.name for term in terms]
    for i, name in enumerate(names):  # each term's scores are logged and normalised under its name
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


def check_reward_modalities(config: RunConfig, reward, modality: str) -> None:
    """A ConfigError naming the first of the config's rewards (`reward`: their WeightedSum) that cannot score the
    pipeline's `modality`."""
    for i, (term, one) in enumerate(zip(config.reward, reward.rewards)):
        if modality not in one.modalities:
            raise ConfigError(
                f"reward[{i}].name: {term.name} scores {' and '.join(one.modalities)}, but the "
                f"pipeline samples {modality}; score frames with {{name: per_frame, params: "
                f"{{reward: {term.name}}}}}"
            )


def check_reward_terms(config: RunConfig) -> None:
    """The config's rewards checked without loading them (`check_reward`): before the model loads."""
    for i, term in enumerate(config.reward):
        check_reward(term.name, term.params, f"reward[{i}]")


def build_optimizer(train, params):
    """The optimizer named by train.optimizer over `params`."""
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.adam_betas[0], weight_decay=train.weight_decay)
    if train.optimizer == "adamw_8bit":
        try:
            import bitsandbytes
        except ImportError:
            raise ConfigError(
                "train.optimizer: adamw_8bit needs bitsandbytes (pip install bitsandbytes; CUDA)"
            ) from None
        return bitsandbytes.optim.AdamW8bit(
            params, lr=train.lr, betas=tuple(train.adam_betas), weight_decay=train.weight_decay
        )
    return torch.optim.AdamW(params, lr=train.lr, betas=tuple(train.adam_betas), weight_decay=train.weight_decay)


def sample_spec(config: RunConfig, policy) -> SampleSpec:
    """The configured sample size and frames, the pipeline's own defaults where the config leaves them out."""
    c = config.pipeline
    return policy.sample_spec(c.height, c.width, c.num_frames)


def adapter_description(config: RunConfig, policy) -> dict | None:
    if config.lora is None:
        return None
    return {
        "rank": config.lora.rank,
        "alpha": config.lora.alpha,
        "target_modules": config.lora.target_modules or policy.lora_targets,
        "active_from_sigma": config.lora.active_from_sigma,
        "sample_from_sigma": config.lora.sample_from_sigma,
    }


def refuse_deepspeed(accelerator) -> None:
    """DeepSpeed is not supported: accelerate's DeepSpeed backward steps the optimizer after every backward unless told
    each microbatch's place (the trainer takes several microbatches per optimizer step), its bf16 mode casts the
    trained weights the log-prob maths keeps in fp32, and its sharded optimizer state needs checkpoints of its own;
    none of it can be tested without CUDA. DDP (LoRA) and FSDP2 (full fine-tunes; tested on CPU processes) can."""
    from accelerate.utils import DistributedType

    if getattr(accelerator, "distributed_type", None) == DistributedType.DEEPSPEED:
        raise ConfigError(
            "accelerate launch: DeepSpeed is not supported by flowrl's trainer (it would step the "
            "optimizer once per microbatch); launch with configs/accelerate/ddp.yaml (LoRA) or "
            "configs/accelerate/fsdp2.yaml (full fine-tunes: weights, gradients and Adam's state sharded)"
        )


class Trainer:
    def __init__(self, config: RunConfig, accelerator=None, run_dir: Path | None = None, log=True):
        from datetime import timedelta

        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        self.config = config
        if config.run.deterministic:  # before the accelerator touches the GPU
            use_deterministic_kernels()
        if config.train.threads:
            torch.set_num_threads(config.train.threads)
        wait = InitProcessGroupKwargs(timeout=timedelta(minutes=config.train.collective_timeout_minutes))
        self.accelerator = accelerator or Accelerator(
            cpu=not torch.cuda.is_available(), kwargs_handlers=[wait], mixed_precision=config.train.mixed_precision
        )
        refuse_deepspeed(self.accelerator)
        self.world = self.accelerator.num_processes
        self.rank = self.accelerator.process_index
        self.is_main = self.accelerator.is_main_process
        self.run_dir = Path(run_dir or Path(config.run.out_dir) / config.run.name)
        self.log = log and self.is_main
        global_batch = config.train.groups_per_update * config.train.group_size
        if global_batch % self.world:
            raise ConfigError(
                f"train.groups_per_update x train.group_size = {global_batch} samples must divide "
                f"evenly over {self.world} processes"
            )
        # checked before the model loads (minutes for a large pipeline): the task, its prompts, the rewards' names
        # and local folders (the reward models load after the pipeline is placed, so host memory holds one at a time)
        self.task = build_task(config.task.name, config.task.params)
        self.prompts = PromptSource(self.task, config.prompts.source)
        check_reward_terms(config)
        self.algorithm = build_algorithm(config.algorithm.name, config.algorithm.params, config.sampler)
        self.check_whole_groups(config)
        torch.manual_seed(config.run.seed)  # LoRA initialisation draws from the global generator
        self.policy = placed_policy(config, self.accelerator.device)
        if config.sampler.kind not in self.policy.kinds:
            raise ConfigError(
                f"sampler.kind: a {type(self.policy.pipeline).__name__} samples with "
                f"{list(self.policy.kinds)}, got {config.sampler.kind!r}"
            )
        self.check_resume_settings()  # (after the config's own errors: a typo'd name is said as such)
        if config.train.rollout_microbatch:
            # an algorithm's own no-grad forwards (NFT's, DHO's and DPO's old velocities) take as many items as a
            # rollout call does, so a large model's memory setting bounds them too
            self.algorithm.chunk = config.train.rollout_microbatch
        if self.algorithm.needs_raw_rewards and config.train.normalize_rewards != "none":
            raise ConfigError(
                f"train.normalize_rewards: algorithm {config.algorithm.name!r} compares the batch's "
                f"rewards with rewards it computes itself, on the raw scale; expected none, got "
                f"{config.train.normalize_rewards!r}"
            )
        if config.train.async_rollouts and self.world > 1:
            raise ConfigError("train.async_rollouts: runs on one process; set it to false under accelerate / torchrun")
        if config.train.async_rollouts and config.train.staleness and self.algorithm.old_policy_from_prepare:
            raise ConfigError(
                f"train.staleness: algorithm {config.algorithm.name!r} takes its ratio's old "
                "log-densities from the current policy, so batches sampled with older weights would go "
                "uncorrected; set train.staleness: 0 or train.async_rollouts: false"
            )
        if self.algorithm.needs_reference and config.lora is None:
            raise ConfigError(
                f"lora: algorithm {config.algorithm.name!r} compares against the frozen base (the "
                "LoRA-disabled policy); set a lora section"
            )
        if config.train.async_rewards and not config.train.rollout_microbatch:
            raise ConfigError(
                "train.async_rewards: overlaps a chunk's reward with the next chunk's rollout; set "
                "train.rollout_microbatch to a part of each process's samples"
            )
        if config.train.rollout_microbatch and (config.sampler.fk is not None or self.algorithm.needs_step_rewards):
            raise ConfigError(
                "train.rollout_microbatch: FK-resampled and intermediate-reward rollouts see whole "
                "groups at once; set it to 0"
            )
        local = global_batch // self.world
        self.rollout_chunks = (
            math.ceil(local / config.train.rollout_microbatch) if config.train.rollout_microbatch else 1
        )
        if (
            self.algorithm.needs_ode_rollout or self.algorithm.needs_flow_matching
        ) and self.policy.prediction == "epsilon":
            raise ConfigError(
                f"algorithm.name: {config.algorithm.name!r} is implemented for flow-matching pipelines; "
                f"{type(self.policy.pipeline).__name__} predicts noise"
            )
        self.reward = build_rewards(config, self.policy.modality).to(self.accelerator.device)
        self.reward.bind_policy(self.policy)
        self.algorithm.bind_reward(self.reward)
        self.spec = sample_spec(config, self.policy)
        self.check_trained_steps()
        self.data_loss = None
        if config.train.data_loss is not None and config.train.data_loss.weight > 0:
            from flowrl.data_loss import DataLoss

            self.data_loss = DataLoss(config.train.data_loss, self.policy, self.task, config.run.seed)
        params = self.policy.trainable_parameters()
        if not params:
            raise ConfigError("nothing to train: the policy has no trainable parameters")
        optimizer = build_optimizer(config.train, params)
        fsdp2_precision(self.accelerator)
        if self.world > 1:  # one prepare() call: what DDP and FSDP2 each need to wrap model and optimizer
            # (one module: with Wan2.2's two experts both training, one module holding both, so one reducer orders
            # the gradient collectives alike on every process)
            self.policy.model, self.optimizer = self.accelerator.prepare(self.policy.distributed_module(), optimizer)
            without_buffer_broadcast(self.policy.model)
            self.policy.distributed = True
            params = self.policy.trainable_parameters()  # FSDP2 puts sharded parameters in place of the module's own
        else:  # one process: the bare module (no wrapper, no output casting), as before
            self.optimizer = self.accelerator.prepare_optimizer(optimizer)
        self.params = params
        self.state = RunState()
        self.saved_update: int | None = None  # the update this run dir's newest checkpoint holds, once known
        self.stepped = False  # whether the current update's optimizer has stepped
        self.saved_snapshots: dict[int, dict] = {}  # rollout-worker snapshots a resumed checkpoint carried
        self.worker = None  # the asynchronous rollout worker while run() goes (train.async_rollouts)
        if config.train.ema_decay > 0:
            self.state.ema = [p.detach().clone() for p in params]

    def check_trained_steps(self) -> None:
        """SDE steps below the noise level where trainable weights stop acting (a gated LoRA, Wan2.2's frozen
        low-noise expert) train nothing: a warning naming them, or a ConfigError when no SDE step is left."""
        frozen = self.policy.frozen_below() if self.policy.prediction == "flow" else None
        if frozen is None or self.algorithm.needs_ode_rollout:  # ODE-rollout methods train at their own levels
            return
        c = self.config.sampler
        sigmas = self.policy.sigmas(c.num_steps, self.policy.noise_shape(self.spec))
        lo, hi = c.sde_window_range
        steps = range(lo, hi - 1 + c.sde_window_size) if c.sde_window_size else range(c.num_steps)
        below = [j for j in steps if float(sigmas[j]) < frozen[0]]
        if not below:
            return
        where = (
            f"sigma < {frozen[0]:g}, where {frozen[1]}; the steps at sigma >= {frozen[0]:g} are "
            f"{[j for j in range(c.num_steps) if float(sigmas[j]) >= frozen[0]]}"
        )
        if len(below) == len(steps):
            raise ConfigError(
                f"sampler: every SDE step ({list(steps)}) sits at {where}: the run would train nothing; "
                "set sampler.sde_window_size and sde_window_range on those steps"
            )
        if getattr(self.accelerator, "is_fsdp2", False):  # a microbatch of only such steps has no gradient through
            # the sharded module, so its process would skip the gradient reduction the others run
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

    # ---- rollout and scoring ------------------------------------------------------------------------------
    def local_slice(self) -> slice:
        per_rank = self.config.train.groups_per_update * self.config.train.group_size // self.world
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def collect(self, update: int, progress=None, policy=None) -> tuple[RolloutBatch, dict]:
        """Roll out, score and gather update `update`'s batch with `policy` (the trained one by default; the rollout
        worker's snapshot copy under train.async_rollouts)."""
        c = self.config
        policy = policy or self.policy
        seed, size = c.run.seed, c.train.group_size
        conditions = self.prompts.draw(c.train.groups_per_update, seed, update)
        every_item = [item for item in conditions for _ in range(size)]
        every_group = torch.arange(len(conditions)).repeat_interleave(size)
        every_seed = [derived_seed(seed, update, i) for i in range(len(every_item))]
        mine = self.local_slice()
        local_items, local_groups, local_seeds = every_item[mine], every_group[mine], every_seed[mine]
        local_prompts = [item.prompt for item in local_items]
        shape = policy.noise_shape(self.spec)
        generators = sample_generators(local_seeds)
        initial = None
        if self.algorithm.shared_initial_noise:  # DanceGRPO: the group's first sample seeds everyone's x_T
            initial = per_sample_noise(sample_generators([every_seed[int(g) * size] for g in local_groups]), shape)
        window = None
        if c.sampler.sde_window_size:
            lo, hi = c.sampler.sde_window_range
            start = int(
                torch.randint(lo, hi, (1,), generator=torch.Generator().manual_seed(derived_seed(seed, update, 29)))
            )
            window = (start, start + c.sampler.sde_window_size)
        cond = policy.encode(local_items, c.sampler.guidance_scale, self.spec)
        callbacks, steering = [], None
        if c.sampler.fk is not None:
            from flowrl.fk import FKSteering
            from flowrl.generate import FK_DRAWS

            # one generator per group, from its first sample's seed: the draws do not depend on the process split
            groups = [
                torch.Generator().manual_seed(derived_seed(every_seed[int(g) * size], FK_DRAWS))
                for g in local_groups[::size]
            ]
            steering = FKSteering(
                c.sampler.fk,
                latent_scorer(policy, self.reward, robust=True),
                c.sampler.num_steps,
                len(local_prompts) // size,
                groups,
            )
            callbacks = [steering]
        recorder = None
        if self.algorithm.needs_step_rewards:
            from flowrl.algorithms.credit import IntermediateRewards

            recorder = IntermediateRewards(latent_scorer(policy, self.reward, robust=True), c.sampler.num_steps)
            callbacks.append(recorder)  # after FK, so it follows FK's re-indexing
        meta = {"seeds": local_seeds, "conditions": local_items}
        if c.train.async_rewards:
            traj, scored, error = self.rollout_scoring_behind(
                policy, cond, generators, shape, window, initial, progress, local_prompts, meta
            )
        else:
            with self.accelerator.autocast():
                if callbacks:
                    traj = rollout(
                        policy,
                        cond,
                        generators,
                        shape,
                        c.sampler.num_steps,
                        c.sampler.kind,
                        c.sampler.noise_level,
                        c.sampler.guidance_scale,
                        window,
                        initial_noise=initial,
                        callbacks=callbacks,
                        progress=progress,
                    )
                else:
                    traj = rollout_in_chunks(
                        c.train.rollout_microbatch,
                        policy,
                        cond,
                        generators,
                        shape,
                        c.sampler.num_steps,
                        c.sampler.kind,
                        c.sampler.noise_level,
                        c.sampler.guidance_scale,
                        window,
                        initial_noise=initial,
                        progress=progress,
                    )
                with torch.no_grad():
                    samples = policy.decode_in_chunks(traj.final)
            scored, error = score_robustly(self.reward, samples, local_prompts, meta, c.train.reward_microbatch)
        fault_point("rollout", update)
        rewards = scored.scores.float().to(self.accelerator.device)
        global_rewards = self.accelerator.gather(rewards).cpu()
        global_groups = self.accelerator.gather(local_groups.to(self.accelerator.device)).cpu()
        if c.train.normalize_rewards != "none":  # over the gathered batch, so groups split over processes count whole
            components = [
                self.accelerator.gather(
                    scored.info.get(r.name, torch.full_like(rewards, float("nan"))).float().to(self.accelerator.device)
                ).cpu()
                for r in self.reward.rewards
            ]
            groups = global_groups if c.train.normalize_rewards == "group" else None
            global_rewards = torch.where(
                torch.isfinite(global_rewards),
                standardized_sum(components, self.reward.weights, groups),
                global_rewards,
            )
            rewards = global_rewards[mine.start : mine.stop].to(self.accelerator.device)
        batch = RolloutBatch(
            traj,
            rewards.cpu(),
            local_groups,
            local_seeds,
            global_rewards,
            global_groups,
            torch.arange(mine.start, mine.stop),
            local_prompts,
            progress=update / c.train.updates,
        )
        if recorder is not None:
            batch.step_rewards = recorder.rewards
            batch.global_step_rewards = self.accelerator.gather(batch.step_rewards.to(self.accelerator.device)).cpu()
        failed = ~torch.isfinite(global_rewards)
        if batch.global_step_rewards is not None:  # an intermediate reward that failed leaves its steps no credit
            failed |= ~torch.isfinite(batch.global_step_rewards).all(dim=1)
        metrics = {}
        if failed.any():  # NaN / inf / raising rewards: their groups carry no usable signal and are skipped
            share = failed.float().mean().item()
            metrics = {
                "reward_failed_samples": float(failed.sum()),
                "reward_failed_groups": float(len(torch.unique(global_groups[failed]))),
            }
            if share > c.train.max_failed_reward_share:
                raise RewardFailure(
                    f"reward {self.reward_names()}: {100 * share:.0f}% of update {update}'s samples got no finite "
                    f"reward (train.max_failed_reward_share = {c.train.max_failed_reward_share})"
                    + (f"; first error: {error}" if error else "; it returned NaN or inf")
                )
            if self.log:
                tqdm.write(
                    f"update {update}: {int(failed.sum())} samples without a finite reward"
                    + (f" ({error})" if error else "")
                    + "; their groups are skipped"
                )
            dropped = torch.unique(global_groups[failed])
            per_process = (~torch.isin(global_groups, dropped)).view(self.world, -1).sum(dim=1)
            # every process sees the global rewards, so all decide alike: a process left without samples could not
            # join the others' forward and backward passes (DDP's and FSDP2's collectives would wait for it), and
            # under FSDP2 unequal shares would also run unequal numbers of an algorithm's own no-grad passes (NFT's,
            # DHO's and DPO's old velocities), each gathering the sharded weights: nobody trains on this update
            if (per_process == 0).any() or (self.sharded() and (per_process != per_process[0]).any()):
                metrics["update_skipped"] = 1.0
                if self.log:
                    tqdm.write(
                        f"update {update}: the failed groups left the processes unequal shares; the update "
                        "trains nothing"
                    )
            batch = drop_groups(batch, dropped)
            global_rewards = batch.global_rewards
        metrics.update({"reward_mean": global_rewards.mean().item(), "reward_std": global_rewards.std().item()})
        if steering is not None:  # FK-resampled groups are biased towards the reward: say so in every row
            metrics["fk_resamplings"] = float(len(steering.resampled_at))
        keys = sorted(scored.info)
        if self.world > 1:  # one gather per key on every process: a process whose reward failed wholly holds only
            # the terms' names (a scorer's own keys, e.g. pickscore/cosine, are missing there), so agree on the union
            from accelerate.utils import gather_object

            keys = sorted(set().union(*gather_object([keys])))
        for key in keys:  # the same order on every process
            value = scored.info.get(key, torch.full_like(scored.scores, float("nan")))
            gathered = self.accelerator.gather(value.float().to(self.accelerator.device))
            finite = torch.isfinite(gathered)
            metrics[f"reward/{key}"] = (gathered if finite.all() else gathered[finite]).mean().item()
        return batch, metrics

    def rollout_scoring_behind(self, policy, cond, generators, shape, window, initial, progress, prompts, meta):
        """The rollout chunk by chunk (train.rollout_microbatch), each chunk's reward computed in a worker thread
        while the next chunk samples (train.async_rewards): the same samples and scores as scoring each chunk right
        after it, with the reward's time hidden behind sampling."""
        from concurrent.futures import ThreadPoolExecutor

        c = self.config
        parts, futures = [], []
        with ThreadPoolExecutor(max_workers=1) as pool, self.accelerator.autocast():  # autocast: this thread only
            for rows, part in rollout_chunks(
                c.train.rollout_microbatch,
                policy,
                cond,
                generators,
                shape,
                c.sampler.num_steps,
                c.sampler.kind,
                c.sampler.noise_level,
                c.sampler.guidance_scale,
                window,
                initial,
                progress,
            ):
                with torch.no_grad():
                    samples = policy.decode_in_chunks(part.final)
                parts.append(part)
                futures.append(
                    pool.submit(
                        score_robustly,
                        self.reward,
                        samples,
                        [prompts[i] for i in rows],
                        {k: [v[i] for i in rows] for k, v in meta.items()},
                        c.train.reward_microbatch,
                    )
                )
            results = [future.result() for future in futures]
        keys = sorted(set().union(*[r.info for r, _ in results]))
        scored = RewardOutput(
            torch.cat([r.scores for r, _ in results]),
            {k: torch.cat([r.info.get(k, torch.full_like(r.scores, float("nan"))) for r, _ in results]) for k in keys},
        )
        return join_trajectories(parts, cond), scored, next((e for _, e in results if e), None)

    def reward_names(self) -> str:
        return " + ".join(term.name for term in self.config.reward)

    # ---- update -------------------------------------------------------------------------------------------
    def _global_max(self, value: int) -> int:
        return int(self.accelerator.gather(torch.tensor([value], device=self.accelerator.device)).max())

    def check_whole_groups(self, config: RunConfig) -> None:
        """Groups that must stay whole, checked off the config before any model loads: FK's particles (a group)
        resample on one process, an algorithm that pairs or matches within a group (DPO, DHO) sees one process's
        rows, and a reward that scores a condition's samples together (a group rubric builds one rubric per call,
        Reward.groups_scored) must get whole groups from every cut of the rollout's samples (reward calls, async
        chunks, the term's batches); else results would depend on memory settings and the number of processes."""
        from flowrl.rewards.base import groups_scored

        c = config.train
        grouped = [i for i, term in enumerate(config.reward) if groups_scored(term.name, term.params, f"reward[{i}]")]
        names = ", ".join(config.reward[i].name for i in grouped)
        reasons = []
        if config.sampler.fk is not None:
            reasons.append("FK rollouts keep each prompt's particles on one process")
        if self.algorithm.needs_whole_groups:
            reasons.append(f"algorithm {config.algorithm.name!r} pairs samples within a group on one process")
        if grouped:
            reasons.append(f"reward {names} scores a group's samples together")
        if reasons and c.groups_per_update % self.world:
            raise ConfigError(
                f"train.groups_per_update: {'; '.join(reasons)}; expected a multiple of {self.world} "
                f"processes, got {c.groups_per_update}"
            )
        if not grouped:
            return
        size = c.group_size
        cuts = {"train.reward_microbatch": c.reward_microbatch}
        if c.async_rewards:
            cuts["train.rollout_microbatch"] = c.rollout_microbatch
        for i in grouped:
            cuts[f"reward[{i}].batch_size"] = config.reward[i].batch_size
        for name, value in cuts.items():
            if value % size:
                raise ConfigError(
                    f"{name}: reward {names} scores a group's samples together (a group rubric); "
                    f"expected 0 or a multiple of train.group_size = "
                    f"{size}, got {value}"
                )

    def _global_sum(self, value: int) -> int:
        return int(self.accelerator.gather(torch.tensor([value], device=self.accelerator.device)).sum())

    def optimize(self, batch: RolloutBatch, items: WorkItems, update: int, progress=None) -> dict:
        c = self.config.train
        # Each optimizer step takes the samples at its positions of one global shuffle, so the split does not
        # depend on how samples are sharded over processes.
        generator = torch.Generator().manual_seed(derived_seed(self.config.run.seed, update, 31))
        position = torch.argsort(torch.randperm(len(batch.global_rewards), generator=generator))
        step_of_item = position[batch.local_index[items.sample]] % c.optimizer_steps_per_update
        sums: dict[str, float] = {}
        counted = 0
        grad_norms = []
        self._set_learning_rate(update)
        for chunk_index in range(c.optimizer_steps_per_update):
            chunk = items.subset(torch.nonzero(step_of_item == chunk_index).flatten())
            total = self._global_sum(chunk.trained())
            if total == 0:
                continue
            micro = max(1, math.ceil(self._global_max(len(chunk)) / c.microbatch_size))
            for m in range(micro):
                part = chunk.subset(
                    torch.arange(min(len(chunk), m * c.microbatch_size), min(len(chunk), (m + 1) * c.microbatch_size))
                )
                if len(part) == 0:  # keep every process's backward count equal (DDP), with zero weight
                    part = WorkItems(items.sample[:1], items.step[:1], torch.zeros(1)) if len(items) else None
                if part is None:
                    raise RuntimeError("a process had no trainable items while others did")
                sync = m == micro - 1
                context = (
                    self.accelerator.no_sync(self.policy.model) if (self.world > 1 and not sync) else nullcontext()
                )
                with context, self.accelerator.autocast():
                    losses, diagnostics = self.algorithm.loss(self.policy, batch, part)
                    loss = (losses * part.weight.to(losses.device)).sum() * self.world / total
                    if sync and self.data_loss is not None:  # one data batch per optimizer step and process
                        data = self.data_loss(update, chunk_index, self.rank)
                        loss = loss + c.data_loss.weight * data
                        sums["data_loss"] = sums.get("data_loss", 0.0) + data.item()
                    if not loss.requires_grad:  # every item sits below lora.active_from_sigma, where the adapter
                        # is off, or in Wan2.2's frozen low-noise expert: no gradient, but each process still runs
                        # its backward (under DDP the policy has also run its wrapper's forward: WanPolicy._forward)
                        loss = loss + 0.0 * sum(p.sum() for p in self.params)
                    self.accelerator.backward(loss)
                real = part.weight > 0
                for key, value in diagnostics.items():
                    sums[key] = sums.get(key, 0.0) + value[real.to(value.device)].float().sum().item()
                sums["loss"] = sums.get("loss", 0.0) + (losses.detach() * part.weight.to(losses.device)).sum().item()
                counted += int(real.sum())
                if progress is not None:
                    progress.update(1)
            fault_point("update", update)
            grad_norms.append(float(self.accelerator.clip_grad_norm_(self.params, c.grad_clip)))
            self.stepped = True  # from here on (an interrupt inside the step too) the weights may hold part of it
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._update_ema()
        data_sum = sums.pop("data_loss", None)
        metrics = {k: v / max(counted, 1) for k, v in sums.items()}
        if data_sum is not None:
            metrics["data_loss"] = data_sum / c.optimizer_steps_per_update
        metrics["grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics["trained_items"] = self._global_sum(items.trained())
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    def _set_learning_rate(self, update: int) -> None:
        c = self.config.train
        scale = 1.0 if c.lr_schedule == "constant" else cosine_decay(update, c.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = c.lr * scale

    def _update_ema(self):
        if self.state.ema is None:
            return
        decay = self.config.train.ema_decay
        with torch.no_grad():
            torch._foreach_lerp_(self.state.ema, [p.detach() for p in self.params], 1 - decay)

    # ---- checkpoints --------------------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def sharded(self) -> bool:
        """Whether FSDP2 shards the trained parameters (every process then takes part in gathering them)."""
        return any(is_sharded(p) for p in self.params)

    def save(self) -> Path | None:
        """Write a checkpoint from the main process; under FSDP2 every process calls this, to gather the shards."""
        self.saved_update = self.state.update  # on every process (not read from disk, which the main one writes)
        if not (self.is_main or self.sharded()):
            return None
        keep, named = self.is_main, self.policy.named_trainable_parameters()  # in the order of self.params and the EMA
        trainable = gathered(named, keep)
        ema = gathered(dict(zip(named, self.state.ema)), keep) if self.state.ema is not None else None
        optimizer_state = gathered_optimizer_state(self.optimizer.state_dict(), keep)
        if not keep:
            return None
        update = self.state.update

        def export(folder):
            (folder / RUN_CONFIG).write_text(yaml.safe_dump(config_to_dict(self.config), sort_keys=False))
            if self.worker is not None:  # the weights the batches after this update are sampled with
                self.worker.write_snapshots(folder, update)
            if self.policy.has_lora:  # the weights flowrl samples with, loadable by diffusers and peft
                write_lora_files(
                    self.policy, ema or trainable, folder, sampling_gate(adapter_description(self.config, self.policy))
                )
            fault_point("checkpoint", update)  # files written, state.json not yet

        scaler = getattr(self.accelerator, "scaler", None)  # fp16's loss scale: a resume starts where it stood
        return save_checkpoint(
            self.checkpoint_dir,
            update,
            trainable,
            optimizer_state,
            ema,
            adapter_description(self.config, self.policy),
            keep=self.config.train.keep_checkpoints,
            write_extra=export,
            grad_scaler=scaler.state_dict() if scaler is not None else None,
        )

    def resume_path(self) -> Path | None:
        requested = self.config.run.resume
        if requested and requested != "auto":
            return Path(requested)
        found = list_checkpoints(self.checkpoint_dir)
        return found[-1] if found else None

    def check_resume_settings(self) -> None:
        """A run dir resumed by its name (run.resume unset or auto) must hold a run of these settings: a config edited
        and run again under the same run.name would otherwise carry on from the old run's weights, its report showing
        the old model under the new config. An explicit run.resume=PATH continues on purpose: the changes are named."""
        path = self.resume_path()
        changed = changed_settings(path, config_to_dict(self.config)) if path is not None else []
        if not changed:
            return
        names = ", ".join(changed[:6]) + (", ..." if len(changed) > 6 else "")
        if self.config.run.resume in (None, "auto"):
            raise ConfigError(
                f"run.name: {self.run_dir} holds a run trained with other settings ({names}); give this "
                f"config another run.name, or continue that run with these settings on purpose: "
                f"run.resume={path}"
            )
        if self.log:
            tqdm.write(f"resuming {path} with settings changed from its run's: {names}")

    def resume(self) -> Path | None:
        """Restore the checkpoint to resume from: the one named in run.resume, or the newest readable one of the run
        dir (a corrupt newest one is reported and the one before it used)."""
        requested = self.config.run.resume
        if requested and requested != "auto":
            self.restore(Path(requested))
            self.set_aside_newer(Path(requested))
            return Path(requested)
        for path in reversed(list_checkpoints(self.checkpoint_dir)):
            error = None
            try:
                self.restore(path)
            except CorruptCheckpoint as failure:
                error = failure
            # every process takes the checkpoint or sets it aside together (one that read it whole while another
            # did not would train on while the other waits)
            if self._global_sum(int(error is not None)) == 0:
                return path
            aside = path.with_name(f"corrupt_{path.name}")  # kept for inspection; pruning and resumes skip it
            self.accelerator.wait_for_everyone()  # every process is done reading it before the main one moves it
            if self.is_main:
                shutil.rmtree(aside, ignore_errors=True)
                path.rename(aside)
                tqdm.write(
                    f"{error or 'another process could not read it'}; moved to {aside.name}, trying the "
                    "checkpoint before it"
                )
        return None

    def set_aside_newer(self, path: Path) -> None:
        """Rewound to an older checkpoint of this run dir, the newer ones belong to the line abandoned: renamed to
        abandoned_update_N (kept for inspection), or a later auto resume would pick them up again while this line's
        metrics rows past `path` are gone."""
        resumed = checkpoint_update(path)
        if Path(path).resolve().parent != self.checkpoint_dir.resolve() or resumed is None:
            return
        newer = [
            p
            for p in list_checkpoints(self.checkpoint_dir)  # by update number, never the resumed folder
            if (checkpoint_update(p) or 0) > resumed and p.resolve() != Path(path).resolve()
        ]
        self.accelerator.wait_for_everyone()  # every process has read its checkpoint before any is moved
        if self.is_main:
            for old in newer:
                aside, n = old.with_name(f"abandoned_{old.name}"), 1
                while aside.exists():  # an earlier rewind's: kept too
                    aside, n = old.with_name(f"abandoned{n}_{old.name}"), n + 1
                old.rename(aside)
                tqdm.write(
                    f"resumed from {Path(path).name}: {old.name} (a later checkpoint of the line left) moved "
                    f"to {aside.name}"
                )

    def restore(self, path: Path) -> None:
        saved = load_checkpoint(path)
        ours = set(self.policy.named_trainable_parameters())  # names, no copies
        theirs = set(saved["trainable"])
        if ours != theirs:  # another adapter, or another choice of what trains (pipeline.experts, lora vs full)
            only = sorted(theirs - ours)[:1] or sorted(ours - theirs)[:1]
            raise ConfigError(
                f"run.resume: checkpoint {path} trained other weights than this config does (e.g. "
                f"{only[0]} is in {'the checkpoint' if theirs - ours else 'this run'} only): resume "
                "with the run's own lora and pipeline.experts settings, or start a new run.name"
            )
        self.policy.load_trainable_state_dict(saved["trainable"])
        in_order = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.optimizer.load_state_dict(sharded_optimizer_state(saved["optimizer"], in_order))
        for group in self.optimizer.param_groups:  # the saved groups carry their run's hyperparameters: this
            group["weight_decay"] = self.config.train.weight_decay  # config's apply (lr is set every update)
            if "betas" in group:
                group["betas"] = tuple(self.config.train.adam_betas)
            if "momentum" in group:  # (SGD's momentum is adam_betas[0], as build_optimizer sets it)
                group["momentum"] = self.config.train.adam_betas[0]
        if self.state.ema is not None:  # the saved EMA, or (a run saved without one) the restored weights
            with torch.no_grad():
                for e, (name, p) in zip(self.state.ema, self.policy.named_trainable_parameters().items()):
                    e.copy_(like(saved["ema"][name], e) if saved["ema"] is not None else p.detach())
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None and saved["grad_scaler"]:
            scaler.load_state_dict(saved["grad_scaler"])
        self.state.update = saved["update"]
        if Path(path).resolve().parent == self.checkpoint_dir.resolve():  # the run dir holds it (not another run's)
            self.saved_update = saved["update"]
        from flowrl.async_rollouts import read_snapshots

        self.saved_snapshots = read_snapshots(path)

    # ---- main loop ----------------------------------------------------------------------------------------
    def run(self, on_update=None, every_process: bool = False) -> RunState:
        """Train until config.train.updates; `on_update(update, metrics)` runs after each, on the main process, or
        on every process with `every_process` (for work they share, such as a sharded evaluation)."""
        c = self.config
        self.resumed_from = self.resume()
        if self.resumed_from is not None and self.log:
            tqdm.write(f"resumed from {self.resumed_from} at update {self.state.update}")
        steps = c.sampler.num_steps
        if c.train.async_rollouts:
            from flowrl.async_rollouts import RolloutWorker

            self.worker = RolloutWorker(self)
        bar = tqdm(total=c.train.updates, initial=self.state.update, desc="updates", disable=not self.log)
        try:
            if self.worker is not None:
                self.worker.start(self.state.update, c.train.updates, self.saved_snapshots)
            while self.state.update < c.train.updates:
                update = self.state.update
                started = time.time()
                if self.worker is not None:
                    batch, metrics = self.worker.take(update)
                else:
                    inner = tqdm(
                        total=steps * self.rollout_chunks, desc=f"rollout {update}", leave=False, disable=not self.log
                    )
                    batch, metrics = self.collect(update, inner)
                    inner.close()
                if not metrics.get("update_skipped"):
                    with self.accelerator.autocast():  # the same precision as the loss's forward passes
                        items, prep = self.algorithm.prepare(batch, self.policy)
                    metrics.update(prep)
                    inner = tqdm(desc=f"train {update}", leave=False, disable=not self.log)
                    metrics.update(self.optimize(batch, items, update, inner))
                    inner.close()
                self.state.update += 1
                self.stepped = False  # the update is whole again: weights and update number agree
                if self.worker is not None:
                    self.worker.trained(update, c.train.updates)
                metrics["seconds"] = time.time() - started
                if on_update is not None and (self.is_main or every_process):
                    on_update(self.state.update, metrics)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}")
                if c.train.checkpoint_every and self.state.update % c.train.checkpoint_every == 0:
                    self.save()
        except KeyboardInterrupt:
            if self.stepped:  # weights, Adam's moments and EMA hold part of this update: saved as
                # update u, a resume would apply its steps again
                if self.log:
                    tqdm.write(
                        f"interrupted inside update {self.state.update + 1}'s optimizer steps: no checkpoint is "
                        "written now; the run resumes from its last one (train.checkpoint_every)"
                    )
                raise
            if self.sharded():  # each process stopped at its own point: gathering shards now could pair with the
                # collectives another process still has pending
                if self.log:
                    tqdm.write(
                        f"interrupted at update {self.state.update}: under FSDP2 no checkpoint is written now; "
                        "the run resumes from its last periodic one (train.checkpoint_every)"
                    )
                raise
            if self.log:
                tqdm.write(f"interrupted: saving a checkpoint at update {self.state.update}")
            self.save()
            raise
        except RewardFailure as failure:  # stop cleanly: everything trained so far is kept
            path = self.save()
            raise UserError(
                f"{failure}; stopped with a checkpoint at update {self.state.update}" + (f" ({path})" if path else "")
            ) from None
        finally:
            bar.close()
            if self.worker is not None:
                self.worker.close()
        if self.saved_update != self.state.update:
            self.save()
        self.accelerator.wait_for_everyone()
        return self.state

    @contextmanager
    def swap_in_ema(self):
        """The EMA weights in place of the trained ones (for evaluation), when EMA is on."""
        if self.state.ema is None:
            yield
            return
        saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.state.ema)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, saved)


def write_config(config: RunConfig, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))


__all__ = ["Trainer", "build_policy", "build_rewards", "write_config"]
