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


def turntable_view(angle_degrees: float) -> tuple[float, float, float]:
    """The world's view direction turned about the vertical axis by `angle_degrees` (0: the condition's view)."""
    a = np.radians(angle_degrees)
    x, y, z = VIEW
    return (float(x * np.cos(a) + z * np.sin(a)), y, float(-x * np.sin(a) + z * np.cos(a)))


def camera_rays(size: int, view=VIEW) -> tuple[torch.Tensor, torch.Tensor]:
    """(origins [size^2, 3], direction [3]) of the orthographic camera looking from `view`, rows top to bottom."""
    forward = -_unit(view)
    right = torch.linalg.cross(forward, torch.tensor([0.0, 1.0, 0.0]))
    right = right / right.norm()
    up = torch.linalg.cross(right, forward)
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 * SPAN - SPAN
    v, u = torch.meshgrid(-coords, coords, indexing="ij")
    origins = torch.tensor(TARGET) + u.reshape(-1, 1) * right + v.reshape(-1, 1) * up - 3.0 * forward
    return origins, forward


def render(sdf, size: int = 32, steps: int = 64, view=VIEW) -> tuple[np.ndarray, np.ndarray]:
    """(shaded uint8 image [size, size, 3] in grey, silhouette bool [size, size]) of an SDF callable on [N, 3],
    seen from `view` (the condition's view by default)."""
    origins, direction = camera_rays(size, view)
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


def grid_field(values) -> "callable":
    """An SDF callable on points [N, 3] from a field sampled on the world grid (geometry.grid_points: cell centres
    over [-1, 1]^3, x slowest): trilinear inside the cube, plus the distance to the cube outside it, so that sphere
    tracing from outside moves in full steps."""
    import torch.nn.functional as F

    volume = torch.as_tensor(np.asarray(values, dtype=np.float32))[None, None]  # [1, 1, X, Y, Z]

    def sdf(points: torch.Tensor) -> torch.Tensor:
        inside = points.clamp(-1, 1)
        # grid_sample reads (x, y, z) as (W, H, D): our volume's last axis (z) is W
        coords = inside[:, [2, 1, 0]].reshape(1, -1, 1, 1, 3)
        sampled = F.grid_sample(volume, coords, mode="bilinear", padding_mode="border", align_corners=False)
        return sampled.reshape(-1) + (points - inside).norm(dim=-1)

    return sdf


def silhouette(image: np.ndarray) -> np.ndarray:
    """The silhouette of a condition image (uint8 [H, W, 3], black background): its lit pixels."""
    return np.asarray(image).max(-1) > 0


def silhouette_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0
