"""The 3D shapes world's evaluation: every generated field against its ground-truth solid (the measures of
flowrl/sdf.py), per tag and overall."""

from __future__ import annotations

import numpy as np

from flowrl.sdf import compare

METRICS = ("iou", "chamfer", "fscore", "watertight", "valid", "components")


def summarise(rows: list[dict], tags: list[str]) -> dict:
    """Per-tag means (NaN-skipping: Chamfer is NaN for an empty mesh) and their mean over tags of every metric in
    METRICS: {'overall': {metric: value}, 'tags': {tag: {metric: value}}, 'counts': {tag: n}, 'rows': per sample}."""
    from flowrl.worlds.shapes3d.prompts import TAGS

    per_tag = {
        tag: {k: float(np.nanmean([r[k] for r, t in zip(rows, tags) if t == tag])) for k in METRICS}
        for tag in TAGS
        if tag in tags
    }
    overall = {k: float(np.nanmean([per_tag[t][k] for t in per_tag])) for k in METRICS}
    return {"overall": overall, "tags": per_tag, "counts": {t: tags.count(t) for t in per_tag}, "rows": rows}


def evaluate_fields(grids, solids, tags: list[str]) -> dict:
    """`summarise` of every generated field [R, R, R] against its solid's field on the same grid."""
    from flowrl.worlds.shapes3d.geometry import sdf_grid

    rows = [compare(np.asarray(g), sdf_grid(s, len(g)), seed=k) for k, (g, s) in enumerate(zip(grids, solids))]
    return summarise(rows, tags)
