"""How much of a run's measured gain is the eval's own sampling noise?

The shapes eval draws 36 held-out prompts x 4 images from fixed seeds. This samples the same protocol (ODE 20 steps,
CFG 4.5) under several other eval seeds, for the base pipeline and for trained checkpoints, and prints per seed
the overall accuracy of each and the gain, with the mean and standard deviation over seeds. With `--split train`
it samples training prompts instead (up to 12 per tag, a fixed draw): whether a checkpoint's gain on the held-out
split shows on the prompts it trained on.

    python benchmarks/eval_seed_spread.py runs/shapes_grpo/checkpoints/update_000200 --seeds 2024,1,2,3,4

(~40 s per model and seed on 2 CPU cores). Writes benchmarks/results/eval_seed_spread.json (or --out) with --save.
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
from flowrl.shapes.prompts import TAGS, eval_prompt_set, train_prompt_set  # noqa: E402

TRAIN_PROMPTS_PER_TAG = 12


def split_prompts(split: str) -> list[str]:
    if split == "eval":
        return eval_prompt_set()
    by_tag = train_prompt_set()
    rng = np.random.default_rng(7)
    return [p for tag in TAGS
            for p in rng.permutation(by_tag[tag])[:TRAIN_PROMPTS_PER_TAG].tolist()]


def overall_by_seed(checkpoint: str | None, seeds: list[int], pipeline: str, split: str = "eval") -> list[float]:
    policy = policy_for(load_pipeline(pipeline), max_sequence_length=T5_SEQUENCE_LENGTH)
    if checkpoint is not None:
        load_trained_weights(policy, checkpoint)
    prompts = split_prompts(split)
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
    parser.add_argument("--split", choices=("eval", "train"), default="eval",
                        help="eval: the held-out eval prompts; train: up to 12 training prompts per tag")
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "eval_seed_spread.json"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    base = overall_by_seed(None, seeds, args.pipeline, args.split)
    results = {"split": args.split, "seeds": seeds, "base": base, "checkpoints": {}}
    print("seed      " + "  ".join(f"{s:>6}" for s in seeds) + "    mean    std")
    print("base      " + "  ".join(f"{a:6.3f}" for a in base) + f"  {np.mean(base):6.3f} {np.std(base, ddof=1):6.3f}")
    for checkpoint in args.checkpoints:
        tuned = overall_by_seed(checkpoint, seeds, args.pipeline, args.split)
        gain = 100 * (np.array(tuned) - np.array(base))
        results["checkpoints"][checkpoint] = {"overall": tuned, "gain_points": gain.tolist()}
        print(f"{checkpoint}\n  tuned   " + "  ".join(f"{a:6.3f}" for a in tuned)
              + f"  {np.mean(tuned):6.3f} {np.std(tuned, ddof=1):6.3f}")
        print("  gain    " + "  ".join(f"{g:+6.1f}" for g in gain) + f"  {gain.mean():+6.1f} {gain.std(ddof=1):6.1f}")
    if args.save:
        out = Path(args.out)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"written to {out}")


if __name__ == "__main__":
    main()
