"""Is RL's gain more than a better guidance scale? The wide held-out set (time_to_quality's low-noise eval: same
prompts, seeds, 10 ODE steps) sampled at several CFG scales, for the untrained shapes-sd3 and for trained
checkpoints; the verifier's per-tag accuracy, the share of empty images (nothing the detector finds), and every
model's gain paired against the base at the eval's CFG 4.5.

The question it answers ("is the base what holds RL back"): the base draws nothing for a third of
single-object prompts at CFG 4.5; if that emptiness comes from guidance itself, part of the main job's gain is
RL undoing an artefact of the sampler setting, which a lower CFG would also remove without training.

    python benchmarks/guidance_sweep.py                                   # the base only
    python benchmarks/guidance_sweep.py benchmarks/results/time_to_quality/runs/grpo_seed1/checkpoints/update_000240

(~1 minute per model and scale at --per-tag 96 on 2 CPU cores). Writes benchmarks/results/guidance_sweep.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.checkpoint import load_trained_weights  # noqa: E402
from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.worlds.shapes.model_sd3 import T5_SEQUENCE_LENGTH  # noqa: E402
from flowrl.worlds.shapes.verifier import detect  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from time_to_quality import EVAL_CFG, LowNoiseEval  # noqa: E402


def judge(evaluator: LowNoiseEval, policy, guidance_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Verdict and emptiness (no detection at all) per image of the evaluator's prompts and seeds."""
    images = evaluator.images(policy, guidance_scale)
    return evaluator.judge(images), np.array([not detect(im) for im in images], float)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="*", help="trained checkpoints (LoRA folders) to sweep beside the base")
    parser.add_argument("--scales", default="1,2,3,4.5", help="comma-separated CFG scales (4.5 is always included)")
    parser.add_argument("--per-tag", type=int, default=96)
    parser.add_argument("--pipeline", default=str(ROOT / "pipelines" / "shapes-sd3"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "guidance_sweep.json")
    args = parser.parse_args(argv)
    try:
        scales = sorted({float(s) for s in args.scales.split(",") if s.strip()} | {EVAL_CFG})
    except ValueError:
        parser.error(f"--scales: expected comma-separated numbers, got {args.scales!r}")
    for checkpoint in args.checkpoints:
        if not Path(checkpoint).is_dir():
            parser.error(f"checkpoint {checkpoint}: no such folder")
    torch.set_num_threads(2)
    evaluator = LowNoiseEval(args.per_tag, steps=10)
    results, reference = {"images": len(evaluator.expanded), "scales": scales, "models": {}}, None
    for model in ["base"] + args.checkpoints:
        torch.manual_seed(0)
        policy = policy_for(load_pipeline(args.pipeline), max_sequence_length=T5_SEQUENCE_LENGTH)
        if model != "base":
            load_trained_weights(policy, model)
        rows = {}
        # the eval's scale first, so the base's verdicts there are the reference every gain is paired against
        for scale in sorted(scales, key=lambda s: s != EVAL_CFG):
            with torch.no_grad():
                verdicts, empty = judge(evaluator, policy, scale)
            reference = verdicts if reference is None else reference
            rows[str(scale)] = {
                "accuracy": evaluator.summary(verdicts),
                "empty": float(empty.mean()),
                "gain_vs_base_at_eval_cfg": evaluator.summary(verdicts - reference),
            }
            a, g = rows[str(scale)]["accuracy"], rows[str(scale)]["gain_vs_base_at_eval_cfg"]
            print(
                f"{Path(model).parent.parent.name if model != 'base' else 'base':12s} CFG {scale:3.1f}: overall "
                f"{a['overall']:.3f}  gain {100 * g['overall']:+.1f} +- {196 * g['draw_se']:.1f}  empty "
                f"{empty.mean():.3f}  " + "  ".join(f"{t[:6]} {v:.2f}" for t, v in a["tags"].items()),
                flush=True,
            )
        results["models"][model] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
