"""Plain generation with a policy (ODE by default): what `flowrl sample`, evaluation and reports use.

Sample k of prompt p always uses seed derived_seed(seed, p, k), so base and tuned models are compared on the same
noise, and any subset of prompts reproduces the same images.
"""
from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from .images import to_uint8
from .prompt_source import derived_seed
from .rollout import rollout, sample_generators


def sample_seeds(seed: int, num_prompts: int, num_per_prompt: int) -> list[int]:
    return [derived_seed(seed, p, k) for p in range(num_prompts) for k in range(num_per_prompt)]


@torch.no_grad()
def generate(policy, prompts: list[str], num_per_prompt: int = 1, seed: int = 0, num_steps: int = 20,
             guidance_scale: float = 4.5, height: int = 32, width: int = 32, kind: str = "ode",
             noise_level: float = 0.0, batch_size: int = 64, desc: str | None = "sampling") -> tuple[np.ndarray, list[dict]]:
    """Images (uint8 [N, H, W, 3]) for every prompt x num_per_prompt, and one record per image (prompt, seed)."""
    expanded = [p for p in prompts for _ in range(num_per_prompt)]
    seeds = sample_seeds(seed, len(prompts), num_per_prompt)
    shape = policy.noise_shape(height, width)
    outputs = []
    bar = tqdm(total=len(expanded), desc=desc, disable=desc is None, mininterval=2)
    for start in range(0, len(expanded), batch_size):
        chunk = expanded[start:start + batch_size]
        cond = policy.encode(chunk, guidance_scale)
        traj = rollout(policy, cond, sample_generators(seeds[start:start + batch_size]), shape, num_steps, kind,
                       noise_level, guidance_scale)
        outputs.append(to_uint8(policy.decode(traj.final)))
        bar.update(len(chunk))
    bar.close()
    records = [{"prompt": p, "seed": s} for p, s in zip(expanded, seeds)]
    return np.concatenate(outputs), records
