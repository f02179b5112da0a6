"""Peak memory of one training run per memory setting, side by side: the main job's config (2 updates, eval off),
each setting in its own process. Reports peak CPU RSS (and peak GPU memory when CUDA is used) and seconds per
update, and writes benchmarks/results/memory.json plus a markdown table.

    python benchmarks/memory.py [--config configs/shapes_grpo.yaml] [--updates 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "baseline": [],
    "rollout_microbatch=16": ["memory.rollout_microbatch=16"],
    "decode+reward microbatch=8": ["memory.decode_microbatch=8", "memory.reward_microbatch=8"],
    "microbatch_size=8": ["memory.microbatch_size=8"],
    "gradient_checkpointing": ["memory.gradient_checkpointing=true"],
    "weight_dtype=bf16": ["memory.weight_dtype=bf16", "memory.mixed_precision=bf16"],
    "offload_text_encoders+cache": ["memory.offload_text_encoders=true", "memory.embedding_cache=true"],
    "all of the above": [
        "memory.rollout_microbatch=16",
        "memory.decode_microbatch=8",
        "memory.reward_microbatch=8",
        "memory.microbatch_size=8",
        "memory.gradient_checkpointing=true",
        "memory.weight_dtype=bf16",
        "memory.mixed_precision=bf16",
        "memory.offload_text_encoders=true",
        "memory.embedding_cache=true",
    ],
}

CHILD = """
import json, resource, sys, time, torch
from flowrl.config import load_config
from flowrl.train import Trainer
config = load_config(sys.argv[1], sys.argv[3:])
trainer = Trainer(config, log=False)
seconds = []
def on_update(update, metrics):
    seconds.append(metrics["seconds"])
trainer.run(on_update)
out = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "seconds_per_update": seconds}
if torch.cuda.is_available():
    out["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
open(sys.argv[2], "w").write(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes_grpo.yaml"))
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory.json"))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in SETTINGS.items():
            result = Path(tmp) / f"{len(results)}.json"
            shared = [
                f"run.out_dir={tmp}",
                f"run.name=m{len(results)}",
                f"train.updates={args.updates}",
                "train.checkpoint_every=0",
                "eval.enabled=false",
            ]
            subprocess.run(
                [sys.executable, "-c", CHILD, args.config, str(result), *shared, *overrides], check=True, cwd=ROOT
            )
            results[name] = json.loads(result.read_text())
            print(name, results[name], flush=True)
    Path(args.out).write_text(
        json.dumps({"config": args.config, "updates": args.updates, "settings": results}, indent=1) + "\n"
    )
    base = results["baseline"]["peak_rss_mib"]
    print(
        "\n| setting | peak RSS (MiB) | vs baseline | s/update (last) |"
        + (" peak GPU (MiB) |" if "peak_gpu_mib" in results["baseline"] else "")
    )
    print("|---|---|---|---|" + ("---|" if "peak_gpu_mib" in results["baseline"] else ""))
    for name, r in results.items():
        gpu = f" {r['peak_gpu_mib']:.0f} |" if "peak_gpu_mib" in r else ""
        print(
            f"| {name} | {r['peak_rss_mib']:.0f} | {r['peak_rss_mib'] / base:.2f} | "
            f"{r['seconds_per_update'][-1]:.1f} |{gpu}"
        )


if __name__ == "__main__":
    main()
