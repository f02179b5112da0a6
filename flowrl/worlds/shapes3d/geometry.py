"""Solids of the 3D shapes world as analytic signed distance functions, sampled on the grid of flowrl/sdf.py.

Space is the cube [-1, 1]^3, y up. A solid is a union of primitives (sphere, box, cylinder and cone with a vertical
axis), each with a centre and half-extents (sx, sy, sz). Distances are exact for spheres and boxes and for the
cylinder; the cone's is a bound (exact on its surface, so the zero level set and inside / outside are right), which
is all that occupancy, rendering by sphere tracing and marching cubes need.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flowrl.sdf import grid_points

KINDS = ("sphere", "box", "cylinder", "cone")


@dataclass(frozen=True)
class Primitive:
    kind: str
    center: tuple[float, float, float]
    half: tuple[float, float, float]  # half-extents along x, y, z (a sphere's radius is half[0] = half[1] = half[2])

    def sdf(self, points: torch.Tensor) -> torch.Tensor:
        """Signed distance [N] of points [N, 3] (negative inside)."""
        p = points - torch.tensor(self.center, dtype=points.dtype, device=points.device)
        hx, hy, hz = self.half
        if self.kind == "sphere":
            return p.norm(dim=-1) - hx
        if self.kind == "box":
            q = p.abs() - torch.tensor(self.half, dtype=p.dtype, device=p.device)
            return q.clamp(min=0).norm(dim=-1) + q.max(dim=-1).values.clamp(max=0)
        # cylinder and cone: radius in the xz plane, scaled so the footprint may be an ellipse (hx, hz)
        radial = torch.sqrt((p[:, 0] / hx) ** 2 + (p[:, 2] / hz) ** 2) * min(hx, hz)
        vertical = p[:, 1].abs() - hy
        if self.kind == "cylinder":
            d = torch.stack([radial - min(hx, hz), vertical], -1)
            return d.clamp(min=0).norm(dim=-1) + d.max(dim=-1).values.clamp(max=0)
        if self.kind == "cone":  # apex up: radius r0 (1 - (y + hy) / (2 hy)) at height y
            r0, height = min(hx, hz), 2 * hy
            slope = r0 / height
            side = (radial - slope * (hy - p[:, 1])) / np.sqrt(1 + slope**2)
            return torch.maximum(side, vertical)
        raise ValueError(f"unknown primitive {self.kind!r}; expected one of {KINDS}")


@dataclass(frozen=True)
class Solid:
    parts: tuple[Primitive, ...]

    def sdf(self, points: torch.Tensor) -> torch.Tensor:
        return torch.stack([part.sdf(points) for part in self.parts]).min(0).values


def sdf_grid(solid, resolution: int = 32) -> np.ndarray:
    """The SDF sampled on the grid, [R, R, R] (x, y, z)."""
    with torch.no_grad():
        return solid.sdf(grid_points(resolution)).reshape(resolution, resolution, resolution).numpy()
