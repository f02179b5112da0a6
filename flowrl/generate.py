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
             noise_level: float = 0.0, batch_size: int = 64, desc: str | None = "sampling", fk=None,
             fk_reward=None, steering=None, probe=None, seeds: list[int] | None = None) -> tuple[np.ndarray, list[dict]]:
    """Images (uint8 [N, H, W, 3]) for every prompt x num_per_prompt, and one record per image (prompt, seed).

    With `fk` (an FKConfig) and `fk_reward`, each image is the first particle of its own FK-steered set of
    fk.num_particles particles (a draw from the final, resampled set), with its final reward in the record.
    With `steering` (a safety.steering.SteeringConfig) and its `probe`, a SafetyMonitor watches every step and
    steers the samples on which the probe fires; records say whether and at which step it fired.
    `seeds` (one per image) replaces the derived ones, so a subset of a prompt list can keep its images' noise.
    """
    expanded = [p for p in prompts for _ in range(num_per_prompt)]
    seeds = sample_seeds(seed, len(prompts), num_per_prompt) if seeds is None else list(seeds)
    shape = policy.noise_shape(height, width)
    if steering is not None:
        from .safety.steering import FK_MODES

        if steering.mode in FK_MODES:  # particles resampled with the probe as potential
            from .fk import FKConfig

            fk = FKConfig(num_particles=steering.fk_particles, lam=steering.fk_lambda,
                          resample_every=steering.fk_every)
    k = fk.num_particles if fk is not None else 1
    per_batch = max(1, batch_size // k)
    outputs, records = [], []
    bar = tqdm(total=len(expanded), desc=desc, disable=desc is None, mininterval=2)
    for start in range(0, len(expanded), per_batch):
        chunk, chunk_seeds = expanded[start:start + per_batch], seeds[start:start + per_batch]
        particle_seeds = [derived_seed(s, j) for s in chunk_seeds for j in range(k)] if k > 1 else chunk_seeds
        cond = policy.encode([p for p in chunk for _ in range(k)], guidance_scale)
        callbacks, resampler, monitor = [], None, None
        fk_generator = torch.Generator().manual_seed(chunk_seeds[0])
        if steering is not None:
            from .safety.steering import ProbeFK, SafetyMonitor

            monitor = SafetyMonitor(policy, probe, steering, len(cond))
            if fk is not None:
                resampler = ProbeFK(monitor, fk, num_steps, len(chunk), fk_generator)
        elif fk is not None:
            from .fk import FKSteering
            from .rewards import latent_scorer

            resampler = FKSteering(fk, latent_scorer(policy, fk_reward), num_steps, len(chunk), fk_generator)
        if resampler is not None:
            callbacks = [resampler]
        traj = rollout(policy, cond, sample_generators(particle_seeds), shape, num_steps, kind, noise_level,
                       guidance_scale, callbacks=callbacks, guide=monitor)
        outputs.append(to_uint8(policy.decode(traj.final[::k])))
        for n, (prompt, s) in enumerate(zip(chunk, chunk_seeds)):
            record = {"prompt": prompt, "seed": s}
            if resampler is not None:
                record["fk_reward"] = float(resampler.final_rewards[n * k])
            if monitor is not None:
                record["probe_fired_at"] = int(monitor.fired_at[n * k])  # -1: never fired
            records.append(record)
        bar.update(len(chunk))
    bar.close()
    return np.concatenate(outputs), records
