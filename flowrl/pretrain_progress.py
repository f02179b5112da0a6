"""Pretraining that an interruption does not waste: a recipe's stages save their state into a progress folder, and the
same command run again continues from the last save to the weights an uninterrupted run gives (the weights, the
optimizer, the EMA and every random stream the stage draws from are saved together)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from flowrl.atomic import write_whole, written_whole
from flowrl.errors import UserError


class GeneratorState:
    """A torch.Generator as a state_dict / load_state_dict pair, so a stage can save it with its modules."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


class NumpyRngState:
    """A numpy Generator as a state_dict / load_state_dict pair (its bit generator's state), as GeneratorState."""

    def __init__(self, rng):
        self.rng = rng

    def state_dict(self) -> dict:
        return {"state": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["state"]


class PretrainProgress:
    """The saved stages of one recipe run in `folder`: settings.json (what a continuation must match) and one file per
    stage, written whole (a kill mid-save leaves the previous one). A stage saves at most every `every_seconds`
    while it runs and once when it ends; `seconds()` is the work's wall-clock over every piece of the run."""

    def __init__(self, folder: Path, settings: dict, every_seconds: float = 300.0):
        self.folder = Path(folder)
        self.every_seconds = every_seconds
        record = self.folder / "settings.json"
        text = json.dumps(settings, indent=2, sort_keys=True) + "\n"
        if record.is_file() and record.read_text() != text:
            raise UserError(
                f"{self.folder} holds the progress of this recipe with other settings (see its settings.json): "
                f"rerun with those settings, or delete the folder to start over"
            )
        if record.is_file():
            print(f"continuing the run saved in {self.folder}")
        self.folder.mkdir(parents=True, exist_ok=True)
        write_whole(record, text)
        clock = self.folder / "seconds.json"
        self.carried = json.loads(clock.read_text())["seconds"] if clock.is_file() else 0.0
        self.started = self.last_save = time.monotonic()

    def seconds(self) -> float:
        """Seconds of work so far: earlier pieces' up to their last save, and this piece's."""
        return self.carried + time.monotonic() - self.started

    def due(self) -> bool:
        return time.monotonic() - self.last_save >= self.every_seconds

    def path(self, stage: str) -> Path:
        return self.folder / f"{stage.replace(' ', '_')}.pt"

    def load(self, stage: str) -> dict | None:
        path = self.path(stage)
        return torch.load(path, weights_only=True) if path.is_file() else None

    def save(self, stage: str, state: dict) -> None:
        with written_whole(self.path(stage)) as partial:
            torch.save(state, partial)
        write_whole(self.folder / "seconds.json", json.dumps({"seconds": self.seconds()}) + "\n")
        self.last_save = time.monotonic()

    def stage(self, name: str, modules, run) -> dict:
        """`run()`'s facts (a dict) with `modules` as it left them; or, where an earlier piece finished the stage, its
        saved facts and modules without running it."""
        saved = self.load(name)
        if saved is not None:
            for module, state in zip(modules, saved["modules"]):
                module.load_state_dict(state)
            return saved["facts"]
        facts = run()
        self.save(name, {"modules": [m.state_dict() for m in modules], "facts": facts})
        return facts


def recipe_progress(args, recipe: str, cfg) -> PretrainProgress | None:
    """The progress of `flowrl pretrain RECIPE` in the folder the command gives (`args.progress`; None when it gives
    none, as with --out unset), keyed on the recipe and its config `cfg` (a dataclass): a continuation must match."""
    from dataclasses import asdict

    if getattr(args, "progress", None) is None:
        return None
    return PretrainProgress(args.progress, {"recipe": recipe, "config": asdict(cfg)})
