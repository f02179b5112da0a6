"""The shapes world: a GenEval analogue that is cheap to render and exact to verify.

Images are 32x32 RGB on black. Objects are filled discs, axis-aligned squares and upright isosceles
triangles (apex up) in four saturated colours; each object's bounding box is 7-13 px and objects keep a gap
of at least 2 px.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IMAGE_SIZE = 32
PALETTE = {
    "red": (230, 30, 30),
    "green": (30, 200, 30),
    "blue": (40, 70, 230),
    "yellow": (230, 220, 30),
}
COLORS = tuple(PALETTE)
SHAPES = ("circle", "square", "triangle")
MIN_SIZE, MAX_SIZE, MIN_GAP = 7, 13, 2


@dataclass(frozen=True)
class ShapeObject:
    shape: str
    color: str
    x0: int  # left column of the bounding box
    y0: int  # top row of the bounding box
    size: int  # bounding-box side in pixels

    @property
    def centroid(self) -> tuple[float, float]:
        """Centre of the bounding box as (x, y); the relation checks of the position tag use it."""
        return self.x0 + (self.size - 1) / 2, self.y0 + (self.size - 1) / 2

    def mask(self, image_size: int = IMAGE_SIZE) -> np.ndarray:
        yy, xx = np.mgrid[0:image_size, 0:image_size]
        u = xx - self.x0  # coordinates inside the box
        v = yy - self.y0
        inside = (u >= 0) & (u < self.size) & (v >= 0) & (v < self.size)
        c = (self.size - 1) / 2
        if self.shape == "square":
            return inside
        if self.shape == "circle":
            return inside & ((u - c) ** 2 + (v - c) ** 2 <= (self.size / 2) ** 2)
        if self.shape == "triangle":
            half_width = (v + 1) / self.size * self.size / 2  # widens linearly from the apex row down
            return inside & (np.abs(u - c) <= half_width)
        raise ValueError(f"unknown shape {self.shape!r}")


def boxes_clash(a: ShapeObject, b: ShapeObject, gap: int = MIN_GAP) -> bool:
    """True when the boxes overlap or are closer than `gap` pixels on both axes."""
    apart_x = a.x0 + a.size + gap <= b.x0 or b.x0 + b.size + gap <= a.x0
    apart_y = a.y0 + a.size + gap <= b.y0 or b.y0 + b.size + gap <= a.y0
    return not (apart_x or apart_y)


def world_sized(image: np.ndarray) -> np.ndarray:
    """A uint8 [H, W, 3] image at the world's IMAGE_SIZE, box-averaged (an n-times upscaled render comes back
    exactly): the verifiers' areas, distances and object positions are in the world's pixels, so a model sampling at
    another size (a real editor at 512 px on the shapes-editing world) is judged as at 32."""
    if image.shape[:2] == (IMAGE_SIZE, IMAGE_SIZE):
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(np.ascontiguousarray(image)).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BOX))


def render(objects: list[ShapeObject], image_size: int = IMAGE_SIZE) -> np.ndarray:
    """Render objects onto a black canvas: uint8 array [H, W, 3]."""
    image = np.zeros((image_size, image_size, 3), dtype=np.uint8)
    for obj in objects:
        image[obj.mask(image_size)] = PALETTE[obj.color]
    return image


def random_box(rng: np.random.Generator, image_size: int = IMAGE_SIZE) -> tuple[int, int, int]:
    size = int(rng.integers(MIN_SIZE, MAX_SIZE + 1))
    x0 = int(rng.integers(0, image_size - size + 1))
    y0 = int(rng.integers(0, image_size - size + 1))
    return x0, y0, size
