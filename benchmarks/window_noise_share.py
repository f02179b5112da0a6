"""How much of a group's reward spread does the trained SDE window cause? A diagnostic of RL's signal per base.

GRPO learns from reward differences inside a prompt's group, but its gradient only credits the noise the trained
steps drew; the rest of the spread (from each sample's initial noise) is noise in the advantage. This samples, per
training prompt, several initial noises and, for each, several draws of the window's noise with everything else
fixed, and splits the within-prompt variance of the verifier's dense reward:

    window share = mean over (prompt, initial noise) of Var(reward | window draws) / mean over prompts of Var(reward)

for each pipeline with the window its RL recipe trains: shapes-sd3 with the main job's Flow-SDE (noise 0.7), and
shapes-sd with DDIM eta 1 (`ddpo_window`), windows of 3 steps at the given starts, 10 steps, CFG 4.5.

    python benchmarks/window_noise_share.py            # ~5 minutes on 2 CPU cores
Writes benchmarks/results/window_noise_share.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.prompt_source import derived_seed  # noqa: E402
from flowrl.rollout import per_sample_noise, rollout, sample_generators  # noqa: E402
from flowrl.worlds.shapes import dense_score  # noqa: E402
from flowrl.worlds.shapes.prompts import train_prompt_set  # noqa: E402

# pipeline folder -> (sampler kind, noise level) its window-trained RL recipe uses
SAMPLERS = {"pipelines/shapes-sd3": ("flow", 0.7), "pipelines/shapes-sd": ("ddim", 1.0)}


def spread(
    policy,
    prompts,
    kind,
    noise_level,
    window,
    inits: int,
    draws: int,
    seed: int,
    steps: int = 10,
    guidance_scale: float = 4.5,
) -> dict:
    """Rewards [prompt, init, draw] for one pipeline and window, and their variance split."""
    shape = policy.noise_shape(policy.default_spec())
    rewards = np.zeros((len(prompts), inits, draws))
    for p, prompt in enumerate(prompts):
        initial = per_sample_noise(sample_generators([derived_seed(seed, p, i) for i in range(inits)]), shape)
        initial = initial.repeat_interleave(draws, 0)
        generators = sample_generators([derived_seed(seed, p, i, d, 1) for i in range(inits) for d in range(draws)])
        cond = policy.encode([prompt] * (inits * draws), guidance_scale)
        traj = rollout(
            policy, cond, generators, shape, steps, kind, noise_level, guidance_scale, window, initial_noise=initial
        )
        images = policy.decode_samples(traj.final).to_uint8()
        rewards[p] = np.array([dense_score(im, prompt) for im in images]).reshape(inits, draws)
    return {"window": list(window), **variance_split(rewards)}


def variance_split(rewards: np.ndarray, resamples: int = 2000, seed: int = 0) -> dict:
    """The window's share of the within-prompt variance, with a 95% bootstrap interval over prompts."""

    def share(r):
        return r.var(axis=2, ddof=1).mean() / r.reshape(len(r), -1).var(axis=1, ddof=1).mean()

    rng = np.random.default_rng(seed)
    boot = [share(rewards[rng.integers(0, len(rewards), len(rewards))]) for _ in range(resamples)]
    return {
        "mean_reward": float(rewards.mean()),
        "within_prompt_var": float(rewards.reshape(len(rewards), -1).var(axis=1, ddof=1).mean()),
        "window_var": float(rewards.var(axis=2, ddof=1).mean()),
        "window_share": float(share(rewards)),
        "window_share_95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
        "rewards": rewards.round(4).tolist(),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", default=",".join(SAMPLERS))
    parser.add_argument("--starts", default="0,2", help="window starts (3 steps each)")
    parser.add_argument("--prompts-per-tag", type=int, default=4)
    parser.add_argument("--inits", type=int, default=4)
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "window_noise_share.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    rng = np.random.default_rng(args.seed)
    prompts = [
        p
        for tag_prompts in train_prompt_set().values()
        for p in rng.choice(tag_prompts, min(args.prompts_per_tag, len(tag_prompts)), replace=False)
    ]
    results = {}
    for path in args.pipelines.split(","):
        kind, noise_level = SAMPLERS[path]
        policy = policy_for(load_pipeline(ROOT / path), max_sequence_length=16)
        for start in (int(s) for s in args.starts.split(",")):
            r = spread(policy, prompts, kind, noise_level, (start, start + 3), args.inits, args.draws, args.seed)
            results[f"{Path(path).name} window {start}-{start + 2}"] = {"kind": kind, "noise_level": noise_level, **r}
            print(
                f"{Path(path).name:10s} {kind:4s} window {start}-{start + 2}: mean reward {r['mean_reward']:.3f}  "
                f"within-prompt var {r['within_prompt_var']:.4f}  window share {r['window_share']:.2f} "
                f"[{r['window_share_95'][0]:.2f}, {r['window_share_95'][1]:.2f}]",
                flush=True,
            )
    args.out.write_text(
        json.dumps({"prompts": prompts, "inits": args.inits, "draws": args.draws, "results": results}, indent=1) + "\n"
    )
    return results


if __name__ == "__main__":
    main()
