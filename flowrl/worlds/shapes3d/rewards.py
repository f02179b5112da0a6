"""Geometric rewards for 3D samples (SDF grids [B, R, R, R] over [-1, 1]^3, as the 3D policy decodes them):

- `silhouette_iou`: condition consistency. The generated field is rendered from the condition image's view (the
  world's fixed camera) and its silhouette compared with the condition image's lit pixels (IoU). Needs no ground
  truth: only the image the sample was conditioned on.
- `mesh_validity`: 1 for a watertight mesh without floaters, else 0; `dense: true` gives
  0.5 watertight + 0.5 (1 - floaters / components) instead (an empty mesh scores 0 either way).
- `mesh_smoothness`: 1 - mean dihedral angle between adjacent faces / pi (marching-cubes staircase and noise lower it).
- `shape_match`: the analytic quality score of the 3D shapes world: volume IoU (or F-score at 0.05) against the
  ground-truth solid the condition was rendered from (a verifier reward: it reads the world's truth). With
  `against: prompt` it is the mean score against `draws` fixed draws of the solid the prompt describes: what a text
  condition determines. Against one item's solid, a text-conditioned sample is also scored on the size jitter and
  shift of that one draw, which no prompt says; within a group that lottery outweighs the sample's own quality.
None is differentiable.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np
import torch

from flowrl.errors import ConfigError
from flowrl.rewards.base import REWARDS, Reward, RewardOutput, condition_items


def _grids(samples: torch.Tensor) -> np.ndarray:
    if samples.ndim != 4:
        raise ValueError(f"3D rewards take SDF grids [B, R, R, R]; got shape {tuple(samples.shape)}")
    return samples.detach().float().cpu().numpy()


class GeometryReward(Reward):
    modalities = ("3d",)

    def __call__(self, samples: torch.Tensor, prompts: list[str], meta: dict | None = None) -> RewardOutput:
        scores = [self.score(grid, item) for grid, item in zip(_grids(samples), condition_items(prompts, meta))]
        return RewardOutput(torch.tensor(scores, dtype=torch.float32))

    def score(self, grid: np.ndarray, item) -> float:
        raise NotImplementedError


@REWARDS.register("silhouette_iou")
class SilhouetteIoU(GeometryReward):
    name = "silhouette_iou"

    def score(self, grid, item) -> float:
        from flowrl.sdf import grid_field, render, silhouette_iou
        from flowrl.worlds.shapes3d.policy import condition_image

        target = condition_image(item, 32).max(0).values.numpy() > 0  # the condition's lit pixels
        return silhouette_iou(render(grid_field(grid), target.shape[0])[1], target)


@REWARDS.register("mesh_validity")
class MeshValidity(GeometryReward):
    name = "mesh_validity"

    def __init__(self, dense: bool = False):
        self.dense = dense

    def score(self, grid, item) -> float:
        from flowrl.sdf import mesh_from_grid, validity

        v = validity(mesh_from_grid(grid))
        if not self.dense or v["components"] == 0:
            return v["valid"]
        return 0.5 * v["watertight"] + 0.5 * (1 - v["floaters"] / v["components"])


@REWARDS.register("mesh_smoothness")
class MeshSmoothness(GeometryReward):
    name = "mesh_smoothness"

    def score(self, grid, item) -> float:
        from flowrl.sdf import mesh_from_grid

        mesh = mesh_from_grid(grid)
        if mesh is None or len(mesh.face_adjacency_angles) == 0:
            return 0.0
        return float(1 - np.mean(mesh.face_adjacency_angles) / np.pi)


@REWARDS.register("shape_match")
class ShapeMatch(GeometryReward):
    name = "shape_match"

    def __init__(
        self, metric: Literal["iou", "fscore"] = "iou", against: Literal["solid", "prompt"] = "solid", draws: int = 8
    ):
        if metric not in ("iou", "fscore"):
            raise ConfigError(f"reward shape_match: params.metric: expected iou or fscore, got {metric!r}")
        if against not in ("solid", "prompt"):
            raise ConfigError(f"reward shape_match: params.against: expected solid or prompt, got {against!r}")
        if int(draws) < 1:
            raise ConfigError(f"reward shape_match: params.draws: expected a count of 1 or more, got {draws!r}")
        self.metric, self.against, self.draws = metric, against, int(draws)

    def score(self, grid, item) -> float:
        from flowrl.sdf import compare, volume_iou
        from flowrl.worlds.shapes3d.conditions import prompt_solids, solid_of

        solids = prompt_solids(item.prompt, self.draws) if self.against == "prompt" else (solid_of(item),)
        scores = [
            volume_iou(grid, truth) if self.metric == "iou" else compare(grid, truth)["fscore"]
            for truth in (_truth_grid(solid, len(grid)) for solid in solids)
        ]
        return float(np.mean(scores))


@lru_cache(maxsize=4096)
def _truth_grid(solid, resolution: int) -> np.ndarray:
    from flowrl.worlds.shapes3d.geometry import sdf_grid

    grid = sdf_grid(solid, resolution)
    grid.setflags(write=False)  # shared by every caller of the cache
    return grid
