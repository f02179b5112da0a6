"""Rule-based verifier: find the objects in an image and judge it against a prompt.

Detection: every bright pixel takes its nearest palette colour, each colour's pixels split into connected
components, and each component is classed by its silhouette (fill of the bounding box and how much narrower its
top is than its bottom). The judgement follows GenEval's tag rules, more leniently for colours and positions: a
colour or relation holds when any detection (or pair) of the named shapes shows it, where GenEval judges the
top-scoring `count` detections of each class and needs all of them to. A relation is read on its own axis alone
(the centroids more than POSITION_MARGIN apart along it): a diagonal pair passes both "left of" and "above", where
GenEval's rule also needs the named axis to carry most of the offset; `score` is the binary verdict used for
evaluation and `dense_score` the fraction of the prompt's constraints met, a smoother training reward.
`exact_score` is the stricter verdict that also refuses objects the prompt does not name: RL learns to pass
GenEval's rule with clutter ("a circle" drawn as three circles and a square), which only this verdict sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from flowrl.worlds.shapes.prompts import PromptSpec, parse_prompt
from flowrl.worlds.shapes.world import PALETTE, world_sized

BACKGROUND_MAX = 70  # a pixel whose brightest channel is below this is background
COLOR_MAX_DISTANCE = 130.0  # farther than this from every palette colour: not an object pixel
MIN_AREA = 14  # smaller components are noise (the smallest rendered object covers 25 px)
POSITION_MARGIN = 2.0  # centroid displacement (px) needed along the relation's axis

_PALETTE_NAMES = list(PALETTE)
_PALETTE_RGB = np.array([PALETTE[c] for c in _PALETTE_NAMES], dtype=np.float32)


@dataclass(frozen=True)
class Detection:
    shape: str  # circle | square | triangle | unknown
    color: str
    cx: float
    cy: float
    area: int


def classify_silhouette(mask: np.ndarray) -> str:
    """Class of one connected component given as a boolean mask cropped to its bounding box."""
    h, w = mask.shape
    if max(h, w) > 1.6 * min(h, w):
        return "unknown"  # elongated: merged objects or smears
    fill = mask.sum() / (h * w)
    rows = mask.sum(axis=1)
    third = max(1, h // 3)
    top, bottom = rows[:third].mean(), rows[-third:].mean()
    if top < 0.6 * bottom:
        return "triangle"
    if fill >= 0.9:
        return "square"
    if fill >= 0.62:
        return "circle"
    return "unknown"


def colour_map(image: np.ndarray) -> np.ndarray:
    """[H, W] int in the world's pixels: the palette index (PALETTE's order) of each object pixel, -1 for
    background and pixels too far from every palette colour."""
    pixels = world_sized(image).astype(np.float32)
    bright = pixels.max(axis=-1) >= BACKGROUND_MAX
    distance = np.linalg.norm(pixels[:, :, None, :] - _PALETTE_RGB[None, None], axis=-1)
    return np.where(bright & (distance.min(axis=-1) <= COLOR_MAX_DISTANCE), distance.argmin(axis=-1), -1)


def detected_mask(image: np.ndarray, d: Detection) -> np.ndarray:
    """[H, W] bool in the world's pixels: the connected component of `d`'s colour that `d` was detected as (the one
    holding its centroid, else the nearest to it)."""
    labels, _ = ndimage.label(colour_map(image) == _PALETTE_NAMES.index(d.color))
    ys, xs = np.nonzero(labels)
    if not len(ys):
        return np.zeros(labels.shape, dtype=bool)
    nearest = int(np.argmin((xs - d.cx) ** 2 + (ys - d.cy) ** 2))
    return labels == labels[ys[nearest], xs[nearest]]


def detect(image: np.ndarray) -> list[Detection]:
    """Objects in a uint8 [H, W, 3] image, in the world's pixels (`world_sized`)."""
    colour_of = colour_map(image)
    found = []
    for index, color in enumerate(_PALETTE_NAMES):
        labels, count = ndimage.label(colour_of == index)
        for region, box in enumerate(ndimage.find_objects(labels), start=1):
            component = labels[box] == region
            area = int(component.sum())
            if area < MIN_AREA:
                continue
            ys, xs = np.nonzero(component)
            found.append(
                Detection(
                    classify_silhouette(component),
                    color,
                    float(xs.mean() + box[1].start),
                    float(ys.mean() + box[0].start),
                    area,
                )
            )
    return found


def _matches(d: Detection, shape: str, color: str | None) -> bool:
    return d.shape == shape and (color is None or d.color == color)


def relation_holds(a: Detection, b: Detection, relation: str) -> bool:
    dx, dy = b.cx - a.cx, b.cy - a.cy  # image y grows downwards
    return {"left of": dx, "right of": -dx, "above": dy, "below": -dy}[relation] > POSITION_MARGIN


def constraint_scores(spec: PromptSpec, found: list[Detection]) -> list[float]:
    """Per-constraint scores in [0, 1]; the prompt is met when all are 1."""

    def exists(phrase) -> float:
        return float(any(_matches(d, phrase.shape, phrase.color) for d in found))

    if spec.tag == "counting":
        n = sum(d.shape == spec.phrases[0].shape for d in found)
        return [float(n > 0), max(0.0, 1.0 - abs(n - spec.count) / spec.count), float(n == spec.count)]
    scores, first = [], spec.phrases[0]
    for i, phrase in enumerate(spec.phrases):
        if phrase.color:  # partial credit for the right shape in the wrong colour
            scores.append(float(any(d.shape == phrase.shape for d in found)))
        if spec.tag == "two_object" and i == 1 and phrase.shape == first.shape:  # "a circle and a circle": two
            scores.append(
                float(
                    any(
                        _matches(a, first.shape, first.color) and _matches(b, phrase.shape, phrase.color)
                        for a in found
                        for b in found
                        if a is not b
                    )
                )
            )  # objects, not one met twice
        else:
            scores.append(exists(phrase))
    if spec.tag == "position":
        a_phrase, b_phrase = spec.phrases
        pairs = [
            (a, b)
            for a in found
            for b in found
            if a is not b
            and _matches(a, a_phrase.shape, a_phrase.color)
            and _matches(b, b_phrase.shape, b_phrase.color)
        ]
        scores.append(float(any(relation_holds(a, b, spec.relation) for a, b in pairs)))
    if spec.tag == "color_attr":  # both phrases must be met by different objects
        a_phrase, b_phrase = spec.phrases
        scores.append(
            float(
                any(
                    _matches(a, a_phrase.shape, a_phrase.color) and _matches(b, b_phrase.shape, b_phrase.color)
                    for a in found
                    for b in found
                    if a is not b
                )
            )
        )
    return scores


def score(image: np.ndarray, prompt: str | PromptSpec) -> float:
    """1.0 when the image meets every constraint of the prompt, else 0.0 (the GenEval-style verdict)."""
    return verdict_and_dense(image, prompt)[0]


def exact_score(image: np.ndarray, prompt: str | PromptSpec) -> float:
    """1.0 when the image meets every constraint of the prompt and holds exactly the objects it names (as the
    renderer draws the prompt: "three circles" is three objects), else 0.0."""
    spec = parse_prompt(prompt) if isinstance(prompt, str) else prompt
    found = detect(image)
    return float(judge_detections(spec, found)[0] == 1.0 and len(found) == len(spec.named_objects()))


def judge_detections(spec: PromptSpec, found: list[Detection], exact_objects: bool = False) -> tuple[float, float]:
    """(verdict, dense score) of detections against a prompt: every constraint met, and the fraction met."""
    scores = constraint_scores(spec, found)
    verdict = float(all(s == 1.0 for s in scores))
    if exact_objects:
        scores.append(float(len(found) == len(spec.named_objects())))
    return verdict, float(sum(scores) / len(scores))


def verdict_and_dense(image: np.ndarray, prompt: str | PromptSpec, exact_objects: bool = False) -> tuple[float, float]:
    """`score` and `dense_score` of one image from a single detection pass."""
    spec = parse_prompt(prompt) if isinstance(prompt, str) else prompt
    return judge_detections(spec, detect(image), exact_objects)


def dense_score(image: np.ndarray, prompt: str | PromptSpec, exact_objects: bool = False) -> float:
    """Fraction of the prompt's constraints met, in [0, 1].

    The verdict, like GenEval's, lets "a circle" pass with three circles. `exact_objects` adds one constraint, that
    the image holds exactly the objects the prompt names (the renderer's reading of a prompt), so a training reward
    does not pay for clutter that the counting prompts then punish.
    """
    return verdict_and_dense(image, prompt, exact_objects)[1]
