"""The tactile sensor against closed forms: a sphere's normals and their shading under the three DIGIT lights, an
untouched gel showing exactly its background, the sensor noise's size, and gradients reaching the heights."""

import math

import pytest
import torch

from flowrl.worlds.tactile.materials import Material, height_field
from flowrl.worlds.tactile.sensor import BACKGROUND, Press, render, shade, surface_normals

PATCH = 8.0


def _sphere_cap(size: int, radius: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """z = sqrt(R^2 - x^2 - y^2) over the patch, with the pixel centres' x and y (mm)."""
    coords = ((torch.arange(size, dtype=torch.float64) + 0.5) / size - 0.5) * PATCH
    y, x = torch.meshgrid(coords, coords, indexing="ij")
    return torch.sqrt(radius**2 - x**2 - y**2), x, y


def test_normals_of_a_sphere_are_its_radial_directions():
    z, x, y = _sphere_cap(64, 10.0)
    normals = surface_normals(z, PATCH)
    expected = torch.stack([x, y, z]) / 10.0
    inner = (slice(None), slice(1, -1), slice(1, -1))  # central differences inside, one-sided at the border
    torch.testing.assert_close(normals[inner], expected[inner], atol=2e-4, rtol=0)


def test_shading_is_the_change_of_each_lights_lambert_term():
    z, x, y = _sphere_cap(32, 10.0)
    normals = torch.stack([x, y, z]) / 10.0
    press = Press(gain=1.5)
    image = shade(normals, press)
    elevation = math.radians(25.0)
    for channel, azimuth in enumerate((30.0, 150.0, 270.0)):  # red, green, blue: TACTO's DIGIT light angles
        a = math.radians(azimuth)
        light = (math.cos(elevation) * math.cos(a), math.cos(elevation) * math.sin(a), math.sin(elevation))
        lambert = light[0] * normals[0] + light[1] * normals[1] + light[2] * normals[2]
        expected = (BACKGROUND[channel] + 1.5 * (lambert - math.sin(elevation))).clamp(0, 1)
        torch.testing.assert_close(image[channel], expected, atol=1e-6, rtol=0)


def test_an_untouched_gel_shows_its_background_and_noise_has_the_stated_std():
    flat = torch.zeros(48, 48)
    clean = render(flat, PATCH, Press(depth=0.0))
    torch.testing.assert_close(clean, torch.tensor(BACKGROUND).view(3, 1, 1).expand(3, 48, 48), atol=1e-6, rtol=0)
    pressed = render(flat, PATCH, Press(depth=0.2, gel_radius=10.0))  # a flat plate flattens the curved gel: a disc
    assert (pressed - clean).abs().sum(0)[20:28, 20:28].mean() > 0.01
    noisy = render(flat, PATCH, Press(depth=0.0, noise=0.03), generator=torch.Generator().manual_seed(0))
    assert (noisy - clean).std().item() == pytest.approx(0.03, rel=0.05)


def test_a_press_shows_the_texture_only_where_the_gel_touches_and_gradients_reach_the_heights():
    heights = height_field(Material("ridged", 6, 0.0, 0.3, 0.0), 64, seed=0).requires_grad_(True)
    image = render(heights, PATCH, Press(depth=0.3, gel_radius=10.0))
    change = (image - torch.tensor(BACKGROUND).view(3, 1, 1)).abs().sum(0)
    centre, corner = change[24:40, 24:40].mean(), change[:6, :6].mean()
    assert centre > 0.05 and corner < 1e-6  # the curved gel rises out of contact towards the corners
    image.sum().backward()
    assert heights.grad is not None and heights.grad.abs().sum() > 0


def test_ssim_is_one_for_identical_images_and_falls_with_noise():
    from flowrl.worlds.tactile.metrics import ssim

    image = render(height_field(Material("woven", 6, 0.0, 0.3, 0.2), 32, seed=0), PATCH, Press())[None]
    noisy = (image + 0.1 * torch.randn(image.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    assert ssim(image, image).item() == pytest.approx(1.0, abs=1e-5)
    assert ssim(noisy, image).item() < 0.9
