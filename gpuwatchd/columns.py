"""Samples taken apart into columns: how History keeps the samples it does
not keep whole.

A GPU's sample has some sixty fields and eighteen links, a port's some forty
counters; most stay the same for hours (names, limits, a quiet link's
counters), a few change every poll. Each field is kept as its runs of equal
values, numbers unboxed in typed arrays: one run for a field that never
changes, one a poll for one that always does. A mapping field (a port's
counters) is a run per key, its keys interned, so no per-poll dict is kept;
a tuple of nested samples (a GPU's links) is kept by each one's key (its link
number). A sample is read back whole, through its own constructor, only when
asked for (`at`).

Positions are sequence numbers: the n-th sample put is at n. What was put
for the last sequence number can be taken back (`forget_from`, for a sample
replaced at the same time), and what lies wholly before a sequence number
dropped (`forget_before`).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable, Hashable, Mapping
from dataclasses import fields
from operator import attrgetter
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_INT64 = (-(2**63), 2**63 - 1)


class Runs:
    """One field's values by sequence number, as runs of equal values: a run
    starts where the value differs from the one before. Bools, 64-bit ints
    and floats are kept unboxed while the field holds only one of them (and
    None); anything else, or a mix, as Python objects."""

    __slots__ = ("_absent", "_kind", "_last", "_starts", "_values")

    def __init__(self) -> None:
        self._starts = array("q")
        self._absent = bytearray()
        # None until the first value that is not None: bool, int, float or object.
        self._kind: type | None = None
        self._values: array[Any] | list[Any] = array("q")
        # The last run's value, as put: what the next value is compared with.
        self._last: object = None

    def put(self, seq: int, value: object) -> None:
        """`value` from `seq` on (after every sequence number put before)."""
        last = self._last
        if self._starts and type(last) is type(value) and (last is value or last == value):
            return
        if value is not None and self._kind is not object:
            kind = _kind_of(value)
            if kind is not self._kind:
                self._promote(kind)
        self._starts.append(seq)
        self._absent.append(value is None)
        self._values.append(self._placeholder() if value is None else value)
        self._last = value

    def at(self, seq: int) -> Any:
        """The value at `seq`; None before the first run."""
        run = bisect_right(self._starts, seq) - 1
        if run < 0 or self._absent[run]:
            return None
        value = self._values[run]
        return bool(value) if self._kind is bool else value

    def forget_from(self, seq: int) -> None:
        while self._starts and self._starts[-1] >= seq:
            self._starts.pop()
            self._absent.pop()
            self._values.pop()
        self._last = self.at(self._starts[-1]) if self._starts else None

    def forget_before(self, seq: int) -> None:
        """Drop the runs that end before `seq` (the one holding `seq` stays)."""
        runs = bisect_right(self._starts, seq) - 1
        if runs > 0:
            del self._starts[:runs]
            del self._absent[:runs]
            del self._values[:runs]

    def _placeholder(self) -> object:
        return None if isinstance(self._values, list) else 0

    def _promote(self, kind: type) -> None:
        """Keep values of `kind` from now on: in the array they fit, or as
        objects once the field has held another kind."""
        held = [
            None if absent else (bool(v) if self._kind is bool else v)
            for v, absent in zip(self._values, self._absent, strict=True)
        ]
        if self._kind is None and kind is not object:
            self._kind = kind
            self._values = array(_TYPECODES[kind], [0 if v is None else v for v in held])
        else:
            self._kind = object
            self._values = held


_TYPECODES = {bool: "b", int: "q", float: "d"}


def _kind_of(value: object) -> type:
    """How a value is kept: in the typed array of its exact type, else as an object."""
    kind = type(value)
    if isinstance(value, int) and kind is int and not _INT64[0] <= value <= _INT64[1]:
        return object
    return kind if kind in _TYPECODES else object


# What no field holds: every field of the first sample put is new.
_UNSEEN = object()


def _key(key: Hashable) -> Hashable:
    return sys.intern(key) if isinstance(key, str) else key


class SampleColumns(Generic[T]):
    """Samples of one frozen dataclass, taken apart field by field into Runs.

    `nested`: tuple fields of nested samples, by field name: the attribute
    that keys each nested sample, and its dataclass (a GPU's `nvlinks`, by
    `link`). Mapping fields are told by their values."""

    def __init__(
        self,
        kind: Callable[..., T],
        nested: Mapping[str, tuple[str, Callable[..., Any]]] | None = None,
    ) -> None:
        self._kind = kind
        self._names = tuple(f.name for f in fields(kind))  # type: ignore[arg-type]
        getter = attrgetter(*self._names)
        # attrgetter of one name gives the value itself, of more a tuple.
        self._fields: Callable[[T], tuple[Any, ...]] = (
            getter if len(self._names) > 1 else lambda sample: (getter(sample),)
        )
        self._nested_kinds = dict(nested or {})
        self._scalars: dict[str, Runs] = {}
        self._mappings: dict[str, dict[Hashable, Runs]] = {}
        self._nested: dict[str, dict[Any, SampleColumns[Any]]] = {}
        self._present: dict[str, dict[Any, Runs]] = {}
        # The last value put of each field: the same object again costs nothing.
        self._last: list[object] = [_UNSEEN] * len(self._names)

    def put(self, seq: int, sample: T) -> None:
        last = self._last
        for field, (name, value) in enumerate(zip(self._names, self._fields(sample), strict=True)):
            if last[field] is value:
                continue
            last[field] = value
            if name in self._nested_kinds:
                self._put_nested(seq, name, value)
            elif isinstance(value, Mapping):
                self._put_mapping(seq, name, value)
            else:
                runs = self._scalars.get(name)
                if runs is None:
                    runs = self._scalars[name] = Runs()
                runs.put(seq, value)

    def _put_mapping(self, seq: int, name: str, value: Mapping[Hashable, object]) -> None:
        columns = self._mappings.setdefault(name, {})
        for key, item in value.items():
            runs = columns.get(key)
            if runs is None:
                runs = columns[_key(key)] = Runs()
            runs.put(seq, item)
        if len(columns) != len(value):
            for key, runs in columns.items():
                if key not in value:
                    runs.put(seq, None)

    def _put_nested(self, seq: int, name: str, value: tuple[Any, ...]) -> None:
        key_attr, kind = self._nested_kinds[name]
        columns = self._nested.setdefault(name, {})
        present = self._present.setdefault(name, {})
        keys = set()
        for item in value:
            key = getattr(item, key_attr)
            keys.add(key)
            if key not in columns:
                columns[key] = SampleColumns(kind)
                present[key] = Runs()
            columns[key].put(seq, item)
            present[key].put(seq, True)
        for key, runs in present.items():
            if key not in keys:
                runs.put(seq, False)

    def at(self, seq: int) -> T:
        """The sample put at `seq`, made anew."""
        values: dict[str, Any] = {}
        for name in self._names:
            if name in self._nested_kinds:
                columns, present = self._nested.get(name, {}), self._present.get(name, {})
                values[name] = tuple(
                    columns[key].at(seq) for key in sorted(present) if present[key].at(seq)
                )
            elif name in self._mappings:
                values[name] = {
                    key: item
                    for key, runs in self._mappings[name].items()
                    if (item := runs.at(seq)) is not None
                }
            else:
                values[name] = self._scalars[name].at(seq)
        return self._kind(**values)

    def forget_from(self, seq: int) -> None:
        self._last = [_UNSEEN] * len(self._names)
        for runs in self._all_runs():
            runs.forget_from(seq)
        for columns in self._nested.values():
            for nested in columns.values():
                nested.forget_from(seq)

    def forget_before(self, seq: int) -> None:
        for runs in self._all_runs():
            runs.forget_before(seq)
        for columns in self._nested.values():
            for nested in columns.values():
                nested.forget_before(seq)

    def _all_runs(self) -> list[Runs]:
        found = list(self._scalars.values())
        for group in (*self._mappings.values(), *self._present.values()):
            found.extend(group.values())
        return found
