"""Plain generation with a policy (ODE by default): what `flowrl sample`, evaluation and reports use.

Sample k of prompt p always uses seed derived_seed(seed, p, k), so base and tuned models are compared on the same
noise, and any subset of prompts reproduces the same samples. In-generation steering (FK resampling, safety
steering, ...) comes in as a `Steer` built by the caller; this module knows none of them. A steer that resamples
(FK) draws from one generator per output, seeded from the output's own seed, so its resampling does not depend on
how the samples are batched either.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from flowrl.devices import DEFAULT_BATCH_SIZE
from flowrl.policies.base import SampleSpec
from flowrl.prompt_source import derived_seed
from flowrl.rollout import rollout, sample_generators

# derived_seed(output seed, FK_DRAWS) seeds an output's resampling draws (its particles' noise takes parts 0..k-1)
FK_DRAWS = 1_000_003


class Steer:
    """Steering of one generation chunk. `particles` samples are drawn per output (the first of each set is
    kept); `start` returns the rollout callbacks and guide for a chunk; `record(n)` adds fields to output n's
    record."""

    particles = 1

    def start(self, policy, cond, num_outputs: int, num_steps: int, generator: torch.Generator):
        """(rollout callbacks, guide) for a chunk of `num_outputs` outputs under `cond` (`particles` rows each) over
        `num_steps`; `generator`: one per output, for the steer's own draws."""
        return [], None

    def record(self, n: int) -> dict:
        """Fields added to the record of the chunk's output `n`."""
        return {}


def particle_sampler(policy) -> tuple[str, float]:
    """(kind, noise level) FK particles sample with unless told otherwise: a stochastic sampler, since copies of a
    particle made by a resampling must diverge afterwards (under the ODE they stay identical, and FK only chooses
    among the starting noises): the Flow-SDE at 0.7, or DDIM with eta 1 on an epsilon pipeline."""
    return ("ddim", 1.0) if policy.prediction == "epsilon" else ("flow", 0.7)


def contiguous_share(count: int, rank: int, world: int) -> range:
    """Process `rank`'s part of `count` items: contiguous, in rank order, sizes differing by at most one (so no
    process waits long for the others at the end)."""
    size, extra = divmod(count, world)
    start = rank * size + min(rank, extra)
    return range(start, start + size + (rank < extra))


def sample_seeds(seed: int, num_prompts: int, num_per_prompt: int) -> list[int]:
    """The seed of sample k of prompt p, prompt-major: derived_seed(seed, p, k)."""
    return [derived_seed(seed, p, k) for p in range(num_prompts) for k in range(num_per_prompt)]


def generate_samples(
    policy,
    prompts: list,
    num_per_prompt: int = 1,
    seed: int = 0,
    num_steps: int = 20,
    guidance_scale: float = 4.5,
    spec: SampleSpec | None = None,
    kind: str = "ode",
    noise_level: float = 0.0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    desc: str | None = "sampling",
    steer: Steer | None = None,
    seeds: list[int] | None = None,
    sde_window: tuple[int, int] | None = None,
    guide=None,
):
    """A typed sample batch (flowrl.sample_io) for every prompt (or condition item) x num_per_prompt, and one record
    per sample (prompt, seed, plus the steer's fields). `seeds` (one per sample) replaces the derived ones, so a
    subset of a prompt list can keep its samples' noise; `sde_window` limits an SDE `kind` to those steps, as the
    RL rollouts do; `guide` (see FlowPolicy.step) replaces the model output at every step (a steer brings its own)."""
    from flowrl.sample_io import as_samples

    outputs, records = [], []
    for chunk, chunk_records in sample_chunks(
        policy,
        prompts,
        num_per_prompt,
        seed,
        num_steps,
        guidance_scale,
        spec,
        kind,
        noise_level,
        batch_size,
        desc,
        steer,
        seeds,
        sde_window,
        guide,
    ):
        outputs.append(chunk)
        records += chunk_records
    return as_samples(torch.cat(outputs), fps=policy.fps, modality=policy.modality), records


@torch.no_grad()
def sample_chunks(
    policy,
    prompts: list,
    num_per_prompt: int = 1,
    seed: int = 0,
    num_steps: int = 20,
    guidance_scale: float = 4.5,
    spec: SampleSpec | None = None,
    kind: str = "ode",
    noise_level: float = 0.0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    desc: str | None = "sampling",
    steer: Steer | None = None,
    seeds: list[int] | None = None,
    sde_window: tuple[int, int] | None = None,
    guide=None,
):
    """`generate_samples` one batch at a time: yields (decoded tensor on the CPU, records) per batch of at most
    `batch_size` samples, so a caller can write each batch before the next is drawn."""
    expanded = [p for p in prompts for _ in range(num_per_prompt)]
    seeds = sample_seeds(seed, len(prompts), num_per_prompt) if seeds is None else list(seeds)
    spec = spec or policy.default_spec()
    shape = policy.noise_shape(spec)
    k = steer.particles if steer is not None else 1
    per_batch = max(1, batch_size // k)
    bar = tqdm(total=len(expanded), desc=desc, disable=desc is None, mininterval=2)
    for start in range(0, len(expanded), per_batch):
        chunk, chunk_seeds = expanded[start : start + per_batch], seeds[start : start + per_batch]
        particle_seeds = [derived_seed(s, j) for s in chunk_seeds for j in range(k)] if k > 1 else chunk_seeds
        cond = policy.encode([p for p in chunk for _ in range(k)], guidance_scale, spec)
        callbacks, step_guide = [], guide
        if steer is not None:
            # one generator per output, from its own seed: its resampling does not depend on its batch-mates
            callbacks, step_guide = steer.start(
                policy,
                cond,
                len(chunk),
                num_steps,
                [torch.Generator().manual_seed(derived_seed(s, FK_DRAWS)) for s in chunk_seeds],
            )
        traj = rollout(
            policy,
            cond,
            sample_generators(particle_seeds),
            shape,
            num_steps,
            kind,
            noise_level,
            guidance_scale,
            sde_window,
            callbacks=callbacks,
            guide=step_guide,
        )
        decoded = policy.decode_in_chunks(traj.final[::k]).cpu()  # memory.decode_microbatch at a time
        records = [
            {"prompt": cond.prompts[n * k], "seed": s, **(steer.record(n) if steer is not None else {})}
            for n, s in enumerate(chunk_seeds)
        ]
        bar.update(len(chunk))
        yield decoded, records
    bar.close()


def generate(
    policy,
    prompts: list,
    num_per_prompt: int = 1,
    seed: int = 0,
    num_steps: int = 20,
    guidance_scale: float = 4.5,
    spec: SampleSpec | None = None,
    **kwargs,
) -> tuple[np.ndarray, list[dict]]:
    """`generate_samples` as uint8 arrays (images [N, H, W, 3]; video [N, F, H, W, 3])."""
    samples, records = generate_samples(
        policy, prompts, num_per_prompt, seed, num_steps, guidance_scale, spec, **kwargs
    )
    return samples.to_uint8(), records
