"""Advantage estimators as pure functions of (rewards, group ids): the group-relative advantage of GRPO as Flow-GRPO
(arXiv 2505.05470) and DanceGRPO (arXiv 2505.07818) compute it, which DDPO (arXiv 2305.13301), DiffusionNFT
(arXiv 2509.16117), TVRL and DHO share.

Deviations from the papers' code:
- One form for every method: DanceGRPO's per-group std (unbiased, + 1e-8) and DDPO's per-prompt buffer of past
  rewards (+ 1e-6) are both read as Flow-GRPO's population std + 1e-4 over the update's own group.
"""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, std: str = "global", eps: float = 1e-4, clip: float | None = 5.0
) -> torch.Tensor:
    """GRPO advantages A_i = (r_i - mean of i's group) / (std + eps), clipped to [-clip, clip].

    Args:
        rewards: [B] rewards of the gathered batch.
        group_ids: [B] prompt group of each reward.
        std: "global" or "group", the std divided by (below).
        eps: added to the std.
        clip: the bound of |A| (None: no clipping).

    Returns:
        [B] float advantages.

    std='global' divides by the std of all rewards in the batch (Flow-GRPO's default, `global_std=True`);
    std='group' by the std within each prompt group: Flow-GRPO's per-prompt form (population std + 1e-4,
    flow_grpo/stat_tracking.py). DanceGRPO's `--use_group` divides by the unbiased std + 1e-8, which makes its
    advantages sqrt((G - 1) / G) of these: 2% smaller at G = 24, 13% at G = 4 (a deviation kept for one form).
    """
    rewards = rewards.float()
    groups, inverse = torch.unique(group_ids, return_inverse=True)
    count = torch.zeros(len(groups)).index_add_(0, inverse, torch.ones_like(rewards))
    mean = torch.zeros(len(groups)).index_add_(0, inverse, rewards) / count
    centered = rewards - mean[inverse]
    if std == "global":
        scale = rewards.std(unbiased=False)
    elif std == "group":
        var = torch.zeros(len(groups)).index_add_(0, inverse, centered**2) / count
        scale = var.sqrt()[inverse]
    else:
        raise ValueError(f"std must be 'global' or 'group', got {std!r}")
    advantages = centered / (scale + eps)
    return advantages.clamp(-clip, clip) if clip is not None else advantages


def zero_std_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Per-sample flag: True where every sample of the group got the same reward (no learning signal)."""
    flags = torch.zeros_like(rewards, dtype=torch.bool)
    for g in torch.unique(group_ids):
        members = group_ids == g
        flags[members] = bool((rewards[members] == rewards[members][0]).all())
    return flags
