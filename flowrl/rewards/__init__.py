"""Rewards: one contract, a registry by name (built-ins load on first use), weighted combination."""

from flowrl.rewards.base import (
    Reward,
    RewardOutput,
    WeightedSum,
    build_reward,
    check_reward,
    latent_scorer,
    register_reward,
    reward_names,
)

__all__ = [
    "Reward",
    "RewardOutput",
    "WeightedSum",
    "build_reward",
    "check_reward",
    "latent_scorer",
    "register_reward",
    "reward_names",
]
