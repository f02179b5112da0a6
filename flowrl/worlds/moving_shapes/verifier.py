"""Rule-based video verifier of the moving-shapes world: detect objects per frame (the image world's detector),
track each object the prompt names across frames, and check presence, direction, stillness, colour change, motion
order and relative motion. `judge_clip` gives the binary verdict (every constraint met, for evaluation) and the
dense score (the fraction met, a smoother training reward).

Tracking: an object's track starts at a detection of its shape (and colour, the start colour for a turning object)
in one of the first frames and follows, frame by frame, the nearest detection of that shape within MAX_STEP px
whose colour is one the object may show; the longest track wins. A track is present when it covers PRESENT_SHARE of
the frames. Motion is read from the track's centroids: a direction holds when the displacement along it is at
least MOVE_MIN px and the displacement across it at most half of that (and at most ACROSS_MAX px); still when the
centroid never strays more than STILL_MAX px from its first position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowrl.tasks.base import tag_metrics
from flowrl.worlds.moving_shapes.prompts import TAGS, VECTORS, ClipSpec, Mover, parse_prompt
from flowrl.worlds.shapes.verifier import Detection, detect

MAX_STEP = 5.0  # px a tracked centroid may move between consecutive frames (objects move 12 px per clip: 3 px per
# frame at 5 frames, 1.5 at 9)
PRESENT_SHARE = 0.7
MOVE_MIN = 6.0  # px along the direction over the clip (rendered motion: 12 px)
LEG_MIN = 3.0  # px along each direction of a motion-order leg (rendered: 6 px)
ACROSS_MAX = 3.0
STILL_MAX = 2.0
RELATIVE_MIN = 3.0  # px the distance between the two objects must change (rendered: at least 6 px)


@dataclass
class TrackFound:
    points: list[tuple[float, float] | None]  # centroid per frame, None where the object was not found
    colors: list[str | None]

    @property
    def share(self) -> float:
        return sum(p is not None for p in self.points) / len(self.points)

    def found(self) -> list[tuple[int, tuple[float, float]]]:
        return [(f, p) for f, p in enumerate(self.points) if p is not None]

    def displacement(self, start: int = 0, stop: int | None = None) -> tuple[float, float] | None:
        """Centroid displacement between the first and last found frames in [start, stop]."""
        inside = [(f, p) for f, p in self.found() if start <= f <= (len(self.points) - 1 if stop is None else stop)]
        if len(inside) < 2:
            return None
        (_, (x0, y0)), (_, (x1, y1)) = inside[0], inside[-1]
        return x1 - x0, y1 - y0


def track(mover: Mover, per_frame: list[list[Detection]]) -> TrackFound:
    frames = len(per_frame)
    allowed = {mover.color, mover.start_color} - {None}
    best = TrackFound([None] * frames, [None] * frames)
    for first in range(min(3, frames)):
        start_color = mover.start_color or mover.color
        for seed in (d for d in per_frame[first] if d.shape == mover.shape and d.color == start_color):
            points, colors = [None] * frames, [None] * frames
            points[first], colors[first] = (seed.cx, seed.cy), seed.color
            last, last_frame = (seed.cx, seed.cy), first
            for f in range(first + 1, frames):
                reach = MAX_STEP * (f - last_frame)  # an object missed in a frame may have moved further
                near = [
                    d
                    for d in per_frame[f]
                    if d.shape == mover.shape
                    and d.color in allowed
                    and np.hypot(d.cx - last[0], d.cy - last[1]) <= reach
                ]
                if near:
                    d = min(near, key=lambda d: np.hypot(d.cx - last[0], d.cy - last[1]))
                    points[f], colors[f], last, last_frame = (d.cx, d.cy), d.color, (d.cx, d.cy), f
            candidate = TrackFound(points, colors)
            if candidate.share > best.share:
                best = candidate
    return best


def moves(displacement: tuple[float, float] | None, direction: str, minimum: float) -> bool:
    if displacement is None:
        return False
    vx, vy = VECTORS[direction]
    along = displacement[0] * vx + displacement[1] * vy
    across = abs(displacement[0] * vy) + abs(displacement[1] * vx)
    return along >= minimum and across <= min(ACROSS_MAX, along / 2)


def still(found: TrackFound) -> bool:
    points = [p for _, p in found.found()]
    return len(points) >= 2 and max(np.hypot(x - points[0][0], y - points[0][1]) for x, y in points) <= STILL_MAX


def mover_constraints(mover: Mover, found: TrackFound) -> list[bool]:
    present = found.share >= PRESENT_SHARE
    checks = [present]
    frames = len(found.points)
    if mover.start_color:  # turning: the first frames show the start colour, the last frames the end colour
        third = max(1, frames // 3)
        early = [c for c in found.colors[:third] if c]
        late = [c for c in found.colors[-third:] if c]
        checks += [
            present and bool(early) and early.count(mover.start_color) > len(early) / 2,
            present and bool(late) and late.count(mover.color) > len(late) / 2,
        ]
    elif mover.motion == ("still",):
        checks.append(present and still(found))
    elif len(mover.motion) == 1:
        checks.append(present and moves(found.displacement(), mover.motion[0], MOVE_MIN))
    elif len(mover.motion) == 2:
        half = frames // 2
        checks += [
            present and moves(found.displacement(0, half), mover.motion[0], LEG_MIN),
            present and moves(found.displacement(half), mover.motion[1], LEG_MIN),
        ]
    return checks


def distance(a: TrackFound, b: TrackFound, which: int) -> float | None:
    both = [f for f in range(len(a.points)) if a.points[f] is not None and b.points[f] is not None]
    if len(both) < 2:
        return None
    f = both[which]
    return float(np.hypot(a.points[f][0] - b.points[f][0], a.points[f][1] - b.points[f][1]))


def detections(clip: np.ndarray) -> list[list[Detection]]:
    """The image world's detections in each frame of a uint8 clip [F, H, W, 3]."""
    return [detect(frame) for frame in clip]


def constraints(spec: ClipSpec, per_frame: list[list[Detection]]) -> list[bool]:
    """Each constraint of the prompt, met or not, given a clip's per-frame detections."""
    if spec.tag == "relative_motion":
        a, b = (track(m, per_frame) for m in spec.movers)
        present = a.share >= PRESENT_SHARE and b.share >= PRESENT_SHARE
        start, end = distance(a, b, 0), distance(a, b, -1)
        change = None if start is None else (start - end if spec.relation == "toward" else end - start)
        da, db = a.displacement(), b.displacement()
        mover_moved = da is not None and db is not None and np.hypot(*da) > np.hypot(*db)
        return [
            a.share >= PRESENT_SHARE,
            b.share >= PRESENT_SHARE,
            present and change is not None and change >= RELATIVE_MIN,
            present and mover_moved,
        ]
    checks = []
    for mover in spec.movers:
        checks += mover_constraints(mover, track(mover, per_frame))
    return checks


def judge_clip(clip: np.ndarray | list[list[Detection]], prompt: str | ClipSpec) -> tuple[float, float]:
    """(verdict, dense score) of a uint8 clip [F, H, W, 3] (or its `detections`) against a prompt."""
    spec = parse_prompt(prompt) if isinstance(prompt, str) else prompt
    checks = constraints(spec, detections(clip) if isinstance(clip, np.ndarray) else clip)
    return float(all(checks)), float(sum(checks) / len(checks))


def video_accuracy(clips: np.ndarray, prompts: list[str]) -> dict:
    """Per-tag and overall verdict accuracy of uint8 clips [N, F, H, W, 3]."""
    return tag_metrics(
        [judge_clip(clip, prompt)[0] for clip, prompt in zip(clips, prompts)],
        [parse_prompt(prompt).tag for prompt in prompts],
        TAGS,
        clusters=prompts,
    )
