"""Families kept from one render to the next while what they are made of is
unchanged.

Most of a node's page does not move between polls: its NVLinks' error
counters and its subjects' health stay as they were for hours. `Held` keeps
such families with a key that holds every value they are made of, as plain
immutable values compared by equality: a key made afresh from equal readings
finds them, and any change at all builds them anew. Their encoded text is
kept with them (gpuwatchd.encoding.HeldFamily). A sample value goes into a
key through `bits`.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwatchd.encoding import HeldFamily, LinePrefixes

Key = TypeVar("Key", bound=Hashable)
Series = Sequence[tuple[tuple[str, ...], float]]  # label values, value
# Label names where they vary, the series' label values, and their values' bits (see `bits`).
SeriesKey = tuple[tuple[str, ...], tuple[tuple[str, ...], ...], bytes]


def bits(values: Iterable[float]) -> bytes:
    """`values` as a key that tells apart what is written apart: 0.0 and -0.0
    are equal, and a NaN equals nothing, but each has the bits it is written by."""
    return array("d", values).tobytes()


class Held(Generic[Key]):
    """The families of the last key: `build()`'s, built again only when the
    key changes. The key must determine everything `build` returns (a family
    it returns held by series already is kept as it is)."""

    def __init__(self) -> None:
        # One attribute, swapped whole: renders in two threads see a key and its families.
        self._last: tuple[Key, tuple[HeldFamily, ...]] | None = None

    def __call__(self, key: Key, build: Callable[[], Iterable[Metric]]) -> tuple[HeldFamily, ...]:
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        families = tuple(
            family if isinstance(family, HeldFamily) else HeldFamily(family) for family in build()
        )
        self._last = (key, families)
        return families


class _HeldSeries(Held[SeriesKey]):
    def __init__(self) -> None:
        super().__init__()
        self._prefixes = LinePrefixes(None)

    def family(self, key: SeriesKey, build: Callable[[], Metric]) -> HeldFamily:
        """One family whose samples are made of `key`'s series, one a sample:
        rebuilt, it writes its lines with the prefixes of the families of its
        name that were shaped as it is."""
        last = self._last
        if last is not None and last[0] == key:
            return last[1][0]
        built = build()
        prefixes = self._prefixes
        if prefixes.shape != LinePrefixes.shape_of(built):
            # Swapped whole: a family of the old shape keeps the prefixes it had.
            prefixes = self._prefixes = LinePrefixes(LinePrefixes.shape_of(built))
        family = HeldFamily(built, key[1], prefixes)
        self._last = (key, (family,))
        return family


# A family name is one family of the page: each is held on its own.
_BY_NAME: defaultdict[str, _HeldSeries] = defaultdict(_HeldSeries)


def held_series(
    family: GaugeMetricFamily | CounterMetricFamily,
    series: Series,
    label_names: tuple[str, ...] = (),
) -> Metric:
    """`family` (empty) with `series`, or the family of its name held with equal
    series. A family whose label names vary from one render to the next
    passes them as `label_names`, so that they are part of the key."""
    labels = tuple([labels for labels, _ in series])
    key = (label_names, labels, bits([value for _, value in series]))
    return _BY_NAME[family.name].family(key, lambda: _filled(family, series))


def _filled(family: GaugeMetricFamily | CounterMetricFamily, series: Series) -> Metric:
    for labels, value in series:
        family.add_metric(labels, value)
    return family
