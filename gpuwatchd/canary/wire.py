"""Frozen dataclasses to and from JSON-ready values, for the worker protocol
and `canary --json`.

`to_wire` gives plain dicts, lists and scalars; `from_wire` rebuilds the
dataclass and checks every field against its type hint, so a malformed line
from a worker is an error, never a half-built result.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class WireError(ValueError):
    """A value that does not fit the dataclass it should become."""


def to_wire(value: object) -> dict[str, Any]:
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        raise TypeError(f"expected a dataclass instance, got {value!r}")
    return dataclasses.asdict(value)


def from_wire(cls: type[T], data: object) -> T:
    return typing.cast(T, _build(cls, data, cls.__name__))


def _build(tp: Any, value: object, where: str) -> Any:
    origin = get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in get_args(tp):
            return None
        options = [arg for arg in get_args(tp) if arg is not type(None)]
        return _build(options[0], value, where)
    if origin is Literal:
        if value not in get_args(tp):
            raise WireError(f"{where}: {value!r} is not one of {get_args(tp)}")
        return value
    if origin is tuple:
        return _tuple(get_args(tp), value, where)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, value, where)
    return _scalar(tp, value, where)


def _tuple(args: tuple[Any, ...], value: object, where: str) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise WireError(f"{where}: expected a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_build(args[0], item, f"{where}[{i}]") for i, item in enumerate(value))
    if len(args) != len(value):
        raise WireError(f"{where}: expected {len(args)} items, got {len(value)}")
    return tuple(
        _build(arg, item, f"{where}[{i}]")
        for i, (arg, item) in enumerate(zip(args, value, strict=True))
    )


def _dataclass(cls: type[Any], value: object, where: str) -> Any:
    if not isinstance(value, dict):
        raise WireError(f"{where}: expected an object, got {value!r}")
    hints = get_type_hints(cls)
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = set(value) - names
    if unknown:
        raise WireError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    built = {name: _build(hints[name], item, f"{where}.{name}") for name, item in value.items()}
    try:
        return cls(**built)
    except (TypeError, ValueError) as error:
        raise WireError(f"{where}: {error}") from error


def _scalar(tp: Any, value: object, where: str) -> Any:
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool) and isinstance(value, tp):
        return value
    raise WireError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")
