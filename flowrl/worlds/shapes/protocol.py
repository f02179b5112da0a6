"""The eval-split protocol the benchmarks share: sample the 36 eval prompts x 4 with fixed seeds and measure
alignment (learned reward, verifier accuracy) and diversity (pixel and scorer-feature distances within a prompt,
Vendi score, spread of the attributes a prompt leaves open), plus the distance to a base model's same-seed samples.
"""

from __future__ import annotations

import numpy as np
import torch

from flowrl.config import EvalSection
from flowrl.images import to_unit
from flowrl.inference import generate
from flowrl.worlds.shapes.diversity import (
    feature_distance,
    free_attribute_spread,
    mean_vendi,
    paired_pixel_distance,
    within_prompt_pixel_distance,
)
from flowrl.worlds.shapes.evaluation import shapes_accuracy
from flowrl.worlds.shapes.prompts import eval_prompt_set

# the same protocol as a run's eval section by default (config.EvalSection), stated once there
PROTOCOL = {key: getattr(EvalSection(), key) for key in ("num_per_prompt", "seed", "num_steps", "guidance_scale")}


@torch.no_grad()
def measure(images: np.ndarray, prompts: list[str], scorer, base_images: np.ndarray | None = None) -> dict:
    k = PROTOCOL["num_per_prompt"]
    pixels = to_unit(images)
    features = scorer.image_embeddings(pixels).cpu().numpy()
    out = {
        "learned_reward": float(scorer(pixels, prompts).scores.mean()),
        "accuracy": shapes_accuracy(images, prompts)["overall"],
        "diversity": within_prompt_pixel_distance(images, k),
        "feature_diversity": feature_distance(features, k),
        "vendi": mean_vendi(features, k),
        **free_attribute_spread(images, prompts, k),
    }
    if base_images is not None:
        out["distance_to_base"] = paired_pixel_distance(images, base_images)
    return out


def evaluate_policy(
    policy,
    scorer,
    base_images: np.ndarray | None = None,
    kind: str = "ode",
    noise_level: float = 0.0,
    fk=None,
    fk_reward=None,
) -> tuple[dict, np.ndarray]:
    """Sample the eval split with `policy` and measure it; returns (metrics, images)."""
    from flowrl.fk import FKSteer

    p = PROTOCOL
    images, records = generate(
        policy,
        eval_prompt_set(),
        p["num_per_prompt"],
        p["seed"],
        p["num_steps"],
        p["guidance_scale"],
        kind=kind,
        noise_level=noise_level,
        desc=None,
        steer=FKSteer(fk, fk_reward) if fk is not None else None,
    )
    return measure(images, [r["prompt"] for r in records], scorer, base_images), images
