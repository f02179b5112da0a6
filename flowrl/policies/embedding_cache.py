"""Prompt encoding with the text encoders on the device only while they run (offload_text_encoders) and, with
memory.embedding_cache, each distinct prompt encoded once per (prompt, CFG on or off) and kept in host memory.

The cache is the policy's `embedding_cache` (a dict, or None when off; set by `set_memory_options`); encoding holds
the policy's `_encode_lock`, which a sharing copy (the asynchronous rollout worker's) shares with its cache.
"""

from __future__ import annotations

import torch

from flowrl.policies.conditioning import Conditioning


def encode_prompts_cached(policy, prompts: list[str], guidance_scale: float) -> Conditioning:
    """`policy.encode_prompts(prompts, guidance_scale)` through the cache: the prompts it lacks are encoded (each
    once) and kept there on the host, the rest read from it; the rows come back in `prompts`' order on the policy's
    device. Without a cache every prompt is encoded, as given."""
    cache = getattr(policy, "embedding_cache", None)
    key = policy.uses_cfg(guidance_scale)
    with policy._encode_lock:
        missing = list(dict.fromkeys(p for p in prompts if cache is None or (p, key) not in cache))
        fresh = None
        if missing:
            with policy.text_encoders_on_device():
                fresh = policy.encode_prompts(missing if cache is not None else prompts, guidance_scale)
        if cache is None:
            return fresh
        for row, prompt in enumerate(missing):  # kept in host memory: a real prompt file's T5 embeddings grow
            entry = fresh.select([row]).to("cpu")  # without bound: 1-4 MB a prompt for T5 families, ~8 MB for
            if entry.negative:  # FLUX.2 klein 4B
                entry.negative = shared_negative(cache, key, entry.negative)
            cache[(prompt, key)] = entry
        rows = [cache[(p, key)] for p in prompts]
    return Conditioning(
        {k: torch.cat([r.tensors[k] for r in rows]) for k in rows[0].tensors},
        {k: torch.cat([r.negative[k] for r in rows]) for k in rows[0].negative},
        list(prompts),
    ).to(policy.device)


def shared_negative(cache: dict, key, negative: dict) -> dict:
    """The cached unconditional branch for `negative` (its tensors by name) under CFG key `key`: every shipped
    family's is one prompt ("" or " ") for all prompts, so an equal one is kept once (the first copy, returned), not
    once a prompt, which would double the cache's host memory; a different one is returned as it is."""
    first = cache.setdefault(("unconditional branch", key), negative)
    same = first.keys() == negative.keys() and all(
        first[k].shape == negative[k].shape and torch.equal(first[k], negative[k]) for k in first
    )
    return first if same else negative
