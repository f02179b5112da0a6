"""Where does a trained LoRA help? One checkpoint judged with its adapter at every step, only at high noise, only at
low noise, and off (the base), on time_to_quality's low-noise eval (the wide held-out set, ~192 images per tag, ODE
10 steps, CFG 4.5, the same seeds for every mode, gains paired per image), under GenEval's verdict and under the
exact one (no objects beyond those the prompt names).

A window-trained LoRA (the main job trains a 3-step window starting in steps 0-2 of 10: sigma 1.0 down to 0.556)
still acts at the low-noise steps it never learned on; `high noise only` is what `lora.active_from_sigma` does,
`low noise only` its complement.

    python benchmarks/lora_step_gate.py --checkpoint runs/NAME/checkpoints/update_000240 [--sigma 0.6]
        [--modes "every step,high noise only"]
(any folder `pipe.load_lora_weights` reads: a flowrl checkpoint holds its LoRA in diffusers' format)
Writes OUT (default benchmarks/results/lora_step_gate.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from time_to_quality import LowNoiseEval  # noqa: E402

from flowrl.policies import load_pipeline, policy_for  # noqa: E402

MODES = ("base", "every step", "high noise only", "low noise only")


def base_below(policy, sigma_min: float):
    """A sampler guide giving the adapter-free output at sigma >= sigma_min (the LoRA acts only below)."""

    def guide(x, sigma, cond, guidance_scale, v):
        if float(torch.as_tensor(sigma).reshape(-1)[0]) < sigma_min:
            return v
        with policy.reference():
            return policy.velocity(x, sigma, cond, guidance_scale)

    return guide


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--pipeline", default=str(ROOT / "pipelines" / "shapes-sd3"))
    parser.add_argument("--sigma", type=float, default=0.6, help="the gate: high noise is sigma >= this")
    parser.add_argument("--per-tag", type=int, default=192)
    parser.add_argument(
        "--modes",
        default=",".join(MODES[1:]),
        help=f"comma-separated, of {MODES[1:]}; the base is always judged first (gains are paired)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lora_step_gate.json")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES[1:]]:
        parser.error(f"--modes: unknown {unknown}; known: {list(MODES[1:])}")
    torch.set_num_threads(2)
    pipeline = load_pipeline(args.pipeline)
    pipeline.load_lora_weights(args.checkpoint)  # the checkpoint's diffusers LoRA file, as a diffusers user loads it
    policy = policy_for(pipeline, max_sequence_length=16)
    evaluator = LowNoiseEval(args.per_tag, 10)
    results, base = {}, None
    for mode in ["base", *modes]:
        if mode == "base":
            with policy.reference():
                verdicts = evaluator.both_verdicts(policy)
        elif mode == "high noise only":
            policy.lora_active_from_sigma = args.sigma
            verdicts = evaluator.both_verdicts(policy)
            policy.lora_active_from_sigma = None
        else:
            guide = base_below(policy, args.sigma) if mode == "low noise only" else None
            verdicts = evaluator.both_verdicts(policy, guide=guide)
        base = verdicts if base is None else base
        results[mode] = evaluator.point(verdicts, base)
        for label, r in (("", results[mode]), ("exact ", results[mode]["exact"])):
            print(
                f"{label + mode:22s} accuracy {r['accuracy']['overall']:.3f}  "
                f"gain {100 * r['gain']['overall']:+.1f} +- "
                f"{196 * r['gain']['draw_se']:.1f}  "
                + "  ".join(f"{t} {v:.2f}" for t, v in r["accuracy"]["tags"].items()),
                flush=True,
            )
    args.out.write_text(
        json.dumps({"checkpoint": str(args.checkpoint), "sigma": args.sigma, "modes": results}, indent=1) + "\n"
    )
    return results


if __name__ == "__main__":
    main()
