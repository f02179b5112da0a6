"""The 3D shapes world's grammar: one to three primitives with a size word and an arrangement, the solid each prompt
describes (drawn with jitter), and a fixed train / eval split that holds out combinations.

Tags: `single` ("a tall box"), `stacked` ("a sphere on top of a cylinder"), `side_by_side` ("a cone next to a box"),
`tower` ("a cone on top of a box on top of a cylinder"). Size words change the half-extents: tall (y x1.6), flat
(y x0.5), wide (x and z x1.4), small (all x0.7); none keeps the base size. Stacked parts touch; side-by-side parts
stand on the same floor a small gap apart. Held out of training: the stacked prompts that name a sphere on top of a
cone, every prompt with a cylinder next to a cone or a flat sphere, and the tower prompts whose top is a sphere (three
training towers hold a sphere on top of a cone lower down: the contact itself is not held out, docs/research/3d.md).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from flowrl.worlds.shapes3d.geometry import KINDS, Primitive, Solid

TAGS = ("single", "stacked", "side_by_side", "tower")
SIZES = ("", "tall", "flat", "wide", "small")
BASE_HALF = 0.3  # half-extent of a primitive with no size word
FLOOR = -0.9
MAX_HEIGHT = 1.8  # from the floor to y = 0.9


@dataclass(frozen=True)
class Part:
    kind: str
    size: str = ""

    def words(self) -> str:
        return f"{self.size} {self.kind}".strip()

    def half(self, rng: np.random.Generator | None = None) -> tuple[float, float, float]:
        jitter = 1.0 if rng is None else float(rng.uniform(0.9, 1.1))
        x = y = z = BASE_HALF * jitter
        if self.size == "tall":
            y *= 1.6
        elif self.size == "flat":
            y *= 0.5
        elif self.size == "wide":
            x, z = x * 1.4, z * 1.4
        elif self.size == "small":
            x, y, z = x * 0.7, y * 0.7, z * 0.7
        if self.kind == "sphere":  # a sphere keeps one radius; its size word scales it
            x = y = z = {"tall": y, "flat": y, "wide": x}.get(self.size, x)
        return (x, y, z)


@dataclass(frozen=True)
class ShapeSpec:
    tag: str
    parts: tuple[Part, ...]

    def prompt(self) -> str:
        first = f"a {self.parts[0].words()}"
        if self.tag == "single":
            return first
        if self.tag == "side_by_side":
            return f"{first} next to a {self.parts[1].words()}"
        return " on top of ".join(f"a {p.words()}" for p in self.parts)


def parse_prompt(prompt: str) -> ShapeSpec:
    """The spec a prompt of the grammar names; ValueError naming the prompt otherwise."""

    def part(text: str) -> Part:
        words = text.removeprefix("a ").split()
        if len(words) == 1 and words[0] in KINDS:
            return Part(words[0])
        if len(words) == 2 and words[0] in SIZES and words[1] in KINDS:
            return Part(words[1], words[0])
        raise ValueError(f"not a prompt of the 3D shapes grammar: {prompt!r}")

    if " next to " in prompt:
        a, b = prompt.split(" next to ")
        return ShapeSpec("side_by_side", (part(a), part(b)))
    pieces = prompt.split(" on top of ")
    tag = {1: "single", 2: "stacked", 3: "tower"}.get(len(pieces))
    if tag is None:
        raise ValueError(f"not a prompt of the 3D shapes grammar: {prompt!r}")
    return ShapeSpec(tag, tuple(part(p) for p in pieces))


def is_held_out(spec: ShapeSpec) -> bool:
    kinds = [p.kind for p in spec.parts]
    if any(p.kind == "sphere" and p.size == "flat" for p in spec.parts):
        return True
    if spec.tag == "stacked" and kinds == ["sphere", "cone"]:
        return True
    if spec.tag == "side_by_side" and set(kinds) == {"cylinder", "cone"}:
        return True
    return spec.tag == "tower" and kinds[0] == "sphere"


def all_specs() -> list[ShapeSpec]:
    parts = [Part(k, s) for k in KINDS for s in SIZES]
    plain = [Part(k) for k in KINDS]
    specs = [ShapeSpec("single", (p,)) for p in parts]
    specs += [ShapeSpec("stacked", (a, b)) for a, b in itertools.product(parts, plain)]
    specs += [ShapeSpec("side_by_side", (a, b)) for a, b in itertools.product(plain, plain) if a != b]
    specs += [ShapeSpec("tower", (a, b, c)) for a, b, c in itertools.product(plain, plain, plain) if a != b and b != c]
    return specs


def vocabulary() -> list[str]:
    """Every word of the grammar's prompts, sorted (a text-to-3D model's vocabulary: held-out prompts combine the
    same words differently)."""
    return sorted({word for spec in all_specs() for word in spec.prompt().split()})


def train_prompt_set() -> dict[str, list[str]]:
    return {tag: [s.prompt() for s in all_specs() if s.tag == tag and not is_held_out(s)] for tag in TAGS}


def eval_prompt_set(per_tag: int = 8) -> list[str]:
    """Up to `per_tag` held-out prompts per tag (a fixed draw)."""
    rng = np.random.default_rng(3)
    out = []
    for tag in TAGS:
        held = [s.prompt() for s in all_specs() if s.tag == tag and is_held_out(s)]
        out += [held[i] for i in sorted(rng.permutation(len(held))[:per_tag])]
    return out


def sample_solid(spec: ShapeSpec, rng: np.random.Generator) -> Solid:
    """A solid the spec describes: sizes jittered by up to 10%, stacked parts touching, centred in x and z with a
    little jitter, standing on the floor y = FLOOR, a stack scaled to at most MAX_HEIGHT."""
    halves = [p.half(rng) for p in spec.parts]
    if spec.tag in ("stacked", "tower"):  # a stack taller than the cube allows is scaled down whole
        scale = min(1.0, MAX_HEIGHT / sum(2 * h[1] for h in halves))
        halves = [tuple(scale * v for v in h) for h in halves]
    shift = rng.uniform(-0.1, 0.1, size=2)
    prims = []
    if spec.tag == "side_by_side":
        gap = 0.05
        total = 2 * halves[0][0] + gap + 2 * halves[1][0]
        left = -total / 2 + halves[0][0]
        xs = (left, left + halves[0][0] + gap + halves[1][0])
        for part, half, x in zip(spec.parts, halves, xs):
            prims.append(Primitive(part.kind, (x + shift[0], FLOOR + half[1], shift[1]), half))
    else:
        y = FLOOR
        for part, half in reversed(list(zip(spec.parts, halves))):  # bottom part first
            prims.append(Primitive(part.kind, (shift[0], y + half[1], shift[1]), half))
            y += 2 * half[1]
    return Solid(tuple(prims))
