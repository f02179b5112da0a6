"""Where do one process and two part? The tiny shapes run of the two-process tests (2 updates, 2 optimizer steps each,
AdamW at lr 1e-3), trained on one process and on two gloo processes (DDP), compared stage by stage: rollouts,
log-probs, rewards, advantages, gradients before clipping, weights after each step (the largest difference over the
largest value, as the tests' assert_trains_as_one measures it).

Each arm sets the reward (the JPEG size, which rounds, or mean brightness, which is smooth) and which side computes
with the tests' OTHER_KERNELS (MKL's compatible code path, oneDNN on SSE4.1), as another CPU rounds otherwise:

    python benchmarks/process_equivalence.py            # ~2 minutes on 2 CPU cores
Writes benchmarks/results/process_equivalence.json and prints a table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from run_helpers import (  # noqa: E402
    OTHER_KERNELS,
    SMOOTH_REWARD,
    child_env,
    tiny_run_config,
    train_on_two_processes,
    two_process_trace,
)
from safetensors.torch import load_file  # noqa: E402

ONE_PROCESS = """
import sys
from run_helpers import traced_run
from safetensors.torch import save_file
save_file(traced_run(sys.argv[1], sys.argv[3:])[1], sys.argv[2])
"""

# (name, reward override, the side with other kernels)
ARMS = [
    ("jpeg, same kernels", [], None),
    ("jpeg, one process on other kernels", [], "one"),
    ("brightness, one process on other kernels", [SMOOTH_REWARD], "one"),
    ("brightness, two processes on other kernels", [SMOOTH_REWARD], "two"),
]


def parted(one: dict, two: dict) -> dict[str, float]:
    return {k: ((one[k] - two[k]).abs().max() / one[k].abs().max().clamp_min(1e-30)).item() for k in one}


def main() -> None:
    from tiny_pipelines import tiny_shapes_sd3

    results = {}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        tiny_shapes_sd3().save_pretrained(tmp / "pipe")
        config = tiny_run_config(tmp / "d.yaml", tmp / "pipe", tmp / "runs", "d", updates=2, checkpoint_every=0)
        for index, (name, reward, other) in enumerate(ARMS):
            overrides = list(reward)
            env = child_env(**(OTHER_KERNELS if other == "one" else {}))
            single = tmp / f"one{index}.safetensors"
            subprocess.run(
                [sys.executable, "-c", ONE_PROCESS, str(config), str(single), *overrides, f"run.name=one{index}"],
                cwd=ROOT,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            out = tmp / f"two{index}.safetensors"
            two = [*overrides, f"run.name=two{index}"]
            train_on_two_processes(config, out, 29651 + index, two, other_kernels=other == "two")
            results[name] = parted(load_file(single), two_process_trace(out))
    stages = list(next(iter(results.values())))
    print(f"{'stage':14s}" + "".join(f"{name[:26]:>28s}" for name in results))
    for stage in stages:
        print(f"{stage:14s}" + "".join(f"{figures[stage]:28.1e}" for figures in results.values()))
    out = ROOT / "benchmarks/results/process_equivalence.json"
    out.write_text(json.dumps({"cpu": cpu_model(), "arms": results}, indent=1))
    print(f"wrote {out}")


def cpu_model() -> str:
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Model name")), "?")


if __name__ == "__main__":
    main()
