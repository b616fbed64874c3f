"""Families kept from one render to the next while what they are made of is
unchanged.

Most of a node's page does not move between polls: its NVLinks' error
counters and its subjects' health stay as they were for hours. `Held` keeps
such families with a key that holds every value they are made of, as plain
immutable values compared by equality: a key made afresh from equal readings
finds them, and any change at all builds them anew. Their encoded text is
kept with them (gpuwatchd.encoding.HeldFamily). A sample value goes into a
key through `exact`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwatchd.encoding import HeldFamily

Key = TypeVar("Key", bound=Hashable)
Series = Sequence[tuple[tuple[str, ...], float]]  # label values, value
SeriesKey = tuple[tuple[tuple[str, ...], float | str], ...]


def exact(value: float) -> float | str:
    """`value` as a key: 0.0 and -0.0 are equal but are written apart, so a zero
    is keyed by its text (NaN equals nothing: a family showing one is rebuilt)."""
    return value if value else repr(value)


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


class _HeldSeries(Held[SeriesKey]):
    def family(self, key: SeriesKey, build: Callable[[], Metric]) -> HeldFamily:
        """One family whose samples are made of `key`'s series, one a sample:
        rebuilt, it re-uses the lines of the series that did not change."""
        last = self._last
        if last is not None and last[0] == key:
            return last[1][0]
        previous = last[1][0] if last is not None and len(last[1]) == 1 else None
        family = HeldFamily(build(), key, previous)
        self._last = (key, (family,))
        return family


# A family name is one family of the page: each is held on its own.
_BY_NAME: defaultdict[str, _HeldSeries] = defaultdict(_HeldSeries)


def held_series(family: GaugeMetricFamily | CounterMetricFamily, series: Series) -> Metric:
    """`family` (empty) with `series`, or the family of its name held with equal series."""
    key = tuple((labels, exact(value)) for labels, value in series)
    return _BY_NAME[family.name].family(key, lambda: _filled(family, series))


def _filled(family: GaugeMetricFamily | CounterMetricFamily, series: Series) -> Metric:
    for labels, value in series:
        family.add_metric(labels, value)
    return family
