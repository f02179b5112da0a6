"""Memory soak: a few hundred updates of the main job's config at reduced size (fewer prompts per update, fewer
steps), recording the process's resident memory after every update; reports the growth from the first tenth of the
run to the last tenth (goal: under 2%) and writes benchmarks/results/memory_soak.json and a PNG of RSS per update.

    python benchmarks/memory_soak.py [--updates 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import load_config  # noqa: E402
from flowrl.report import figure  # noqa: E402
from flowrl.train import Trainer  # noqa: E402


def rss_mib() -> float:
    """Current resident set size of this process (Linux /proc), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes_grpo.yaml"))
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory_soak.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            args.config,
            [
                f"run.out_dir={tmp}",
                f"train.updates={args.updates}",
                "eval.enabled=false",
                "train.groups_per_update=2",
                "train.group_size=4",
                "sampler.num_steps=6",
                "sampler.sde_window_range=[0, 2]",
                "train.checkpoint_every=50",
            ],
        )
        trainer = Trainer(config, log=False)
        rss = []
        trainer.run(lambda update, metrics: rss.append(rss_mib()))
    tenth = max(1, len(rss) // 10)
    early, late = sum(rss[:tenth]) / tenth, sum(rss[-tenth:]) / tenth
    result = {
        "updates": len(rss),
        "rss_mib_first_tenth": early,
        "rss_mib_last_tenth": late,
        "growth": late / early - 1,
        "rss_mib": rss,
    }
    Path(args.out).write_text(json.dumps(result) + "\n")
    with figure(Path(args.out).with_suffix(".png"), figsize=(6, 3), dpi=120) as (fig, ax):
        ax.plot(range(1, len(rss) + 1), rss)
        ax.set_xlabel("update")
        ax.set_ylabel("RSS (MiB)")
        ax.set_title(f"memory soak: {100 * result['growth']:+.2f}% from the first to the last tenth")
    print(json.dumps({k: v for k, v in result.items() if k != "rss_mib"}, indent=2))


if __name__ == "__main__":
    main()
