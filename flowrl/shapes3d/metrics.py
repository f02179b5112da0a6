"""Geometry against ground truth: volume IoU on a grid, Chamfer distance and F-score on surface points, and mesh
validity (watertight, connected components, floaters). Definitions as in 3D reconstruction papers: Chamfer is the
mean of the two directed mean nearest-neighbour distances (L2, not squared); F-score at tau is the harmonic mean of
precision (generated points within tau of the truth) and recall (true points within tau of the generated)."""
from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

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
    return {"watertight": watertight, "components": float(len(parts)), "floaters": float(floaters),
            "valid": float(watertight and floaters == 0)}


def compare(pred_sdf: np.ndarray, true_sdf: np.ndarray, seed: int = 0) -> dict:
    """Every metric of one generated field against the truth, both sampled on the same grid over [-1, 1]^3."""
    from .geometry import mesh_from_grid

    pred_mesh, true_mesh = mesh_from_grid(pred_sdf), mesh_from_grid(true_sdf)
    out = {"iou": volume_iou(pred_sdf, true_sdf), **validity(pred_mesh)}
    if pred_mesh is None or true_mesh is None:
        out.update(chamfer=float("nan"), fscore=0.0)
    else:
        out["chamfer"], out["fscore"] = chamfer_and_fscore(surface_points(pred_mesh, seed=seed),
                                                           surface_points(true_mesh, seed=seed + 1))
    return out


METRICS = ("iou", "chamfer", "fscore", "watertight", "valid", "components")


def summarise(rows: list[dict], tags: list[str]) -> dict:
    """Per-tag means (NaN-skipping: Chamfer is NaN for an empty mesh) and their mean over tags of every metric in
    METRICS: {'overall': {metric: value}, 'tags': {tag: {metric: value}}, 'counts': {tag: n}, 'rows': per sample}."""
    from .prompts import TAGS

    per_tag = {tag: {k: float(np.nanmean([r[k] for r, t in zip(rows, tags) if t == tag])) for k in METRICS}
               for tag in TAGS if tag in tags}
    overall = {k: float(np.nanmean([per_tag[t][k] for t in per_tag])) for k in METRICS}
    return {"overall": overall, "tags": per_tag, "counts": {t: tags.count(t) for t in per_tag}, "rows": rows}


def evaluate_fields(grids, solids, tags: list[str]) -> dict:
    """`summarise` of every generated field [R, R, R] against its solid's field on the same grid."""
    from .geometry import sdf_grid

    rows = [compare(np.asarray(g), sdf_grid(s, len(g)), seed=k) for k, (g, s) in enumerate(zip(grids, solids))]
    return summarise(rows, tags)
