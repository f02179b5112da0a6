"""Prompt grammar of the moving-shapes world, with tags that mirror VBench / VBench-2.0 dimensions, and the fixed
train / eval split.

Grammar (DIR is left, right, up or down; the objects of one prompt differ in colour or shape):
  object             "a {color} {shape}"                                     (VBench object class + colour)
  motion             "a {color} {shape} moving {DIR}"                        (motion direction)
  static             "a still {color} {shape}"                               (VBench dynamic degree, negated)
  two_objects        "a {color} {shape} moving {DIR} and a {color} {shape} moving {DIR}"   (multiple objects)
  dynamic_attribute  "a {shape} turning from {color} to {color}"             (VBench-2.0 Dynamic Attribute)
  motion_order       "a {color} {shape} moving {DIR}, then {DIR}"            (VBench-2.0 Motion Order)
  relative_motion    "a {color} {shape} moving {toward|away from} a {color} {shape}"  (Dynamic Spatial Relationship)

The eval split holds out three colour-shape combinations (the image world's) and three shape-direction combinations:
no training prompt names one; the eval prompts of a tag are drawn among those that do.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from flowrl.worlds.shapes.prompts import HELD_OUT_COMBOS as HELD_OUT_COLOR_SHAPES
from flowrl.worlds.shapes.tokenizer import shapes_vocabulary
from flowrl.worlds.shapes.world import COLORS, SHAPES

TAGS = ("object", "motion", "static", "two_objects", "dynamic_attribute", "motion_order", "relative_motion")
DIRECTIONS = ("left", "right", "up", "down")
VECTORS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0)}
RELATIVE = ("toward", "away from")
HELD_OUT_SHAPE_DIRECTIONS = frozenset({("circle", "up"), ("square", "left"), ("triangle", "down")})
EVAL_PROMPTS_PER_TAG = 8
SPLIT_SEED = 4321
VOCABULARY = ("moving", "still", "turning", "from", "to", "then", "toward", "away", ",", *DIRECTIONS)


@dataclass(frozen=True)
class Mover:
    """One object of a prompt: its shape, colour (the colour it ends with when it turns), and its motion: one
    direction, two in order, or none (still); `start_color` is set when it turns from one colour to another."""

    shape: str
    color: str | None
    motion: tuple[str, ...] = ()  # () free, ("still",), (DIR,), or (DIR, DIR) in order
    start_color: str | None = None

    def text(self) -> str:
        if self.start_color:
            return f"a {self.shape} turning from {self.start_color} to {self.color}"
        noun = f"{self.color} {self.shape}"
        if self.motion == ("still",):
            return f"a still {noun}"
        if len(self.motion) == 2:
            return f"a {noun} moving {self.motion[0]}, then {self.motion[1]}"
        if self.motion:
            return f"a {noun} moving {self.motion[0]}"
        return f"a {noun}"

    def color_at(self, frame: int, frames: int) -> str:
        """The colour the object shows at `frame` (a turning object changes at mid-clip)."""
        return self.start_color if self.start_color and frame < frames // 2 else self.color


@dataclass(frozen=True)
class ClipSpec:
    tag: str
    movers: tuple[Mover, ...]
    relation: str | None = None  # relative_motion: toward | away from (the first object relative to the second)

    def text(self) -> str:
        if self.tag == "relative_motion":
            a, b = self.movers
            return f"a {a.color} {a.shape} moving {self.relation} a {b.color} {b.shape}"
        return " and ".join(m.text() for m in self.movers)

    def color_shape_pairs(self) -> set[tuple[str, str]]:
        return {(c, m.shape) for m in self.movers for c in (m.color, m.start_color) if c}

    def shape_directions(self) -> set[tuple[str, str]]:
        return {(m.shape, d) for m in self.movers for d in m.motion}


def _noun(words: list[str], prompt: str) -> tuple[str, str]:
    if len(words) == 3 and words[0] == "a" and words[1] in COLORS and words[2] in SHAPES:
        return words[1], words[2]
    raise ValueError(f"prompt {prompt!r} is not in the moving-shapes grammar (bad phrase {' '.join(words)!r})")


def _mover(text: str, prompt: str) -> Mover:
    words = text.replace(",", " ,").split()
    if (
        len(words) == 7
        and words[0] == "a"
        and words[1] in SHAPES
        and words[2:4] == ["turning", "from"]
        and words[4] in COLORS
        and words[5] == "to"
        and words[6] in COLORS
        and words[4] != words[6]
    ):
        return Mover(words[1], words[6], ("still",), start_color=words[4])
    if len(words) == 4 and words[1] == "still":
        color, shape = _noun([words[0], *words[2:]], prompt)
        return Mover(shape, color, ("still",))
    if len(words) == 5 and words[3] == "moving" and words[4] in DIRECTIONS:
        color, shape = _noun(words[:3], prompt)
        return Mover(shape, color, (words[4],))
    if (
        len(words) == 8
        and words[3] == "moving"
        and words[5:7] == [",", "then"]
        and words[4] in DIRECTIONS
        and words[7] in DIRECTIONS
        and words[4] != words[7]
    ):
        color, shape = _noun(words[:3], prompt)
        return Mover(shape, color, (words[4], words[7]))
    color, shape = _noun(words, prompt)
    return Mover(shape, color)


def parse_prompt(prompt: str) -> ClipSpec:
    """Parse a prompt of the grammar above; ValueError naming the prompt otherwise."""
    text = " ".join(prompt.strip().lower().split())
    for relation in RELATIVE:
        marker = f" moving {relation} "
        if marker in text:
            left, right = text.split(marker, 1)
            a, b = _noun(left.split(), prompt), _noun(right.split(), prompt)
            if a == b:
                raise ValueError(f"prompt {prompt!r}: the two objects must differ")
            return ClipSpec("relative_motion", (Mover(a[1], a[0]), Mover(b[1], b[0], ("still",))), relation)
    if " and " in text:
        movers = tuple(_mover(part, prompt) for part in text.split(" and ", 1))
        if not all(len(m.motion) == 1 and m.motion[0] in DIRECTIONS for m in movers):
            raise ValueError(f"prompt {prompt!r}: two objects each need 'moving DIRECTION'")
        if (movers[0].color, movers[0].shape) == (movers[1].color, movers[1].shape):
            raise ValueError(f"prompt {prompt!r}: the two objects must differ")
        return ClipSpec("two_objects", movers)
    mover = _mover(text, prompt)
    if mover.start_color:
        return ClipSpec("dynamic_attribute", (mover,))
    tag = {0: "object", 2: "motion_order"}.get(len(mover.motion), "static" if mover.motion == ("still",) else "motion")
    return ClipSpec(tag, (mover,))


def all_specs(tag: str) -> list[ClipSpec]:
    """Every prompt of one tag, in a fixed order."""
    nouns = [(c, s) for s in SHAPES for c in COLORS]
    if tag == "object":
        return [ClipSpec(tag, (Mover(s, c),)) for c, s in nouns]
    if tag == "motion":
        return [ClipSpec(tag, (Mover(s, c, (d,)),)) for c, s in nouns for d in DIRECTIONS]
    if tag == "static":
        return [ClipSpec(tag, (Mover(s, c, ("still",)),)) for c, s in nouns]
    if tag == "two_objects":
        return [
            ClipSpec(tag, (Mover(a[1], a[0], (da,)), Mover(b[1], b[0], (db,))))
            for a, b in itertools.permutations(nouns, 2)
            for da in DIRECTIONS
            for db in DIRECTIONS
        ]
    if tag == "dynamic_attribute":
        return [
            ClipSpec(tag, (Mover(s, c2, ("still",), start_color=c1),))
            for s in SHAPES
            for c1, c2 in itertools.permutations(COLORS, 2)
        ]
    if tag == "motion_order":
        return [
            ClipSpec(tag, (Mover(s, c, (d1, d2)),))
            for c, s in nouns
            for d1, d2 in itertools.permutations(DIRECTIONS, 2)
        ]
    if tag == "relative_motion":
        return [
            ClipSpec(tag, (Mover(a[1], a[0]), Mover(b[1], b[0], ("still",))), r)
            for a, b in itertools.permutations(nouns, 2)
            for r in RELATIVE
        ]
    raise ValueError(f"unknown tag {tag!r}; expected one of {TAGS}")


def is_held_out(spec: ClipSpec) -> bool:
    return bool(spec.color_shape_pairs() & HELD_OUT_COLOR_SHAPES or spec.shape_directions() & HELD_OUT_SHAPE_DIRECTIONS)


def train_prompts(tag: str) -> list[str]:
    return [s.text() for s in all_specs(tag) if not is_held_out(s)]


def eval_prompts(tag: str) -> list[str]:
    """The fixed eval prompts of a tag: up to EVAL_PROMPTS_PER_TAG among those naming a held-out combination."""
    specs = [s for s in all_specs(tag) if is_held_out(s)]
    if len(specs) > EVAL_PROMPTS_PER_TAG:
        specs = random.Random(f"{SPLIT_SEED}-{tag}").sample(specs, EVAL_PROMPTS_PER_TAG)
    return [s.text() for s in specs]


def train_prompt_set() -> dict[str, list[str]]:
    return {tag: train_prompts(tag) for tag in TAGS}


def eval_prompt_set() -> list[str]:
    return [p for tag in TAGS for p in eval_prompts(tag)]


def sub_prompts(spec: ClipSpec) -> list[str]:
    """The yes/no checks a prompt consists of, each itself a prompt of the grammar ("does the clip show ...?"):
    each named object's presence, then its motion, colour change or order, then the relative motion."""
    checks = []
    for mover in spec.movers:
        if mover.start_color:
            checks.append(mover.text())
            continue
        checks.append(f"a {mover.color} {mover.shape}")
        if mover.motion and spec.tag != "relative_motion":
            checks.append(mover.text())
    if spec.tag == "relative_motion":
        checks.append(spec.text())
    return list(dict.fromkeys(checks))


def perturb(spec: ClipSpec, rng) -> ClipSpec:
    """`spec` with one attribute redrawn (a colour, a direction, the order, the relation): a near-miss prompt."""
    movers = list(spec.movers)
    i = int(rng.integers(len(movers)))
    m = movers[i]
    options = ["color"]
    if m.motion and m.motion != ("still",):
        options.append("direction")
    if len(m.motion) == 2:
        options.append("order")
    if spec.relation:
        options.append("relation")
    choice = options[int(rng.integers(len(options)))]
    if choice == "relation":
        return ClipSpec(spec.tag, spec.movers, "away from" if spec.relation == "toward" else "toward")
    if choice == "order":
        movers[i] = Mover(m.shape, m.color, m.motion[::-1], m.start_color)
    elif choice == "direction":
        legs = list(m.motion)
        j = int(rng.integers(len(legs)))
        legs[j] = [d for d in DIRECTIONS if d not in legs][int(rng.integers(len(DIRECTIONS) - len(legs)))]
        movers[i] = Mover(m.shape, m.color, tuple(legs), m.start_color)
    else:
        taken = {(o.color, o.shape) for o in movers} | {m.start_color}
        colors = [c for c in COLORS if (c, m.shape) not in taken and c != m.start_color]
        movers[i] = Mover(m.shape, colors[int(rng.integers(len(colors)))], m.motion, m.start_color)
    return ClipSpec(spec.tag, tuple(movers), spec.relation)


def motion_vocabulary() -> list[str]:
    """The shapes vocabulary plus the moving-shapes world's words (motion, directions, colour change); the shapes
    words keep their ids."""
    base = shapes_vocabulary()
    return base + sorted(set(VOCABULARY) - set(base))
