"""Alignment against diversity: DDPO on all steps, DDPO on the latter (low-noise) steps only, incremental
Feynman-Kac training (per-step credit + growing early-first windows), and FK steering at sampling time on the base
model, each at several budgets, on the epsilon-prediction shapes-sd pipeline with the learned reward.

Training methods share configs/shapes_ddpo.yaml with the learned reward and 4 prompts x 8 samples per update;
their budget is the number of updates (evaluated at every --eval-every). FK steering's budget is its particle
count. Each point samples the eval split (36 prompts x 4, fixed seeds) and records the learned reward, verifier
accuracy, and within-prompt diversity (pixel and scorer-feature distance, Vendi score, colour entropy and
position spread of the attributes a prompt leaves open).

    python benchmarks/alignment_diversity.py            # ~15 min on 2 CPU cores

Writes OUT/results.json, OUT/table.md and OUT/tradeoff.png (OUT = benchmarks/results/alignment_diversity).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import load_config  # noqa: E402
from flowrl.fk import FKConfig  # noqa: E402
from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.report import figure  # noqa: E402
from flowrl.rewards import build_reward  # noqa: E402
from flowrl.train import Trainer  # noqa: E402
from flowrl.worlds.shapes.protocol import evaluate_policy  # noqa: E402

TRAINED = {
    "ddpo (all steps)": [],
    "ddpo latter-only": ["algorithm.params.window_schedule=latter", "algorithm.params.window_size=3"],
    "incremental FK": [
        "algorithm.params.credit=incremental",
        "algorithm.params.window_schedule=incremental",
        "algorithm.params.window_size=3",
    ],
}
PIPELINE = "pipelines/shapes-sd"


def train_points(label: str, overrides: list[str], args, scorer) -> list[dict]:
    name = label.replace(" ", "_").replace("(", "").replace(")", "")
    shared = [
        f"run.name={name}",
        f"run.out_dir={args.out / 'runs'}",
        f"train.updates={args.updates}",
        "train.groups_per_update=4",
        "train.group_size=8",
        "train.checkpoint_every=0",
        "eval.enabled=false",
        "algorithm.params.timestep_fraction=1.0",
        "reward=[{name: shapes_clip, weight: 1.0}]",
    ]
    config = load_config(ROOT / "configs" / "shapes_ddpo.yaml", shared + overrides)
    shutil.rmtree(Path(config.run.out_dir) / name, ignore_errors=True)
    trainer = Trainer(config, log=False)
    points, clock = [], {"train": 0.0}

    def on_update(update, metrics):
        clock["train"] += metrics["seconds"]
        if update % args.eval_every == 0:
            point = {"budget": update, "train_seconds": clock["train"], **evaluate_policy(trainer.policy, scorer)[0]}
            points.append(point)
            print(
                f"  {label} {update}: reward {point['learned_reward']:.3f}  acc {point['accuracy']:.3f}  "
                f"div {point['diversity']:.3f}  vendi {point['vendi']:.3f}",
                flush=True,
            )

    trainer.run(on_update)
    return points


def fk_points(args, scorer) -> list[dict]:
    policy = policy_for(load_pipeline(ROOT / PIPELINE))
    points = []
    for k in args.particles:
        started = time.time()
        fk = FKConfig(num_particles=k, lam=args.fk_lambda, potential="diff", resample_every=2)
        metrics, _ = evaluate_policy(policy, scorer, kind="ddim", noise_level=1.0, fk=fk, fk_reward=scorer)
        points.append({"budget": k, "sample_seconds": time.time() - started, **metrics})
        print(
            f"  FK steering k={k}: reward {metrics['learned_reward']:.3f}  acc {metrics['accuracy']:.3f}  "
            f"div {metrics['diversity']:.3f}  vendi {metrics['vendi']:.3f}",
            flush=True,
        )
    return points


def write_table(base: dict, results: dict, path: Path) -> str:
    columns = [
        "learned_reward",
        "accuracy",
        "diversity",
        "feature_diversity",
        "vendi",
        "colour_entropy",
        "position_spread",
    ]
    lines = [
        "| method | budget | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
        "| base (DDIM, eta 0) | - | " + " | ".join(f"{base[c]:.3f}" for c in columns) + " |",
    ]
    for label, points in results.items():
        unit = "particles" if label.startswith("FK") else "updates"
        for p in points:
            lines.append(f"| {label} | {p['budget']} {unit} | " + " | ".join(f"{p[c]:.3f}" for c in columns) + " |")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(base: dict, results: dict, path: Path) -> None:
    title = "Alignment vs diversity on shapes-sd (labels: updates, or particles for FK steering)"
    with figure(path, 1, 2, figsize=(11, 4.2), title=title) as (fig, axes):
        for ax, diversity in zip(axes, ["diversity", "vendi"]):
            ax.scatter([base[diversity]], [base["learned_reward"]], color="black", marker="*", s=120, label="base")
            for label, points in results.items():
                ax.plot([p[diversity] for p in points], [p["learned_reward"] for p in points], marker="o", label=label)
                for p in points:
                    ax.annotate(
                        str(p["budget"]),
                        (p[diversity], p["learned_reward"]),
                        fontsize=7,
                        textcoords="offset points",
                        xytext=(3, 3),
                    )
            ax.set_xlabel(
                {"diversity": "within-prompt pixel distance", "vendi": "within-prompt Vendi score (scorer features)"}[
                    diversity
                ]
            )
            ax.set_ylabel("learned reward (eval split)")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument(
        "--particles",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8],
        help="FK particle counts (1 = plain stochastic DDIM, the no-steering reference)",
    )
    parser.add_argument("--fk-lambda", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "alignment_diversity")
    args = parser.parse_args()
    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    scorer = build_reward("shapes_clip")
    started = time.time()
    base, _ = evaluate_policy(policy_for(load_pipeline(ROOT / PIPELINE)), scorer)
    results = {}
    for label, overrides in TRAINED.items():
        print(f"{label}: {args.updates} updates", flush=True)
        results[label] = train_points(label, overrides, args, scorer)
    print(f"FK steering at sampling time, lambda {args.fk_lambda}", flush=True)
    results["FK steering (sampling)"] = fk_points(args, scorer)
    (args.out / "results.json").write_text(
        json.dumps({"base": base, "results": results, "minutes": (time.time() - started) / 60}, indent=2) + "\n"
    )
    print(write_table(base, results, args.out / "table.md"))
    plot(base, results, args.out / "tradeoff.png")
    print(f"{(time.time() - started) / 60:.1f} minutes; written to {args.out}")


if __name__ == "__main__":
    main()
