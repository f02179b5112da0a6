"""Edit RL rewards on the same work: the edit verifier's dense reward vs a per-sample audit vs the ARRO group rubric.

Every variant trains configs/shapes_edit_grpo.yaml (Flow-GRPO on pipelines/shapes-kontext; same training
instructions, LoRA, learning rate, 8 items x 8 edits per update), or the edit config --config names (e.g.
configs/shapes_edit_nft.yaml), with each training seed; only the reward differs:

- verifier: `shapes_edit` (dense: 0.5 requested change made + 0.5 the share of the other objects kept);
- audit: `edit_rubric` with mode sample (each candidate scored against its own verified issues);
- rubric: `edit_rubric` with mode group (the group's merged, verified issues; one rubric for all its candidates).

Before training and after the last update the policy edits the held-out eval items (80 items x 4 edits, ODE 20
steps) under each eval seed; we record edit success (with its 95% interval, scenes as the sampling unit), the
off-target pixel change and its ratio to the base's, and the EditScore analogues SC, PQ and Overall
(flowrl/worlds/shapes_edit/verifier.py).

    python benchmarks/compare_edit_rewards.py                 # 3 rewards x 2 seeds, shipped config
    python benchmarks/compare_edit_rewards.py --rewards verifier --seeds 0 --updates 2 --eval-seeds 2024 --out /tmp/e
    python benchmarks/compare_edit_rewards.py --checkpoint RUN/checkpoints/update_000150 --out OUT   # judge only

`--checkpoint` judges a trained checkpoint against the base on the same protocol without training (e.g. a run
chosen on the val split, judged on the eval split), into OUT/checkpoint_eval.json.

Writes OUT/results.json and OUT/table.md (OUT = benchmarks/results/compare_edit_rewards).
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
from flowrl.experiment import evaluate  # noqa: E402
from flowrl.tasks.base import interval  # noqa: E402
from flowrl.train import Trainer  # noqa: E402

REWARDS = {
    "verifier": "[{name: shapes_edit, params: {dense: true}}]",
    "audit": "[{name: edit_rubric, params: {mode: sample}}]",
    "rubric": "[{name: edit_rubric, params: {mode: group}}]",
}
METRICS = ("off_target", "sc", "pq", "editscore", "requested", "preserved")


def config_for(reward: str, seed: int, args):
    overrides = [
        f"run.name={reward}_seed{seed}",
        f"run.out_dir={args.out / 'runs'}",
        f"run.seed={seed}",
        f"reward={REWARDS[reward]}",
        "train.checkpoint_every=0",
        "eval.every=0",
        *args.override,
    ]
    if args.updates is not None:
        overrides.append(f"train.updates={args.updates}")
    return load_config(args.config, overrides)


def measure(trainer: Trainer, eval_seeds: list[int], desc: str) -> dict:
    """Per eval seed: success (with its interval), per-kind success and the other metrics' overall means."""
    out = {}
    for seed in eval_seeds:
        trainer.config.eval.seed = seed
        result, _, _ = evaluate(trainer, f"{desc} eval seed {seed}")
        out[str(seed)] = {
            "success": result["overall"],
            "interval": interval(result),
            "tags": result["tags"],
            **{k: result["metrics"][k]["overall"] for k in METRICS},
        }
    return out


def weights_fingerprint(pipeline: str) -> str:
    """sha256 over the pipeline's weight files: a stored base is reused only for the same weights."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(Path(pipeline).rglob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def mean_over_seeds(point: dict, key: str) -> float:
    return float(np.mean([v[key] for v in point.values()]))


def run_one(reward: str, seed: int, args, base: dict | None) -> dict:
    config = config_for(reward, seed, args)
    shutil.rmtree(Path(config.run.out_dir) / config.run.name, ignore_errors=True)  # a fresh run, never a resume
    trainer = Trainer(config, log=False)
    base = base or measure(trainer, args.eval_seeds, f"{reward} base")
    history = []

    def on_update(update, metrics):
        history.append({"update": update, **{k: float(v) for k, v in metrics.items()}})
        if update % 10 == 0:
            print(
                f"  {reward} seed {seed} {update:3d}: train reward {metrics['reward_mean']:.3f} "
                f"({metrics['seconds']:.1f} s)",
                flush=True,
            )

    started = time.time()
    trainer.run(on_update)
    train_seconds = time.time() - started
    final = measure(trainer, args.eval_seeds, f"{reward} final")
    return {
        "reward": reward,
        "seed": seed,
        "base": base,
        "final": final,
        "history": history,
        "train_seconds": train_seconds,
        "seconds_per_update": float(np.mean([h["seconds"] for h in history])),
        "config": config_to_dict(config),
    }


def judge_checkpoint(args) -> None:
    """The base, then the checkpoint's trained weights, under each eval seed: the same `measure` a run ends with."""
    from flowrl.checkpoint import load_trained_weights

    trainer = Trainer(config_for("verifier", 0, args), log=False)
    base = measure(trainer, args.eval_seeds, "base")
    load_trained_weights(trainer.policy, args.checkpoint)
    final = measure(trainer, args.eval_seeds, "checkpoint")
    result = {
        "checkpoint": str(args.checkpoint),
        "eval_prompts": trainer.config.eval.prompts,
        "base": base,
        "final": final,
    }
    (args.out / "checkpoint_eval.json").write_text(json.dumps(result, indent=2) + "\n")
    for key in ("success", "off_target"):
        print(
            f"{key}: base {mean_over_seeds(base, key):.4f} -> {mean_over_seeds(final, key):.4f} (mean of eval "
            f"seeds {', '.join(map(str, args.eval_seeds))})"
        )
    print(f"written to {args.out / 'checkpoint_eval.json'}")


def write_table(runs: list[dict], path: Path) -> str:
    lines = [
        "| reward | training seeds | edit success (base -> final, 95% +-) | per seed | off-target (x base) | "
        "SC | PQ | Overall | s / update |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for reward in dict.fromkeys(r["reward"] for r in runs):
        mine = [r for r in runs if r["reward"] == reward]
        base = mine[0]["base"]
        finals = [mean_over_seeds(r["final"], "success") for r in mine]
        half = float(np.mean([mean_over_seeds(r["final"], "interval") for r in mine]))
        off = [mean_over_seeds(r["final"], "off_target") / mean_over_seeds(base, "off_target") for r in mine]

        def pair(key, digits=2):
            return (
                f"{mean_over_seeds(base, key):.{digits}f} -> "
                f"{np.mean([mean_over_seeds(r['final'], key) for r in mine]):.{digits}f}"
            )

        lines.append(
            f"| {reward} | {len(mine)} | {mean_over_seeds(base, 'success'):.3f} -> {np.mean(finals):.3f} "
            f"(+-{half:.3f}) | {', '.join(f'{f:.3f}' for f in finals)} | {pair('off_target', 4)} "
            f"({np.mean(off):.2f}) | {pair('sc')} | {pair('pq')} | {pair('editscore')} | "
            f"{np.mean([r['seconds_per_update'] for r in mine]):.1f} |"
        )
    text = (
        "\n".join(lines) + "\n\n(finals: mean over training seeds of the mean over eval seeds; 95% +- is one "
        "run's interval, scenes as the sampling unit)\n"
    )
    path.write_text(text)
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rewards", default=",".join(REWARDS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--eval-seeds", default="2024,2025,2026")
    parser.add_argument(
        "--config",
        type=Path,
        default=ROOT / "configs" / "shapes_edit_grpo.yaml",
        help="the edit RL config every variant trains (e.g. configs/shapes_edit_nft.yaml)",
    )
    parser.add_argument("--updates", type=int, default=None, help="default: the config's")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compare_edit_rewards")
    parser.add_argument("--override", nargs="*", default=[], help="key=value applied to every run")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="judge this checkpoint against the base (no training) into OUT/checkpoint_eval.json",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    rewards = [r.strip() for r in args.rewards.split(",") if r.strip()]
    unknown = [r for r in rewards if r not in REWARDS]
    if unknown:
        parser.error(f"--rewards: unknown {unknown}; known: {list(REWARDS)}")
    args.eval_seeds = [int(s) for s in args.eval_seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.checkpoint is not None:
        return judge_checkpoint(args)
    results_path = args.out / "results.json"
    runs = json.loads(results_path.read_text())["runs"] if results_path.is_file() else []
    # runs of other weights (an earlier editor) or eval seeds are dropped: their base and gains are not this one's
    weights = weights_fingerprint(config_for(rewards[0], 0, args).pipeline.path)
    kept = [r for r in runs if r.get("weights") == weights and list(r["base"]) == [str(s) for s in args.eval_seeds]]
    if len(kept) < len(runs):
        print(f"dropping {len(runs) - len(kept)} stored runs of other pipeline weights or eval seeds", flush=True)
    runs = kept
    base = runs[0]["base"] if runs else None
    for reward in rewards:
        for seed in [int(s) for s in args.seeds.split(",")]:
            print(f"{reward} seed {seed}", flush=True)
            run = {**run_one(reward, seed, args, base), "weights": weights}
            base = run["base"]  # every LoRA starts at zero: one base for all
            runs = [r for r in runs if (r["reward"], r["seed"]) != (reward, seed)] + [run]
            results_path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")  # nothing lost if a later run fails
    print(write_table(runs, args.out / "table.md"))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
