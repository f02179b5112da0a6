"""GTPO (Group Tactile Policy Optimisation, from PhysTacGen; no arXiv id or code given by the source) for the
description policy: G descriptions per camera image, task rewards, advantages normalised within each image's
group, and a clipped token-level objective.

Rewards, flowrl's reading of "task-specific rewards": the share of the material's five attributes the description
gets right (kind, pitch, direction, feel, friction; a smooth material has no pitch or direction, so three), plus
`ssim_weight` times the SSIM of the tactile image the frozen generator draws from the description against the
sensor's.

The objective is PPO's clipped surrogate per token, averaged over every valid token of the batch (each token counts
once, so long descriptions are not down-weighted per token as a per-sequence mean would do); the advantage of a
description is its group-normalised reward (std within the group, as the group form of GRPO).
"""

from __future__ import annotations

import torch

from flowrl.algorithms.advantages import group_advantages
from flowrl.algorithms.grpo import clipped_surrogate
from flowrl.worlds.tactile.materials import Material

ATTRIBUTE_WORDS = {
    "kind": ("ridged", "woven", "bumpy", "grained", "smooth"),
    "pitch": ("fine", "medium", "coarse"),
    "direction": ("horizontal", "diagonal", "vertical"),
    "feel": ("soft", "rough"),
    "friction": ("high", "low"),
}


def attributes(text: str) -> dict[str, str | None]:
    """The attribute words a description names (the first of each attribute's words found; None where none)."""
    words = text.lower().replace(",", " ").split()
    return {name: next((w for w in words if w in options), None) for name, options in ATTRIBUTE_WORDS.items()}


def attribute_accuracy(text: str, material: Material) -> float:
    """The share of the material's attributes the description names correctly."""
    truth = attributes(material.description())
    named = attributes(text)
    relevant = [k for k, v in truth.items() if v is not None]
    return sum(named[k] == truth[k] for k in relevant) / len(relevant)


def description_rewards(
    texts: list[str], materials: list[Material], ssim: torch.Tensor | None = None, ssim_weight: float = 1.0
) -> torch.Tensor:
    """[B] rewards: attribute accuracy, plus ssim_weight x SSIM where the generator's SSIMs [B] are given."""
    reward = torch.tensor([attribute_accuracy(t, m) for t, m in zip(texts, materials)], dtype=torch.float32)
    return reward if ssim is None else reward + ssim_weight * ssim.float()


def gtpo_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    clip_range: float = 0.2,
) -> torch.Tensor:
    """The clipped token-level objective (a loss to minimise): token log-probs [B, T] of the policy now and of the
    one that sampled, `mask` [B, T] (1 on the description's tokens), rewards [B] and each description's group
    (its camera image) [B]."""
    advantages = group_advantages(rewards, group_ids, std="group", clip=None)
    ratio = torch.exp(new_log_probs - old_log_probs)
    per_token = clipped_surrogate(ratio, advantages[:, None].to(ratio), clip_range)
    mask = mask.to(per_token)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)
