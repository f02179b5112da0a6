"""`flowrl diagnose`: does a config's base give group-relative RL anything to learn from, before any training?

RL sharpens what the base already does sometimes. A group whose samples all score alike carries no advantage, and
a reward that varies across prompts but not within them teaches nothing that training can use. So this draws
groups from the base with the config's own sampler, prompts and reward (the first updates of a run, exactly) and
reports:

- the reward's mean and spread (population std over every sample);
- the share of the reward's variance that lies within groups (the rest lies between prompts);
- the share of groups with zero spread (max - min <= `ZERO_SPREAD`);
- pass@1 against pass@G where the reward has a success: its `accuracy` component, or `--success-threshold`;
- the reward gap between the SDE sampler and the ODE on the same prompts and noise (what the exploration noise
  costs or adds);
- the clipped fraction of a first update, for ratio-clipped methods (GRPO, DDPO);
- a verdict: the share of prompts whose group carries signal, its std at least `SIGNAL_SHARE` of the whole batch's
  (not lost in the spread across prompts) and above zero;
- the same figures per tag where the training set has tags (an edit's kind, a video prompt's family): which kinds
  of item RL has something to sharpen on, judged against the whole batch's spread;

with a per-prompt table and a plot of every sample's reward per prompt.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

ZERO_SPREAD = 1e-6  # a group whose rewards differ by no more than this has none
SIGNAL_SHARE = 0.1  # a group carries signal when its std is at least this share of the batch's std
LITTLE_SIGNAL = 0.25  # below this share of prompts with signal, the verdict says to change the testbed


@dataclasses.dataclass
class SignalStats:
    """The figures of one table of rewards [P prompts, G samples] (population statistics throughout)."""

    reward_mean: float
    reward_std: float
    within_group_share: float  # mean within-group variance / total variance
    zero_spread_share: float
    signal_share: float  # share of prompts whose group carries signal
    group_mean: list[float]
    group_std: list[float]
    pass_at_1: float | None = None
    pass_at_g: float | None = None

    @classmethod
    def of(
        cls, rewards: np.ndarray, success: np.ndarray | None = None, reference_std: float | None = None
    ) -> SignalStats:
        """The figures of `rewards` [P, G] and, where given, the per-sample successes [P, G] (bool). A group carries
        signal against `reference_std` (default: the table's own std); a slice of a batch (one tag's groups) passes
        the whole batch's, so a tag whose groups all score alike is not judged by its own small spread."""
        rewards = np.asarray(rewards, dtype=np.float64)
        total_var = rewards.var()
        reference = np.sqrt(total_var) if reference_std is None else reference_std
        group_std = rewards.std(axis=1)
        spread = rewards.max(axis=1) - rewards.min(axis=1)
        carries = (spread > ZERO_SPREAD) & (group_std >= SIGNAL_SHARE * reference)
        stats = cls(
            reward_mean=float(rewards.mean()),
            reward_std=float(np.sqrt(total_var)),
            within_group_share=float((group_std**2).mean() / total_var) if total_var > 0 else 0.0,
            zero_spread_share=float((spread <= ZERO_SPREAD).mean()),
            signal_share=float(carries.mean()),
            group_mean=rewards.mean(axis=1).tolist(),
            group_std=group_std.tolist(),
        )
        if success is not None:
            success = np.asarray(success, dtype=bool)
            stats.pass_at_1, stats.pass_at_g = float(success.mean()), float(success.any(axis=1).mean())
        return stats

    def verdict(self) -> str:
        """One line a user acts on."""
        line = (
            f"groups carry signal on {self.signal_share:.0%} of prompts; {self.within_group_share:.0%} of the "
            f"reward's variance lies within groups, {self.zero_spread_share:.0%} of groups have none"
        )
        if self.signal_share < LITTLE_SIGNAL:
            return line + ": little to learn from; change the testbed (prompts, reward, sampler noise), not the recipe"
        return line


def _grouped(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[np.ndarray, list[int]]:
    """[B] per-sample values -> [P, G] by group (groups in order of first appearance), and each group's id."""
    ids = list(dict.fromkeys(group_ids.tolist()))
    return np.stack([values[group_ids == g].double().numpy() for g in ids]), ids


def accuracy_component(info: dict) -> torch.Tensor | None:
    """The reward's binary success per sample: its one `accuracy` component (a weighted sum names it
    `<term>/accuracy`); None where there is none, or several."""
    keys = [k for k in info if k == "accuracy" or k.endswith("/accuracy")]
    return info[keys[0]].cpu() if len(keys) == 1 else None


def _tag_of_prompt(trainer) -> dict[str, str]:
    """Each training prompt's tag, where the training set is drawn by tag (empty otherwise)."""
    by_tag = trainer.prompts.set.by_tag or {}
    tags: dict[str, str] = {}
    for tag, items in by_tag.items():
        for item in items:
            tags.setdefault(item.prompt, tag)
    return tags


def tag_stats(
    reward_table: np.ndarray, success_table: np.ndarray | None, tags: list[str | None]
) -> dict[str, SignalStats]:
    """SignalStats of each tag's groups (rows of the [P, G] tables), a group carrying signal against the whole
    batch's std; groups without a tag are left out. Tags in order of first appearance."""
    batch_std = float(np.asarray(reward_table, dtype=np.float64).std())
    out = {}
    for tag in dict.fromkeys(t for t in tags if t is not None):
        rows = [i for i, t in enumerate(tags) if t == tag]
        success = success_table[rows] if success_table is not None else None
        out[tag] = SignalStats.of(reward_table[rows], success, reference_std=batch_std)
    return out


def _with_sampler(config, **changes):
    return dataclasses.replace(config, sampler=dataclasses.replace(config.sampler, **changes))


def diagnose(config, updates: int = 1, success_threshold: float | None = None, progress: bool = True) -> dict:
    """Draw `updates` batches of the config's groups from its base and measure what they carry (see the module
    docstring). The run's folder is a temporary one: nothing is written beside the config's runs.

    Returns:
        A dict: `stats` (SignalStats as a dict), `verdict`, `prompts` (per group: prompt, rewards), `sde_ode_gap`
        (None when the config samples with the ODE), `clip_fraction` (None for methods without a clipped ratio),
        `config` facts (sampler, group size, algorithm), and `tags` (per tag of the training set: its figures
        without the per-group lists; empty when the set has no tags).
    """
    from tqdm import tqdm

    from flowrl.train import Trainer

    config = dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, async_rollouts=False))
    with tempfile.TemporaryDirectory(prefix="flowrl-diagnose-") as folder:
        trainer = Trainer(config, run_dir=Path(folder), log=False)
        rewards, groups, prompts, success, ode_rewards = [], [], [], [], []
        bar = tqdm(total=updates * (2 if config.sampler.kind != "ode" else 1), desc="diagnose", disable=not progress)
        first = None
        for update in range(updates):
            batch, _ = trainer.collect(update)
            first = batch if first is None else first
            rewards.append(batch.global_rewards)
            groups.append(batch.global_group_ids + update * 1_000_000)  # groups of different updates stay apart
            prompts += batch.prompts
            accuracy = accuracy_component(batch.reward_info or {})
            if success_threshold is not None:
                success.append(batch.global_rewards >= success_threshold)
            elif accuracy is not None:
                success.append(accuracy > 0.5)
            bar.update(1)
            if config.sampler.kind != "ode":
                trainer.config = _with_sampler(config, kind="ode")
                ode_batch, _ = trainer.collect(update)
                trainer.config = config
                ode_rewards.append(ode_batch.global_rewards)
                bar.update(1)
        bar.close()
        group_ids = torch.cat(groups)
        reward_table, ids = _grouped(torch.cat(rewards), group_ids)
        success_table = _grouped(torch.cat(success), group_ids)[0] if success else None
        stats = SignalStats.of(reward_table, success_table)
        prompt_of = dict(zip(group_ids.tolist(), prompts))  # a group's samples share its prompt
        tag_of = _tag_of_prompt(trainer)
        by_tag = tag_stats(reward_table, success_table, [tag_of.get(prompt_of[g]) for g in ids])
        clip_fraction = _first_update_clip_fraction(trainer, first)
    gap = None
    if ode_rewards:
        sde, ode = torch.cat(rewards), torch.cat(ode_rewards)
        gap = {"sde_mean": sde.mean().item(), "ode_mean": ode.mean().item(), "gap": (sde - ode).mean().item()}
    return {
        "stats": dataclasses.asdict(stats),
        "verdict": stats.verdict(),
        "prompts": [
            {
                "prompt": prompt_of[g],
                "tag": tag_of.get(prompt_of[g]),
                "rewards": row.tolist(),
                "mean": float(row.mean()),
                "std": float(row.std()),
            }
            for g, row in zip(ids, reward_table)
        ],
        "tags": {
            tag: {"groups": len(t.group_std)}
            | {k: v for k, v in dataclasses.asdict(t).items() if k not in ("group_mean", "group_std")}
            for tag, t in by_tag.items()
        },
        "sde_ode_gap": gap,
        "clip_fraction": clip_fraction,
        "config": {
            "sampler": config.sampler.kind,
            "noise_level": config.sampler.noise_level,
            "num_steps": config.sampler.num_steps,
            "group_size": config.train.group_size,
            "groups": len(ids),
            "algorithm": config.algorithm.name,
        },
    }


def _first_update_clip_fraction(trainer, batch) -> float | None:
    """The share of trained items whose likelihood ratio left the clip range in the run's first update (its
    optimiser steps after the first see a moved policy); None for methods without a clipped ratio."""
    items, _ = trainer.algorithm.prepare(batch, trainer.policy)
    if len(items) == 0:
        return None
    metrics = trainer.optimize(batch, items, 0)
    return metrics.get("clip_frac")


def write_report(result: dict, out: Path) -> list[Path]:
    """diagnose.json, prompts.md (the per-prompt table) and rewards.png (every sample's reward per prompt) in
    `out`."""
    from flowrl.report import figure

    out.mkdir(parents=True, exist_ok=True)
    (out / "diagnose.json").write_text(json.dumps(result, indent=1))
    rows = sorted(result["prompts"], key=lambda r: -r["std"])
    lines = ["| prompt | tag | mean | std | min | max |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['prompt'][:80]} | {r.get('tag') or '-'} | {r['mean']:.3f} | {r['std']:.3f} | "
            f"{min(r['rewards']):.3f} | {max(r['rewards']):.3f} |"
        )
    (out / "prompts.md").write_text(f"{result['verdict']}\n\n" + "\n".join(tag_table(result) + lines) + "\n")
    by_mean = sorted(result["prompts"], key=lambda r: r["mean"])
    with figure(out / "rewards.png", figsize=(max(5, 0.35 * len(by_mean) + 2), 3.6)) as (fig, ax):
        for x, r in enumerate(by_mean):
            ax.scatter(np.full(len(r["rewards"]), x), r["rewards"], s=10, alpha=0.6, color="#1f77b4")
            ax.plot([x - 0.3, x + 0.3], [r["mean"]] * 2, color="black", lw=1)
        ax.set_xticks(range(len(by_mean)))
        ax.set_xticklabels([r["prompt"][:24] for r in by_mean], rotation=60, ha="right", fontsize=6)
        ax.set_ylabel("reward")
        ax.set_title(result["verdict"].split(";")[0], fontsize=9)
    return [out / "diagnose.json", out / "prompts.md", out / "rewards.png"]


def tag_table(result: dict) -> list[str]:
    """The per-tag table (markdown lines and a blank line), or nothing when the training set has no tags."""
    tags = result.get("tags") or {}
    if not tags:
        return []
    lines = [
        "| tag | groups | reward mean | within-group share | zero spread | prompts with signal | pass@1 / pass@G |",
        "|---|---|---|---|---|---|---|",
    ]
    for tag, t in tags.items():
        passes = f"{t['pass_at_1']:.2f} / {t['pass_at_g']:.2f}" if t["pass_at_1"] is not None else "-"
        lines.append(
            f"| {tag} | {t['groups']} | {t['reward_mean']:.3f} | {t['within_group_share']:.0%} | "
            f"{t['zero_spread_share']:.0%} | {t['signal_share']:.0%} | {passes} |"
        )
    return lines + [""]


def summary_lines(result: dict) -> list[str]:
    """What the command prints."""
    s, gap, clip = result["stats"], result["sde_ode_gap"], result["clip_fraction"]
    lines = [
        f"reward: mean {s['reward_mean']:.4f}, std {s['reward_std']:.4f} over {result['config']['groups']} groups "
        f"of {result['config']['group_size']}",
        f"within-group share of variance: {s['within_group_share']:.1%}; groups with zero spread: "
        f"{s['zero_spread_share']:.1%}",
    ]
    if s["pass_at_1"] is not None:
        lines.append(f"pass@1 {s['pass_at_1']:.3f}, pass@{result['config']['group_size']} {s['pass_at_g']:.3f}")
    if gap is not None:
        lines.append(f"SDE - ODE reward gap: {gap['gap']:+.4f} ({gap['sde_mean']:.4f} against {gap['ode_mean']:.4f})")
    if clip is not None:
        lines.append(f"clipped fraction of a first update: {clip:.1%}")
    for tag, t in (result.get("tags") or {}).items():
        passes = f", pass@1 {t['pass_at_1']:.2f}" if t["pass_at_1"] is not None else ""
        lines.append(
            f"  {tag}: {t['groups']} groups, mean {t['reward_mean']:.3f}, within-group share "
            f"{t['within_group_share']:.0%}, signal on {t['signal_share']:.0%} of prompts{passes}"
        )
    lines.append(f"verdict: {result['verdict']}")
    return lines
