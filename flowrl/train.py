"""The one training loop: rollout -> reward -> (gathered) advantages -> algorithm loss -> optimizer step.

Runs unchanged on one CPU, on several processes (`accelerate launch` / torchrun: prompt groups are sharded
across ranks, rewards gathered before advantages, gradients averaged by DDP), with exact resume from the newest
checkpoint of the run dir or from `run.resume=PATH`. What it builds is flowrl/builders.py's, the checks that the
config's sections fit together flowrl/preflight.py's, its checkpoints flowrl/run_checkpoints.py's.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from flowrl import preflight
from flowrl.algorithms import RolloutBatch, WorkItems, build_algorithm
from flowrl.builders import (
    build_optimizer,
    build_rewards,
    eval_spec,
    fsdp2_precision,
    placed_policy,
    sample_spec,
    without_buffer_broadcast,
)
from flowrl.collect import (
    RewardFailure,
    draw_conditions,
    gathered_batch,
    reward_metrics,
    roll_out_and_score,
    rollout_noise,
    step_callbacks,
    without_failed_groups,
)
from flowrl.config import RunConfig
from flowrl.devices import use_deterministic_kernels
from flowrl.errors import ConfigError, UserError
from flowrl.faults import fault_point
from flowrl.prompt_source import PromptSource, derived_seed
from flowrl.run_checkpoints import RunCheckpoints
from flowrl.schedules import cosine_decay
from flowrl.sharding import is_sharded
from flowrl.tasks.base import build_task


@dataclass
class RunState:
    """What a checkpoint resumes besides weights and optimizer: the updates done and the EMA of the weights."""

    update: int = 0
    ema: list[torch.Tensor] | None = None


class Trainer:
    """A run: set up from a config (`__init__`), then `run` repeats collect -> optimize -> save until
    train.updates.

    Args:
        config: the run's config.
        accelerator: an accelerate Accelerator (default: one made from the config's precision and timeout).
        run_dir: the run folder (default: run.out_dir / run.name).
        log: print progress and notices (on the main process only).

    Attributes:
        policy, reward, algorithm, optimizer: what the config built; state: the update number and EMA;
        checkpoints: the run folder's RunCheckpoints; worker: the asynchronous rollout worker while `run` goes.
    """

    def __init__(self, config: RunConfig, accelerator=None, run_dir: Path | None = None, log=True):
        from datetime import timedelta

        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        self.config = config
        if config.run.deterministic:  # before the accelerator touches the GPU
            use_deterministic_kernels()
        if config.runtime.threads:
            torch.set_num_threads(config.runtime.threads)
        wait = InitProcessGroupKwargs(timeout=timedelta(minutes=config.runtime.collective_timeout_minutes))
        self.accelerator = accelerator or Accelerator(
            cpu=not torch.cuda.is_available(), kwargs_handlers=[wait], mixed_precision=config.memory.mixed_precision
        )
        preflight.check_launch(config, self.accelerator)
        self.world, self.rank = self.accelerator.num_processes, self.accelerator.process_index
        self.is_main = self.accelerator.is_main_process
        self.run_dir = Path(run_dir or Path(config.run.out_dir) / config.run.name)
        self.log = log and self.is_main
        self.checkpoints = RunCheckpoints(self)
        # checked before the model loads (minutes for a large pipeline): the task, its prompts, the rewards' names
        # and local folders (the reward models load after the pipeline is placed, so host memory holds one at a time)
        self.task = build_task(config.task.name, config.task.params)
        self.prompts = PromptSource(self.task, config.prompts.source)
        preflight.check_reward_terms(config)
        self.algorithm = build_algorithm(config.algorithm.name, config.algorithm.params, config.sampler)
        preflight.check_before_loading(config, self.algorithm, self.world)
        torch.manual_seed(config.run.seed)  # LoRA initialisation draws from the global generator
        self.policy = placed_policy(config, self.accelerator.device)
        preflight.check_loaded_policy(config, self.algorithm, self.policy)
        preflight.check_resume_settings(config, self.checkpoints.resume_path(), self.run_dir, self.log)
        rollout_microbatch = config.memory.rollout_microbatch
        if rollout_microbatch:  # an algorithm's own no-grad forwards (NFT's, DHO's and DPO's old velocities) take
            self.algorithm.chunk = rollout_microbatch  # as many items as a rollout call does
        local = config.train.groups_per_update * config.train.group_size // self.world
        self.rollout_chunks = math.ceil(local / rollout_microbatch) if rollout_microbatch else 1
        self.reward = build_rewards(config, self.policy.modality).to(self.accelerator.device)
        self.reward.bind_policy(self.policy)
        self.algorithm.bind_reward(self.reward)
        self.spec = sample_spec(config, self.policy)
        self.eval_spec = eval_spec(config, self.policy)
        if config.eval.enabled and self.eval_spec != self.spec:
            first = PromptSource(self.task, config.eval.prompts).all()[0]
            preflight.check_eval_size(self.policy, self.eval_spec, first)
        fsdp2 = getattr(self.accelerator, "is_fsdp2", False)
        preflight.check_trained_steps(config, self.algorithm, self.policy, self.spec, fsdp2)
        self.data_loss = None
        if config.train.data_loss is not None and config.train.data_loss.weight > 0:
            from flowrl.data_loss import DataLoss

            self.data_loss = DataLoss(config.train.data_loss, self.policy, self.task, config.run.seed)
        self.setup_optimizer()
        self.state = RunState()
        self.stepped = False  # whether the current update's optimizer has stepped
        self.worker = None  # the asynchronous rollout worker while run() goes (runtime.async_rollouts)
        if config.optim.ema_decay > 0:
            self.state.ema = [p.detach().clone() for p in self.params]

    def setup_optimizer(self) -> None:
        """The optimizer over the policy's trainable parameters, and the model wrapped for several processes: one
        prepare() call gives what DDP and FSDP2 each need (one module: with Wan2.2's two experts both training, one
        module holding both, so one reducer orders the gradient collectives alike on every process)."""
        params = self.policy.trainable_parameters()
        if not params:
            raise ConfigError("nothing to train: the policy has no trainable parameters")
        optimizer = build_optimizer(self.config.optim, params)
        fsdp2_precision(self.accelerator)
        if self.world > 1:
            self.policy.model, self.optimizer = self.accelerator.prepare(self.policy.distributed_module(), optimizer)
            without_buffer_broadcast(self.policy.model)
            self.policy.distributed = True
            params = self.policy.trainable_parameters()  # FSDP2 puts sharded parameters in place of the module's own
        else:  # one process: the bare module (no wrapper, no output casting), as before
            self.optimizer = self.accelerator.prepare_optimizer(optimizer)
        self.params = params

    # ---- collect: draw, roll out, score, gather (flowrl/collect.py) ---------------------------------------------
    def collect(self, update: int, progress=None, policy=None) -> tuple[RolloutBatch, dict]:
        """Roll out, score and gather update `update`'s batch.

        Args:
            update: the update number (it seeds the conditions, noise and SDE window).
            progress: a tqdm bar advanced per sampling step, or None.
            policy: the policy to sample with: the trained one by default; the rollout worker's snapshot copy
                under runtime.async_rollouts.

        Returns:
            (the RolloutBatch: this process's rows with every process's rewards; the reward metrics).
        """
        config, accelerator, reward, policy = self.config, self.accelerator, self.reward, policy or self.policy
        draw = draw_conditions(self.prompts, config, update, self.rank, self.world)
        generators, shape, initial, window = rollout_noise(config, self.algorithm, policy, self.spec, update, draw)
        cond = policy.encode(draw.local_items, config.sampler.guidance_scale, self.spec)
        steering, recorder = step_callbacks(config, self.algorithm, reward, policy, draw)
        callbacks = [one for one in (steering, recorder) if one is not None]  # the recorder follows FK's re-indexing
        rollout_args = (policy, cond, generators, shape, window, initial, progress)
        traj, scored, error = roll_out_and_score(accelerator, config, reward, rollout_args, callbacks, draw)
        fault_point("rollout", update)
        batch = gathered_batch(accelerator, config, reward, update, draw, traj, scored, recorder)
        batch, metrics = without_failed_groups(config, update, batch, error, self.world, self.sharded(), self.log)
        metrics.update(reward_metrics(accelerator, self.world, batch, scored, steering))
        return batch, metrics

    # ---- optimize -----------------------------------------------------------------------------------------
    def global_sum(self, value: int) -> int:
        """`value` summed over every process."""
        return int(self.accelerator.gather(torch.tensor([value], device=self.accelerator.device)).sum())

    def global_max(self, value: int) -> int:
        """The largest `value` of every process."""
        return int(self.accelerator.gather(torch.tensor([value], device=self.accelerator.device)).max())

    def sharded(self) -> bool:
        """Whether FSDP2 shards the trained parameters (every process then takes part in gathering them)."""
        return any(is_sharded(p) for p in self.params)

    def optimize(self, batch: RolloutBatch, items: WorkItems, update: int, progress=None) -> dict:
        """Train on an update's work items: train.optimizer_steps_per_update steps, each on the items at its positions
        of one global shuffle (so the split does not depend on how samples are sharded over processes), in
        microbatches of memory.microbatch_size, gradients clipped, EMA updated after each step.

        Args:
            batch: the update's RolloutBatch.
            items: the (sample, step, weight) items the algorithm's `prepare` chose.
            update: the update number (it seeds the shuffle and sets the learning rate).
            progress: a tqdm bar advanced per microbatch, or None.

        Returns:
            The update's metrics: the loss and the algorithm's diagnostics per trained item, data_loss, grad_norm,
            trained_items, lr."""
        train, memory, optim = self.config.train, self.config.memory, self.config.optim
        steps, size = train.optimizer_steps_per_update, memory.microbatch_size
        generator = torch.Generator().manual_seed(derived_seed(self.config.run.seed, update, 31))
        position = torch.argsort(torch.randperm(len(batch.global_rewards), generator=generator))
        step_of_item = position[batch.local_index[items.sample]] % steps
        sums: dict[str, float] = {}
        counted, grad_norms = 0, []
        scale = 1.0 if optim.lr_schedule == "constant" else cosine_decay(update, train.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = optim.lr * scale
        for chunk_index in range(steps):
            chunk = items.subset(torch.nonzero(step_of_item == chunk_index).flatten())
            total = self.global_sum(chunk.trained())
            if total == 0:
                continue
            micro = max(1, math.ceil(self.global_max(len(chunk)) / size))
            for m in range(micro):
                part = chunk.subset(torch.arange(min(len(chunk), m * size), min(len(chunk), (m + 1) * size)))
                if len(part) == 0:  # keep every process's backward count equal (DDP), with zero weight
                    part = WorkItems(items.sample[:1], items.step[:1], torch.zeros(1)) if len(items) else None
                if part is None:
                    raise RuntimeError("a process had no trainable items while others did")
                sync = m == micro - 1
                context = self.accelerator.no_sync(self.policy.model) if self.world > 1 and not sync else nullcontext()
                with context, self.accelerator.autocast():
                    losses, diagnostics = self.algorithm.loss(self.policy, batch, part)
                    loss = (losses * part.weight.to(losses.device)).sum() * self.world / total
                    if sync and self.data_loss is not None:  # one data batch per optimizer step and process
                        data = self.data_loss(update, chunk_index, self.rank)
                        loss = loss + train.data_loss.weight * data
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
            grad_norms.append(float(self.accelerator.clip_grad_norm_(self.params, optim.grad_clip)))
            self.stepped = True  # from here on (an interrupt inside the step too) the weights may hold part of it
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.state.ema is not None:
                with torch.no_grad():
                    torch._foreach_lerp_(self.state.ema, [p.detach() for p in self.params], 1 - optim.ema_decay)
        data_sum = sums.pop("data_loss", None)
        metrics = {k: v / max(counted, 1) for k, v in sums.items()}
        if data_sum is not None:
            metrics["data_loss"] = data_sum / steps
        metrics["grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics["trained_items"] = self.global_sum(items.trained())
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    # ---- save and resume ----------------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write a checkpoint of the current update (RunCheckpoints.save). Returns its folder on the main process."""
        return self.checkpoints.save()

    def resume(self) -> Path | None:
        """Restore the checkpoint to resume from, if any (RunCheckpoints.resume). Returns it, or None."""
        return self.checkpoints.resume()

    @property
    def checkpoint_dir(self) -> Path:
        """The run folder's checkpoints folder."""
        return self.checkpoints.folder

    # ---- run ----------------------------------------------------------------------------------------------
    def run(self, on_update=None, every_process: bool = False) -> RunState:
        """Resume if there is a checkpoint, then collect -> prepare -> optimize each update until train.updates,
        checkpointing every train.checkpoint_every updates, on an interrupt at an update boundary, when too many
        rewards fail, and at the end.

        Args:
            on_update: called as on_update(update, metrics) after each update, on the main process only.
            every_process: call `on_update` on every process (for work they share, such as a sharded evaluation).

        Returns:
            The RunState at the end (state.update == train.updates)."""
        train = self.config.train
        self.resumed_from = self.resume()
        if self.resumed_from is not None and self.log:
            tqdm.write(f"resumed from {self.resumed_from} at update {self.state.update}")
        if self.config.runtime.async_rollouts:
            from flowrl.async_rollouts import RolloutWorker

            self.worker = RolloutWorker(self)
        bar = tqdm(total=train.updates, initial=self.state.update, desc="updates", disable=not self.log)
        try:
            if self.worker is not None:
                self.worker.start(self.state.update, train.updates, self.checkpoints.saved_snapshots)
            while self.state.update < train.updates:
                metrics = self.run_update(self.state.update, on_update, every_process)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}")
                if train.checkpoint_every and self.state.update % train.checkpoint_every == 0:
                    self.save()
        except KeyboardInterrupt:
            self.on_interrupt()
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
        if self.checkpoints.saved_update != self.state.update:
            self.save()
        self.accelerator.wait_for_everyone()
        return self.state

    def run_update(self, update: int, on_update, every_process: bool) -> dict:
        """One update: its batch (collected here, or taken from the rollout worker), the algorithm's work items,
        the optimizer steps; then `on_update`.

        Args:
            update: the update number (state.update before it).
            on_update, every_process: as `run` takes them.

        Returns:
            The update's metrics (rewards, losses, diagnostics, seconds)."""
        started = time.time()
        if self.worker is not None:
            batch, metrics = self.worker.take(update)
        else:
            total = self.config.sampler.num_steps * self.rollout_chunks
            inner = tqdm(total=total, desc=f"rollout {update}", leave=False, disable=not self.log)
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
            self.worker.trained(update, self.config.train.updates)
        metrics["seconds"] = time.time() - started
        if on_update is not None and (self.is_main or every_process):
            on_update(self.state.update, metrics)
        return metrics

    def on_interrupt(self) -> None:
        """Ctrl-C: a checkpoint at the update boundary, unless the optimizer has stepped inside the update (saved as
        update u, a resume would apply its steps again) or FSDP2 shards the weights (each process stopped at its own
        point: gathering shards now could pair with collectives another process still has pending)."""
        if self.stepped or self.sharded():
            if self.log and self.stepped:
                tqdm.write(
                    f"interrupted inside update {self.state.update + 1}'s optimizer steps: no checkpoint is written "
                    "now; the run resumes from its last one (train.checkpoint_every)"
                )
            elif self.log:
                tqdm.write(
                    f"interrupted at update {self.state.update}: under FSDP2 no checkpoint is written now; the run "
                    "resumes from its last periodic one (train.checkpoint_every)"
                )
            return
        if self.log:
            tqdm.write(f"interrupted: saving a checkpoint at update {self.state.update}")
        self.save()


__all__ = ["RewardFailure", "RunState", "Trainer"]
