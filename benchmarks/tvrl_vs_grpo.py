"""TVRL against matched GRPO under each SDE kind (flow, dance, sage), on shapes-wan, in one run.

Both arms of a pair use the same config (configs/moving_shapes_grpo.yaml), the same reward (the question scorer's
mean p(yes) over the prompt's questions, `moving_shapes_qa`: TVRL's R), the same prompts, seeds and budget; the only
difference is TVRL's token-level credit inside the clipped ratio. After training each policy samples the held-out
split (46 prompts x 4 clips, ODE 20 steps, CFG 4.5) under every `--eval-seeds` seed, and we record the video
verifier's accuracy, the scorer's reward, and how much the parts of each clip that the base left empty changed
(mean |tuned - base| over the pixels at least 3 px from any object of the base's same-seed clip: what
token-level credit should leave alone).

    python benchmarks/tvrl_vs_grpo.py --updates 12 --seeds 0,1            # 12 runs; minutes per run in the output
    python benchmarks/tvrl_vs_grpo.py --updates 2 --kinds flow --seeds 0 --eval-seeds 2024   # smoke run

`--methods grpo` runs the GRPO arm alone; with `--override "reward=[...]"` it is video GRPO on any reward (the
verifier's dense score: `[{name: moving_shapes, weight: 1.0, params: {dense: true}}]`) over training seeds, each
gain paired with the base on the same eval seeds and given a 95% Student t interval over the training seeds.

Writes OUT/results.json and OUT/table.md (OUT = benchmarks/results/tvrl_vs_grpo).
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

from flowrl.config import load_config  # noqa: E402
from flowrl.inference import generate_samples  # noqa: E402
from flowrl.policies.base import SampleSpec  # noqa: E402
from flowrl.report import t_half_width  # noqa: E402
from flowrl.rewards import build_reward  # noqa: E402
from flowrl.train import Trainer  # noqa: E402
from flowrl.worlds.moving_shapes.prompts import eval_prompt_set  # noqa: E402
from flowrl.worlds.moving_shapes.verifier import video_accuracy  # noqa: E402

CONFIG = ROOT / "configs" / "moving_shapes_grpo.yaml"
SPEC = SampleSpec(32, 32, 9)


def background_mask(clips: np.ndarray, margin: int = 3) -> np.ndarray:
    """[N, F, H, W] True where no object pixel (any channel > 40) lies within `margin` px in that frame."""
    lit = torch.from_numpy((clips.max(-1) > 40).astype(np.float32)).flatten(0, 1)[:, None]
    near = torch.nn.functional.max_pool2d(lit, 2 * margin + 1, stride=1, padding=margin)[:, 0]
    return (near.view(clips.shape[:4]) == 0).numpy()


def evaluate(policy, scorer, seeds: list[int], base: dict | None) -> tuple[dict, dict]:
    prompts = eval_prompt_set()
    accuracy, by_tag, reward, untouched, clips_by_seed = [], [], [], [], {}
    for seed in seeds:
        samples, records = generate_samples(policy, prompts, 4, seed, 20, 4.5, SPEC, desc=None)
        clips = samples.to_uint8()
        clips_by_seed[seed] = clips
        asked = [r["prompt"] for r in records]
        verdicts = video_accuracy(clips, asked)
        accuracy.append(verdicts["overall"])
        by_tag.append(verdicts["tags"])
        with torch.no_grad():
            reward.append(float(scorer(samples.decoded(), asked).scores.mean()))
        if base is not None:
            mask = background_mask(base[seed])
            change = np.abs(clips.astype(np.float32) - base[seed].astype(np.float32)).mean(-1)
            untouched.append(float(change[mask].mean() / 255))
    metrics = {
        "accuracy": float(np.mean(accuracy)),
        "accuracy_by_seed": accuracy,
        "accuracy_by_tag": {tag: float(np.mean([t[tag] for t in by_tag])) for tag in by_tag[0]},
        "reward": float(np.mean(reward)),
        "untouched_change": float(np.mean(untouched)) if untouched else 0.0,
    }
    return metrics, clips_by_seed


def run(kind: str, algorithm: str, seed: int, args, scorer, base: dict) -> dict:
    name = f"{kind}_{algorithm}_s{seed}"
    overrides = [
        f"run.name={name}",
        f"run.out_dir={args.out / 'runs'}",
        f"run.seed={seed}",
        f"train.updates={args.updates}",
        f"train.groups_per_update={args.groups}",
        f"train.group_size={args.group_size}",
        "train.checkpoint_every=0",
        "eval.enabled=false",
        f"sampler.kind={kind}",
        f"algorithm.name={algorithm}",
        "reward=[{name: moving_shapes_qa, weight: 1.0}]",
    ] + list(args.override)
    config = load_config(CONFIG, overrides)
    shutil.rmtree(Path(config.run.out_dir) / name, ignore_errors=True)  # a fresh run, never a resume
    trainer = Trainer(config, log=False)
    seconds, train_reward = [], []  # per update: its time and its rollouts' mean training reward

    def on_update(update: int, metrics: dict) -> None:
        seconds.append(metrics["seconds"])
        train_reward.append(metrics["reward_mean"])

    trainer.run(on_update)
    metrics, _ = evaluate(trainer.policy, scorer, args.eval_seeds, base)
    return {
        "kind": kind,
        "algorithm": algorithm,
        "seed": seed,
        "train_seconds": sum(seconds),
        "train_reward": train_reward,
        **metrics,
    }


def first_and_last(values: list[float], share: float = 0.1) -> str:
    """The mean of the first and of the last `share` of a run's per-update values ("a -> b")."""
    k = max(1, round(share * len(values)))
    return f"{np.mean(values[:k]):.3f} -> {np.mean(values[-k:]):.3f}"


def gain_interval(gains: list[float]) -> str:
    """The mean gain in points and, over two or more training seeds, its 95% Student t half-width."""
    points = 100 * np.asarray(gains)
    half = t_half_width(points)
    return f"{points.mean():+.1f}" + (f" +- {half:.1f}" if half is not None else "")


def table(base: dict, rows: list[dict]) -> str:
    lines = [
        f"base: accuracy {base['accuracy']:.3f}, scorer reward {base['reward']:.3f}",
        "",
        "| SDE kind | method | held-out accuracy (mean over training seeds) | gain, points (95% over training seeds) "
        "| per training seed | scorer reward | untouched-region change | training reward, first -> last tenth "
        "| s / run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    arms: dict[tuple[str, str], list[dict]] = {}  # (SDE kind, method) -> its training seeds' rows, in run order
    for r in rows:
        arms.setdefault((r["kind"], r["algorithm"]), []).append(r)
    for (kind, algorithm), rs in arms.items():
        accs = [r["accuracy"] for r in rs]
        lines.append(
            f"| {kind} | {algorithm} | {np.mean(accs):.3f} | "
            f"{gain_interval([a - base['accuracy'] for a in accs])} | "
            f"{', '.join(f'{a:.3f}' for a in accs)} | {np.mean([r['reward'] for r in rs]):.3f} | "
            f"{np.mean([r['untouched_change'] for r in rs]):.4f} | "
            f"{', '.join(first_and_last(r['train_reward']) for r in rs if 'train_reward' in r) or '-'} | "
            f"{np.mean([r['train_seconds'] for r in rs]):.0f} |"
        )
    tags = list(base["accuracy_by_tag"])
    lines += ["", "| SDE kind | method | " + " | ".join(tags) + " |", "|---|---|" + "---|" * len(tags)]
    lines.append("| | base | " + " | ".join(f"{base['accuracy_by_tag'][t]:.2f}" for t in tags) + " |")
    for (kind, algorithm), rs in arms.items():
        means = [np.mean([r["accuracy_by_tag"][t] for r in rs]) for t in tags]
        lines.append(f"| {kind} | {algorithm} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="flow,dance,sage")
    parser.add_argument("--methods", default="grpo,tvrl", help="which arms: grpo, tvrl or both")
    parser.add_argument("--seeds", default="0,1", help="training seeds")
    parser.add_argument("--eval-seeds", default="2024,1,2")
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--groups", type=int, default=8, help="groups (prompts) per update")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--pipeline", default="pipelines/shapes-wan")
    parser.add_argument("--override", action="append", default=[], help="key=value for every run's config")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tvrl_vs_grpo")
    args = parser.parse_args()
    args.eval_seeds = [int(s) for s in args.eval_seeds.split(",")]
    args.override = [f"pipeline.path={args.pipeline}"] + args.override
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)

    scorer = build_reward("moving_shapes_qa")
    base_trainer = Trainer(
        load_config(
            CONFIG, [f"run.out_dir={args.out / 'runs'}", "run.name=base", "eval.enabled=false", *args.override]
        ),
        log=False,
    )
    base_metrics, base_clips = evaluate(base_trainer.policy, scorer, args.eval_seeds, None)
    del base_trainer
    print(f"base: accuracy {base_metrics['accuracy']:.3f}  reward {base_metrics['reward']:.3f}", flush=True)
    rows = []
    for kind in args.kinds.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            for algorithm in args.methods.split(","):
                started = time.time()
                rows.append(run(kind, algorithm, seed, args, scorer, base_clips))
                r = rows[-1]
                print(
                    f"{kind:6s} {algorithm:5s} seed {seed}: accuracy {r['accuracy']:.3f}  reward {r['reward']:.3f}  "
                    f"untouched change {r['untouched_change']:.4f}  ({time.time() - started:.0f} s)",
                    flush=True,
                )
                (args.out / "results.json").write_text(
                    json.dumps(
                        {"base": base_metrics, "runs": rows, "args": {k: str(v) for k, v in vars(args).items()}},
                        indent=2,
                    )
                )
    text = table(base_metrics, rows)
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
