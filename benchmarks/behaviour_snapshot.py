"""Snapshot of what the shipped configs do in a few updates, to check that a refactor changes nothing.

Runs every configs/*.yaml for `--updates` updates (eval off, no checkpoints) through the `flowrl` CLI and keeps
each metrics.csv; with --eval, one run also keeps the base and tuned eval of configs/shapes_grpo.yaml.
Compare two snapshots (e.g. before and after a change) with --compare A.json B.json: it lists every value that
differs. Run it from the repository root:

    python benchmarks/behaviour_snapshot.py --out before.json [--eval]
    python benchmarks/behaviour_snapshot.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run_config(config: Path, out_dir: Path, updates: int, extra: list[str]) -> list[dict]:
    name = config.stem
    overrides = [
        f"run.out_dir={out_dir}",
        f"run.name={name}",
        f"train.updates={updates}",
        "train.checkpoint_every=0",
        *extra,
    ]
    subprocess.run(
        [sys.executable, "-m", "flowrl", "train", str(config), *overrides], check=True, stdout=subprocess.DEVNULL
    )
    with (out_dir / name / "metrics.csv").open() as f:
        return [without_clock(row) for row in csv.DictReader(f)]


def without_clock(row: dict) -> dict:
    """A metrics row without its wall-clock columns (`seconds`, `rollout_wait_seconds`): they differ run to run."""
    return {k: v for k, v in row.items() if not k.endswith("seconds")}


# Defaults changed on purpose to match the reference implementations, set back to their old values (for comparing
# with code from before the change): CFG's unconditional branch now gets no gradient in likelihood-ratio methods
# (Flow-GRPO's script detaches it), and NFT scales its loss by adv_clip_max and trains A = 0 items (DiffusionNFT's)
OLD_DEFAULTS = ["train.cfg_uncond_grad=true"]
OLD_NFT_DEFAULTS = ["algorithm.params.scale_by_adv_clip=false", "algorithm.params.drop_zero_advantage=true"]


def snapshot(updates: int, with_eval: bool, only: list[str], old_defaults: bool) -> dict:
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for config in sorted(Path("configs").glob("*.yaml")):
            if only and config.stem not in only:
                continue
            print(f"{config.stem} ...", flush=True)
            extra = ["eval.enabled=false"]
            if old_defaults:
                extra += OLD_DEFAULTS + (OLD_NFT_DEFAULTS if "nft" in config.stem else [])
            result[config.stem] = run_config(config, Path(tmp), updates, extra)
        if with_eval:
            out = Path(tmp) / "eval"
            run_config(
                Path("configs/shapes_grpo.yaml"),
                out,
                1,
                ["eval.enabled=true", "eval.every=0"] + (OLD_DEFAULTS if old_defaults else []),
            )
            result["shapes_grpo_eval"] = json.loads((out / "shapes_grpo" / "eval.json").read_text())
    return result


def compare(a: dict, b: dict) -> int:
    a, b = ({k: [without_clock(r) for r in v] if isinstance(v, list) else v for k, v in s.items()} for s in (a, b))
    differences = 0
    for key in sorted(set(a) | set(b)):
        if json.dumps(a.get(key), sort_keys=True) != json.dumps(b.get(key), sort_keys=True):
            differences += 1
            print(f"{key}: differs")
            print(f"  A: {json.dumps(a.get(key))[:600]}")
            print(f"  B: {json.dumps(b.get(key))[:600]}")
    print(f"{differences} of {len(set(a) | set(b))} entries differ")
    return differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--eval", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated config names")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    parser.add_argument(
        "--old-defaults",
        action="store_true",
        help="train with the defaults changed to match the reference implementations set "
        "to their old values (CFG's unconditional gradient kept; NFT's unscaled loss, A = 0 dropped)",
    )
    args = parser.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        sys.exit(1 if compare(a, b) else 0)
    result = snapshot(args.updates, args.eval, [n for n in args.only.split(",") if n], args.old_defaults)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
