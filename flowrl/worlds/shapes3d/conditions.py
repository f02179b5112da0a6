"""Condition items of the 3D shapes world: a prompt of the grammar plus the seed of the solid it names (drawn with
the grammar's jitter), and the condition image rendered from that solid. Items stay small and JSON-friendly (the
image is rendered when it is needed, once per solid); the ground-truth solid of any item is `solid_of(item)`."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from flowrl.prompt_source import text_seed
from flowrl.sdf import render
from flowrl.tasks.base import Condition
from flowrl.worlds.shapes3d.prompts import TAGS, eval_prompt_set, parse_prompt, sample_solid, train_prompt_set

IMAGE_SIZE = 32
TRAIN_SOLIDS_PER_PROMPT = 4
EVAL_ITEMS_PER_TAG = 16  # tags with few held-out prompts (single: 1, side by side: 2) get more solids per prompt
EVAL_SEED = 2024


def condition_item(prompt: str, solid_seed: int | None = None) -> Condition:
    spec = parse_prompt(prompt)
    return Condition(
        prompt, meta={"tag": spec.tag, "solid_seed": int(text_seed(prompt) if solid_seed is None else solid_seed)}
    )


def solid_seed(item: Condition) -> int:
    """An item's solid seed (a bare prompt's: a fixed one derived from its text)."""
    return int(item.meta.get("solid_seed", text_seed(item.prompt)))


def solid_of(item: Condition):
    """The ground-truth solid of a world item (its prompt drawn with its solid seed)."""
    return _solid(item.prompt, solid_seed(item))


@lru_cache(maxsize=4096)
def _solid(prompt: str, seed: int):
    return sample_solid(parse_prompt(prompt), np.random.default_rng(seed))


@lru_cache(maxsize=1024)
def prompt_solids(prompt: str, count: int) -> tuple:
    """`count` fixed draws of the solid a prompt describes (sizes jittered, shifted as the grammar draws them; a
    stream of their own, apart from any item's solid seed): the prompt's distribution, which a text condition
    determines where one item's solid is one draw of it."""
    spec = parse_prompt(prompt)
    return tuple(sample_solid(spec, np.random.default_rng([text_seed(prompt), j])) for j in range(count))


@lru_cache(maxsize=4096)
def _image(prompt: str, seed: int) -> np.ndarray:
    image = render(_solid(prompt, seed).sdf, IMAGE_SIZE)[0]
    image.setflags(write=False)
    return image


def world_image(item: Condition) -> np.ndarray:
    """The condition image (uint8 [32, 32, 3]) of a world item; ValueError naming a prompt outside the grammar."""
    return _image(item.prompt, solid_seed(item))


def train_conditions() -> dict[str, list[Condition]]:
    """Per tag: every training prompt with TRAIN_SOLIDS_PER_PROMPT solids."""
    return {
        tag: [condition_item(p, text_seed(p) + k) for p in prompts for k in range(TRAIN_SOLIDS_PER_PROMPT)]
        for tag, prompts in train_prompt_set().items()
    }


def eval_conditions() -> list[Condition]:
    """EVAL_ITEMS_PER_TAG items per tag of the held-out prompts, cycling through each tag's prompts, each with a
    solid of its own (a fixed draw)."""
    prompts = eval_prompt_set()
    items = []
    for tag in TAGS:
        mine = [p for p in prompts if parse_prompt(p).tag == tag]
        items += [
            condition_item(mine[k % len(mine)], EVAL_SEED + 1000 * TAGS.index(tag) + k)
            for k in range(EVAL_ITEMS_PER_TAG)
        ]
    return items
