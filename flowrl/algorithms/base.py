"""What the loop hands an algorithm, the interface it implements, and the registry by name.

The loop rolls out, scores and gathers; the algorithm picks which (sample, step) items to train and returns their
per-item losses. The loop sums those over microbatches and processes, normalizes by the global item count and
steps the optimizer, so every algorithm gets distributed training and exact resume for free.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import from_dict
from ..rollout import Trajectory


@dataclass
class RolloutBatch:
    trajectory: Trajectory  # this process's samples
    rewards: torch.Tensor  # [B_local]
    group_ids: torch.Tensor  # [B_local] prompt group of each sample (global numbering)
    seeds: list[int]  # per-sample seeds (they also seed each sample's choice of trained steps)
    global_rewards: torch.Tensor  # [B_global], gathered from every process
    global_group_ids: torch.Tensor  # [B_global]
    local_index: torch.Tensor  # positions of this process's samples in the global arrays


@dataclass
class WorkItems:
    """The (sample, step) pairs one update trains on this process, each with its own loss weight."""
    sample: torch.Tensor  # [N] long, index into the local batch
    step: torch.Tensor  # [N] long, denoising step index
    weight: torch.Tensor  # [N] float

    def __len__(self) -> int:
        return int(self.sample.numel())

    def subset(self, index) -> "WorkItems":
        return WorkItems(self.sample[index], self.step[index], self.weight[index])


class Algorithm:
    name = "algorithm"
    Params = None  # a dataclass of the algorithm's hyperparameters

    def __init__(self, params, sampler):
        self.params = params
        self.sampler = sampler

    @classmethod
    def from_config(cls, params: dict, sampler):
        return cls(from_dict(cls.Params, params, f"algorithm.params"), sampler)

    # rollout needs
    shared_initial_noise = False

    def prepare(self, batch: RolloutBatch) -> tuple[WorkItems, dict]:
        """Compute per-sample quantities (advantages, ...) and choose the items to train; return metrics too."""
        raise NotImplementedError

    def loss(self, policy, batch: RolloutBatch, items: WorkItems) -> tuple[torch.Tensor, dict]:
        """Per-item losses [N] (weights not yet applied) with gradients, plus per-item diagnostics."""
        raise NotImplementedError


_REGISTRY: dict[str, type[Algorithm]] = {}


def register_algorithm(cls):
    _REGISTRY[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    return sorted(_REGISTRY)


def build_algorithm(name: str, params: dict, sampler) -> Algorithm:
    from ..errors import ConfigError
    if name not in _REGISTRY:
        raise ConfigError(f"algorithm.name: expected one of {algorithm_names()}, got {name!r}")
    algorithm = _REGISTRY[name].from_config(params, sampler)
    if hasattr(algorithm.params, "validate"):
        algorithm.params.validate()
    return algorithm

