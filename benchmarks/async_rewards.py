"""Wall-clock saved by asynchronous scoring on the main job: the same config with the rollout in two chunks, scored
right after each chunk (sync), in a worker thread while the next chunk samples (async), or so with the reward in a
child process of its own (async_process: `reward[i].process: true`), side by side in one run (alternating, several
rounds), reporting seconds per update for the collect phase (rollout + reward) and the ratios to sync.

    python benchmarks/async_rewards.py [--rounds 3] [--updates 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import load_config  # noqa: E402
from flowrl.train import Trainer  # noqa: E402


def collect_seconds(trainer: Trainer, updates: int) -> list[float]:
    times = []
    for update in range(updates):
        started = time.perf_counter()
        trainer.collect(update)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes_grpo.yaml"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "async_rewards.json"))
    args = parser.parse_args()
    shared = ["eval.enabled=false", "memory.rollout_microbatch=32", "run.out_dir=/tmp/flowrl_async_bench"]
    modes = {
        "sync": [],
        "async": ["runtime.async_rewards=true"],
        "async_process": [
            "runtime.async_rewards=true",
            "reward=[{name: shapes, params: {dense: true}, process: true}]",
        ],
    }
    trainers = {mode: Trainer(load_config(args.config, shared + extra), log=False) for mode, extra in modes.items()}
    for trainer in trainers.values():  # warm-up
        collect_seconds(trainer, 1)
    seconds = {mode: [] for mode in trainers}
    for _ in range(args.rounds):
        for mode, trainer in trainers.items():
            seconds[mode] += collect_seconds(trainer, args.updates)
    mean = {mode: sum(v) / len(v) for mode, v in seconds.items()}
    result = {
        "seconds_per_collect": mean,
        "async_over_sync": mean["async"] / mean["sync"],
        "async_process_over_sync": mean["async_process"] / mean["sync"],
        "samples": seconds,
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
