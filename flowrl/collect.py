"""The steps of `Trainer.collect`, which makes an update's batch: draw the conditions, draw the noise, roll out, decode
and score, gather the rewards over the processes, drop the groups whose rewards failed, and measure the rewards.

Every random draw comes from a generator seeded by (run.seed, update, index), so a batch depends on neither the
number of processes nor the memory settings that cut it into chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from flowrl.algorithms import RolloutBatch
from flowrl.algorithms.base import drop_groups
from flowrl.config import RunConfig
from flowrl.errors import UserError
from flowrl.prompt_source import derived_seed
from flowrl.rewards import latent_scorer
from flowrl.rewards.base import RewardOutput, score_robustly, standardized_sum
from flowrl.rollout import (
    join_trajectories,
    per_sample_noise,
    rollout,
    rollout_chunks,
    rollout_in_chunks,
    sample_generators,
)
from flowrl.sde_window import sde_window


class RewardFailure(UserError):
    """Too many samples of an update got no finite reward (train.max_failed_reward_share)."""


@dataclass
class Draw:
    """An update's samples over every process and this process's share of them.

    Attributes:
        items: every sample's condition (train.groups_per_update groups of train.group_size).
        groups: every sample's group index.
        seeds: every sample's seed.
        mine: this process's contiguous share of the samples.
    """

    items: list
    groups: torch.Tensor
    seeds: list[int]
    mine: slice

    @property
    def local_items(self) -> list:
        return self.items[self.mine]

    @property
    def local_groups(self) -> torch.Tensor:
        return self.groups[self.mine]

    @property
    def local_seeds(self) -> list[int]:
        return self.seeds[self.mine]

    @property
    def local_prompts(self) -> list[str]:
        return [item.prompt for item in self.local_items]


def draw_conditions(prompts, config: RunConfig, update: int, rank: int, world: int) -> Draw:
    """Draw an update's conditions and seeds.

    Args:
        prompts: the run's PromptSource.
        config: the run's config.
        update: the update number.
        rank: this process's index; world: the number of processes.

    Returns:
        The Draw: train.groups_per_update conditions each repeated train.group_size times, every sample's seed
        derived from (run.seed, update, index), and this process's contiguous share.
    """
    seed, size = config.run.seed, config.train.group_size
    conditions = prompts.draw(config.train.groups_per_update, seed, update)
    items = [item for item in conditions for _ in range(size)]
    per_rank = len(items) // world
    return Draw(
        items,
        torch.arange(len(conditions)).repeat_interleave(size),
        [derived_seed(seed, update, i) for i in range(len(items))],
        slice(rank * per_rank, (rank + 1) * per_rank),
    )


def rollout_noise(config: RunConfig, algorithm, policy, spec, update: int, draw: Draw) -> tuple:
    """The noise of this process's samples, each from generators of its own (no draw depends on the split).

    Args:
        config: the run's config.
        algorithm: the run's Algorithm (`shared_initial_noise`: DanceGRPO's one initial noise per group).
        policy: the policy that samples (its latent shape).
        spec: the run's SampleSpec.
        update: the update number (it seeds the SDE window).
        draw: the update's Draw.

    Returns:
        (per-sample generators, the latent shape, the groups' shared initial noise or None, the update's SDE window
        (start, end) or None).
    """
    sampler, size = config.sampler, config.train.group_size
    shape = policy.noise_shape(spec)
    generators = sample_generators(draw.local_seeds)
    initial = None
    if algorithm.shared_initial_noise:  # the group's first sample seeds everyone's x_T
        initial = per_sample_noise(sample_generators([draw.seeds[int(g) * size] for g in draw.local_groups]), shape)
    return generators, shape, initial, sde_window(sampler, config.run.seed, update)


def step_callbacks(config: RunConfig, algorithm, reward, policy, draw: Draw) -> tuple:
    """The rollout's step callbacks.

    Args:
        config: the run's config (sampler.fk).
        algorithm: the run's Algorithm (`needs_step_rewards`).
        reward: the run's reward.
        policy: the policy that samples.
        draw: the update's Draw.

    Returns:
        (FKSteering or None: each group one set of particles, its resampling draws from its first sample's seed;
        IntermediateRewards or None: the step rewards of step-credit methods).
    """
    sampler, size, steering, recorder = config.sampler, config.train.group_size, None, None
    if sampler.fk is not None:
        from flowrl.fk import FKSteering
        from flowrl.inference import FK_DRAWS

        groups = [
            torch.Generator().manual_seed(derived_seed(draw.seeds[int(g) * size], FK_DRAWS))
            for g in draw.local_groups[::size]
        ]
        scorer = latent_scorer(policy, reward, robust=True)
        steering = FKSteering(sampler.fk, scorer, sampler.num_steps, len(draw.local_items) // size, groups)
    if algorithm.needs_step_rewards:
        from flowrl.algorithms.credit import IntermediateRewards

        recorder = IntermediateRewards(latent_scorer(policy, reward, robust=True), sampler.num_steps)
    return steering, recorder


def roll_out_and_score(accelerator, config: RunConfig, reward, rollout_args: tuple, callbacks: list, draw: Draw):
    """Sample this process's share, decode it and score it: at once, in memory.rollout_microbatch chunks, or each
    chunk scored in a worker thread while the next one samples (runtime.async_rewards: the same samples and scores,
    the reward's time hidden behind sampling).

    Args:
        accelerator: the run's Accelerator (its autocast).
        config: the run's config.
        reward: the run's reward.
        rollout_args: (policy, conditioning, generators, latent shape, SDE window, initial noise, progress bar).
        callbacks: the rollout's step callbacks (FK's first).
        draw: the update's Draw.

    Returns:
        (the Trajectory, the RewardOutput, the first reward error or None).
    """
    policy, cond, generators, shape, window, initial, progress = rollout_args
    sampler, memory = config.sampler, config.memory
    sampling = (sampler.num_steps, sampler.kind, sampler.noise_level, sampler.guidance_scale, window)
    meta = {"seeds": draw.local_seeds, "conditions": draw.local_items}
    prompts = draw.local_prompts
    if not config.runtime.async_rewards:
        with accelerator.autocast():
            if callbacks:
                traj = rollout(
                    policy,
                    cond,
                    generators,
                    shape,
                    *sampling,
                    initial_noise=initial,
                    callbacks=callbacks,
                    progress=progress,
                    ode_solver=sampler.ode_solver,
                )
            else:
                traj = rollout_in_chunks(
                    memory.rollout_microbatch,
                    policy,
                    cond,
                    generators,
                    shape,
                    *sampling,
                    initial,
                    progress=progress,
                    ode_solver=sampler.ode_solver,
                )
            with torch.no_grad():
                samples = policy.decode_in_chunks(traj.final)
        scored, error = score_robustly(reward, samples, prompts, meta, memory.reward_microbatch)
        return traj, scored, error
    from concurrent.futures import ThreadPoolExecutor

    parts, futures = [], []
    chunks = rollout_chunks(
        memory.rollout_microbatch, policy, cond, generators, shape, *sampling, initial, progress, sampler.ode_solver
    )
    with ThreadPoolExecutor(max_workers=1) as pool, accelerator.autocast():  # autocast: this thread only
        for rows, part in chunks:
            with torch.no_grad():
                samples = policy.decode_in_chunks(part.final)
            parts.append(part)
            part_meta = {k: [v[i] for i in rows] for k, v in meta.items()}
            args = (reward, samples, [prompts[i] for i in rows], part_meta, memory.reward_microbatch)
            futures.append(pool.submit(score_robustly, *args))
        results = [future.result() for future in futures]
    keys = sorted(set().union(*[r.info for r, _ in results]))
    scored = RewardOutput(
        torch.cat([r.scores for r, _ in results]),
        {k: torch.cat([r.info.get(k, torch.full_like(r.scores, float("nan"))) for r, _ in results]) for k in keys},
    )
    return join_trajectories(parts, cond), scored, next((e for _, e in results if e), None)


def gathered_batch(accelerator, config: RunConfig, reward, update: int, draw: Draw, traj, scored, recorder):
    """The RolloutBatch of this process's rows, with every process's rewards and groups gathered.

    Args:
        accelerator: the run's Accelerator (its gathers).
        config: the run's config (train.normalize_rewards: applied over the gathered batch, so groups split over
            processes count whole).
        reward: the run's reward (its terms and weights).
        update: the update number.
        draw: the update's Draw.
        traj: this process's Trajectory.
        scored: its RewardOutput.
        recorder: the IntermediateRewards callback, or None.

    Returns:
        The RolloutBatch (with every process's step rewards when `recorder` recorded them).
    """
    device, mine = accelerator.device, draw.mine
    rewards = scored.scores.float().to(device)
    global_rewards = accelerator.gather(rewards).cpu()
    global_groups = accelerator.gather(draw.local_groups.to(device)).cpu()
    normalize = config.train.normalize_rewards
    if normalize != "none":
        nan = torch.full_like(rewards, float("nan"))
        components = [accelerator.gather(scored.info.get(r.name, nan).float().to(device)).cpu() for r in reward.rewards]
        groups = global_groups if normalize == "group" else None
        standardized = standardized_sum(components, reward.weights, groups)
        global_rewards = torch.where(torch.isfinite(global_rewards), standardized, global_rewards)
        rewards = global_rewards[mine.start : mine.stop].to(device)
    batch = RolloutBatch(
        traj,
        rewards.cpu(),
        draw.local_groups,
        draw.local_seeds,
        global_rewards,
        global_groups,
        torch.arange(mine.start, mine.stop),
        draw.local_prompts,
        progress=update / config.train.updates,
        reward_info={k: v.detach().cpu() for k, v in scored.info.items()},
    )
    if recorder is not None:
        batch.step_rewards = recorder.rewards
        batch.global_step_rewards = accelerator.gather(batch.step_rewards.to(device)).cpu()
    return batch


def without_failed_groups(
    config: RunConfig, update: int, batch: RolloutBatch, error, world: int, sharded: bool, log: bool
) -> tuple[RolloutBatch, dict]:
    """Drop the groups of samples without a finite reward (NaN, inf, raised: no usable signal). Every process sees
    the global rewards, so all decide alike: a process left without samples could not join the others' forward and
    backward passes, and under FSDP2 unequal shares would run unequal numbers of no-grad passes gathering the
    sharded weights; then nobody trains on this update (`update_skipped`).

    Args:
        config: the run's config (train.max_failed_reward_share).
        update: the update number.
        batch: the gathered RolloutBatch.
        error: the first reward error, or None.
        world: the number of processes.
        sharded: whether FSDP2 shards the trained weights.
        log: whether to print what was skipped.

    Returns:
        (the batch less the failed groups, the metrics counting them: {} when none failed).

    Raises:
        RewardFailure: when the failed share exceeds train.max_failed_reward_share.
    """
    failed = ~torch.isfinite(batch.global_rewards)
    if batch.global_step_rewards is not None:  # an intermediate reward that failed leaves its steps no credit
        failed |= ~torch.isfinite(batch.global_step_rewards).all(dim=1)
    if not failed.any():
        return batch, {}
    share, limit, groups = failed.float().mean().item(), config.train.max_failed_reward_share, batch.global_group_ids
    metrics = {
        "reward_failed_samples": float(failed.sum()),
        "reward_failed_groups": float(len(torch.unique(groups[failed]))),
    }
    if share > limit:
        raise RewardFailure(
            f"reward {' + '.join(term.name for term in config.reward)}: {100 * share:.0f}% of update {update}'s "
            f"samples got no finite reward (train.max_failed_reward_share = {limit})"
            + (f"; first error: {error}" if error else "; it returned NaN or inf")
        )
    if log:
        tqdm.write(
            f"update {update}: {int(failed.sum())} samples without a finite reward"
            + (f" ({error})" if error else "")
            + "; their groups are skipped"
        )
    dropped = torch.unique(groups[failed])
    per_process = (~torch.isin(groups, dropped)).view(world, -1).sum(dim=1)
    if (per_process == 0).any() or (sharded and (per_process != per_process[0]).any()):
        metrics["update_skipped"] = 1.0
        if log:
            tqdm.write(
                f"update {update}: the failed groups left the processes unequal shares; the update trains nothing"
            )
    return drop_groups(batch, dropped), metrics


def reward_metrics(accelerator, world: int, batch: RolloutBatch, scored: RewardOutput, steering) -> dict:
    """An update's reward metrics.

    Args:
        accelerator: the run's Accelerator (its gathers).
        world: the number of processes.
        batch: the RolloutBatch after `without_failed_groups`.
        scored: this process's RewardOutput.
        steering: the FKSteering callback, or None.

    Returns:
        reward_mean and reward_std over the batch, fk_resamplings (FK-resampled groups are biased towards the
        reward: said in every row) and reward/KEY, the mean of each reward info key over every process's finite
        values.
    """
    metrics = {"reward_mean": batch.global_rewards.mean().item(), "reward_std": batch.global_rewards.std().item()}
    if steering is not None:
        metrics["fk_resamplings"] = float(len(steering.resampled_at))
    keys = sorted(scored.info)
    if world > 1:  # one gather per key on every process: a process whose reward failed wholly holds only the terms'
        # names (a scorer's own keys, e.g. pickscore/cosine, are missing there), so agree on the union
        from accelerate.utils import gather_object

        keys = sorted(set().union(*gather_object([keys])))
    for key in keys:  # the same order on every process
        value = scored.info.get(key, torch.full_like(scored.scores, float("nan")))
        gathered = accelerator.gather(value.float().to(accelerator.device))
        finite = torch.isfinite(gathered)
        metrics[f"reward/{key}"] = (gathered if finite.all() else gathered[finite]).mean().item()
    return metrics
