"""Registries by name, one mechanism for rewards, algorithms, policies and tasks.

A name resolves to (1) something registered with `register`, (2) a built-in, whose module is imported on first use
(so importing flowrl loads no reward model, task or safety code it does not need), or (3) a dotted path
`package.module:Name` to a user's own class or factory, imported from their package: how flowrl is extended
without editing it (docs/guide/extending.md).
"""

from __future__ import annotations

import importlib

from flowrl.errors import ConfigError


def import_dotted(path: str, where: str):
    """The object at `package.module:Name` (ConfigError naming `where` when the module or name is missing)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{where}: expected a registered name or a dotted path package.module:Name, got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            f"{where}: cannot import module {module_name!r} ({error}); is its package installed or on PYTHONPATH?"
        ) from None
    if not hasattr(module, attribute):
        raise ConfigError(f"{where}: module {module_name!r} has no attribute {attribute!r}")
    return getattr(module, attribute)


class Registry:
    def __init__(self, kind: str, builtins: dict[str, str]):
        self.kind = kind
        self.builtins = builtins  # name -> module whose import registers it
        self.entries: dict = {}

    def register(self, name: str | None = None):
        """Decorator: register a class or factory under `name` (default: its `name` attribute)."""

        def wrap(obj):
            self.entries[name or obj.name] = obj
            return obj

        return wrap

    def names(self) -> list[str]:
        return sorted(set(self.entries) | set(self.builtins))

    def get(self, name: str, where: str):
        if ":" in name:
            return import_dotted(name, where)
        if name not in self.entries and name in self.builtins:
            importlib.import_module(self.builtins[name])
        if name not in self.entries:
            raise ConfigError(
                f"{where}: unknown {self.kind} {name!r}; expected one of {self.names()} or a dotted "
                "path package.module:Name"
            )
        return self.entries[name]
