"""Time to quality: every image method on the same work with the verifier's reward, several training seeds each,
judged by the low-noise eval; held-out accuracy against training wall-clock and against samples.

Each method runs its shipped config (configs/shapes_<method>.yaml: shapes-sd3 for the flow methods, shapes-sd for
DDPO) with the shared work: training prompts, samples per update (8 prompts x 8), LoRA r16, its own updates from
UPDATES (sized so each run covers ~20 minutes of training on 2 CPU cores), and the reward: the verifier's dense
score (`shapes`), except for the methods that need a differentiable reward (ReFL, DRaFT and MEND, whose proposals
follow the reward's gradient: the learned scorer `shapes_clip`, as shipped). `grpo_anchor` is Flow-GRPO at the
anchors' defaults (flow_grpo's geneval_sd3: SDE on every step, noise 0.7, 99% of the steps trained, KL beta 0.04,
global std, clip 1e-4, lr 3e-4 constant; their EMA of the weights is not used here): the reference the time-to-+10
ratio is taken against.

The eval (update 0, every --eval-every updates and the last): the wide held-out set (shapes.prompts.
wide_eval_prompt_set: 105 prompts, the eval split's 36 plus every held-out colors prompt and 42 each of the held-out
color_attr and position ones) with about --per-tag images per tag (spread evenly over the tag's prompts, so each
tag's mean has about the same error; seeds fixed, so every checkpoint and the base draw the same noise), ODE
--eval-steps steps, CFG 4.5 (a method whose config evaluates at another scale, CFG-free NFT, samples at its own; its
gain is still against the base at 4.5), the verifier's tag-averaged accuracy, under GenEval's verdict and under the
exact one (the same images; no objects beyond the named ones); the gain is paired per image (checkpoint minus base,
same prompt and seed). Intervals are 95%: 'draw' holds the prompts fixed (how far another draw of seeds could move
it), 'prompts' makes the prompt the sampling unit. Across training seeds the table reports the mean and a 95%
interval from the seeds' standard error (Student's t: 4.30 standard errors for 3 seeds).

    python benchmarks/time_to_quality.py                         # every method x 3 seeds: many hours on 2 cores
    python benchmarks/time_to_quality.py --methods grpo,grpo_anchor --seeds 0   # a part; results accumulate
    python benchmarks/time_to_quality.py --replot                # table and plot from results.json only

Finished (method, seed) runs are kept in OUT/results.json and skipped on the next call (--fresh reruns them), so
the benchmark can be run in parts and survives interruption. Writes OUT/results.json, OUT/table.md and
OUT/curves.png (OUT = benchmarks/results/time_to_quality).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.config import config_to_dict, load_config  # noqa: E402
from flowrl.experiment import sampled_as_checkpoint  # noqa: E402
from flowrl.inference import generate_samples  # noqa: E402
from flowrl.prompt_source import derived_seed  # noqa: E402
from flowrl.report import cpu_model, figure, t_half_width, t_quantile  # noqa: E402
from flowrl.tasks.base import tag_metrics  # noqa: E402
from flowrl.train import Trainer  # noqa: E402
from flowrl.worlds.shapes import exact_score, parse_prompt, score  # noqa: E402
from flowrl.worlds.shapes.prompts import TAGS, wide_eval_prompt_set  # noqa: E402

VERIFIER = "reward=[{name: shapes, weight: 1.0, params: {dense: true}}]"
# the verifier's dense reward with one more constraint, exactly the named objects: GenEval's verdict lets "a circle"
# pass with three circles, and the main job learns that clutter (benchmarks/lora_step_gate.py's exact verdict)
EXACT_VERIFIER = "reward=[{name: shapes, weight: 1.0, params: {dense: true, exact_objects: true}}]"
# Flow-GRPO trains the first int(0.99 x 10) = 9 steps in order (its last, lowest-noise step never); the stored
# grpo_anchor run predates step_order and trained all 10
ANCHOR = [
    "sampler.sde_window_size=0",
    "sampler.noise_level=0.7",
    "algorithm.params.timestep_fraction=0.99",
    "algorithm.params.step_order=first",
    "algorithm.params.kl_beta=0.04",
    "algorithm.params.std=global",
    "algorithm.params.clip_range=1.0e-4",
    "optim.lr=3.0e-4",
    "optim.lr_schedule=constant",
]
# DiffusionNFT at the paper's geneval setting (DiffusionNFT config/nft.py): CFG-free rollouts, training and evaluation
# (the gain is still against the base at CFG 4.5), every step trained, the reference's C x loss, A = 0 items kept,
# lr 3e-4 constant; their KL beta 1e-4 and EMA old policy (decay <= 0.16 over these updates) are left out. The
# shipped recipe trains the guided velocity at CFG 4.5 and collapses on the verifier's reward.
NFT_CFG_FREE = [
    "sampler.guidance_scale=1.0",
    "eval.guidance_scale=1.0",
    "algorithm.params.timestep_fraction=1.0",
    "algorithm.params.scale_by_adv_clip=true",
    "algorithm.params.drop_zero_advantage=false",
    "optim.lr=3.0e-4",
    "optim.lr_schedule=constant",
]
# name: (shipped config, overrides); the reward is the verifier's unless the method needs gradients of it
METHODS = {
    "grpo": ("shapes_grpo", [VERIFIER]),
    "grpo_anchor": ("shapes_grpo", [VERIFIER] + ANCHOR),
    "grpo_group_std": ("shapes_grpo", [VERIFIER, "algorithm.params.std=group"]),
    "grpo_exact": ("shapes_grpo", [EXACT_VERIFIER]),
    "grpo_fast": ("shapes_grpo_fast", [VERIFIER]),
    "dancegrpo": ("shapes_dancegrpo", [VERIFIER]),
    "fk_incremental": ("shapes_grpo", [VERIFIER, "algorithm.params.credit=incremental"]),
    "nft": ("shapes_nft", [VERIFIER]),
    "nft_cfg_free": ("shapes_nft", [VERIFIER] + NFT_CFG_FREE),
    # the same with the exact verdict as reward: on GenEval's verdict, CFG-free NFT learns clutter (exact accuracy 0)
    "nft_cfg_free_exact": ("shapes_nft", [EXACT_VERIFIER] + NFT_CFG_FREE),
    "mend": ("shapes_mend", []),
    "ddpo": ("shapes_ddpo", [VERIFIER]),
    # the main job's structure on DDPO's base: DDIM noise only in a window of 3 of the first steps, only those trained
    "ddpo_window": ("shapes_ddpo", [VERIFIER, "sampler.sde_window_size=3", "sampler.sde_window_range=[0,3]"]),
    # DDPO's structure on the flow model: every step stochastic and trained (CPS, so each step's noise is a set share
    # of the next noise level, as DDIM's eta = 1 is), per-prompt std: is it DDPO's recipe or shapes-sd's base that
    # learns faster than the main job?
    "grpo_cps_full": (
        "shapes_grpo",
        [
            VERIFIER,
            "sampler.kind=cps",
            "sampler.noise_level=0.7",
            "sampler.sde_window_size=0",
            "algorithm.params.std=group",
        ],
    ),
    # the main job with its window's SDE step made coefficients-preserving (CPS): the flow analogue of ddpo_window's
    # DDIM step, each window step's fresh noise sin(0.3 pi) = 0.81 of the next noise level (DDIM eta 1: 0.73-0.79
    # on shapes-sd's first steps), so the window's samples stay on the model's marginals
    "grpo_cps_window": ("shapes_grpo", [VERIFIER, "sampler.kind=cps", "sampler.noise_level=0.6"]),
    # the main job with its LoRA acting only at sigma >= 0.6 (steps 0-3 of 10, sigma 1.0-0.667; the window's last
    # possible step, 4 at 0.556, is left to the base), so the low-noise steps keep the base network: a trained
    # window LoRA left on there cost 3.2 points (benchmarks/lora_step_gate.py)
    "grpo_gated_lora": ("shapes_grpo", [VERIFIER, "lora.active_from_sigma=0.6"]),
    # the main job with SAGE-GRPO's sampler (the step variance integrated over the step, the drift's score term
    # scaled by it): the SDE-consistent kind beside the main job's flow
    "grpo_sage": ("shapes_grpo", [VERIFIER, "sampler.kind=sage"]),
    "refl": ("shapes_refl", []),
    "draft": ("shapes_draft", []),
    # the main job on the peers' methods' budget (120 updates, so its cosine schedule spans the same run), with the
    # exact verdict recorded: the reference the peers' rows are read against
    "grpo_short": ("shapes_grpo", [VERIFIER]),
    # the peers' methods on the main job. GRPO-Guard at its paper's clip; with one optimizer step per update its
    # ratio is 1 (nothing to normalise), so what acts is its per-step weight s_t / |dt|
    "grpo_guard": ("shapes_grpo", [VERIFIER, "algorithm.name=grpo_guard", "algorithm.params.clip_range=2.0e-6"]),
    # TempFlow-GRPO's noise-aware step weight (without its branching)
    "grpo_tempflow": ("shapes_grpo", [VERIFIER, "algorithm.params.step_weight=tempflow"]),
    # MixGRPO-Flash's sampler: the 3-step window moves from step 0 to 7 over the run (one step every 15 updates),
    # DPM-Solver++ 2M after it; the LoRA samples at every step, since the window reaches low noise
    "mixgrpo": (
        "shapes_grpo",
        [
            VERIFIER,
            "sampler.sde_window_schedule=progressive",
            "sampler.sde_window_range=[0,8]",
            "sampler.sde_window_shift_every=15",
            "sampler.ode_solver=dpm2",
            "lora.sample_from_sigma=null",
        ],
    ),
    # AWM as its paper samples: CFG-free ODE rollouts, training and evaluation (the gain still against the base at
    # CFG 4.5), ghuber weighting; 4 stratified times per sample (flowrl's default; the paper's is 6), lr 3e-4
    # constant; every step's LoRA samples
    "awm": (
        "shapes_grpo",
        [
            VERIFIER,
            "algorithm={name: awm, params: {}}",
            "sampler.kind=ode",
            "sampler.guidance_scale=1.0",
            "eval.guidance_scale=1.0",
            "lora.sample_from_sigma=null",
            "optim.lr=3.0e-4",
            "optim.lr_schedule=constant",
        ],
    ),
}
# updates per run: ~20 minutes of training each, estimated from the s / update compare_algorithms measured at 4
# prompts per update (x2 for 8; AMD EPYC, 2 cores); the table reads every method's gain at --minutes of its own clock.
# Measured here (seed 0): grpo 6.5, grpo_anchor 16.4, fk_incremental 7.6, nft 9.0 s / update, so those runs train
# 26-30 minutes; the counts stay as run, since the lr schedule spans them and further seeds must match seed 0.
# runs from before the benchmark recorded its CPU all ran on the project's AMD EPYC machine
# (docs/research/benchmarks.md)
UNRECORDED_CPU = "AMD EPYC"
UPDATES = {
    "grpo": 240,
    "grpo_exact": 240,
    "grpo_anchor": 100,
    "grpo_group_std": 240,
    "grpo_fast": 300,
    "dancegrpo": 150,
    "fk_incremental": 240,
    "nft": 200,
    "nft_cfg_free": 160,
    "nft_cfg_free_exact": 160,
    "mend": 300,
    "ddpo": 200,
    "ddpo_window": 300,
    "grpo_cps_full": 130,
    "grpo_cps_window": 240,
    "grpo_gated_lora": 240,
    "grpo_sage": 240,
    "refl": 330,
    # the peers' methods: half the budget (~12 minutes at the main job's ~6 s / update), read beside grpo's curve
    "grpo_short": 120,
    "grpo_guard": 120,
    "grpo_tempflow": 120,
    "mixgrpo": 120,
    "awm": 120,
    "draft": 95,
}
GAINS = (0.10, 0.20)
EVAL_CFG = 4.5  # the wide eval's guidance scale


def method_config(name: str, seed: int, out: Path, args):
    config_name, overrides = METHODS[name]
    shared = [
        f"run.name={name}_seed{seed}",
        f"run.out_dir={out / 'runs'}",
        f"run.seed={seed}",
        f"train.updates={args.updates or UPDATES[name]}",
        f"train.groups_per_update={args.groups}",
        f"train.group_size={args.group_size}",
        "train.checkpoint_every=0",
        "eval.enabled=false",
        "lora.rank=16",
        "lora.alpha=32",
    ]
    return load_config(ROOT / "configs" / f"{config_name}.yaml", shared + overrides + list(args.override))


class LowNoiseEval:
    """The wide held-out prompts with fixed seeds, about `per_tag` images per tag (a tag with few prompts gives each
    more images, so every tag's mean has about the same error); the verifier's verdict per image, and each
    pipeline's base verdicts (the paired gain's reference)."""

    def __init__(self, per_tag: int, steps: int, prompts: list[str] | None = None, seed: int = 2024):
        self.steps = steps
        prompts = prompts or wide_eval_prompt_set()
        tags = [parse_prompt(p).tag for p in prompts]
        counts = {t: -(-per_tag // tags.count(t)) for t in set(tags)}  # ceil: at least per_tag images per tag
        self.expanded = [p for p, t in zip(prompts, tags) for _ in range(counts[t])]
        self.seeds = [derived_seed(seed, i, k) for i, t in enumerate(tags) for k in range(counts[t])]
        self.tags = [t for t in tags for _ in range(counts[t])]
        self.base: dict[tuple[str, float], tuple[np.ndarray, np.ndarray]] = {}  # (pipeline, CFG): verdicts

    def images(self, policy, guidance_scale: float = EVAL_CFG, **sampler) -> np.ndarray:
        """One uint8 image per (prompt, seed); `sampler` (kind, noise_level, sde_window) replaces the ODE."""
        samples, _ = generate_samples(
            policy, self.expanded, 1, 0, self.steps, guidance_scale, desc=None, seeds=self.seeds, **sampler
        )
        return samples.to_uint8()

    def judge(self, images: np.ndarray, verdict=score) -> np.ndarray:
        """One verdict per image: GenEval's rule (`score`), or `exact_score`, which also refuses unnamed objects."""
        return np.array([verdict(image, prompt) for image, prompt in zip(images, self.expanded)], float)

    def verdicts(self, policy, guidance_scale: float = EVAL_CFG, **sampler) -> np.ndarray:
        """The verifier's verdict per image drawn by `images`."""
        return self.judge(self.images(policy, guidance_scale, **sampler))

    def both_verdicts(self, policy, guidance_scale: float = EVAL_CFG, **sampler) -> tuple[np.ndarray, np.ndarray]:
        """(GenEval's verdicts, exact verdicts) of the same images."""
        images = self.images(policy, guidance_scale, **sampler)
        return self.judge(images), self.judge(images, exact_score)

    def summary(self, values: np.ndarray) -> dict:
        r = tag_metrics(values.tolist(), self.tags, TAGS, clusters=self.expanded)
        return {
            "overall": r["overall"],
            "tags": r["tags"],
            "draw_se": r["draw_stderr"]["overall"],
            "prompt_se": r["stderr"]["overall"],
            "tag_draw_se": r["draw_stderr"]["tags"],
        }

    def __call__(self, policy, pipeline: str, untrained: bool = False, guidance_scale: float = EVAL_CFG) -> dict:
        """The point of `policy` sampled at `guidance_scale`, under GenEval's verdict and under the exact one
        (`exact`: the same images, no objects beyond the named ones). The gain is always against the base at
        EVAL_CFG, the base as the project evaluates it, so a method that samples without guidance (CFG-free NFT)
        is compared with the base users sample, not with a base handicapped by its own scale. `untrained` (a LoRA
        still at zero) is the base itself: its verdicts are stored per (pipeline, scale) and reused."""
        if untrained:
            for scale in dict.fromkeys((EVAL_CFG, guidance_scale)):
                if (pipeline, scale) not in self.base:
                    self.base[(pipeline, scale)] = self.both_verdicts(policy, scale)
            verdicts = self.base[(pipeline, guidance_scale)]
        else:
            verdicts = self.both_verdicts(policy, guidance_scale)
        return self.point(verdicts, self.base.setdefault((pipeline, EVAL_CFG), verdicts))

    def point(self, verdicts: tuple[np.ndarray, np.ndarray], base: tuple[np.ndarray, np.ndarray]) -> dict:
        """Accuracy and paired gain over `base` of `both_verdicts`' (GenEval's, exact) pair, the exact one as
        `exact`."""
        (lenient, exact), (base_lenient, base_exact) = verdicts, base
        return {
            "accuracy": self.summary(lenient),
            "gain": self.summary(lenient - base_lenient),
            "exact": {"accuracy": self.summary(exact), "gain": self.summary(exact - base_exact)},
        }


def run_method(name: str, seed: int, args, evaluator: LowNoiseEval) -> dict:
    config = method_config(name, seed, args.out, args)
    shutil.rmtree(Path(config.run.out_dir) / config.run.name, ignore_errors=True)  # a fresh run, never a resume
    trainer = Trainer(config, log=False)
    pipeline, updates = config.pipeline.path, config.train.updates
    samples_per_update = config.train.groups_per_update * config.train.group_size
    cfg = config.eval.guidance_scale  # the method's own sampling scale (4.5 but for CFG-free methods)
    curve = [
        {
            "update": 0,
            "train_seconds": 0.0,
            "samples": 0,
            **evaluator(trainer.policy, pipeline, untrained=True, guidance_scale=cfg),
        }
    ]
    clock = {"train": 0.0}
    rewards = []

    def on_update(update, metrics):
        clock["train"] += metrics["seconds"]
        rewards.append(float(metrics["reward_mean"]))
        if update % args.eval_every == 0 or update == updates:
            with sampled_as_checkpoint(trainer) as policy:  # as the run's own evaluations sample
                point = {
                    "update": update,
                    "train_seconds": clock["train"],
                    "samples": update * samples_per_update,
                    **evaluator(policy, pipeline, guidance_scale=cfg),
                }
            curve.append(point)
            g = point["gain"]
            print(
                f"  {name} seed {seed} update {update:4d}: accuracy {point['accuracy']['overall']:.3f}  gain "
                f"{100 * g['overall']:+.1f} +- {196 * g['draw_se']:.1f} points  ({clock['train'] / 60:.1f} min)",
                flush=True,
            )

    trainer.run(on_update)
    return {
        "method": name,
        "seed": seed,
        "pipeline": pipeline,
        "curve": curve,
        "train_rewards": rewards,
        "seconds_per_update": clock["train"] / updates,
        "cpu": cpu_model(),
        "config": config_to_dict(config),
    }


def time_to_gain(curve: list[dict], gain: float, key: str = "train_seconds") -> float | None:
    """The first eval point's `key` (training seconds, samples) at which the gain reached `gain`; None if never."""
    return next((p[key] for p in curve if p["update"] > 0 and p["gain"]["overall"] >= gain), None)


def gain_at(curve: list[dict], seconds: float, verdict: str = "geneval") -> float | None:
    """The gain of the last eval point within `seconds` of training, under GenEval's verdict or the `exact` one
    (None for a run recorded before the exact verdict was)."""
    last = [p for p in curve if p["train_seconds"] <= seconds][-1]
    if verdict == "exact":
        return last["exact"]["gain"]["overall"] if "exact" in last else None
    return last["gain"]["overall"]


def mean_se(values: list[float]) -> tuple[float, float]:
    v = np.asarray(values, float)
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0


def exact_gain_at(runs: list[dict], seconds: float) -> tuple[float, float] | None:
    """Mean and standard error over seeds of the exact verdict's gain at `seconds`; None unless every seed has it."""
    gains = [gain_at(r["curve"], seconds, "exact") for r in runs]
    return mean_se(gains) if None not in gains else None


def runs_by_method(results: dict) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for run in results.values():
        grouped.setdefault(run["method"], []).append(run)
    return grouped


def summarize(results: dict, minutes: float) -> dict:
    """Per method, over its seeds: final and at-`minutes` gains, times to each of GAINS, per-tag final gains."""
    table = {}
    for name, runs in runs_by_method(results).items():
        row = {
            "seeds": sorted(r["seed"] for r in runs),
            "pipeline": Path(runs[0]["pipeline"]).name,
            "cpu": " / ".join(sorted({r.get("cpu", UNRECORDED_CPU) for r in runs})),
            "seconds_per_update": float(np.mean([r["seconds_per_update"] for r in runs])),
            "base": float(np.mean([r["curve"][0]["accuracy"]["overall"] for r in runs])),
            "final_gain": mean_se([r["curve"][-1]["gain"]["overall"] for r in runs]),
            "final_draw_se": float(np.mean([r["curve"][-1]["gain"]["draw_se"] for r in runs])),
            "train_minutes": float(np.mean([r["curve"][-1]["train_seconds"] for r in runs])) / 60,
            "gain_at_budget": mean_se([gain_at(r["curve"], 60 * minutes) for r in runs]),
            "exact_gain_at_budget": exact_gain_at(runs, 60 * minutes),
            "tag_gains": {t: float(np.mean([r["curve"][-1]["gain"]["tags"][t] for r in runs])) for t in TAGS},
        }
        for gain in GAINS:
            times = [time_to_gain(r["curve"], gain) for r in runs]
            reached = [t for t in times if t is not None]
            row[f"minutes_to_{round(100 * gain)}"] = float(np.mean(reached)) / 60 if len(reached) == len(runs) else None
            row[f"reached_{round(100 * gain)}"] = f"{len(reached)}/{len(runs)}"
        table[name] = row
    return table


def anchor_ratio(table: dict) -> str:
    """The best method's time to +10 points against grpo_anchor's (a lower bound when the anchor never got there);
    when that method trains another base, also the best on the anchor's own pipeline."""
    if "grpo_anchor" not in table:
        return ""
    anchor = table["grpo_anchor"]
    # minutes on different CPUs are not comparable: only methods timed on the anchor's
    reached = {
        n: r["minutes_to_10"]
        for n, r in table.items()
        if r["minutes_to_10"] is not None and n != "grpo_anchor" and r.get("cpu") == anchor.get("cpu")
    }
    if not reached:
        return ""

    def line(name: str) -> str:
        minutes, pipeline = reached[name], table[name].get("pipeline")
        label = (
            name
            if pipeline == anchor.get("pipeline")
            else f"{name} (on {pipeline}, the anchor on {anchor.get('pipeline')})"
        )
        if anchor["minutes_to_10"] is not None:
            return (
                f"\nTime to +10 points: {label} {minutes:.1f} min vs grpo_anchor {anchor['minutes_to_10']:.1f} "
                f"min: {anchor['minutes_to_10'] / minutes:.1f}x faster."
            )
        return (
            f"\nTime to +10 points: {label} {minutes:.1f} min; grpo_anchor did not reach +10 in its "
            f"{anchor['train_minutes']:.1f} minutes ({anchor['reached_10']} seeds): at least "
            f"{anchor['train_minutes'] / minutes:.1f}x faster."
        )

    best = min(reached, key=reached.get)
    same_base = [n for n in reached if table[n].get("pipeline") == anchor.get("pipeline")]
    text = line(best)
    if same_base and best not in same_base:
        text += line(min(same_base, key=reached.get))
    return text


def write_table(table: dict, minutes: float, path: Path) -> str:
    def pm(pair, seeds, scale=100):  # no interval over seeds from one seed
        interval = t_quantile(len(seeds)) * scale * pair[1] if len(seeds) > 1 else None
        return f"{scale * pair[0]:+.1f}" + (f" +- {interval:.1f}" if interval is not None else "")

    def reach(row, gain):
        value = row[f"minutes_to_{gain}"]
        return f"{value:.1f} ({row[f'reached_{gain}']})" if value is not None else f"- ({row[f'reached_{gain}']})"

    lines = [
        f"| method | pipeline | seeds | base acc | final gain (pts) | final draw +- | "
        f"gain at {minutes:g} min (pts) | exact verdict's gain at {minutes:g} min (pts) | "
        "min to +10 | min to +20 | minutes trained | s / update | cpu | "
        + " | ".join(f"{t} gain" for t in TAGS)
        + " |",
        "|" + "---|" * (13 + len(TAGS)),
    ]
    for name, row in sorted(table.items(), key=lambda kv: -kv[1]["gain_at_budget"][0]):
        lines.append(
            f"| {name} | {row['pipeline']} | {len(row['seeds'])} | {row['base']:.3f} | "
            f"{pm(row['final_gain'], row['seeds'])} | "
            f"{196 * row['final_draw_se']:.1f} | {pm(row['gain_at_budget'], row['seeds'])} | "
            f"{pm(row['exact_gain_at_budget'], row['seeds']) if row['exact_gain_at_budget'] is not None else '-'} | "
            f"{reach(row, 10)} | {reach(row, 20)} | {row['train_minutes']:.1f} | "
            f"{row['seconds_per_update']:.1f} | {row['cpu']} | "
            + " | ".join(f"{100 * row['tag_gains'][t]:+.1f}" for t in TAGS)
            + " |"
        )
    lines.append(anchor_ratio(table))
    lines.append(
        "\nGains are paired (checkpoint minus base, same prompts and seeds); +- is 95% over training seeds "
        "(with 2 or more; Student's t); 'final draw +-' is one eval's 95% interval for a redraw of its seeds (the mean "
        "over seeds); the exact verdict also refuses objects the prompt does not name ('-': run recorded "
        "before it was); times are training wall-clock (eval excluded), the mean over seeds, shown only when "
        "every seed reached the gain (how many did in brackets)."
    )
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(results: dict, path: Path) -> None:
    title = "Time to quality on shapes: verifier reward, low-noise eval (mean over training seeds, 95% band)"
    with figure(path, 1, 2, figsize=(12, 4.5), title=title) as (fig, axes):
        for name, runs in sorted(runs_by_method(results).items()):
            for ax, key, scale in ((axes[0], "train_seconds", 1 / 60), (axes[1], "samples", 1.0)):
                # seeds share eval updates, so their points line up by index; x is the mean over seeds
                length = min(len(r["curve"]) for r in runs)
                x = np.mean([[p[key] * scale for p in r["curve"][:length]] for r in runs], axis=0)
                y = 100 * np.array([[p["gain"]["overall"] for p in r["curve"][:length]] for r in runs])
                (line,) = ax.plot(x, y.mean(0), marker="o", ms=3, label=f"{name} ({len(runs)} seeds)")
                if len(runs) > 1:
                    spread = t_half_width(y, axis=0)
                    ax.fill_between(x, y.mean(0) - spread, y.mean(0) + spread, color=line.get_color(), alpha=0.15)
        for ax, label in zip(axes, ("training minutes (2 CPU cores, eval excluded)", "training samples")):
            ax.set_xlabel(label)
            ax.set_ylabel("held-out accuracy gain (points, paired)")
            for level in GAINS:
                ax.axhline(100 * level, color="grey", lw=0.8, ls="--")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--updates", type=int, default=None, help="every method's updates (default: UPDATES)")
    parser.add_argument("--groups", type=int, default=8, help="prompts per update")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=60)
    parser.add_argument("--per-tag", type=int, default=192, help="eval images per tag (spread over its prompts)")
    parser.add_argument("--eval-steps", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=20.0, help="the budget the table reads the gain at")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "time_to_quality")
    parser.add_argument("--override", nargs="*", default=[], help="key=value applied to every run")
    parser.add_argument("--fresh", action="store_true", help="rerun (method, seed) pairs already in results.json")
    parser.add_argument("--replot", action="store_true", help="only rewrite table.md and curves.png")
    args = parser.parse_args(argv)
    args.method_names = [n.strip() for n in args.methods.split(",") if n.strip()]
    unknown = [n for n in args.method_names if n not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {list(METHODS)}")
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    return args


def main(argv=None, prompts: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    evaluator = LowNoiseEval(args.per_tag, args.eval_steps, prompts)
    for name in [] if args.replot else args.method_names:
        for seed in args.seed_list:
            key = f"{name}/seed{seed}"
            if key in results and not args.fresh:
                continue
            print(f"{key}: {args.updates or UPDATES[name]} updates", flush=True)
            results[key] = run_method(name, seed, args, evaluator)
            results_path.write_text(json.dumps(results, indent=2) + "\n")  # nothing finished is lost
    table = summarize(results, args.minutes) if results else {}
    print(write_table(table, args.minutes, args.out / "table.md"))
    if results:
        plot(results, args.out / "curves.png")
    print(f"written to {args.out}")
    return results


if __name__ == "__main__":
    main()
