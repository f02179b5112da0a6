"""Every image method on the same work, side by side, in one run.

Each method runs its shipped config (configs/shapes_<method>.yaml: shapes-sd3 for the flow methods, shapes-sd for
DDPO, which is defined on DDIM) with the same learned reward (the shapes scorer, `shapes_clip`), training prompts
and seeds, LoRA, optimizer, learning rate and samples per update (4 prompts x 8) overriding it. Every
`--eval-every` updates each method's policy samples the eval split (36 prompts x 4, fixed seeds, deterministic
sampler, CFG 4.5) and we record the learned reward, the
verifier's accuracy, the RMS pixel distance to the base model's same-seed samples and the within-prompt pixel
diversity, against updates and against training wall-clock (evaluation time excluded).

    python benchmarks/compare_algorithms.py            # ~40 min on 2 CPU cores
    python benchmarks/compare_algorithms.py --updates 4 --eval-every 2 --algorithms grpo,mend   # smoke run

Writes OUT/results.json, OUT/table.md and OUT/curves.png (OUT = benchmarks/results/compare_algorithms).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import RunConfig, config_to_dict, load_config  # noqa: E402
from flowrl.report import figure  # noqa: E402
from flowrl.rewards import build_reward  # noqa: E402
from flowrl.train import Trainer  # noqa: E402
from flowrl.worlds.shapes.protocol import evaluate_policy  # noqa: E402

METHODS = {
    name: ROOT / "configs" / f"shapes_{name}.yaml" for name in ("grpo", "nft", "refl", "draft", "mend", "ddpo", "dho")
}


def method_config(name: str, updates: int, out: Path, seed: int, extra: list[str] = ()) -> RunConfig:
    """The method's shipped config with the shared budget, reward and seed of the comparison (and `extra`)."""
    shared = [
        f"run.name={name}",
        f"run.out_dir={out / 'runs'}",
        f"run.seed={seed}",
        f"train.updates={updates}",
        "train.groups_per_update=4",
        "train.group_size=8",
        "optim.lr=1.0e-3",
        "optim.lr_schedule=cosine",
        "memory.microbatch_size=32",
        "train.checkpoint_every=0",
        "lora.rank=16",
        "lora.alpha=32",
        "eval.enabled=false",
        "reward=[{name: shapes_clip, weight: 1.0}]",
    ]
    return load_config(METHODS[name], shared + list(extra))


class Evaluator:
    """The shared eval protocol (flowrl.worlds.shapes.protocol), remembering each pipeline's base samples."""

    def __init__(self):
        self.scorer = build_reward("shapes_clip")
        self.base: dict[str, np.ndarray] = {}

    def __call__(self, policy, pipeline_path: str, desc: str) -> dict:
        metrics, images = evaluate_policy(policy, self.scorer, self.base.get(pipeline_path))
        if pipeline_path not in self.base:
            self.base[pipeline_path] = images
            metrics["distance_to_base"] = 0.0
        return metrics


def run_method(name: str, args, evaluator: Evaluator) -> dict:
    config = method_config(name, args.updates, args.out, args.seed, args.override)
    shutil.rmtree(Path(config.run.out_dir) / name, ignore_errors=True)  # a fresh run, never a resume
    trainer = Trainer(config, log=False)
    path = config.pipeline.path
    curve = [{"update": 0, "train_seconds": 0.0, **evaluator(trainer.policy, path, f"{name} base")}]
    clock = {"train": 0.0}
    history = []  # every update's training metrics (reward, loss, the method's diagnostics)

    def on_update(update, metrics):
        clock["train"] += metrics["seconds"]
        history.append({"update": update, **{k: float(v) for k, v in metrics.items()}})
        if update % args.eval_every == 0 or update == args.updates:
            point = {
                "update": update,
                "train_seconds": clock["train"],
                "train_reward": metrics["reward_mean"],
                **evaluator(trainer.policy, path, f"{name} eval {update}"),
            }
            curve.append(point)
            print(
                f"  {name} {update:4d}: learned {point['learned_reward']:.3f}  acc {point['accuracy']:.3f}  "
                f"dist {point['distance_to_base']:.3f}  div {point['diversity']:.3f}  ({clock['train']:.0f} s)",
                flush=True,
            )

    started = time.time()
    trainer.run(on_update)
    return {
        "pipeline": path,
        "curve": curve,
        "history": history,
        "seconds_per_update": clock["train"] / args.updates,
        "wall_seconds": time.time() - started,
        "config": config_to_dict(config),
    }


def updates_to_target(curve: list[dict], target: float) -> int | None:
    return next((p["update"] for p in curve if p["update"] > 0 and p["learned_reward"] >= target), None)


def write_table(results: dict, gain: float, path: Path) -> str:
    lines = [
        f"| method | pipeline | learned reward (base -> final) | eval accuracy (base -> final) | updates to "
        f"+{gain} learned reward | s / update | distance to base | diversity (base -> final) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        first, final = r["curve"][0], r["curve"][-1]
        reached = updates_to_target(r["curve"], first["learned_reward"] + gain)
        lines.append(
            f"| {name} | {Path(r['pipeline']).name} | {first['learned_reward']:.2f} -> {final['learned_reward']:.2f} "
            f"| {first['accuracy']:.3f} -> {final['accuracy']:.3f} | {reached if reached else 'not reached'} "
            f"| {r['seconds_per_update']:.1f} | {final['distance_to_base']:.3f} "
            f"| {first['diversity']:.3f} -> {final['diversity']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(results: dict, path: Path) -> None:
    title = "Image methods on the shapes world: same reward, prompts, seeds and samples per update"
    with figure(path, 2, 2, figsize=(10, 7), title=title) as (fig, axes):
        for name, r in results.items():
            if name not in METHODS:  # side runs stay in results.json and table.md; the plot shows the shipped configs
                continue
            c = r["curve"]
            for row, key in enumerate(["learned_reward", "accuracy"]):
                axes[row, 0].plot([p["update"] for p in c], [p[key] for p in c], marker="o", ms=3, label=name)
                axes[row, 1].plot(
                    [p["train_seconds"] / 60 for p in c], [p[key] for p in c], marker="o", ms=3, label=name
                )
        for row, label in enumerate(["learned reward (eval split)", "verifier accuracy (eval split)"]):
            axes[row, 0].set_ylabel(label)
            axes[row, 0].set_xlabel("updates")
            axes[row, 1].set_xlabel("training minutes (2 CPU cores)")
        axes[0, 0].legend(fontsize=8)
        for ax in axes.flat:
            ax.grid(alpha=0.3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--algorithms", default=",".join(METHODS))
    parser.add_argument("--gain", type=float, default=1.0, help="the stated target: base learned reward + GAIN")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compare_algorithms")
    parser.add_argument(
        "--override",
        nargs="*",
        default=[],
        help="key=value applied to every selected method "
        "(a side run; its results are stored under the method name plus --suffix)",
    )
    parser.add_argument("--suffix", default="", help="label suffix for side runs, e.g. ' (lr 3e-4)'")
    parser.add_argument("--replot", action="store_true", help="only rewrite table.md and curves.png from results.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.algorithms.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        parser.error(f"--algorithms: unknown {unknown}; known: {list(METHODS)}")
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    evaluator = Evaluator() if not args.replot else None
    for name in names if not args.replot else []:
        print(f"{name}{args.suffix}: {args.updates} updates", flush=True)
        results[name + args.suffix] = run_method(name, args, evaluator)
        results_path.write_text(json.dumps(results, indent=2) + "\n")  # nothing lost if a later method fails
    print(write_table(results, args.gain, args.out / "table.md"))
    plot(results, args.out / "curves.png")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
