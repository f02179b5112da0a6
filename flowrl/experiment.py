"""`flowrl train`: a Trainer wrapped with what a run dir holds (config, metrics, evals, plots, report)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from .config import RunConfig, config_to_dict
from .eval.shapes import format_accuracy, shapes_accuracy
from .generate import generate
from .prompt_source import PromptSource
from .report import MetricsLog, image_grid, plot_rewards, save_json, write_report
from .train import Trainer, write_config

GRID_PROMPTS = 12


def evaluate(trainer: Trainer, desc: str) -> tuple[dict, np.ndarray, list[str]]:
    c = trainer.config.eval
    prompts = PromptSource(c.prompts).all()
    probe = None
    if c.steering is not None:
        from .safety.steering import load_steering

        probe = load_steering(trainer.policy, c.steering)
    images, records = generate(trainer.policy, prompts, c.num_per_prompt, c.seed, c.num_steps, c.guidance_scale,
                               trainer.config.pipeline.height, trainer.config.pipeline.width, desc=desc,
                               steering=c.steering, probe=probe)
    expanded = [r["prompt"] for r in records]
    return shapes_accuracy(images, expanded), images, expanded


def run_experiment(config: RunConfig) -> Path:
    trainer = Trainer(config)
    run_dir = trainer.run_dir
    evals_path = run_dir / "eval.json"
    if trainer.is_main:
        write_config(config, run_dir)
    evals = json.loads(evals_path.read_text()) if evals_path.is_file() else {}
    log = MetricsLog(run_dir) if trainer.is_main else None
    base_images = None
    do_eval = config.eval.enabled and trainer.is_main

    if do_eval and "0" not in evals and not trainer.resume_path():
        result, base_images, prompts = evaluate(trainer, "eval base")
        evals["0"] = result
        save_json(evals_path, evals)
        print("base model, eval split:\n" + format_accuracy(result))

    def on_update(update: int, metrics: dict) -> None:
        log.append(update, metrics)
        if do_eval and config.eval.every and update % config.eval.every == 0 and update < config.train.updates:
            with trainer.swap_in_ema():
                evals[str(update)] = evaluate(trainer, f"eval {update}")[0]
            save_json(evals_path, evals)

    trainer.run(on_update)
    if not trainer.is_main:
        return run_dir
    if do_eval:
        with trainer.swap_in_ema():
            result, tuned_images, prompts = evaluate(trainer, "eval tuned")
        evals[str(config.train.updates)] = result
        save_json(evals_path, evals)
        print("tuned model, eval split:\n" + format_accuracy(result))
        if base_images is None:  # resumed: regenerate the base samples for the grid with the adapter off
            base_images = _base_images(trainer)
        step = max(1, len(prompts) // (GRID_PROMPTS * config.eval.num_per_prompt)) * config.eval.num_per_prompt
        rows = list(range(0, len(prompts), step))[:GRID_PROMPTS]
        image_grid([base_images[rows], tuned_images[rows]], ["base", "tuned"], [prompts[i] for i in rows],
                   run_dir / "before_after.png")
    log.close()
    plot_rewards(log.rows, run_dir / "reward_curve.png", evals or None, title=config.run.name)
    before, after = evals.get("0"), evals.get(str(config.train.updates))
    notes = []
    if before and after:
        notes.append(f"Overall eval accuracy {before['overall']:.3f} -> {after['overall']:.3f} "
                     f"({100 * (after['overall'] - before['overall']):+.1f} points).")
    write_report(run_dir, yaml.safe_dump(config_to_dict(config), sort_keys=False), before, after, log.rows, notes)
    return run_dir


def _base_images(trainer: Trainer):
    if trainer.policy.has_lora:
        with trainer.policy.reference():
            return evaluate(trainer, "eval base (for the grid)")[1]
    raise RuntimeError("cannot regenerate base samples after full fine-tuning; keep the first run's eval")
