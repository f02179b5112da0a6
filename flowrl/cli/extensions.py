"""What a task adds to the `flowrl` command: its pretraining recipes, evaluation suites and flags (`TaskCommands`,
returned by `Task.commands()`), collected from every registered task by `task_commands`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TaskCommands:
    """What a task adds to the CLI. Handlers take the parsed arguments."""

    pretrain: dict[str, Callable] = field(default_factory=dict)  # recipe name -> handler
    card_only: tuple[str, ...] = ()  # the recipes that honour --card-only (re-measure a folder, no training)
    pretrain_out: dict[str, str] = field(default_factory=dict)  # recipe name -> its --out default
    pretrain_help: str = ""
    pretrain_arguments: Callable | None = None  # (parser) -> None
    eval_suites: dict[str, Callable] = field(default_factory=dict)  # suite name -> handler
    eval_arguments: Callable | None = None
    sample_arguments: Callable | None = None
    sample_steer: Callable | None = None  # (args, policy) -> a inference.Steer, or None when its flags are unset


def task_commands() -> list[TaskCommands]:
    """The commands of every registered task (each set once, however many tasks share it)."""
    from flowrl.tasks.base import TASKS

    found: list[TaskCommands] = []
    for name in TASKS.names():
        commands = TASKS.get(name, "task").commands()
        if commands is not None and all(commands is not other for other in found):
            found.append(commands)
    return found
