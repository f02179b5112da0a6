"""Rewards: one contract, a registry by name, weighted combination."""
from . import clip, jpeg, learned_real, shapes  # noqa: F401  (registration)
from .base import Reward, RewardOutput, WeightedSum, build_reward, latent_scorer, register_reward, reward_names

__all__ = ["Reward", "RewardOutput", "WeightedSum", "build_reward", "latent_scorer", "register_reward",
           "reward_names"]
