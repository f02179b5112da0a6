"""The moving-shapes world: short clips of the image world's shapes that move, stay still or change colour.

Clips are 1 + 4k frames (9 by default) of 32x32 RGB on black. Each object moves at a constant speed (TRAVEL px over
the clip, whatever its length) in one axis direction, or in one direction for the first half and another for the
second (motion order), or stays still; a turning object changes colour once, at mid-clip. Objects stay inside the
frame and keep apart in every frame. `sample_clip` draws a clip that satisfies a prompt; `sample_pairs` gives
(clip, prompt) pairs for pretraining.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from flowrl.worlds.moving_shapes.prompts import TAGS, VECTORS, ClipSpec, Mover, all_specs
from flowrl.worlds.shapes.world import COLORS, IMAGE_SIZE, PALETTE, SHAPES, ShapeObject, boxes_clash

FRAMES = 9
TRAVEL = 12.0  # px a moving object covers over the clip (1.5 px per frame at 9 frames), 6 px per half: the same
# distance at any clip length, so the verifier's thresholds hold and longer clips still fit in 32 px
# object box sides in px: at 7-9 px (3.5-4.5 latent pixels through the 2x VAE) shapes-wan drew blobs of the prompt's
# colour whatever shape it named; at 9-13, the upper part of the image world's 7-13, the same recipe passed more eval
# clips (docs/research/video.md)
MIN_SIZE, MAX_SIZE = 9, 13
RELATIVE_CHANGE = 6.0  # px the distance between the two objects must change in a rendered relative-motion clip
_MAX_TRIES = 1000


@dataclass(frozen=True)
class Track:
    """One object's clip: its mover (shape, colours, motion) and top-left corner in frame 0, and its box size."""

    mover: Mover
    x0: float
    y0: float
    size: int

    def corner(self, frame: int, frames: int) -> tuple[int, int]:
        legs = self.mover.motion if self.mover.motion else ("still",)
        half, speed = frames // 2, TRAVEL / max(frames - 1, 1)
        if len(legs) == 1:
            dx, dy = (speed * frame * v for v in VECTORS[legs[0]])
        else:
            (ax, ay), (bx, by) = VECTORS[legs[0]], VECTORS[legs[1]]
            first, second = min(frame, half), max(frame - half, 0)
            dx, dy = speed * (first * ax + second * bx), speed * (first * ay + second * by)
        return round(self.x0 + dx), round(self.y0 + dy)

    def shape_at(self, frame: int, frames: int) -> ShapeObject:
        x, y = self.corner(frame, frames)
        return ShapeObject(self.mover.shape, self.mover.color_at(frame, frames), x, y, self.size)


def placed_objects(tracks: list[Track], frames: int, image_size: int):
    """(frame, object, its pixel mask) for every object of every frame, in drawing order."""
    for f in range(frames):
        for track in tracks:
            obj = track.shape_at(f, frames)
            yield f, obj, obj.mask(image_size)


def render_clip(tracks: list[Track], frames: int = FRAMES, image_size: int = IMAGE_SIZE) -> np.ndarray:
    """uint8 [F, H, W, 3]."""
    clip = np.zeros((frames, image_size, image_size, 3), dtype=np.uint8)
    for f, obj, mask in placed_objects(tracks, frames, image_size):
        clip[f][mask] = PALETTE[obj.color]
    return clip


def render_shape_labels(tracks: list[Track], frames: int = FRAMES, image_size: int = IMAGE_SIZE) -> np.ndarray:
    """int64 [F, H, W]: 0 on background, 1 + the object's index in SHAPES where an object covers the pixel."""
    labels = np.zeros((frames, image_size, image_size), dtype=np.int64)
    for f, obj, mask in placed_objects(tracks, frames, image_size):
        labels[f][mask] = 1 + SHAPES.index(obj.shape)
    return labels


@cache  # pure in its arguments, and called for every object of every placement try
def in_frame_starts(mover: Mover, size: int, frames: int, image_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The frame-0 corners (x values, y values) that keep an object of `size` inside the frame in every frame. A
    corner's x only depends on x0 and its y on y0, so drawing each uniformly among these is drawing the corner
    uniformly and rejecting clips that leave the frame, without the rejections (which made two large moving
    objects fail to place in 1,000 tries)."""
    starts = range(image_size - size + 1)
    paths = [[Track(mover, float(v), float(v), size).corner(f, frames) for f in range(frames)] for v in starts]
    xs = tuple(v for v, path in zip(starts, paths) if all(0 <= x <= image_size - size for x, _ in path))
    ys = tuple(v for v, path in zip(starts, paths) if all(0 <= y <= image_size - size for _, y in path))
    return xs, ys


def fits(tracks: list[Track], frames: int, image_size: int = IMAGE_SIZE) -> bool:
    """Every object inside the frame and apart from the others in every frame."""
    for f in range(frames):
        objects = [t.shape_at(f, frames) for t in tracks]
        if any(o.x0 < 0 or o.y0 < 0 or o.x0 + o.size > image_size or o.y0 + o.size > image_size for o in objects):
            return False
        if any(boxes_clash(a, b, gap=1) for i, a in enumerate(objects) for b in objects[i + 1 :]):
            return False
    return True


def centre_distance(a: Track, b: Track, frame: int, frames: int) -> float:
    (ax, ay), (bx, by) = a.shape_at(frame, frames).centroid, b.shape_at(frame, frames).centroid
    return float(np.hypot(ax - bx, ay - by))


def concrete(mover: Mover, rng: np.random.Generator) -> Mover:
    """A mover with its free attributes drawn: colour when unnamed, a motion (still or a direction) when free."""
    color = mover.color or COLORS[rng.integers(len(COLORS))]
    motion = mover.motion or (("still", "left", "right", "up", "down")[rng.integers(5)],)
    return Mover(mover.shape, color, motion, mover.start_color)


def sample_clip(
    spec: ClipSpec, rng: np.random.Generator, frames: int = FRAMES, image_size: int = IMAGE_SIZE
) -> list[Track]:
    """Tracks whose clip satisfies `spec`."""
    for _ in range(_MAX_TRIES):
        movers = [concrete(m, rng) for m in spec.movers]
        if spec.tag == "relative_motion":  # the first object moves along one axis, toward or away from the second
            movers[0] = Mover(movers[0].shape, movers[0].color, (("left", "right", "up", "down")[rng.integers(4)],))
        tracks = []
        for mover in movers:
            size = int(rng.integers(MIN_SIZE, MAX_SIZE + 1))
            xs, ys = in_frame_starts(mover, size, frames, image_size)
            tracks.append(Track(mover, float(xs[rng.integers(len(xs))]), float(ys[rng.integers(len(ys))]), size))
        if not fits(tracks, frames, image_size):
            continue
        if spec.tag == "relative_motion":
            change = centre_distance(*tracks, 0, frames) - centre_distance(*tracks, frames - 1, frames)
            if (change if spec.relation == "toward" else -change) < RELATIVE_CHANGE:
                continue
        return tracks
    raise RuntimeError(f"could not place a clip for {spec.text()!r}")


def random_spec(rng: np.random.Generator) -> ClipSpec:
    """A prompt drawn uniformly over tags, then uniformly within the tag."""
    specs = all_specs(TAGS[rng.integers(len(TAGS))])
    return specs[rng.integers(len(specs))]


def sample_tracks(n: int, rng: np.random.Generator, frames: int = FRAMES) -> tuple[list[list[Track]], list[str]]:
    """n clips' tracks (to render with `render_clip`, or `render_shape_labels`) and their prompts."""
    specs = [random_spec(rng) for _ in range(n)]
    return [sample_clip(s, rng, frames) for s in specs], [s.text() for s in specs]


def sample_pairs(n: int, rng: np.random.Generator, frames: int = FRAMES) -> tuple[np.ndarray, list[str]]:
    """n rendered (clip, prompt) pairs: uint8 [n, F, H, W, 3] and the prompts."""
    tracks, prompts = sample_tracks(n, rng, frames)
    return np.stack([render_clip(t, frames) for t in tracks]), prompts
