"""End to end: a tiny GRPO budget on the embedded pipeline raises the reward of fixed-seed samples."""

import torch
from conftest import REPO
from run_helpers import tiny_run_config

from flowrl.config import load_config
from flowrl.inference import generate
from flowrl.rewards import build_reward
from flowrl.train import Trainer

PROMPTS = ["a red circle", "three squares", "a blue triangle and a green circle", "a square above a circle"]


def _mean_reward(policy, reward) -> float:
    images, records = generate(policy, PROMPTS, 4, seed=11, num_steps=6, guidance_scale=4.5, desc=None)
    samples = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    return reward(samples, [r["prompt"] for r in records]).scores.mean().item()


def test_grpo_raises_jpeg_compressibility(tmp_path):
    config = tiny_run_config(
        tmp_path / "learn.yaml",
        REPO / "pipelines/shapes-sd3",
        tmp_path / "runs",
        "learn",
        updates=8,
        groups_per_update=4,
        group_size=4,
        lr=3e-3,
        optimizer_steps_per_update=1,
        microbatch_size=16,
        ema_decay=0.0,
        checkpoint_every=0,
    )
    trainer = Trainer(
        load_config(
            config, ["sampler.guidance_scale=4.5", "sampler.num_steps=6", "algorithm.params.timestep_fraction=1.0"]
        ),
        log=False,
    )
    reward = build_reward("jpeg_compressibility")
    before = _mean_reward(trainer.policy, reward)
    trainer.run()
    after = _mean_reward(trainer.policy, reward)
    assert after > before + 0.02, (before, after)  # kilobytes saved per image
