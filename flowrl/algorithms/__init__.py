"""Algorithms, one file each, registered by name."""
from . import ddpo, grpo, mend, nft, reward_backprop  # noqa: F401  (registration)
from .base import Algorithm, RolloutBatch, WorkItems, algorithm_names, build_algorithm

__all__ = ["Algorithm", "RolloutBatch", "WorkItems", "algorithm_names", "build_algorithm"]
