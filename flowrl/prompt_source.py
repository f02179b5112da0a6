"""Where training and eval prompts come from: the shapes splits or a text file, drawn reproducibly per update."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import UserError
from .shapes.prompts import eval_prompt_set, train_prompt_set


def read_prompt_file(path: str | Path) -> list[str]:
    """Prompts from a text file, one per line (blank lines and lines starting with # skipped)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist; expected a text file with one prompt per line")
    prompts = [line.strip() for line in path.read_text().splitlines()]
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise UserError(f"prompt file {path} has no prompts; expected one prompt per line")
    return prompts


def derived_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part (run seed, update, sample index, ...)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


class PromptSource:
    """Draws the prompts of update u from (seed, u) alone, so it needs no state to resume exactly.

    The shapes training split is drawn tag first, then prompt within the tag, so every GenEval tag gets the same
    share however many prompts it has.
    """

    def __init__(self, source: str):
        self.source = source
        if source == "shapes_train":
            self.by_tag = train_prompt_set()
        elif source == "safety_train":  # the train side of the safety sets, one set drawn first like a tag
            from .safety.concept import safety_split

            self.by_tag = safety_split()[0]
        elif source == "shapes_eval":
            self.by_tag = None
            self.prompts = eval_prompt_set()
        else:
            self.by_tag = None
            self.prompts = read_prompt_file(source)

    def draw(self, count: int, seed: int, update: int) -> list[str]:
        rng = np.random.default_rng(derived_seed(seed, update, 17))
        if self.by_tag is not None:
            names = list(self.by_tag)
            tags = [names[i] for i in rng.integers(len(names), size=count)]
            return [self.by_tag[t][rng.integers(len(self.by_tag[t]))] for t in tags]
        return [self.prompts[i] for i in rng.integers(len(self.prompts), size=count)]

    def all(self) -> list[str]:
        if self.by_tag is not None:
            return [p for prompts in self.by_tag.values() for p in prompts]
        return list(self.prompts)
