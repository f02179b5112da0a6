"""How much of a run's measured gain is the eval's own sampling noise?

The shapes eval draws 36 held-out prompts x 4 images from fixed seeds. This samples the same protocol (ODE 20 steps,
CFG 4.5) under several other eval seeds, for the base pipeline and for trained checkpoints, and prints per seed
the overall accuracy of each and the gain, with the mean and standard deviation over seeds.

    python benchmarks/eval_seed_spread.py runs/shapes_grpo/checkpoints/update_000200 --seeds 2024,1,2,3,4

(~40 s per model and seed on 2 CPU cores). Writes benchmarks/results/eval_seed_spread.json with --save.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.checkpoint import load_trained_weights  # noqa: E402
from flowrl.eval.protocol import PROTOCOL  # noqa: E402
from flowrl.eval.shapes import shapes_accuracy  # noqa: E402
from flowrl.generate import generate  # noqa: E402
from flowrl.models.shapes_sd3 import T5_SEQUENCE_LENGTH  # noqa: E402
from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.shapes.prompts import eval_prompt_set  # noqa: E402


def overall_by_seed(checkpoint: str | None, seeds: list[int], pipeline: str) -> list[float]:
    policy = policy_for(load_pipeline(pipeline), max_sequence_length=T5_SEQUENCE_LENGTH)
    if checkpoint is not None:
        load_trained_weights(policy, checkpoint)
    prompts = eval_prompt_set()
    out = []
    for seed in seeds:
        images, records = generate(policy, prompts, PROTOCOL["num_per_prompt"], seed, PROTOCOL["num_steps"],
                                   PROTOCOL["guidance_scale"], desc=None)
        out.append(shapes_accuracy(images, [r["prompt"] for r in records])["overall"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--seeds", default="2024,1,2,3,4", help="eval seeds (2024 is the runs' own)")
    parser.add_argument("--pipeline", default="pipelines/shapes-sd3")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    base = overall_by_seed(None, seeds, args.pipeline)
    results = {"seeds": seeds, "base": base, "checkpoints": {}}
    print("seed      " + "  ".join(f"{s:>6}" for s in seeds) + "    mean    std")
    print("base      " + "  ".join(f"{a:6.3f}" for a in base) + f"  {np.mean(base):6.3f} {np.std(base, ddof=1):6.3f}")
    for checkpoint in args.checkpoints:
        tuned = overall_by_seed(checkpoint, seeds, args.pipeline)
        gain = 100 * (np.array(tuned) - np.array(base))
        results["checkpoints"][checkpoint] = {"overall": tuned, "gain_points": gain.tolist()}
        print(f"{checkpoint}\n  tuned   " + "  ".join(f"{a:6.3f}" for a in tuned)
              + f"  {np.mean(tuned):6.3f} {np.std(tuned, ddof=1):6.3f}")
        print("  gain    " + "  ".join(f"{g:+6.1f}" for g in gain) + f"  {gain.mean():+6.1f} {gain.std(ddof=1):6.1f}")
    if args.save:
        out = ROOT / "benchmarks" / "results" / "eval_seed_spread.json"
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"written to {out}")


if __name__ == "__main__":
    main()
