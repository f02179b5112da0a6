"""A differentiable optical tactile sensor (GelSight / DIGIT style) in torch: a curved elastomer pressed onto a
height field, its deformed surface's normals, and the image three coloured lights make of them.

The light geometry is TACTO's DIGIT setting: three point lights coloured red, green and blue on a circle of radius
0.02 m at 30, 150 and 270 degrees; here they are treated as directional, at `LIGHT_ELEVATION` above the gel plane
(the gel is a few mm from a light circle of 20 mm radius). Deviations from a physical sensor, stated: the gel's
deformation is the height field above the undeformed curved gel surface, smoothed by a Gaussian (the elastomer's
spreading) instead of solved elastically; shading is Lambertian in the change of normal, so a flat, untouched gel
shows exactly the background.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LIGHT_AZIMUTHS = (30.0, 150.0, 270.0)  # degrees, red, green, blue (TACTO's DIGIT)
LIGHT_ELEVATION = 25.0  # degrees above the gel plane
BACKGROUND = (0.45, 0.45, 0.5)  # the untouched gel's colour, RGB in [0, 1]


@dataclass(frozen=True)
class Press:
    """How the sensor meets the material: `depth` (mm the gel's centre sinks below the material's highest point),
    `gel_radius` (mm, the gel's curvature radius: TACTO's DIGIT is 0.1 m, a flatter gel presses a wider patch),
    `spread` (mm, the elastomer's smoothing), `gain` (image change per unit change of n . l), `noise` (sensor noise
    std in [0, 1] units; TACTO's 7 of 255)."""

    depth: float = 0.4
    gel_radius: float = 20.0
    spread: float = 0.08
    gain: float = 1.2
    noise: float = 7 / 255


def light_directions() -> torch.Tensor:
    """[3, 3] unit vectors towards the red, green and blue lights."""
    e = math.radians(LIGHT_ELEVATION)
    return torch.tensor(
        [
            [math.cos(e) * math.cos(math.radians(a)), math.cos(e) * math.sin(math.radians(a)), math.sin(e)]
            for a in LIGHT_AZIMUTHS
        ],
        dtype=torch.float32,
    )


def gel_surface(size: int, patch_mm: float, press: Press) -> torch.Tensor:
    """[size, size] heights (mm) of the undeformed curved gel pressed `depth` into a surface whose top is at 0:
    -depth at the centre, rising as r^2 / (2 R) (a sphere of radius R near its apex)."""
    coords = ((torch.arange(size, dtype=torch.float32) + 0.5) / size - 0.5) * patch_mm
    y, x = torch.meshgrid(coords, coords, indexing="ij")
    return -press.depth + (x**2 + y**2) / (2 * press.gel_radius)


def _gaussian_blur(image: torch.Tensor, sigma_px: float) -> torch.Tensor:
    """A separable Gaussian blur of [..., H, W] (reflect padding); identity for sigma below a tenth of a pixel."""
    if sigma_px < 0.1:
        return image
    radius = max(1, math.ceil(3 * sigma_px))
    taps = torch.arange(-radius, radius + 1, dtype=image.dtype, device=image.device)
    kernel = torch.exp(-(taps**2) / (2 * sigma_px**2))
    kernel = kernel / kernel.sum()
    shape = image.shape
    flat = image.reshape(-1, 1, *shape[-2:])
    flat = torch.nn.functional.pad(flat, (radius, radius, radius, radius), mode="reflect")
    flat = torch.nn.functional.conv2d(flat, kernel.view(1, 1, 1, -1))
    flat = torch.nn.functional.conv2d(flat, kernel.view(1, 1, -1, 1))
    return flat.reshape(shape)


def indentation(heights: torch.Tensor, patch_mm: float, press: Press) -> torch.Tensor:
    """How far (mm) the material pushes the gel in at each pixel: the material's relief above the pressed gel's
    surface (the material's top at 0), spread by the elastomer. [..., H, W] -> [..., H, W], differentiable."""
    size = heights.shape[-1]
    top = heights - heights.amax(dim=(-2, -1), keepdim=True)
    depth = torch.relu(top - gel_surface(size, patch_mm, press).to(heights))
    return _gaussian_blur(depth, press.spread / patch_mm * size)


def surface_normals(surface: torch.Tensor, patch_mm: float) -> torch.Tensor:
    """Unit normals [..., 3, H, W] of a height map z(x, y) (mm) by central differences (one-sided at the borders):
    (-dz/dx, -dz/dy, 1) normalised; x runs along columns, y along rows."""
    pixel = patch_mm / surface.shape[-1]
    dz_dy, dz_dx = torch.gradient(surface, spacing=pixel, dim=(-2, -1))
    normal = torch.stack([-dz_dx, -dz_dy, torch.ones_like(surface)], dim=-3)
    return normal / normal.norm(dim=-3, keepdim=True)


def shade(normals: torch.Tensor, press: Press) -> torch.Tensor:
    """The RGB image [..., 3, H, W] in [0, 1] of the gel's normals: each colour's light adds gain x (n . l - n0 . l)
    to the background, n0 = (0, 0, 1) the untouched gel's normal."""
    lights = light_directions().to(normals)
    flat = lights[:, 2].view(3, 1, 1)  # n0 . l
    lit = torch.einsum("kc,...chw->...khw", lights, normals)
    background = torch.tensor(BACKGROUND, dtype=normals.dtype, device=normals.device).view(3, 1, 1)
    return (background + press.gain * (lit - flat)).clamp(0, 1)


def render(heights: torch.Tensor, patch_mm: float, press: Press = Press(), generator=None) -> torch.Tensor:
    """The tactile image [..., 3, H, W] in [0, 1] of the gel pressed onto `heights` [..., H, W] (mm): indentation,
    normals of the deformed gel (pushed in, so the surface the camera sees is -indentation), shading, and sensor
    noise drawn from `generator` (none without one: the noiseless image stays differentiable and deterministic)."""
    normals = surface_normals(-indentation(heights, patch_mm, press), patch_mm)
    image = shade(normals, press)
    if generator is not None and press.noise > 0:
        noise = torch.randn(image.shape, generator=generator, dtype=image.dtype) * press.noise
        image = (image + noise.to(image.device)).clamp(0, 1)
    return image
