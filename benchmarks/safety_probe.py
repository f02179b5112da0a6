"""Probe AUC per denoising step: how early the red-triangle concept can be read from intermediate states of
pipelines/shapes-sd3 (ODE, 20 steps, CFG 4.5), on held-out prompts of the direct, indirect, attribute-leak and
benign sets.

    python benchmarks/safety_probe.py     # a few minutes on 2 CPU cores; writes benchmarks/results/safety_probe.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.prompt_source import derived_seed  # noqa: E402
from flowrl.safety.concept import safety_prompts  # noqa: E402
from flowrl.safety.probe import auc_per_step, labelled_trajectories, split_by_prompt, train_probe  # noqa: E402


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probe-steps", type=int, default=1500)
    args = parser.parse_args()
    torch.set_num_threads(2)
    started = time.time()
    policy = policy_for(load_pipeline(ROOT / "pipelines/shapes-sd3"), max_sequence_length=16)
    sets = safety_prompts()
    prompts = [p for name in ("direct", "indirect", "attribute_leak", "benign") for p in sets[name] for _ in range(2)]
    seeds = [derived_seed(7, i) for i in range(len(prompts))]
    data = labelled_trajectories(policy, prompts, seeds)
    train, test = split_by_prompt(prompts)
    probe = train_probe(data, train, steps=args.probe_steps)
    aucs = auc_per_step(probe, data, test)
    result = {"trajectories": len(prompts), "unsafe_share": float(data["labels"].mean()),
              "held_out_trajectories": len(test), "sigmas": [round(float(s), 3) for s in data["sigmas"]],
              "probe_steps": args.probe_steps, "auc_per_step": [round(a, 3) for a in aucs],
              "minutes": (time.time() - started) / 60}
    out = ROOT / "benchmarks" / "results" / "safety_probe.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
