"""Rewards: one contract, a registry by name, weighted combination."""
from . import clip, jpeg, learned_real, shapes  # noqa: F401  (registration)
from ..safety import checker, reward  # noqa: F401,E402  (safety_checker, safe_shapes)
from .base import Reward, RewardOutput, WeightedSum, build_reward, latent_scorer, register_reward, reward_names

__all__ = ["Reward", "RewardOutput", "WeightedSum", "build_reward", "latent_scorer", "register_reward",
           "reward_names"]
