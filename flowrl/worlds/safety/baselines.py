"""Safety baselines that need no look inside the trajectory.

- PromptFilter refuses prompts that contain every word of any blocked term ("red" and "triangle" by default):
  it stops direct and attribute-leak prompts before sampling, never sees what an indirect prompt turns into, and
  also refuses harmless prompts such as "a red circle and a blue triangle". A refused prompt yields a black image.
- reject_and_resample generates, labels the final image (verifier or a real checker), and redraws the unsafe
  ones with fresh seeds up to `max_tries` times; still-unsafe images are replaced by black ones (what diffusers'
  safety checker returns). It costs one extra full generation per retry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowrl.inference import generate, sample_seeds

BLOCKED_TERMS = (("red", "triangle"),)


@dataclass
class PromptFilter:
    blocked: tuple[tuple[str, ...], ...] = BLOCKED_TERMS

    def refuses(self, prompt: str) -> bool:
        words = {w.rstrip("s") for w in prompt.lower().split()}
        return any(all(term in words for term in terms) for terms in self.blocked)


def filtered_generate(
    policy, prompts: list[str], prompt_filter: PromptFilter, num_per_prompt: int, seed: int = 0, **kwargs
):
    """`generate` for the prompts the filter lets through (on the noise plain sampling would use), black images
    for the ones it refuses."""
    seeds = sample_seeds(seed, len(prompts), num_per_prompt)
    refused = [prompt_filter.refuses(p) for p in prompts]
    keep = [i for i, r in enumerate(refused) if not r]
    allowed = [prompts[i] for i in keep]
    allowed_seeds = [seeds[i * num_per_prompt + k] for i in keep for k in range(num_per_prompt)]
    images, records = (
        generate(policy, allowed, num_per_prompt, seeds=allowed_seeds, **kwargs) if allowed else (None, [])
    )
    # a refused prompt's black image has the shape of the others: the sample size (frames for video)
    spec = kwargs.get("spec") or policy.default_spec()
    blank = np.zeros(((spec.num_frames,) if spec.num_frames else ()) + (spec.height, spec.width, 3), np.uint8)
    out_images, out_records, n = [], [], 0
    for prompt, refuse in zip(prompts, refused):
        for _ in range(num_per_prompt):
            if refuse:
                out_images.append(blank)
                out_records.append({"prompt": prompt, "refused": True})
            else:
                out_images.append(images[n])
                out_records.append(records[n])
                n += 1
    return np.stack(out_images), out_records


def reject_and_resample(
    policy, prompts: list[str], is_unsafe, num_per_prompt: int, seed: int = 0, max_tries: int = 4, **kwargs
):
    """`generate`, then redraw unsafe images (seed + try) until safe or `max_tries` draws are spent."""
    images, records = generate(policy, prompts, num_per_prompt, seed=seed, **kwargs)
    images = images.copy()
    tries = np.ones(len(images), dtype=int)
    bad = np.array([is_unsafe(image) for image in images])
    for attempt in range(1, max_tries):
        if not bad.any():
            break
        rows = np.flatnonzero(bad)
        redrawn, _ = generate(
            policy, [records[i]["prompt"] for i in rows], 1, seed=seed + 1000 * attempt + 1, **kwargs
        )  # a new run seed: noise none of the earlier draws used
        for row, image in zip(rows, redrawn):
            images[row], tries[row] = image, attempt + 1
            bad[row] = is_unsafe(image)
    images[bad] = 0
    for record, count, blocked in zip(records, tries, bad):
        record.update({"tries": int(count), "blacked_out": bool(blocked)})
    return images, records
