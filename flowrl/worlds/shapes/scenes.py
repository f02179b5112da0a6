"""Scenes that satisfy a prompt: the renderer's (image, prompt) pairs for pretraining and for tests."""

from __future__ import annotations

import numpy as np

from flowrl.worlds.shapes.prompts import TAGS, PromptSpec, all_prompt_specs
from flowrl.worlds.shapes.verifier import POSITION_MARGIN
from flowrl.worlds.shapes.world import COLORS, IMAGE_SIZE, PALETTE, ShapeObject, boxes_clash, random_box, render

_MAX_TRIES = 500


def _relation_ok(a: ShapeObject, b: ShapeObject, relation: str) -> bool:
    """The relation holds with margin and dominates the other axis, so a rendered scene is unambiguous."""
    (ax, ay), (bx, by) = a.centroid, b.centroid
    dx, dy = bx - ax, by - ay
    along = {"left of": dx, "right of": -dx, "above": dy, "below": -dy}[relation]
    across = abs(dy) if relation in ("left of", "right of") else abs(dx)
    return along > POSITION_MARGIN + 2 and along > across


def scene_objects(spec: PromptSpec, rng: np.random.Generator) -> list[ShapeObject]:
    """Objects that satisfy `spec`; free attributes (colours, positions, sizes) are drawn from `rng`."""
    wanted = spec.named_objects()
    for _ in range(_MAX_TRIES):
        objects: list[ShapeObject] = []
        for phrase in wanted:
            for _ in range(_MAX_TRIES):
                color = phrase.color or COLORS[rng.integers(len(COLORS))]
                obj = ShapeObject(phrase.shape, color, *random_box(rng, IMAGE_SIZE))
                if not any(boxes_clash(obj, other) for other in objects):
                    objects.append(obj)
                    break
        if len(objects) == len(wanted) and (spec.relation is None or _relation_ok(*objects, spec.relation)):
            return objects
    raise RuntimeError(f"could not place a scene for {spec.text()!r}")


def random_spec(rng: np.random.Generator) -> PromptSpec:
    """A prompt drawn uniformly over tags, then uniformly within the tag."""
    specs = all_prompt_specs(TAGS[rng.integers(len(TAGS))])
    return specs[rng.integers(len(specs))]


def sample_pairs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """n rendered (image, prompt) pairs: uint8 [n, H, W, 3] and the prompts."""
    specs = [random_spec(rng) for _ in range(n)]
    images = np.stack([render(scene_objects(s, rng)) for s in specs])
    return images, [s.text() for s in specs]


def render_mixed_colors(objects: list[ShapeObject], rng: np.random.Generator, keep: float = 0.3) -> np.ndarray:
    """Render objects painted with colour mixtures, the failure reward-gradient methods drive a generator to.

    Each object keeps its colour with probability `keep`; otherwise it is filled with a mixture of its colour and
    another palette colour: half the time a linear gradient across the object (two-tone), half the time one
    uniform blend at a random weight. The verifier judges the result like any image (a gradient usually splits
    into two wrongly shaped components; a blend takes the nearer palette colour).
    """
    image = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32)
    yy, xx = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
    for obj in objects:
        own = np.array(PALETTE[obj.color], dtype=np.float32)
        other = np.array(PALETTE[COLORS[rng.integers(len(COLORS))]], dtype=np.float32)
        if rng.random() < keep:
            weight = np.zeros((IMAGE_SIZE, IMAGE_SIZE))
        elif rng.random() < 0.5:
            along, start = (xx, obj.x0) if rng.random() < 0.5 else (yy, obj.y0)
            weight = np.clip((along - start) / max(1, obj.size - 1), 0, 1)
            weight = 1 - weight if rng.random() < 0.5 else weight
        else:
            weight = np.full((IMAGE_SIZE, IMAGE_SIZE), rng.random())
        mask = obj.mask(IMAGE_SIZE)
        image[mask] = ((1 - weight[..., None]) * own + weight[..., None] * other)[mask]
    return image.round().astype(np.uint8)


def sample_mixed_color_pairs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """n (image, prompt) pairs whose scenes would satisfy the prompt but are painted with colour mixtures."""
    specs = [random_spec(rng) for _ in range(n)]
    images = np.stack([render_mixed_colors(scene_objects(s, rng), rng) for s in specs])
    return images, [s.text() for s in specs]
