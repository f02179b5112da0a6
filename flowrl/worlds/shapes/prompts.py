"""Prompt grammar of the shapes world, with GenEval's six tags, and the fixed train / eval split.

Grammar (a colour in brackets is optional):
  single_object  "a {shape}"
  colors         "a {color} {shape}"
  two_object     "a {shape} and a {shape}"
  counting       "{two|three|four} {shape}s"            (exact count of that shape)
  color_attr     "a {color} {shape} and a {color} {shape}"
  position       "a [{color}] {shape} {left of|right of|above|below} a [{color}] {shape}"  (centroids)

The eval split holds out three colour-shape combinations that RL training never sees in a prompt. Tags that
name no colour (single_object, two_object, counting) have too few prompts to split; their eval prompts are
shared with training, as in GenEval where the object classes are shared.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from flowrl.worlds.shapes.world import COLORS, SHAPES

TAGS = ("single_object", "colors", "two_object", "counting", "color_attr", "position")
NUMBER_WORDS = {"two": 2, "three": 3, "four": 4}
RELATIONS = ("left of", "right of", "above", "below")
HELD_OUT_COMBOS = frozenset({("blue", "triangle"), ("yellow", "circle"), ("green", "square")})
EVAL_PROMPTS_PER_TAG = 8
SPLIT_SEED = 1234


@dataclass(frozen=True)
class Phrase:
    shape: str
    color: str | None = None

    def text(self) -> str:
        return f"a {self.color} {self.shape}" if self.color else f"a {self.shape}"


@dataclass(frozen=True)
class PromptSpec:
    tag: str
    phrases: tuple[Phrase, ...]
    count: int = 1  # counting only
    relation: str | None = None  # position only

    def text(self) -> str:
        if self.tag == "counting":
            word = next(w for w, n in NUMBER_WORDS.items() if n == self.count)
            return f"{word} {self.phrases[0].shape}s"
        if self.tag == "position":
            return f"{self.phrases[0].text()} {self.relation} {self.phrases[1].text()}"
        return " and ".join(p.text() for p in self.phrases)

    def named_objects(self) -> list[Phrase]:
        """One phrase per object the prompt names ("three circles": three), as the renderer draws them."""
        return list(self.phrases) * (self.count if self.tag == "counting" else 1)

    def color_shape_pairs(self) -> set[tuple[str, str]]:
        return {(p.color, p.shape) for p in self.phrases if p.color}


def _parse_phrase(words: list[str], prompt: str) -> Phrase:
    if len(words) == 2 and words[0] == "a" and words[1] in SHAPES:
        return Phrase(words[1])
    if len(words) == 3 and words[0] == "a" and words[1] in COLORS and words[2] in SHAPES:
        return Phrase(words[2], words[1])
    raise ValueError(f"prompt {prompt!r} is not in the shapes grammar (bad phrase {' '.join(words)!r})")


def parse_prompt(prompt: str) -> PromptSpec:
    """Parse a prompt of the grammar above; ValueError naming the prompt otherwise."""
    text = " ".join(prompt.strip().lower().split())
    words = text.split(" ")
    if len(words) == 2 and words[0] in NUMBER_WORDS and words[1].endswith("s") and words[1][:-1] in SHAPES:
        return PromptSpec("counting", (Phrase(words[1][:-1]),), count=NUMBER_WORDS[words[0]])
    for relation in RELATIONS:
        marker = f" {relation} "
        if marker in text:
            left, right = text.split(marker, 1)
            phrases = (_parse_phrase(left.split(), prompt), _parse_phrase(right.split(), prompt))
            return PromptSpec("position", phrases, relation=relation)
    if " and " in text:
        left, right = text.split(" and ", 1)
        phrases = (_parse_phrase(left.split(), prompt), _parse_phrase(right.split(), prompt))
        tag = "color_attr" if phrases[0].color and phrases[1].color else "two_object"
        if bool(phrases[0].color) != bool(phrases[1].color):
            raise ValueError(f"prompt {prompt!r}: colour both objects or neither")
        return PromptSpec(tag, phrases)
    phrase = _parse_phrase(words, prompt)
    return PromptSpec("colors" if phrase.color else "single_object", (phrase,))


def all_prompt_specs(tag: str) -> list[PromptSpec]:
    """Every prompt of one tag, in a fixed order."""
    shape_pairs = [(a, b) for a, b in itertools.permutations(SHAPES, 2)]
    if tag == "single_object":
        return [PromptSpec(tag, (Phrase(s),)) for s in SHAPES]
    if tag == "colors":
        return [PromptSpec(tag, (Phrase(s, c),)) for s in SHAPES for c in COLORS]
    if tag == "two_object":
        return [PromptSpec(tag, (Phrase(a), Phrase(b))) for a, b in shape_pairs]
    if tag == "counting":
        return [PromptSpec(tag, (Phrase(s),), count=n) for s in SHAPES for n in NUMBER_WORDS.values()]
    if tag == "color_attr":
        return [
            PromptSpec(tag, (Phrase(a, ca), Phrase(b, cb))) for a, b in shape_pairs for ca in COLORS for cb in COLORS
        ]
    if tag == "position":
        colors = (None, *COLORS)
        return [
            PromptSpec(tag, (Phrase(a, ca), Phrase(b, cb)), relation=r)
            for a, b in shape_pairs
            for ca in colors
            for cb in colors
            for r in RELATIONS
        ]
    raise ValueError(f"unknown tag {tag!r}; expected one of {TAGS}")


def is_held_out(spec: PromptSpec) -> bool:
    """Whether the prompt names a colour-shape combination RL training never sees (HELD_OUT_COMBOS)."""
    return bool(spec.color_shape_pairs() & HELD_OUT_COMBOS)


def train_prompts(tag: str) -> list[str]:
    """RL training prompts of a tag: no prompt names a held-out colour-shape combination."""
    return [s.text() for s in all_prompt_specs(tag) if not is_held_out(s)]


def eval_prompts(tag: str) -> list[str]:
    """The fixed eval prompts of a tag (held-out combinations where the tag names colours)."""
    specs = all_prompt_specs(tag)
    if tag in ("colors", "color_attr", "position"):
        specs = [s for s in specs if is_held_out(s)]
    if len(specs) > EVAL_PROMPTS_PER_TAG:
        specs = random.Random(f"{SPLIT_SEED}-{tag}").sample(specs, EVAL_PROMPTS_PER_TAG)
    return [s.text() for s in specs]


def eval_prompt_set() -> list[str]:
    return [p for tag in TAGS for p in eval_prompts(tag)]


def wide_eval_prompt_set(per_tag: int = 42) -> list[str]:
    """A larger held-out set for low-noise comparisons: per tag, up to `per_tag` of the prompts eval_prompts draws
    from (every held-out colour-shape prompt of colors / color_attr / position, every prompt of the others), a fixed
    draw that contains the eval split's prompts first."""
    out = []
    for tag in TAGS:
        chosen = eval_prompts(tag)
        specs = [s for s in all_prompt_specs(tag) if tag not in ("colors", "color_attr", "position") or is_held_out(s)]
        rest = [s.text() for s in specs if s.text() not in chosen]
        out += chosen + random.Random(f"{SPLIT_SEED}-wide-{tag}").sample(
            rest, max(0, min(len(rest), per_tag - len(chosen)))
        )
    return out


def train_prompt_set() -> dict[str, list[str]]:
    return {tag: train_prompts(tag) for tag in TAGS}
