"""`flowrl train`: a Trainer wrapped with what a run dir holds (config, metrics, evals, plots, report)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import torch
import yaml

from flowrl.builders import adapter_description
from flowrl.checkpoint import checkpoint_update, sampling_gate
from flowrl.config import RunConfig, config_to_dict
from flowrl.devices import DEFAULT_BATCH_SIZE
from flowrl.errors import ConfigError
from flowrl.inference import contiguous_share, generate_samples, particle_sampler, sample_seeds
from flowrl.prompt_source import PromptSource
from flowrl.report import MetricsLog, image_grid, number, plot_rewards, save_json, tile, write_report
from flowrl.run_checkpoints import swap_in_ema, write_config
from flowrl.sample_io import VideoSamples, side_by_side_clips
from flowrl.tasks.base import build_task, condition_runs, format_metrics, tag_metrics
from flowrl.train import Trainer

GRID_PROMPTS = 12


@contextlib.contextmanager
def sampled_as_checkpoint(trainer: Trainer):
    """The trainer's policy with its LoRA gated as `flowrl sample` draws from the run's checkpoints (the gate that
    checkpoint.sampling_gate reads from the run's adapter description); the training rollouts' gate is back
    afterwards. Under the run's mixed precision, as its rollouts: on several processes the wrapped denoiser
    autocasts every call, so one process must too for a checkpoint to score alike on 1 GPU and on N."""
    policy = trainer.policy
    training_gate = policy.lora_active_from_sigma
    adapter = adapter_description(trainer.config, policy)
    if adapter is not None:
        policy.lora_active_from_sigma = sampling_gate(adapter)
    try:
        with trainer.accelerator.autocast():
            yield policy
    finally:
        policy.lora_active_from_sigma = training_gate


def evaluate(trainer: Trainer, desc: str, judge: bool = True):
    """Sample the task's eval set with fixed seeds and measure it.

    The task's own evaluation when it has one (e.g. the shapes verifier), else the run's reward per tag. A LoRA
    samples here with its sampling gate (lora.sample_from_sigma), as `flowrl sample` draws from the checkpoint.
    Every process samples a contiguous share of the eval prompts, each with all its samples (so a group rubric sees
    a prompt's samples together, and reward calls take whole prompts); each sample keeps the seed it has in a
    one-process run, so the split changes no sample's noise (nor an FK-resampling steer's draws: inference.py). With
    the run's reward, every process also scores its own share (a VLM judge on 8 GPUs scores 8 times as fast). The
    main process gathers samples (and scores) and judges.

    Args:
        trainer: the run's Trainer (its policy, in its EMA weights if the caller swapped them in).
        desc: the progress bar's label (main process).
        judge: measure the samples; False only draws and gathers them.

    Returns:
        (metrics, samples, the condition of each sample) on the main process, (None, None, conditions) on the
        others; metrics None when not judged.
    """
    from flowrl.collect import RewardFailure

    evaluation = trainer.config.eval
    conditions = eval_conditions(trainer.task, evaluation.prompts)
    k = evaluation.num_per_prompt
    items = [item for item in conditions for _ in range(k)]
    seeds = sample_seeds(evaluation.seed, len(conditions), k)
    prompts, real = eval_share(len(conditions), trainer.rank, trainer.world)
    mine = [p * k + j for p in prompts for j in range(k)]
    with sampled_as_checkpoint(trainer) as policy:
        # as many samples per call as a rollout takes (memory.rollout_microbatch), or the default where unbounded
        batch = trainer.config.memory.rollout_microbatch or DEFAULT_BATCH_SIZE
        steer = trainer.task.eval_steer(policy)
        kind, noise_level = particle_sampler(policy) if steer is not None and steer.particles > 1 else ("ode", 0.0)
        samples, _ = generate_samples(
            policy,
            [items[i] for i in mine],
            1,
            evaluation.seed,
            evaluation.num_steps,
            evaluation.guidance_scale,
            trainer.eval_spec,
            kind,
            noise_level,
            batch_size=batch,
            desc=desc if trainer.is_main else None,
            steer=steer,
            seeds=[seeds[i] for i in mine],
        )
    own = samples.select(list(range(real * k)))
    reward_batch = trainer.config.memory.reward_microbatch or DEFAULT_BATCH_SIZE
    scores, error = None, None
    if judge and not trainer.task.judges_samples():
        try:
            scores = reward_scores(
                trainer.reward,
                in_batches(own, [items[i] for i in mine[: real * k]], reward_batch, trainer.reward.scores_groups),
            )
        except Exception as failure:  # every process stops together, not one while the others wait to gather
            error = f"{type(failure).__name__}: {failure}"
    wait = trainer.config.runtime.collective_timeout_minutes
    failed = [(rank, e) for rank, e in enumerate(all_processes(error, trainer.world, wait)) if e is not None]
    if failed:
        raise RewardFailure(f"evaluation: the reward failed on process {failed[0][0]}: {failed[0][1]}")
    parts = gathered_on_main((own.tensor.cpu(), scores), trainer.world, wait)
    if not trainer.is_main:
        return None, None, items
    samples = own.like(torch.cat([tensor for tensor, _ in parts]))
    if not judge:
        return None, samples, items
    result = trainer.task.evaluate(samples, items) if scores is None else None
    if result is None:  # the run's reward per tag (scored above, or here for a task that judged nothing)
        scores = (
            [s for _, part in parts for s in part]
            if scores is not None
            else reward_scores(trainer.reward, in_batches(samples, items, reward_batch, trainer.reward.scores_groups))
        )
        result = tag_metrics_of(scores, items)
    return result, samples, items


def eval_share(count: int, rank: int, world: int) -> tuple[list[int], int]:
    """Process `rank`'s contiguous share of `count` eval prompts, and how many of them are its own: shares are padded
    (with a repeat of a prompt) to one length, so every process runs the same number of batches and forward passes
    (a sharded denoiser needs every process in each), and the padding is dropped before gathering."""
    own = list(contiguous_share(count, rank, world))
    return own + [own[-1] if own else 0] * (-(-count // world) - len(own)), len(own)


_HOST_GROUP = None  # a gloo group over the run's processes: gathers through host memory, not the GPUs'


def _host_group(timeout_minutes: int):
    global _HOST_GROUP
    from datetime import timedelta

    import torch.distributed as dist

    if _HOST_GROUP is None:  # created once, by every process at the same point (their first evaluation); it waits
        # as long as the run's collectives do (gloo's own default is 30 minutes; a VLM judge's share can take longer)
        _HOST_GROUP = (
            dist.group.WORLD
            if dist.get_backend() == "gloo"
            else dist.new_group(backend="gloo", timeout=timedelta(minutes=timeout_minutes))
        )
    return _HOST_GROUP


def gathered_on_main(value, world: int, timeout_minutes: int = 180) -> list | None:
    """Every process's `value`, in rank order, on the main process (None elsewhere), through host memory (over NCCL
    each share would be pickled onto the GPU: a few 81-frame clips in float32 are GBs)."""
    if world == 1:
        return [value]
    import torch.distributed as dist

    parts = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(value, parts, dst=0, group=_host_group(timeout_minutes))
    return parts


def all_processes(value, world: int, timeout_minutes: int = 180) -> list:
    """Every process's (small) `value`, in rank order, on every process."""
    if world == 1:
        return [value]
    import torch.distributed as dist

    values = [None] * world
    dist.all_gather_object(values, value, group=_host_group(timeout_minutes))
    return values


def eval_conditions(task, prompts: str) -> list:
    """The conditions of the eval set `prompts` (one of the task's sets, or a prompt file), each checked by the task
    (one clear error for an item it cannot judge)."""
    conditions = PromptSource(task, prompts).all()
    for item in conditions:
        try:
            task.check(item)
        except ValueError as error:
            raise ConfigError(f"eval.prompts: {error}") from None
    return conditions


@torch.no_grad()
def reward_scores(reward, batches) -> list[float]:
    """`reward` of every sample in `batches` of (samples, their condition items), scored one batch at a time."""
    scores = []
    for samples, chunk in batches:
        scores += reward(samples.decoded(), [i.prompt for i in chunk], {"conditions": chunk}).scores.tolist()
    return scores


def tag_metrics_of(scores: list[float], items: list) -> dict:
    """The mean score per tag (an item's meta 'tag', else 'all') and over tags."""
    return tag_metrics(scores, [str(i.meta.get("tag", "all")) for i in items], clusters=[i.key() for i in items])


def in_batches(samples, items: list, size: int, keep_groups: bool = False):
    """(samples, items) `size` at a time; with `keep_groups` (a reward that scores groups) never splitting a run of
    samples of one condition: see `group_spans`."""
    for start, end in group_spans(items, size, keep_groups):
        yield samples.select(list(range(start, end))), items[start:end]


def group_spans(items: list, size: int, keep_groups: bool = True) -> list[tuple[int, int]]:
    """[start, end) spans of consecutive items of at most `size` items; with `keep_groups`, each holding whole runs of
    equal conditions (prompt and metadata), longer than `size` only where one run alone is."""
    if not keep_groups:
        return [(a, min(a + size, len(items))) for a in range(0, len(items), size)]

    spans, start = [], 0
    runs = condition_runs(items)
    for a, b in zip(runs, runs[1:]):
        if a > start and b - start > size:
            spans.append((start, a))
            start = a
    return spans + ([(start, len(items))] if items else [])


def log_samples(log: MetricsLog, samples, update: int, per_prompt: int, prompts: int = 16, longest: int = 4096) -> None:
    """The first sample of up to `prompts` eval prompts as one grid (video: frame strips), to TensorBoard / wandb,
    shrunk so its longer side is at most `longest` pixels (16 samples at 1024 px, or 81-frame strips, would put tens
    of MB into every event)."""
    from PIL import Image

    rows = list(range(0, len(samples), per_prompt))[:prompts]
    grid = tile(samples.select(rows).preview())
    factor = longest / max(grid.shape[:2])
    if factor < 1:
        size = (max(1, round(grid.shape[1] * factor)), max(1, round(grid.shape[0] * factor)))
        grid = np.asarray(Image.fromarray(grid).resize(size, Image.LANCZOS))
    log.add_image("eval/samples", grid, update)


def run_experiment(config: RunConfig) -> Path:
    """`flowrl train`: train `config` with its run folder around it: the config, metrics.csv (and TensorBoard, W&B),
    evaluations before, every eval.every updates and after training (eval.json, sample grids), the reward curve,
    the before / after grid and report.html. A run folder with checkpoints resumes (run.resume).

    Args:
        config: the run's config.

    Returns:
        The run folder.
    """
    if config.eval.enabled:  # fail in seconds, before the model loads, not after training
        eval_conditions(build_task(config.task.name, config.task.params), config.eval.prompts)
    trainer = Trainer(config)
    run_dir = trainer.run_dir
    evals_path = run_dir / "eval.json"
    if trainer.is_main:
        write_config(config, run_dir)
    evals = json.loads(evals_path.read_text()) if evals_path.is_file() else {}
    resume_path = trainer.checkpoints.resume_path()
    resumed_at = checkpoint_update(resume_path)
    if resumed_at is not None:  # an abandoned attempt's evaluations past the checkpoint go, as its metrics rows do
        evals = {key: value for key, value in evals.items() if int(key) <= resumed_at}
    project = os.environ.get("WANDB_PROJECT", "flowrl")
    wandb = {"project": project, "name": config.run.name, "config": config_to_dict(config)}
    log = (
        MetricsLog(run_dir, wandb=wandb if config.run.wandb else None, resumed_at=resumed_at)
        if trainer.is_main
        else None
    )
    base_samples = None
    do_eval = config.eval.enabled  # every process samples its share of each evaluation; the main one judges
    # every process read eval.json above, before the main one can write it (it waits for the others' samples
    # first), so all of them take the same branch here
    base_evaluated = do_eval and "0" not in evals and not resume_path
    if base_evaluated:
        result, base_samples, items = evaluate(trainer, "eval base")
        if trainer.is_main:
            evals["0"] = result
            save_json(evals_path, evals)
            log_samples(log, base_samples, 0, config.eval.num_per_prompt)
            base_samples = base_samples.select(grid_rows(len(items), config.eval.num_per_prompt))  # all the grid
            # needs: the whole eval set (videos: GBs) would sit in memory through training
            print(f"base model, eval set ({trainer.task.metric_name}):\n" + format_metrics(result))

    def on_update(update: int, metrics: dict) -> None:  # on every process
        if log is not None:
            log.append(update, metrics)
        if do_eval and config.eval.every and update % config.eval.every == 0 and update < config.train.updates:
            with swap_in_ema(trainer.params, trainer.state.ema):
                result, samples, _ = evaluate(trainer, f"eval {update}")
            if trainer.is_main:
                evals[str(update)] = result
                save_json(evals_path, evals)
                log_samples(log, samples, update, config.eval.num_per_prompt)

    trainer.run(on_update, every_process=True)
    if do_eval:
        with swap_in_ema(trainer.params, trainer.state.ema):
            result, tuned_samples, items = evaluate(trainer, "eval tuned")
        if not base_evaluated:  # resumed: regenerate the base samples for the grid with the adapter off
            base_samples = _base_samples(trainer)
            if base_samples is not None and trainer.is_main:
                base_samples = base_samples.select(grid_rows(len(items), config.eval.num_per_prompt))
    # no process exits while its share may still be in flight to the main one (gloo aborts a process that exits
    # mid-send: "terminate called without an active exception")
    trainer.accelerator.wait_for_everyone()
    if not trainer.is_main:
        return run_dir
    clips = []
    if do_eval:
        evals[str(config.train.updates)] = result
        save_json(evals_path, evals)
        log_samples(log, tuned_samples, config.train.updates, config.eval.num_per_prompt)
        print(f"tuned model, eval set ({trainer.task.metric_name}):\n" + format_metrics(result))
        rows = grid_rows(len(items), config.eval.num_per_prompt)
        columns, labels = [tuned_samples.select(rows).preview()], ["tuned"]
        if base_samples is not None:  # (already the grid's rows)
            columns, labels = [base_samples.preview()] + columns, ["base"] + labels
        policy = trainer.policy
        if policy.source_input:  # editing: source | base edit | tuned edit, each source as the editor was given it
            from flowrl.images import item_image, to_uint8

            size = (trainer.eval_spec.height, trainer.eval_spec.width)
            sources = [
                item_image(items[i], policy.source_input, policy.source_world, "the grid", resize_to=size) for i in rows
            ]
            columns, labels = [to_uint8(torch.stack(sources))] + columns, ["source"] + labels
        image_grid(columns, labels, [items[i].prompt for i in rows], run_dir / "before_after.png")
        if isinstance(tuned_samples, VideoSamples) and base_samples is not None:  # the clips, base | tuned
            files = side_by_side_clips(
                [base_samples, tuned_samples.select(rows)], run_dir / "before_after", "base_tuned"
            )
            clips = [
                (items[i].prompt, f"before_after/{mp4}", f"before_after/{gif}") for i, (mp4, gif) in zip(rows, files)
            ]
    log.close()
    plot_rewards(
        log.rows,
        run_dir / "reward_curve.png",
        evals or None,
        title=config.run.name,
        eval_label=f"eval: {trainer.task.metric_name}",
    )
    before, after = evals.get("0"), evals.get(str(config.train.updates))
    notes = []
    if before and after:
        b, a = number(before["overall"]), number(after["overall"])
        notes.append(f"Overall eval {trainer.task.metric_name} {b:.3f} -> {a:.3f} ({100 * (a - b):+.1f} points).")
    write_report(
        run_dir,
        yaml.safe_dump(config_to_dict(config), sort_keys=False),
        before,
        after,
        log.rows,
        notes,
        metric_name=trainer.task.metric_name,
        clips=clips,
        grid=do_eval,
    )
    return run_dir


def grid_rows(count: int, num_per_prompt: int) -> list[int]:
    """The eval samples the before / after grid shows: each of up to GRID_PROMPTS prompts spread over the set, its
    first sample."""
    step = max(1, count // (GRID_PROMPTS * num_per_prompt)) * num_per_prompt
    return list(range(0, count, step))[:GRID_PROMPTS]


def _base_samples(trainer: Trainer):
    """A resumed run's base samples for the before / after grid: drawn again with the adapter off, not judged (the
    base's numbers are in eval.json); None after full fine-tuning, whose base weights are gone (the grid then shows
    the tuned samples alone)."""
    if trainer.policy.has_lora:
        with trainer.policy.reference():
            return evaluate(trainer, "eval base (for the grid)", judge=False)[1]
    if trainer.is_main:
        print(
            "resumed full fine-tune: the base weights are gone, so the before / after grid shows the tuned model only"
        )
    return None
