"""`flowrl diagnose` on every shipped config of the embedded pipelines: the signal table of docs/research.

    python benchmarks/diagnose_configs.py                       # every configs/*.yaml, one update's groups each
    python benchmarks/diagnose_configs.py --configs shapes_grpo,shapes3d_dho --updates 2

Writes OUT/table.md, OUT/results.json and OUT/<config>/{diagnose.json, prompts.md, rewards.png}
(OUT = benchmarks/results/diagnose). The configs under configs/real need their model folders and are not run here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import load_config  # noqa: E402
from flowrl.diagnose import diagnose, write_report  # noqa: E402


def row(name: str, result: dict, seconds: float) -> str:
    s, gap, clip, c = result["stats"], result["sde_ode_gap"], result["clip_fraction"], result["config"]
    passes = "-" if s["pass_at_1"] is None else f"{s['pass_at_1']:.2f} / {s['pass_at_g']:.2f}"
    return (
        f"| {name} | {c['algorithm']} | {c['sampler']} | {c['groups']} x {c['group_size']} | {s['reward_mean']:.3f} | "
        f"{s['reward_std']:.3f} | {s['within_group_share']:.0%} | {s['zero_spread_share']:.0%} | {passes} | "
        f"{'-' if gap is None else format(gap['gap'], '+.3f')} | {'-' if clip is None else format(clip, '.0%')} | "
        f"**{s['signal_share']:.0%}** | {seconds:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=None, help="comma-separated config names (default: every configs/*.yaml)")
    parser.add_argument("--updates", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "diagnose")
    args = parser.parse_args()
    names = args.configs.split(",") if args.configs else sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for name in names:
        print(f"== {name}", flush=True)
        started = time.time()
        result = diagnose(load_config(ROOT / "configs" / f"{name}.yaml"), args.updates)
        result["seconds"] = time.time() - started
        write_report(result, args.out / name)
        results[name] = result
        print(result["verdict"], flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=1))
    header = (
        "| config | method | sampler | groups | reward mean | std | within-group share | zero-spread groups | "
        "pass@1 / pass@G | SDE - ODE | clipped (1st update) | prompts with signal | s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    table = header + "\n".join(row(n, r, r["seconds"]) for n, r in sorted(results.items())) + "\n"
    (args.out / "table.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
