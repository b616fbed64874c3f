"""Families kept from one render to the next while what they are made of is
unchanged.

Most of a node's page does not move between polls: its NVLinks' error
counters and its subjects' health stay as they were for hours. `Held` keeps
such families with a key that holds every value they are made of, as plain
immutable values compared by equality: a key made afresh from equal readings
finds them, and any change at all builds them anew. Their encoded text is
kept with them (gpuwatchd.encoding.HeldFamily). A float goes into a key as
its repr: 0.0 and -0.0 are equal but are written apart.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from prometheus_client.core import Metric

from gpuwatchd.encoding import HeldFamily

Key = TypeVar("Key", bound=Hashable)


class Held(Generic[Key]):
    """The families of the last key: `build()`'s, built again only when the
    key changes. The key must determine everything `build` returns."""

    def __init__(self) -> None:
        # One attribute, swapped whole: renders in two threads see a key and its families.
        self._last: tuple[Key, tuple[HeldFamily, ...]] | None = None

    def __call__(self, key: Key, build: Callable[[], Iterable[Metric]]) -> tuple[HeldFamily, ...]:
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        families = tuple(HeldFamily(family) for family in build())
        self._last = (key, families)
        return families
