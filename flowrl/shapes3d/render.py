"""The condition image: any SDF rendered from the world's fixed view by sphere tracing (orthographic camera, Lambert
shading plus ambient light, black background). The same function renders a generated shape's field, so the
condition-consistency reward compares like with like (silhouette IoU)."""
from __future__ import annotations

import numpy as np
import torch

VIEW = (1.0, 0.7, 1.3)  # the camera looks from this direction towards the origin
LIGHT = (0.4, 1.0, 0.6)
TARGET = (0.0, -0.1, 0.0)  # the point at the image centre
SPAN = 1.0  # the image covers [-SPAN, SPAN]^2 of the view plane around TARGET
AMBIENT = 0.25


def _unit(v) -> torch.Tensor:
    v = torch.tensor(v, dtype=torch.float32)
    return v / v.norm()


def camera_rays(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(origins [size^2, 3], direction [3]) of the orthographic camera, rows top to bottom."""
    forward = -_unit(VIEW)
    right = torch.linalg.cross(forward, torch.tensor([0.0, 1.0, 0.0]))
    right = right / right.norm()
    up = torch.linalg.cross(right, forward)
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 * SPAN - SPAN
    v, u = torch.meshgrid(-coords, coords, indexing="ij")
    origins = torch.tensor(TARGET) + u.reshape(-1, 1) * right + v.reshape(-1, 1) * up - 3.0 * forward
    return origins, forward


def render(sdf, size: int = 32, steps: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(shaded uint8 image [size, size, 3] in grey, silhouette bool [size, size]) of an SDF callable on [N, 3]."""
    origins, direction = camera_rays(size)
    depth = torch.zeros(len(origins))
    with torch.no_grad():
        for _ in range(steps):
            distance = sdf(origins + depth[:, None] * direction)
            depth = depth + distance.clamp(min=0) * 0.9  # a safety factor: the cone's field is a bound
        points = origins + depth[:, None] * direction
        hit = sdf(points).abs() < 1e-2
        eps = 2e-3
        offsets = torch.eye(3) * eps
        normal = torch.stack([sdf(points + o) - sdf(points - o) for o in offsets], -1)
        normal = normal / normal.norm(dim=-1, keepdim=True).clamp(min=1e-8)
        shade = AMBIENT + (1 - AMBIENT) * (normal @ _unit(LIGHT)).clamp(min=0)
    grey = torch.where(hit, shade, torch.zeros_like(shade)).reshape(size, size)
    image = (grey.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    return np.repeat(image[..., None], 3, -1), hit.reshape(size, size).numpy()


def silhouette_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0
