"""Algorithms, one file each, registered by name (loaded on first use)."""

from flowrl.algorithms.base import (
    Algorithm,
    RolloutBatch,
    WorkItems,
    algorithm_names,
    build_algorithm,
    register_algorithm,
)

__all__ = ["Algorithm", "RolloutBatch", "WorkItems", "algorithm_names", "build_algorithm", "register_algorithm"]
