"""Two shapes-sd3 bases on the low-noise eval: the wide held-out prompts, the same seeds for both (time_to_quality's
LowNoiseEval: ~192 images per tag, 10 ODE steps, CFG 4.5), GenEval's verdict and the exact one, and the paired
difference B - A per image with its 95% interval for a redraw of the seeds. Tells whether a change to the pretraining
recipe moved the base before RL is run on it.

    python benchmarks/compare_bases.py pipelines/shapes-sd3 OTHER_DIR --out benchmarks/results/NAME.json   # ~2 min
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.policies import load_pipeline, policy_for  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from time_to_quality import LowNoiseEval  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="the reference base (a pipeline folder)")
    parser.add_argument("b", help="the other base")
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    parser.add_argument("--per-tag", type=int, default=192)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    evaluator = LowNoiseEval(args.per_tag, args.steps)
    verdicts = {
        path: evaluator.both_verdicts(policy_for(load_pipeline(path), max_sequence_length=16))
        for path in (args.a, args.b)
    }
    result = {"a": args.a, "b": args.b, "images": len(evaluator.expanded)}
    for i, verdict in enumerate(("geneval", "exact")):
        a, b = verdicts[args.a][i], verdicts[args.b][i]
        result[verdict] = {"a": evaluator.summary(a), "b": evaluator.summary(b), "b_minus_a": evaluator.summary(b - a)}
        diff = result[verdict]["b_minus_a"]
        print(
            f"{verdict}: a {result[verdict]['a']['overall']:.3f}  b {result[verdict]['b']['overall']:.3f}  "
            f"b - a {100 * diff['overall']:+.1f} +- {100 * 1.96 * diff['draw_se']:.1f} points"
        )
        for tag, value in diff["tags"].items():
            print(
                f"  {tag:<14} a {result[verdict]['a']['tags'][tag]:.2f}  b {result[verdict]['b']['tags'][tag]:.2f}  "
                f"b - a {100 * value:+.1f}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
