"""One policy in two threads: the asynchronous rollout worker samples with a copy of the learner's policy that
shares its frozen weights, its embedding cache and its encoding lock (flowrl/async_rollouts.py)."""

from __future__ import annotations

import copy


def sharing_copy(policy):
    """A second policy for another thread that shares `policy`'s frozen weights and buffers (under LoRA the denoiser's
    base weights, and the VAE and text encoders: only read, by no-grad passes), its embedding cache and its encoding
    lock, and owns copies of the trainable weights, so a snapshot loads into it while `policy` trains. A full
    fine-tune's denoiser is trainable, so it is copied."""
    shared = {
        id(t): t
        for module in policy.components().values()
        for t in [*module.parameters(), *module.buffers()]
        if not t.requires_grad
    }
    for value in (getattr(policy, "embedding_cache", None), policy._encode_lock):
        if value is not None:
            shared[id(value)] = value
    return copy.deepcopy(policy, shared)
