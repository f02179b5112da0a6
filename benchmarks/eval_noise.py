"""How many eval images tell a gain from noise, and what fewer sampler steps change: the measurement behind the
low-noise eval (more images per prompt, 10 steps) that time_to_quality and lora_step_gate use.

Samples the shapes eval split (36 held-out prompts) with 16 images per prompt, for the base pipeline and a trained
checkpoint, at 20 and at 10 Euler steps (CFG 4.5, the runs' protocol otherwise); image k of a prompt has the same seed
whatever the count, so the first 4 per prompt are exactly what the runs' eval (4 per prompt) draws. Prints the
overall accuracy with its 95% interval (prompts as the sampling unit) at 4 and 16 per prompt, the gain with the
interval of the paired difference, and the seconds per image.

    python benchmarks/eval_noise.py runs/shapes_grpo/checkpoints/update_000200      # ~6 min on 2 CPU cores

Writes benchmarks/results/eval_noise.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.checkpoint import load_trained_weights  # noqa: E402
from flowrl.inference import generate_samples  # noqa: E402
from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.tasks.base import interval, tag_metrics  # noqa: E402
from flowrl.worlds.shapes import parse_prompt, score  # noqa: E402
from flowrl.worlds.shapes.model_sd3 import T5_SEQUENCE_LENGTH  # noqa: E402
from flowrl.worlds.shapes.prompts import eval_prompt_set  # noqa: E402
from flowrl.worlds.shapes.protocol import PROTOCOL  # noqa: E402

PER_PROMPT = 16


def image_scores(checkpoint: str | None, pipeline: str, steps: int) -> tuple[np.ndarray, float]:
    """Verifier verdicts [prompts, PER_PROMPT] and seconds per image."""
    policy = policy_for(load_pipeline(pipeline), max_sequence_length=T5_SEQUENCE_LENGTH)
    if checkpoint is not None:
        load_trained_weights(policy, checkpoint)
    prompts = eval_prompt_set()
    started = time.time()
    samples, records = generate_samples(
        policy, prompts, PER_PROMPT, PROTOCOL["seed"], steps, PROTOCOL["guidance_scale"], desc=None
    )
    seconds = (time.time() - started) / len(records)
    verdicts = [score(image, r["prompt"]) for image, r in zip(samples.to_uint8(), records)]
    return np.asarray(verdicts, dtype=float).reshape(len(prompts), PER_PROMPT), seconds


def summary(scores: np.ndarray, per_prompt: int) -> dict:
    prompts = eval_prompt_set()
    values = scores[:, :per_prompt].reshape(-1)
    names = [p for p in prompts for _ in range(per_prompt)]
    result = tag_metrics(values.tolist(), [parse_prompt(p).tag for p in names], clusters=names)
    return {"overall": result["overall"], "interval": interval(result)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--pipeline", default="pipelines/shapes-sd3")
    parser.add_argument("--steps", default="20,10")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "eval_noise.json"))
    args = parser.parse_args()
    results = {}
    for steps in [int(s) for s in args.steps.split(",")]:
        base, base_seconds = image_scores(None, args.pipeline, steps)
        tuned, tuned_seconds = image_scores(args.checkpoint, args.pipeline, steps)
        row = {"seconds_per_image": (base_seconds + tuned_seconds) / 2}
        for n in (4, PER_PROMPT):
            row[f"base_{n}"], row[f"tuned_{n}"] = summary(base, n), summary(tuned, n)
            # the paired gain: per image tuned - base (same prompt and seed), prompts as the sampling unit
            row[f"gain_{n}"] = summary(tuned - base, n)
        results[steps] = row
        print(f"{steps} steps ({row['seconds_per_image']:.3f} s / image):")
        for n in (4, PER_PROMPT):
            b, t, g = row[f"base_{n}"], row[f"tuned_{n}"], row[f"gain_{n}"]
            print(
                f"  {n:2d} per prompt: base {b['overall']:.3f} +- {b['interval']:.3f}   tuned {t['overall']:.3f} +- "
                f"{t['interval']:.3f}   gain {100 * g['overall']:+.1f} +- {100 * g['interval']:.1f} points"
            )
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
