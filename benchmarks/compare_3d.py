"""3D methods on the same work: DHO against SDE-GRPO, DiffusionNFT and Diffusion-DPO on the embedded image-to-3D
pipeline (pipelines/shapes3d-flow), and what asynchronous rollouts cost or save.

Every method runs its shipped config (configs/shapes3d_<method>.yaml: the same rewards, silhouette IoU from the
condition's view + the world's shape score; the same training conditions, LoRA, learning rate, 8 prompts x 8 samples
per update) with each training seed. Every `--eval-every` updates the policy samples the held-out eval set (64
conditions x 2, fixed seeds, 20 Euler steps, CFG 3) and we record volume IoU, Chamfer, F-score and validity against
the ground-truth solids, and the rewards on those samples. `dho_sync` is DHO with synchronous rollouts (the shipped
DHO config samples asynchronously, one version stale), for the wall-clock comparison.

    python benchmarks/compare_3d.py                     # 4 methods x 2 seeds + dho_sync, ~60 min on 2 CPU cores
    python benchmarks/compare_3d.py --updates 2 --eval-every 1 --methods dho,dpo --seeds 0 --out /tmp/c3d  # smoke

Writes OUT/results.json, OUT/table.md and OUT/curves.png (OUT = benchmarks/results/compare_3d).
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

from flowrl.config import config_to_dict, load_config  # noqa: E402
from flowrl.experiment import evaluate, in_batches, reward_scores, tag_metrics_of  # noqa: E402
from flowrl.report import figure, t_half_width  # noqa: E402
from flowrl.train import Trainer  # noqa: E402

METHODS = {"grpo": [], "nft": [], "dpo": [], "dho": [], "dho_sync": ["runtime.async_rollouts=false"]}
METRICS = ("iou", "chamfer", "fscore", "valid")


def config_for(method: str, seed: int, args):
    base = method.split("_")[0]
    overrides = [
        f"run.name={method}_seed{seed}",
        f"run.out_dir={args.out / 'runs'}",
        f"run.seed={seed}",
        f"train.updates={args.updates}",
        "train.checkpoint_every=0",
        "eval.enabled=true",
        *METHODS[method],
        *args.override,
    ]
    return load_config(ROOT / "configs" / f"shapes3d_{base}.yaml", overrides)


def measure(trainer: Trainer, desc: str) -> dict:
    result, samples, items = evaluate(trainer, desc)
    report = result["metrics"]["overall"]
    rewards = tag_metrics_of(reward_scores(trainer.reward, in_batches(samples, items, 64)), items)
    return {
        **{k: report[k] for k in METRICS},
        "eval_reward": rewards["overall"],
        "tags_iou": result["tags"],
        "iou_stderr": result["stderr"]["overall"],  # the eval's own: conditions as the sampling unit
    }


def run_one(method: str, seed: int, args, base_point: dict | None) -> dict:
    config = config_for(method, seed, args)
    shutil.rmtree(Path(config.run.out_dir) / config.run.name, ignore_errors=True)  # a fresh run, never a resume
    trainer = Trainer(config, log=False)
    base = base_point or measure(trainer, f"{method} base")
    curve = [{"update": 0, "train_seconds": 0.0, **base}]
    history, clock = [], {"train": 0.0}

    def on_update(update, metrics):
        clock["train"] += metrics["seconds"]
        history.append({"update": update, **{k: float(v) for k, v in metrics.items()}})
        if update % args.eval_every == 0 or update == args.updates:
            point = {"update": update, "train_seconds": clock["train"], **measure(trainer, f"{method} {update}")}
            curve.append(point)
            print(
                f"  {method} seed {seed} {update:3d}: IoU {point['iou']:.3f}  F {point['fscore']:.3f}  "
                f"Chamfer {point['chamfer']:.4f}  valid {point['valid']:.3f}  reward {point['eval_reward']:.3f}  "
                f"({clock['train']:.0f} s)",
                flush=True,
            )

    started = time.time()
    trainer.run(on_update)
    # an asynchronous worker samples ahead while an evaluation runs: the update after an evaluation is left out of
    # the per-update time so that evaluation never counts for or against a method
    evals = {p["update"] for p in curve}
    timed = [h["seconds"] for h in history if h["update"] - 1 not in evals or h["update"] == 1]
    return {
        "method": method,
        "seed": seed,
        "curve": curve,
        "history": history,
        "seconds_per_update": float(np.mean(timed)),
        "wall_seconds": time.time() - started,
        "config": config_to_dict(config),
    }


def summary(runs: list[dict]) -> dict:
    """Per method: base and final of every metric, mean over seeds, and the seeds' spread (max - min)."""
    out = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == method]
        row = {
            "seeds": [r["seed"] for r in mine],
            "s_per_update": float(np.mean([r["seconds_per_update"] for r in mine])),
        }
        for key in (*METRICS, "eval_reward"):
            finals = [r["curve"][-1][key] for r in mine]
            row[key] = {
                "base": mine[0]["curve"][0][key],
                "final": float(np.mean(finals)),
                "spread": float(max(finals) - min(finals)),
                "per_seed": finals,
            }
        gains = np.array([r["curve"][-1]["iou"] - r["curve"][0]["iou"] for r in mine])
        # the training seeds' 95% interval of the mean gain (Student t with n - 1 degrees of freedom)
        row["iou_gain"] = {"mean": float(gains.mean()), "seed_ci95": t_half_width(gains), "per_seed": gains.tolist()}
        row["iou_eval_ci95"] = {
            "base": 1.96 * mine[0]["curve"][0].get("iou_stderr", float("nan")),
            "final": float(np.mean([1.96 * r["curve"][-1].get("iou_stderr", float("nan")) for r in mine])),
        }
        out[method] = row
    return out


def write_table(table: dict, path: Path) -> str:
    lines = [
        "| method | seeds | volume IoU (base -> final) | IoU gain, points (seeds' 95%) | Chamfer | F-score | valid "
        "| eval reward | s / update |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method, row in table.items():
        cells = [
            f"{row[k]['base']:.3f} -> {row[k]['final']:.3f} (±{row[k]['spread'] / 2:.3f})"
            if k != "chamfer"
            else f"{row[k]['base']:.4f} -> {row[k]['final']:.4f}"
            for k in (*METRICS, "eval_reward")
        ]
        gain = row.get("iou_gain")
        if gain:
            ci = f" ± {100 * gain['seed_ci95']:.1f}" if gain["seed_ci95"] is not None else ""
            cells.insert(
                1, f"{100 * gain['mean']:+.1f}{ci} (" + ", ".join(f"{100 * g:+.1f}" for g in gain["per_seed"]) + ")"
            )
        lines.append(f"| {method} | {len(row['seeds'])} | " + " | ".join(cells) + f" | {row['s_per_update']:.2f} |")
    eval_ci = next((row["iou_eval_ci95"] for row in table.values() if "iou_eval_ci95" in row), None)
    text = "\n".join(lines) + "\n\n(final: mean over training seeds; ± half the seeds' range"
    if eval_ci:
        text += f"; one evaluation's 95% interval on IoU: ±{eval_ci['base']:.3f} (base), conditions as the unit"
    text += ")\n"
    path.write_text(text)
    return text


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    pipeline = Path(runs[0]["config"]["pipeline"]["path"]).name
    title = f"3D methods on {pipeline}: same rewards, conditions and samples per update (thin: seeds)"
    with figure(path, 2, 2, figsize=(10, 7), title=title) as (fig, axes):
        colours = dict(zip(METHODS, matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]))
        panels = [
            ("iou", "volume IoU (held-out)"),
            ("fscore", "F-score at 0.05 (held-out)"),
            ("eval_reward", "reward on held-out samples"),
        ]
        for method in dict.fromkeys(r["method"] for r in runs):
            mine = [r for r in runs if r["method"] == method]
            for ax, (key, label) in zip(axes.flat, panels):
                for r in mine:
                    ax.plot(
                        [p["update"] for p in r["curve"]],
                        [p[key] for p in r["curve"]],
                        color=colours[method],
                        alpha=0.3,
                        lw=1,
                    )
                xs = [p["update"] for p in mine[0]["curve"]]
                ax.plot(
                    xs,
                    np.mean([[p[key] for p in r["curve"]] for r in mine], 0),
                    color=colours[method],
                    marker="o",
                    ms=3,
                    label=method,
                )
                ax.set_ylabel(label)
                ax.set_xlabel("update")
            ax = axes[1, 1]
            for r in mine:
                rewards = [h["reward_mean"] for h in r["history"]]
                k = max(1, len(rewards) // 10)
                ax.plot(
                    np.arange(k, len(rewards) + 1),
                    np.convolve(rewards, np.ones(k) / k, mode="valid"),
                    color=colours[method],
                    alpha=0.6,
                    lw=1,
                    label=method if r is mine[0] else None,
                )
            ax.set_ylabel(f"train reward ({k}-update mean)")
            ax.set_xlabel("update")
        axes[0, 0].legend(fontsize=8)
        axes[1, 1].legend(fontsize=8)
        for ax in axes.flat:
            ax.grid(alpha=0.3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compare_3d")
    parser.add_argument("--override", nargs="*", default=[], help="key=value applied to every run")
    parser.add_argument("--replot", action="store_true", help="only rewrite table.md and curves.png")
    args = parser.parse_args()
    torch.set_num_threads(2)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {list(METHODS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    runs = json.loads(results_path.read_text())["runs"] if results_path.is_file() else []
    base_point = next((r["curve"][0] for r in runs), None)  # every LoRA starts at zero: one base for all
    for method in methods if not args.replot else []:
        for seed in [int(s) for s in args.seeds.split(",")]:
            print(f"{method} seed {seed}: {args.updates} updates", flush=True)
            run = run_one(method, seed, args, base_point)
            base_point = base_point or {
                k: v for k, v in run["curve"][0].items() if k not in ("update", "train_seconds")
            }
            runs = [r for r in runs if (r["method"], r["seed"]) != (method, seed)] + [run]
            results_path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")  # nothing lost if a later run fails
    table = summary(runs)
    (args.out / "summary.json").write_text(json.dumps(table, indent=2) + "\n")
    print(write_table(table, args.out / "table.md"))
    plot(runs, args.out / "curves.png")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
