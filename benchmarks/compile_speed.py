"""Compiled rollouts and updates against eager ones, side by side in one process on the main job
(configs/shapes_grpo.yaml, evaluations off): seconds per update of each, after the first `--warmup` updates (where
the compiled run compiles), and the ratio; the first updates' extra time is the compile cost. Writes
OUT/compile_speed.json.

    python benchmarks/compile_speed.py --updates 10 --warmup 3
    python benchmarks/compile_speed.py --config configs/moving_shapes_grpo.yaml     # another config
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import load_config  # noqa: E402
from flowrl.report import cpu_model  # noqa: E402
from flowrl.train import Trainer  # noqa: E402


def seconds_per_update(config_path: Path, updates: int, compiled: bool, out_dir: Path) -> list[float]:
    """Each update's training seconds (the loop's own clock) of a fresh run, eager or compiled."""
    name = "compiled" if compiled else "eager"
    shutil.rmtree(out_dir / name, ignore_errors=True)
    overrides = [
        f"run.name={name}",
        f"run.out_dir={out_dir}",
        f"train.updates={updates}",
        "train.checkpoint_every=0",
        "eval.enabled=false",
        f"runtime.compile={str(compiled).lower()}",
    ]
    seconds: list[float] = []
    trainer = Trainer(load_config(config_path, overrides), log=False)
    trainer.run(lambda update, metrics: seconds.append(float(metrics["seconds"])))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "shapes_grpo.yaml")
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="first updates left out of the steady-state median")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compile_speed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runs:
        timings = {
            name: seconds_per_update(args.config, args.updates, name == "compiled", Path(runs))
            for name in ("eager", "compiled")
        }
    steady = {name: statistics.median(values[args.warmup :]) for name, values in timings.items()}
    result = {
        "config": str(args.config.relative_to(ROOT)),
        "cpu": cpu_model(),
        "updates": args.updates,
        "warmup": args.warmup,
        "seconds_per_update": timings,
        "steady_median_s": steady,
        "eager_over_compiled": steady["eager"] / steady["compiled"],
        "compile_overhead_s": sum(timings["compiled"][: args.warmup]) - sum(timings["eager"][: args.warmup]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
