"""Where training and eval conditions come from (a task's named set or a prompt file), drawn reproducibly per
update from (seed, update) alone, so a resumed run needs no state to draw the same ones."""

from __future__ import annotations

import zlib

import numpy as np

from flowrl.tasks.base import Condition, Task, condition_set


def derived_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part (run seed, update, sample index, ...)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def text_seed(text: str) -> int:
    """A fixed seed for a text (stable across processes and runs, unlike hash()): the default scene or solid of a
    world's prompt that comes without one."""
    return zlib.crc32(text.encode())


class PromptSource:
    """The conditions of `source` (a set of `task`, or a .txt / .jsonl prompt file).

    Sets with tags are drawn tag first, then an item within the tag, so every tag gets the same share however
    many items it has. Sets without (prompt files) are drawn as Flow-GRPO's sampler draws them: distinct prompts
    within an update (a fresh permutation; more prompts than the set holds take further permutations).
    """

    def __init__(self, task: Task, source: str):
        self.source = source
        self.set = condition_set(task, source)

    def draw(self, count: int, seed: int, update: int) -> list[Condition]:
        rng = np.random.default_rng(derived_seed(seed, update, 17))
        by_tag = self.set.by_tag
        if by_tag is not None:
            names = list(by_tag)
            tags = [names[i] for i in rng.integers(len(names), size=count)]
            return [by_tag[t][rng.integers(len(by_tag[t]))] for t in tags]
        items = self.set.items
        order = np.concatenate([rng.permutation(len(items)) for _ in range(-(-count // len(items)))])
        return [items[i] for i in order[:count]]

    def all(self) -> list[Condition]:
        return list(self.set.items)
