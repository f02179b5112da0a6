"""YAML mappings read into dataclasses, field by field, with one clear error per bad field.

Every field is checked against its annotation (int, float, str, bool, Literal, X | None, list[X], dict, nested
dataclass); unknown keys are errors that list the known ones; `key=value` overrides are parsed as YAML.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

import yaml

from flowrl.errors import ConfigError


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value, tp, where: str):
    """Check / coerce `value` to annotation `tp`; ConfigError naming `where` otherwise."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, where)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value is False and "no" in args:  # YAML 1.1 reads a bare `no` as false (mixed_precision: no)
            value = "no"
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None and math.isfinite(number):  # (a range check `x <= 0` lets NaN through)
            return number
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    raise ConfigError(f"{where}: unsupported field type {tp}")


def from_dict(cls, data, where: str = ""):
    """Build dataclass `cls` from a mapping, checking every field; `where` prefixes field names in errors."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(f"{where + '.' if where else ''}{key}: unknown field; known fields: {', '.join(names)}")
    kwargs = {k: _convert(v, hints[k], f"{where + '.' if where else ''}{k}") for k, v in data.items()}
    return cls(**kwargs)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` strings (value parsed as YAML) to a nested mapping."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. optim.lr=1e-4")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = node[part]
        node[parts[-1]] = value
    return data


def merged(base: dict, top: dict) -> dict:
    """`top` over `base`: mappings merge key by key (`top`'s values win), anything else (lists too) is replaced whole.

    Args:
        base: the mapping underneath (e.g. a task's config defaults).
        top: the mapping on top (e.g. the YAML config).

    Returns:
        A new mapping; neither argument is changed."""
    result = dict(base)
    for key, value in top.items():
        result[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return result
