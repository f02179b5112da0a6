"""Signed distance fields sampled on a grid, the sample type of 3D generation: the grid, meshes by marching cubes,
sphere-traced renders (any SDF callable, a grid's field by trilinear interpolation), and the measures of 3D
generation. Generic: no world's shapes here (the 3D shapes world's solids are in flowrl/worlds/shapes3d/).

Space is the cube [-1, 1]^3, y up; a grid holds the field at cell centres, x slowest. Renders use an orthographic
camera looking from VIEW (the 3D shapes world's condition view) with Lambert shading on black. Measures, as in 3D
reconstruction papers: volume IoU of the insides; Chamfer distance, the mean of the two directed mean
nearest-neighbour distances (L2, not squared), and F-score at tau, the harmonic mean of precision (generated points
within tau of the truth) and recall (true points within tau of the generated), on surface points; validity:
watertight, connected components, floaters (a component under 10% of the largest one's bounding-box diagonal).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.spatial import cKDTree


def grid_points(resolution: int, bound: float = 1.0) -> torch.Tensor:
    """[R^3, 3] cell-centre points of a regular grid over [-bound, bound]^3, x slowest, z fastest."""
    axis = (torch.arange(resolution, dtype=torch.float32) + 0.5) / resolution * 2 * bound - bound
    return torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), -1).reshape(-1, 3)


def mesh_from_grid(values: np.ndarray, bound: float = 1.0, level: float = 0.0):
    """Marching cubes on an SDF (or negated occupancy) grid sampled at cell centres -> a trimesh.Trimesh in world
    units, or None when the level set is empty. The grid is padded with 'outside' so meshes of solids that touch the
    cube's faces close."""
    import trimesh
    from skimage.measure import marching_cubes

    r = values.shape[0]
    padded = np.pad(values, 1, constant_values=max(float(values.max()), level + 1e-3))
    if not (padded.min() < level < padded.max()):
        return None
    vertices, faces, _, _ = marching_cubes(padded, level=level)
    cell = 2 * bound / r
    vertices = (vertices - 1 + 0.5) * cell - bound  # undo the padding; index i is the centre of cell i
    return trimesh.Trimesh(vertices=vertices, faces=faces, process=True)  # skimage's winding: normals point out


# ---- renders ---------------------------------------------------------------------------------------------------
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


def grid_field(values) -> callable:
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


def silhouette_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


# ---- measures --------------------------------------------------------------------------------------------------
SURFACE_POINTS = 2048
F_TAU = 0.05  # 2.5% of the cube's side
FLOATER_SHARE = 0.1  # a component whose bounding-box diagonal is under 10% of the largest one's is a floater


def volume_iou(pred_sdf: np.ndarray, true_sdf: np.ndarray) -> float:
    """IoU of the inside (sdf < 0) of two fields sampled on the same grid."""
    a, b = pred_sdf < 0, true_sdf < 0
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def surface_points(mesh, count: int = SURFACE_POINTS, seed: int = 0) -> np.ndarray:
    import trimesh

    points, _ = trimesh.sample.sample_surface(mesh, count, seed=seed)
    return np.asarray(points)


def chamfer_and_fscore(pred: np.ndarray, true: np.ndarray, tau: float = F_TAU) -> tuple[float, float]:
    to_true = cKDTree(true).query(pred)[0]
    to_pred = cKDTree(pred).query(true)[0]
    chamfer = 0.5 * (to_true.mean() + to_pred.mean())
    precision, recall = (to_true < tau).mean(), (to_pred < tau).mean()
    fscore = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return float(chamfer), float(fscore)


def validity(mesh) -> dict:
    """watertight (every component closed), component count and floaters (tiny detached components)."""
    if mesh is None or len(mesh.faces) == 0:
        return {"watertight": 0.0, "components": 0.0, "floaters": 0.0, "valid": 0.0}
    parts = mesh.split(only_watertight=False)
    sizes = [float(np.linalg.norm(p.extents)) for p in parts]
    floaters = sum(s < FLOATER_SHARE * max(sizes) for s in sizes)
    watertight = float(mesh.is_watertight)
    return {
        "watertight": watertight,
        "components": float(len(parts)),
        "floaters": float(floaters),
        "valid": float(watertight and floaters == 0),
    }


def compare(pred_sdf: np.ndarray, true_sdf: np.ndarray, seed: int = 0) -> dict:
    """Every metric of one generated field against the truth, both sampled on the same grid over [-1, 1]^3."""
    pred_mesh, true_mesh = mesh_from_grid(pred_sdf), mesh_from_grid(true_sdf)
    out = {"iou": volume_iou(pred_sdf, true_sdf), **validity(pred_mesh)}
    if pred_mesh is None or true_mesh is None:
        out.update(chamfer=float("nan"), fscore=0.0)
    else:
        out["chamfer"], out["fscore"] = chamfer_and_fscore(
            surface_points(pred_mesh, seed=seed), surface_points(true_mesh, seed=seed + 1)
        )
    return out
