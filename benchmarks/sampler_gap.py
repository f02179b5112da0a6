"""How much better does the untrained shapes-sd3 draw with the SDE the RL rollouts use than with the ODE the eval
uses? Same prompts (the wide held-out set), same seeds, 10 steps, CFG 4.5; the verifier's per-tag accuracy for the
ODE, for the main job's SDE window (noise 0.7 on steps 0-2, ODE after) and for a full SDE (noise 0.7 on every step).

If the rollouts' samples already score well above the ODE's, an early eval gain can come from the ODE learning to
draw what the SDE draws (the LoRA absorbing the noise's effect) rather than from the reward rising on the samples
RL sees; time_to_quality's runs gain +11 to +12 points in 60 updates while their training reward barely moves.

    python benchmarks/sampler_gap.py            # ~4 minutes on 2 CPU cores; writes benchmarks/results/sampler_gap.json
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

SAMPLERS = {"ode": ("ode", None), "sde_window_0_3": ("flow", (0, 3)), "sde_full": ("flow", None)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-tag", type=int, default=96)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sampler_gap.json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    policy = policy_for(load_pipeline(ROOT / "pipelines" / "shapes-sd3"), max_sequence_length=16)  # as trained
    evaluator = LowNoiseEval(args.per_tag, steps=10)
    results, verdicts = {}, {}
    with torch.no_grad():
        for name, (kind, window) in SAMPLERS.items():
            verdicts[name] = evaluator.verdicts(
                policy, kind=kind, noise_level=0.0 if kind == "ode" else 0.7, sde_window=window
            )
            # paired with the ODE's image of the same prompt and initial noise
            results[name] = {
                "accuracy": evaluator.summary(verdicts[name]),
                "minus_ode": evaluator.summary(verdicts[name] - verdicts["ode"]),
            }
            a, d = results[name]["accuracy"], results[name]["minus_ode"]
            print(
                f"{name:15s} overall {a['overall']:.3f} (minus ODE {100 * d['overall']:+.1f} +- "
                f"{196 * d['draw_se']:.1f} points)  " + "  ".join(f"{t} {v:.2f}" for t, v in a["tags"].items()),
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"images": len(evaluator.expanded), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
