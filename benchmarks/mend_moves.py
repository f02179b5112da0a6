"""Where MEND's signal goes: are its accepted moves good, and does the policy learn them?

MEND (flowrl/algorithms/mend.py) with final-sample moves (`move_space: final`, the shipped config before
prediction moves) moves each below-cap sample's final latent x0 by an accepted step delta along the
learned reward's gradient, then regresses the velocity onto the trajectory shifted to end at x0 + delta. Two
questions, measured on the rollouts of configs/shapes_mend.yaml (its first `--batches` updates' prompts and seeds):

1. Moves: for the moved samples, the learned reward (shapes_clip) and the rule-based verifier (verdict and dense
   score) of decode(x0) against decode(x0 + delta). If the verifier does not rise here, no regression can help.
2. Learning: the loop's optimizer fits the first batch's targets for `--fit-steps` steps; the same prompts and seeds
   are then sampled again. Reported: the cosine between each moved sample's endpoint shift and its delta, the
   shift's size relative to delta, how far the unmoved samples drift, and the learned reward before and after.
   The regression did its job when the shift lines up with delta (cosine near 1, size ratio near 1). A control
   fits one shared move (the same random latent, at the moves' RMS, for every moved sample) on a fresh policy.

    python benchmarks/mend_moves.py                       # ~2 min on 2 CPU cores
    python benchmarks/mend_moves.py --target-states shifted   # the reference's exact-path targets

With --save, adds the run to benchmarks/results/mend_moves.json under its --target-states.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import load_config  # noqa: E402
from flowrl.images import to_uint8  # noqa: E402
from flowrl.rewards import latent_scorer  # noqa: E402
from flowrl.train import Trainer  # noqa: E402
from flowrl.worlds.shapes import verifier  # noqa: E402


def moved_rows(delta: torch.Tensor) -> list[int]:
    return torch.nonzero(delta.flatten(1).abs().amax(1) > 0).flatten().tolist()


@torch.no_grad()
def judge_latents(trainer: Trainer, latents: torch.Tensor, prompts: list[str]) -> dict[str, list[float]]:
    judged = [verifier.verdict_and_dense(im, p) for im, p in zip(to_uint8(trainer.policy.decode(latents)), prompts)]
    learned = latent_scorer(trainer.policy, trainer.algorithm.reward)(latents, prompts).float()
    return {"learned": learned.tolist(), "verdict": [v for v, _ in judged], "dense": [d for _, d in judged]}


def fit_curve(trainer: Trainer, batch, items, delta: torch.Tensor, fit_steps: int) -> list[dict]:
    """Optimizer steps on one batch's MEND targets; at a few step counts, resample its seeds and compare."""
    trainer.algorithm.delta = delta.clone()  # the moves of this batch (prepare() of a later batch replaced them)
    rows = moved_rows(delta)
    still = [i for i in range(len(delta)) if i not in rows]
    x0, d = batch.trajectory.final, delta
    checkpoints = sorted({1, max(1, fit_steps // 4), max(1, fit_steps // 2), fit_steps})
    curve = []
    for step in range(1, fit_steps + 1):
        metrics = trainer.optimize(batch, items, 0)
        if step not in checkpoints:
            continue
        again, _ = trainer.collect(0)  # update 0's prompts and seeds, sampled by the updated policy
        shift = (again.trajectory.final - x0).flatten(1)
        cosine = torch.nn.functional.cosine_similarity(shift[rows], d[rows].flatten(1), dim=1)
        curve.append(
            {
                "fit_steps": step,
                "loss": metrics["loss"],
                "cosine_shift_delta": cosine.mean().item(),
                "shift_over_delta": (shift[rows].norm(dim=1) / d[rows].flatten(1).norm(dim=1)).mean().item(),
                "unmoved_drift_rms": shift[still].pow(2).mean().sqrt().item() if still else 0.0,
                "delta_rms": d[rows].pow(2).mean().sqrt().item(),
                "learned_moved_before": batch.rewards[rows].mean().item(),
                "learned_moved_after": again.rewards[rows].mean().item(),
            }
        )
    return curve


def mean(values: list[float]) -> float:
    return sum(values) / max(len(values), 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=3, help="rollout batches for question 1")
    parser.add_argument("--groups", type=int, default=8, help="prompt groups per batch (8 samples each)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--fit-steps", type=int, default=20)
    parser.add_argument(
        "--target-states",
        choices=["stored", "shifted"],
        default="stored",
        help="where the velocity regresses onto MEND's targets (algorithm.params.target_states)",
    )
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    config = load_config(
        ROOT / "configs" / "shapes_mend.yaml",
        [
            "run.out_dir=/tmp/flowrl_mend_moves",
            f"train.groups_per_update={args.groups}",
            "eval.enabled=false",
            "train.checkpoint_every=0",
            f"optim.lr={args.lr}",
            "optim.lr_schedule=constant",
            f"algorithm.params.target_states={args.target_states}",
            # the moves studied here are final-sample ones (the config before prediction moves), as measured then
            "algorithm.params.move_space=final",
            "algorithm.params.normalize=sample",
            "algorithm.params.timestep_fraction=0.3",
        ],
    )
    trainer = Trainer(config, log=False)
    algorithm = trainer.algorithm

    before, after = {"learned": [], "verdict": [], "dense": []}, {"learned": [], "verdict": [], "dense": []}
    first = None
    for update in range(args.batches):
        batch, _ = trainer.collect(update)
        items, _ = algorithm.prepare(batch, trainer.policy)
        rows = moved_rows(algorithm.delta)
        prompts = [batch.prompts[i] for i in rows]
        x0 = batch.trajectory.final[rows]
        for key, values in judge_latents(trainer, x0, prompts).items():
            before[key] += values
        for key, values in judge_latents(trainer, x0 + algorithm.delta[rows], prompts).items():
            after[key] += values
        if first is None:
            first = (batch, items, algorithm.delta.clone())
    moves = {
        "moved_samples": len(before["verdict"]),
        "samples": args.batches * args.groups * config.train.group_size,
        **{f"{key}_before": mean(before[key]) for key in before},
        **{f"{key}_after_move": mean(after[key]) for key in after},
    }
    print("1. accepted moves, moved samples only ({moved_samples} of {samples}):".format(**moves))
    for key in before:
        print(f"   {key:8s} {moves[key + '_before']:.3f} -> {moves[key + '_after_move']:.3f}")

    batch, items, delta = first
    fit = fit_curve(trainer, batch, items, delta, args.fit_steps)
    # Control: a fresh policy fits one shared move (a fixed random latent of the same RMS for every moved sample),
    # which a LoRA can express; if this did not line up either, the measurement or the targets would be broken.
    control = Trainer(config, log=False)
    batch, _ = control.collect(0)
    items, _ = control.algorithm.prepare(batch, control.policy)
    rows = moved_rows(control.algorithm.delta)
    rms = control.algorithm.delta[rows].pow(2).mean().sqrt()
    shared = torch.randn(delta.shape[1:], generator=torch.Generator().manual_seed(0))
    control.algorithm.delta[rows] = shared / shared.pow(2).mean().sqrt() * rms
    fit_shared = fit_curve(control, batch, items, control.algorithm.delta.clone(), args.fit_steps)
    print(f"2. fitting update 0's targets (lr {args.lr}):")
    print("   targets          steps  loss      cos(shift, delta)  |shift|/|delta|  unmoved drift  learned (moved)")
    for label, curve in (("MEND's moves", fit), ("one shared move", fit_shared)):
        for p in curve:
            print(
                f"   {label:15s}  {p['fit_steps']:5d}  {p['loss']:.5f}   {p['cosine_shift_delta']:+.3f}             "
                f"{p['shift_over_delta']:.2f}             {p['unmoved_drift_rms']:.3f}          "
                f"{p['learned_moved_before']:.2f} -> {p['learned_moved_after']:.2f}"
            )
    if args.save:
        out = ROOT / "benchmarks" / "results" / "mend_moves.json"
        saved = json.loads(out.read_text()) if out.is_file() else {}
        saved[args.target_states] = {"args": vars(args), "moves": moves, "fit": fit, "fit_shared_move": fit_shared}
        out.write_text(json.dumps(saved, indent=2) + "\n")
        print(f"written to {out}")


if __name__ == "__main__":
    main()
