"""How much of a run's measured gain is the eval's own sampling noise?

A task's eval (shapes: 36 held-out prompts x 4 images; moving_shapes: 46 x 4 clips) draws from fixed seeds.
This samples the same protocol (ODE 20 steps, CFG 4.5) under several other eval seeds, for the base pipeline and
for trained checkpoints, and prints per seed the overall accuracy of each and the gain, with the mean and standard
deviation over seeds. With `--split train` it samples training prompts instead (up to 12 per tag, a fixed draw):
whether a checkpoint's gain on the held-out split shows on the prompts it trained on.

    python benchmarks/eval_seed_spread.py runs/shapes_grpo/checkpoints/update_000200 --seeds 2024,1,2,3,4
    python benchmarks/eval_seed_spread.py runs/moving_shapes_grpo/checkpoints/update_000060 --task moving_shapes \
        --pipeline pipelines/shapes-wan --seeds 2024,1,2

(~40 s per model and seed on 2 CPU cores). Writes benchmarks/results/eval_seed_spread.json (or --out) with --save.
"""

from __future__ import annotations

import argparse
import json
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.checkpoint import load_trained_weights  # noqa: E402
from flowrl.cli.arguments import sample_spec  # noqa: E402
from flowrl.inference import generate_samples  # noqa: E402
from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.tasks.base import build_task  # noqa: E402
from flowrl.worlds.shapes.model_sd3 import T5_SEQUENCE_LENGTH  # noqa: E402
from flowrl.worlds.shapes.protocol import PROTOCOL  # noqa: E402

TRAIN_PROMPTS_PER_TAG = 12


def split_items(task, split: str) -> list:
    """The task's held-out eval set, or a fixed draw of up to 12 training prompts per tag."""
    if split == "eval":
        return task.condition_set("eval").items
    by_tag = task.condition_set("train").by_tag
    rng = np.random.default_rng(7)
    return [
        by_tag[tag][i] for tag in by_tag for i in rng.permutation(len(by_tag[tag]))[:TRAIN_PROMPTS_PER_TAG].tolist()
    ]


def overall_by_seed(
    checkpoint: str | None,
    seeds: list[int],
    pipeline: str,
    split: str = "eval",
    task_name: str = "shapes",
    guidance_scale: float = PROTOCOL["guidance_scale"],
) -> list[float]:
    """The task's overall accuracy on the split, per eval seed (the runs' protocol: ODE, 20 steps, CFG 4.5 unless
    `guidance_scale` says otherwise, e.g. 1.0 for a CFG-free policy, 4 per prompt, the pipeline's own size)."""
    task = build_task(task_name)
    size = task.defaults.get("pipeline", {})  # the task's sample size and text length (video: frames too)
    text_length = size.get("max_sequence_length", T5_SEQUENCE_LENGTH)
    policy = policy_for(load_pipeline(pipeline), max_sequence_length=text_length)
    spec = sample_spec(Namespace(**{k: size.get(k) for k in ("height", "width", "num_frames")}), policy)
    if checkpoint is not None:
        load_trained_weights(policy, checkpoint)
    items = split_items(task, split)
    expanded = [item for item in items for _ in range(PROTOCOL["num_per_prompt"])]
    out = []
    for seed in seeds:
        samples, _ = generate_samples(
            policy,
            [c.prompt for c in items],
            PROTOCOL["num_per_prompt"],
            seed,
            PROTOCOL["num_steps"],
            guidance_scale,
            spec,
            desc=None,
        )
        out.append(task.evaluate(samples, expanded)["overall"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--seeds", default="2024,1,2,3,4", help="eval seeds (2024 is the runs' own)")
    parser.add_argument("--pipeline", default="pipelines/shapes-sd3")
    parser.add_argument("--task", default="shapes", help="shapes, moving_shapes, ...: whose splits and evaluation")
    parser.add_argument(
        "--split",
        choices=("eval", "train"),
        default="eval",
        help="eval: the held-out eval prompts; train: up to 12 training prompts per tag",
    )
    parser.add_argument(
        "--guidance-scale",
        type=float,
        default=PROTOCOL["guidance_scale"],
        help="CFG for base and checkpoints alike (1.0 judges a CFG-free policy at its own scale)",
    )
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "eval_seed_spread.json"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]

    def spread(values, digits: int = 3) -> str:  # the standard deviation over seeds; one seed has none
        return f"{np.std(values, ddof=1):6.{digits}f}" if len(values) > 1 else "     -"

    base = overall_by_seed(None, seeds, args.pipeline, args.split, args.task, args.guidance_scale)
    results = {
        "task": args.task,
        "split": args.split,
        "seeds": seeds,
        "guidance_scale": args.guidance_scale,
        "base": base,
        "checkpoints": {},
    }
    print("seed      " + "  ".join(f"{s:>6}" for s in seeds) + "    mean    std")
    print("base      " + "  ".join(f"{a:6.3f}" for a in base) + f"  {np.mean(base):6.3f} {spread(base)}")
    for checkpoint in args.checkpoints:
        tuned = overall_by_seed(checkpoint, seeds, args.pipeline, args.split, args.task, args.guidance_scale)
        gain = 100 * (np.array(tuned) - np.array(base))
        results["checkpoints"][checkpoint] = {"overall": tuned, "gain_points": gain.tolist()}
        print(
            f"{checkpoint}\n  tuned   "
            + "  ".join(f"{a:6.3f}" for a in tuned)
            + f"  {np.mean(tuned):6.3f} {spread(tuned)}"
        )
        print("  gain    " + "  ".join(f"{g:+6.1f}" for g in gain) + f"  {gain.mean():+6.1f} {spread(gain, 1)}")
    if args.save:
        out = Path(args.out)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"written to {out}")


if __name__ == "__main__":
    main()
