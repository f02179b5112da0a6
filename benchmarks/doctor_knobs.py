"""`flowrl doctor` over recipe knobs and training seeds: which settings make a config's training reward rise on its
4 prompts with signal? Each arm is a set of overrides of the config; each (arm, seed) one doctor run.

    python benchmarks/doctor_knobs.py configs/shapes_grpo.yaml --seeds 0 --updates 60 \
        --arm shipped= --arm "lr 3e-3=optim.lr=3e-3 optim.lr_schedule=constant"
Writes benchmarks/results/doctor_knobs/<config name>.json (every run's figures, added to what is there) and prints a
row per run: the measured quantity's mean over the first and the last 8 updates, "pass" where the last 8's success
share reaches 0.9, the seconds per update and the doctor's hint. The prompts are screened with seed 0 for every
training seed, so the seeds train the same prompts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import load_config  # noqa: E402
from flowrl.doctor import doctor  # noqa: E402

PASS = 0.9  # the last 8 updates' success share a recipe must reach


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--arm", action="append", required=True, help="NAME=OVERRIDES (space-separated key=value)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--noise-draws", type=int, default=0, help="the noise share's draws (0: skipped)")
    parser.add_argument("--prompt", action="append", default=None, help="train these prompts (default: screened)")
    args = parser.parse_args(argv)
    out = ROOT / "benchmarks/results/doctor_knobs" / f"{Path(args.config).stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for arm in args.arm:
        name, _, overrides = arm.partition("=")
        for seed in (int(s) for s in args.seeds.split(",")):
            started = time.time()
            config = load_config(ROOT / args.config, [*shlex.split(overrides), f"run.seed={seed}"])
            draws, count = args.noise_draws, len(args.prompt or [None] * 4)
            result = doctor(config, args.updates, count, draws, draws, progress=False, screen_seed=0, only=args.prompt)
            result["seconds"] = time.time() - started
            result["overrides"] = overrides
            runs = json.loads(out.read_text()) if out.exists() else {}  # read anew: another run may have written
            runs.setdefault(name, {})[str(seed)] = result
            out.write_text(json.dumps(runs, indent=1))
            print(row(name, seed, result), flush=True)


def row(name: str, seed: int, result: dict) -> str:
    measured = np.asarray(result["success"] or result["reward"]).mean(1)
    last = measured[-8:].mean()
    mark = "pass" if result["success"] and last >= PASS else "-"
    return (
        f"{name:28s} seed {seed}: {measured[:8].mean():.3f} -> {last:.3f} {mark:4s} "
        f"({result['seconds'] / len(measured):.1f} s/update) {result['hint'][:90]}"
    )


if __name__ == "__main__":
    main()
