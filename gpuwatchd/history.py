"""Bounded history of samples per subject, the input of every check.

The daemon records each poll's readings here; checks read series out of it
and never write. Each subject keeps at most `max_samples` samples and nothing
older than `max_age_seconds`, so memory stays flat however long the daemon
runs. A GPU's track holds one board: a sample with another UUID at its index
starts it afresh.

A check that judges a window of a long history asks the subject's Track for
the window's bounds (a bisection), and for Columns: one counter of the
samples, derived as they arrive, with running totals from which a window's
increase is a subtraction. A poll then costs a check work in proportion to
the new samples, not to the window. What a Track derives lives and dies with
the history, so it is rebuilt from the state database at a restart, as the
history is.

An hour of samples is kept as columns (`gpuwatchd.columns`): each field's
runs of equal values, numbers unboxed, counter names interned, no per-poll
dict or object. Only the newest samples are kept whole: a GPU's for the
last WHOLE_GPU_SECONDS (the windows the clocks and PCIe checks read every
poll), a port's or a PCIe function's the latest alone (their checks read
Columns); an older sample is made again from its columns when asked for.
The NVML source gives a GPU's sample the last one's links and mappings
where they did not change, so the whole ones cost little more than their
numbers.
What a Track derives (Columns, Areas, change marks) is kept the same way:
running totals in typed arrays, the rare events (a reset, a saturated or an
absent value) as the positions they happened at.

Polls closer together than `max_age_seconds / (max_samples - 2)` (0.88 s for
an hour in 4096 samples) would fill the ring before the hour is covered and
cut every window short. So the kept samples are at least that far apart: the
newest sample is always the last poll's, replacing the one before it while
that one is too close to the sample kept before it. Windows keep their full
length at any poll interval, at the resolution of that spacing; counters lose
nothing (they are cumulative), and each poll's own sample is judged as it comes.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from functools import reduce
from math import fsum
from operator import add
from typing import Any, Generic, Protocol, TypeVar, overload

from gpuwatchd.columns import SampleColumns
from gpuwatchd.counters import Increase, saturation_max
from gpuwatchd.model import (
    NVML_SOURCE,
    GpuSample,
    LinkSample,
    NvmlUnavailable,
    PcieFunctionSample,
    PortSample,
    Reading,
    SxidEvent,
    XidEvent,
)

T = TypeVar("T")
V = TypeVar("V")
T_contra = TypeVar("T_contra", contravariant=True)

Number = int | float

# Below this, every partial sum of whole counter increments is exact in a
# float, so a difference of running totals equals the step-by-step sum.
_EXACT = 2**53
# What a Track derives drops the samples that left it this many at a time.
_DROP_BATCH = 64
# How far back a GPU's samples are kept whole: the clocks and PCIe checks read
# their 15 windows of a minute every poll (checks.clocks, checks.pcie), and
# the NVLink check its 3; older samples are made again from their columns.
WHOLE_GPU_SECONDS = 16 * 60.0


class _Numbers:
    """Numbers position by position: unboxed in a typed array while they all
    fit one (64-bit ints, or floats), as a list of Python numbers once one
    does not."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: array[Any] | list[Number] = array("q")

    def append(self, value: Number) -> None:
        items = self.items
        if isinstance(items, array):
            if not items and isinstance(value, float) and items.typecode == "q":
                items = self.items = array("d")
            try:
                if (items.typecode == "d") == isinstance(value, float):
                    items.append(value)
                    return
            except OverflowError:
                pass
            items = self.items = list(items)
        items.append(value)

    def __getitem__(self, index: int) -> Number:
        value: Number = self.items[index]
        return value

    def __len__(self) -> int:
        return len(self.items)

    def pop(self) -> None:
        self.items.pop()

    def drop_first(self, count: int) -> None:
        del self.items[:count]


class _Marks:
    """The sequence numbers of the samples where something rare happened (a
    reset, a saturated or an absent value), oldest first."""

    __slots__ = ("seqs",)

    def __init__(self) -> None:
        self.seqs = array("q")

    def add(self, seq: int) -> None:
        self.seqs.append(seq)

    def count(self, first: int, last: int) -> int:
        """How many of first..last are marked."""
        if last < first or not self.seqs:
            return 0
        return bisect_right(self.seqs, last) - bisect_left(self.seqs, first)

    def forget_from(self, seq: int) -> None:
        while self.seqs and self.seqs[-1] >= seq:
            self.seqs.pop()

    def forget_before(self, seq: int) -> None:
        del self.seqs[: bisect_left(self.seqs, seq)]


class _Derived(Protocol[T_contra]):
    """What a Track derives from its samples, kept from sequence number
    `first` to `taken` (exclusive); `stamp` is the stamp of the sample taken
    last, `skip` how many of the first ones the track no longer holds."""

    first: int
    taken: int
    stamp: int
    skip: int

    def take(self, sample: T_contra, seq: int, position: int) -> None: ...

    def drop_last(self) -> None: ...

    def drop_before(self, seq: int) -> None: ...


class Column(Generic[T]):
    """One counter of one subject's samples, position by position as the
    Track holds them, with running totals of what `counters.increase` adds up:
    each present value's increment over the previous present one (a reset
    counts the value itself), resets, values at the saturation maximum, and
    present values. Increments that are not whole numbers are kept one by one
    and summed in order, so every result is the one `counters.increase` gives
    (with the same `bits` and `lifetime`).
    """

    def __init__(
        self, value: Callable[[T], Number | None], bits: int | None, lifetime: bool = False
    ) -> None:
        self._value = value
        # The value a counter of `bits` stands at once saturated (None: never).
        self._limit = saturation_max(bits)
        self._lifetime = lifetime
        self.first = self.taken = self.stamp = self.skip = 0
        # Each position's value (absent ones marked) and the running total of
        # its whole, non-negative increments up to and including it.
        self._values = _Numbers()
        self._whole = _Numbers()
        self._absent = _Marks()
        self._resets = _Marks()
        self._saturated = _Marks()
        # Positions whose increment is not a whole number, and every
        # position's increment as a float once there is one.
        self._inexact = _Marks()
        self._steps: array[float] | None = None
        # The running total at the last position taken.
        self._total: Number = 0
        # The last present value taken, and the one before it (for drop_last).
        self._last: Number | None = None
        self._before_last: Number | None = None

    def take(self, sample: T, seq: int, position: int) -> None:
        value = self._value(sample)
        previous = self._last
        step: Number = 0
        if value is None:
            self._absent.add(seq)
        else:
            if self._limit is not None and value >= self._limit:
                self._saturated.add(seq)
            if previous is not None:
                if value >= previous:
                    step = value - previous
                else:
                    self._resets.add(seq)
                    step = 0 if self._lifetime else value
            self._before_last, self._last = previous, value
        whole = isinstance(step, int) and step >= 0
        if not whole:
            self._inexact.add(seq)
            if self._steps is None:
                self._steps = self._replayed_steps()
        if self._steps is not None:
            self._steps.append(float(step))
        if whole:
            self._total += step
        self._values.append(0 if value is None else value)
        self._whole.append(self._total)
        self.taken = seq + 1

    def _replayed_steps(self) -> array[float]:
        """Every increment taken so far, as a float: they were all whole."""
        totals = self._whole.items
        return array("d", (float(b - a) for a, b in zip([0, *totals], totals, strict=False)))

    def drop_last(self) -> None:
        seq = self.taken - 1
        absent = self._absent.count(seq, seq)
        for marks in (self._absent, self._resets, self._saturated, self._inexact):
            marks.forget_from(seq)
        self._values.pop()
        self._whole.pop()
        self._total = self._whole[-1] if len(self._whole) else 0
        if self._steps is not None:
            self._steps.pop()
        if not absent:
            # A Track replaces only its last sample, and takes the new one
            # before it can replace again: one value back is all it needs.
            self._last, self._before_last = self._before_last, None
        self.taken = seq

    def drop_before(self, seq: int) -> None:
        count = min(seq, self.taken) - self.first
        if count <= 0:
            return
        for marks in (self._absent, self._resets, self._saturated, self._inexact):
            marks.forget_before(seq)
        self._values.drop_first(count)
        self._whole.drop_first(count)
        if self._steps is not None:
            del self._steps[:count]
        self.first += count

    def _seq(self, position: int) -> int:
        return self.first + self.skip + position

    def present(self, first: int, last: int) -> int:
        """How many of positions first..last hold a value."""
        if last < first:
            return 0
        return last - first + 1 - self._absent.count(self._seq(first), self._seq(last))

    def saturated(self, first: int, last: int) -> bool:
        """Whether any of positions first..last stands at the saturation maximum."""
        return self._saturated.count(self._seq(first), self._seq(last)) > 0

    def increase(self, first: int, last: int, times: Sequence[float]) -> Increase:
        """`counters.increase` over positions first..last, both included."""
        if last < first:
            return Increase(increase=0.0, seconds=0.0)
        offset = self.first + self.skip
        start, end = first + offset, last + offset
        absent = self._absent.count(start, end)
        if absent:
            # Absent values: the increase runs between the present ones.
            if absent == end - start + 1:
                return Increase(increase=0.0, seconds=0.0)
            first = next(p for p in range(first, last + 1) if self.present(p, p))
            last = next(p for p in range(last, first - 1, -1) if self.present(p, p))
            start, end = self._seq(first), self._seq(last)
        index, final = start - self.first, end - self.first
        totals = self._whole.items
        grown = totals[final] - totals[index]
        if self._inexact.count(start + 1, end) or grown >= _EXACT:
            total = reduce(add, self._steps_between(index + 1, final + 1), 0.0)
        else:
            total = float(grown)
        return Increase(
            increase=total,
            seconds=times[last] - times[first],
            resets=self._resets.count(start + 1, end),
            saturated=self._saturated.count(start, end) > 0,
        )

    def _steps_between(self, start: int, end: int) -> Sequence[Number]:
        if self._steps is not None:
            return self._steps[start:end]
        totals = self._whole.items
        return [totals[i] - totals[i - 1] for i in range(start, end)]


class Gauge(Generic[T]):
    """One gauge of one subject's samples, position by position as the Track
    holds them: which positions hold a value, and running totals from which
    a window's sum is a subtraction. The sum is the one `math.fsum` gives:
    whole values are added up exactly, as integers, and a window holding one
    that is not whole is summed by fsum itself."""

    def __init__(self, value: Callable[[T], Number | None]) -> None:
        self._value = value
        self.first = self.taken = self.stamp = self.skip = 0
        # Each position's value as fsum takes it (0 where absent), and the
        # running total of the whole ones up to and including it.
        self._values = array("d")
        self._whole = _Numbers()
        self._present = _Marks()
        self._inexact = _Marks()

    def take(self, sample: T, seq: int, position: int) -> None:
        value = self._value(sample)
        number = 0.0 if value is None else float(value)
        total = self._whole[-1] if len(self._whole) else 0
        if value is not None:
            self._present.add(seq)
            if number.is_integer():
                total += int(number)
            else:
                self._inexact.add(seq)
        self._values.append(number)
        self._whole.append(total)
        self.taken = seq + 1

    def drop_last(self) -> None:
        seq = self.taken - 1
        self._present.forget_from(seq)
        self._inexact.forget_from(seq)
        self._values.pop()
        self._whole.pop()
        self.taken = seq

    def drop_before(self, seq: int) -> None:
        count = min(seq, self.taken) - self.first
        if count <= 0:
            return
        self._present.forget_before(seq)
        self._inexact.forget_before(seq)
        del self._values[:count]
        self._whole.drop_first(count)
        self.first += count

    def _seq(self, position: int) -> int:
        return self.first + self.skip + position

    def count(self, first: int, last: int) -> int:
        """How many of positions first..last hold a value."""
        return self._present.count(self._seq(first), self._seq(last))

    def last_present(self, first: int, last: int) -> int | None:
        """The last of positions first..last that holds a value, if any."""
        if not self.count(first, last):
            return None
        seqs = self._present.seqs
        return seqs[bisect_right(seqs, self._seq(last)) - 1] - self._seq(0)

    def total(self, first: int, last: int) -> float:
        """`math.fsum` of the values at positions first..last."""
        if last < first:
            return 0.0
        start, end = self._seq(first), self._seq(last)
        index, final = start - self.first, end - self.first
        if self._inexact.count(start, end):
            return fsum(self._values[index : final + 1])
        before = self._whole[index - 1] if index else 0
        return float(self._whole[final] - before)


class Area(Generic[T]):
    """The area under one gauge of the samples, interval by interval, as
    `counters.gauge_integral` takes it (each interval at the lower of its two
    end values; none where an end is absent)."""

    def __init__(self, value: Callable[[T], Number | None], times: Sequence[float]) -> None:
        self._value = value
        self._times = times
        self.first = self.taken = self.stamp = self.skip = 0
        # The interval ending at each position (nothing at the first kept).
        self._areas = array("d")
        self._ends: list[Number | None] = []

    def take(self, sample: T, seq: int, position: int) -> None:
        value = self._value(sample)
        area = 0.0
        if position:
            start, end = self._times[position - 1], self._times[position]
            before = self._ends[-1] if self._ends else None
            if before is not None and value is not None and end > start:
                area = min(before, value) * (end - start)
        self._areas.append(area)
        # The value at the last two positions: the next interval's start.
        self._ends = [*self._ends[-1:], value]
        self.taken = seq + 1

    def drop_last(self) -> None:
        self._areas.pop()
        self._ends = self._ends[:-1]
        self.taken -= 1

    def drop_before(self, seq: int) -> None:
        count = min(seq, self.taken) - self.first
        if count > 0:
            del self._areas[:count]
            self.first += count

    def integral(self, first: int, last: int) -> float:
        """`counters.gauge_integral` over positions first..last: the same
        additions in the same order."""
        return reduce(add, self._areas[first + self.skip + 1 : last + self.skip + 1], 0.0)


class _Changes(Generic[T]):
    """The sequence numbers of the samples whose `value` differs from the
    sample's before."""

    def __init__(self, value: Callable[[T], object]) -> None:
        self._value = value
        self.first = self.taken = self.stamp = self.skip = 0
        self.changed = _Marks()
        # The values at the last two positions taken (for drop_last).
        self._values: list[object] = []

    def take(self, sample: T, seq: int, position: int) -> None:
        value = self._value(sample)
        if position and self._values and value != self._values[-1]:
            self.changed.add(seq)
        self._values = [*self._values[-1:], value]
        self.taken = seq + 1

    def drop_last(self) -> None:
        self.changed.forget_from(self.taken - 1)
        self._values = self._values[:-1]
        self.taken -= 1

    def drop_before(self, seq: int) -> None:
        self.changed.forget_before(seq)
        self.first = max(self.first, min(seq, self.taken))

    def last(self) -> int | None:
        """The sequence number of the latest change, if any."""
        seqs = self.changed.seqs
        return seqs[-1] if seqs else None


class _Samples(Sequence[T]):
    """A Track's samples, oldest first: every one as columns (when the track
    keeps columns), the newest `whole` ones as they were recorded."""

    def __init__(self, columns: SampleColumns[T] | None) -> None:
        self._columns = columns
        self._whole: list[T] = []
        self.first = 0  # the sequence number of position 0
        self._count = 0
        # The first sequence number the columns still hold.
        self._columns_first = 0

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            made = self._count - len(self._whole)
            if step == 1 and start >= made:
                return self._whole[start - made : stop - made]
            return [self._at(position) for position in range(start, stop, step)]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("sample position out of range")
        return self._at(index)

    def __iter__(self) -> Iterator[T]:
        return (self._at(position) for position in range(self._count))

    def _at(self, position: int) -> T:
        whole = position - (self._count - len(self._whole))
        if whole >= 0:
            return self._whole[whole]
        assert self._columns is not None
        return self._columns.at(self.first + position)

    def append(self, sample: T) -> None:
        # The last sample again (a source hands back one that did not
        # change) leaves every column as it stands: nothing to put.
        if self._columns is not None and not (self._whole and self._whole[-1] is sample):
            self._columns.put(self.first + self._count, sample)
        self._whole.append(sample)
        self._count += 1

    def replace_last(self, sample: T) -> None:
        seq = self.first + self._count - 1
        if self._columns is not None:
            self._columns.forget_from(seq)
            self._columns.put(seq, sample)
        self._whole[-1] = sample

    def drop_first(self, count: int) -> None:
        self.first += count
        self._count -= count
        if len(self._whole) > self._count:
            del self._whole[: len(self._whole) - self._count]
        if self._columns is not None and self.first - self._columns_first >= _DROP_BATCH:
            self._columns.forget_before(self.first)
            self._columns_first = self.first

    def keep_whole(self, count: int) -> None:
        """Keep only the newest `count` samples whole (all of them without columns)."""
        if self._columns is None:
            return
        if len(self._whole) > max(1, count):
            del self._whole[: len(self._whole) - max(1, count)]


class Track(Generic[T]):
    """One subject's samples, oldest first, with the Columns and change marks
    checks asked for, brought up to date when next asked.

    `columns`: keep the samples as columns (`gpuwatchd.columns`), and only
    those of the last `whole_seconds` whole; without, every sample is kept
    whole."""

    def __init__(
        self,
        max_samples: int,
        spacing: float = 0.0,
        columns: SampleColumns[T] | None = None,
        whole_seconds: float = 0.0,
    ) -> None:
        self.max_samples = max_samples
        # Kept samples are at least this far apart (but the newest): see the
        # module's docstring.
        self.spacing = spacing
        self.whole_seconds = whole_seconds
        self.times: list[float] = []
        self.samples = _Samples(columns)
        # A stamp per sample, new for each sample taken in (a replaced one too):
        # what a Column compares to see which samples it has not seen. Unboxed:
        # in a list, each stamp past 256 (CPython's cached ints) is an object
        # of its own, so the ring grew for 256 polls after the history filled.
        self._stamps = array("q")
        self._next_stamp = 0
        self._columns: dict[Hashable, Column[T]] = {}
        self._changes: dict[Hashable, _Changes[T]] = {}
        self._areas: dict[Hashable, Area[T]] = {}
        self._gauges: dict[Hashable, Gauge[T]] = {}

    def __len__(self) -> int:
        return len(self.samples)

    def append(self, time: float, sample: T) -> None:
        self._next_stamp += 1
        times = self.times
        if times and (
            times[-1] == time or (len(times) > 1 and times[-1] - times[-2] < self.spacing)
        ):
            times[-1] = time
            self.samples.replace_last(sample)
            self._stamps[-1] = self._next_stamp
            return
        self.times.append(time)
        self.samples.append(sample)
        self._stamps.append(self._next_stamp)
        if len(self.samples) > self.max_samples:
            self._drop_first(1)
        self.samples.keep_whole(len(times) - bisect_left(times, time - self.whole_seconds))

    def expire(self, oldest: float) -> None:
        """Drop what is older than `oldest`, but one: rates over a full window need it."""
        count = 0
        while len(self.times) - count > 1 and self.times[count + 1] < oldest:
            count += 1
        if count:
            self._drop_first(count)

    def _drop_first(self, count: int) -> None:
        del self.times[:count]
        del self._stamps[:count]
        self.samples.drop_first(count)

    def items(self) -> list[tuple[float, T]]:
        """(time, sample) pairs, oldest first."""
        return list(zip(self.times, self.samples, strict=True))

    def tail(self, first: int) -> list[tuple[float, T]]:
        """(time, sample) pairs from position `first` on."""
        return list(zip(self.times[first:], self.samples[first:], strict=True))

    def latest(self) -> T | None:
        return self.samples[-1] if len(self.samples) else None

    def at_or_before(self, time: float) -> int:
        """The position of the last sample at or before `time` (0 when none
        is that old): where the intervals ending after `time` start."""
        return max(0, bisect_right(self.times, time) - 1)

    def before(self, time: float) -> int:
        """The position of the last sample before `time` (the latest one when
        none is at or after it): where `counters.window` starts."""
        return max(0, bisect_left(self.times, time) - 1)

    def upto(self, time: float) -> int:
        """The position of the last sample at or before `time`; -1 when none is."""
        return bisect_right(self.times, time) - 1

    def between(self, start: float, end: float) -> list[T]:
        """The samples taken in (start, end]."""
        first, last = self.span(start, end)
        return self.samples[first : last + 1]

    def span(self, start: float, end: float) -> tuple[int, int]:
        """The positions first..last of the samples taken in (start, end]
        (last below first when there are none)."""
        return bisect_right(self.times, start), bisect_right(self.times, end) - 1

    def column(
        self,
        key: Hashable,
        value: Callable[[T], Number | None],
        bits: int | None = None,
        lifetime: bool = False,
    ) -> Column[T]:
        """The column of `value` over the samples, under `key` (one key, one
        `value`: the first caller's is kept). `lifetime`: see `counters.increase`."""
        column = self._columns.get(key)
        if column is None:
            column = self._columns[key] = Column(value, bits, lifetime)
        self._sync(column)
        return column

    def gauge(self, key: Hashable, value: Callable[[T], Number | None]) -> Gauge[T]:
        """The gauge of `value` over the samples, under `key` (one key, one
        `value`: the first caller's is kept)."""
        gauge = self._gauges.get(key)
        if gauge is None:
            gauge = self._gauges[key] = Gauge(value)
        self._sync(gauge)
        return gauge

    def area(self, key: Hashable, value: Callable[[T], Number | None]) -> Area[T]:
        """The area under `value` over the samples, under `key` (one key, one
        `value`: the first caller's is kept)."""
        area = self._areas.get(key)
        if area is None:
            area = self._areas[key] = Area(value, self.times)
        self._sync(area)
        return area

    def last_change(self, key: Hashable, value: Callable[[T], object]) -> int:
        """The position of the latest sample whose `value` differs from the
        sample's before it, or 0: from there on, `value` has not changed. (One
        key, one `value`: the first caller's is kept.)"""
        marks = self._changes.get(key)
        if marks is None:
            marks = self._changes[key] = _Changes(value)
        self._sync(marks)
        changed = marks.last()
        position = -1 if changed is None else changed - self.samples.first
        return position if position > 0 else 0

    def _sync(self, kept: _Derived[T]) -> None:
        """Bring what was derived from the samples up to date with them: the
        samples that left the track out (in batches), a last one replaced
        since redone, the new ones in."""
        # The track holds a time for each of its samples.
        first, count = self.samples.first, len(self.times)
        if count and kept.taken == first + count and kept.stamp == self._stamps[-1]:
            # Up to date: only what left the track since may need dropping.
            if first - kept.first >= _DROP_BATCH:
                kept.drop_before(first)
            kept.skip = first - kept.first
            return
        if kept.taken <= first:
            kept.drop_before(kept.taken)
            kept.first = kept.taken = first
        elif first - kept.first >= _DROP_BATCH:
            kept.drop_before(first)
        kept.skip = first - kept.first
        if kept.taken > first and kept.stamp != self._stamps[kept.taken - 1 - first]:
            kept.drop_last()
        for seq in range(kept.taken, first + count):
            position = seq - first
            kept.take(self.samples[position], seq, position)
            kept.stamp = self._stamps[position]


class History:
    def __init__(self, max_age_seconds: float, max_samples: int = 4096) -> None:
        self.max_age_seconds = max_age_seconds
        self.max_samples = max_samples
        self._spacing = max_age_seconds / max(1, max_samples - 2)
        self._gpus: dict[int, Track[GpuSample]] = {}
        self._ports: dict[tuple[str, int], Track[PortSample]] = {}
        self._xids: deque[XidEvent] = deque(maxlen=max_samples)
        self._sxids: deque[SxidEvent] = deque(maxlen=max_samples)
        self._functions: dict[str, Track[PcieFunctionSample]] = {}
        self.now = 0.0
        # When a reading last said which ports there are (none is an answer too).
        self.last_port_poll: float | None = None
        # What the last NVML reading said of NVML itself and of nvidia-uvm.
        self.nvml_unavailable: NvmlUnavailable | None = None
        self.nvidia_uvm_loaded: bool | None = None

    def record(self, reading: Reading) -> None:
        self.now = max(self.now, reading.time)
        if reading.source == NVML_SOURCE:
            self.nvml_unavailable = reading.nvml_unavailable
            self.nvidia_uvm_loaded = reading.nvidia_uvm_loaded
        for gpu in reading.gpus or ():
            track = self._gpus.get(gpu.index)
            if track is None or _another_board(track, gpu):
                columns = SampleColumns(GpuSample, {"nvlinks": ("link", LinkSample)})
                track = Track(self.max_samples, self._spacing, columns, WHOLE_GPU_SECONDS)
                self._gpus[gpu.index] = track
            track.append(reading.time, gpu)
        if reading.ports is not None:
            self.last_port_poll = max(self.last_port_poll or reading.time, reading.time)
        for port in reading.ports or ():
            key = (port.device, port.port)
            ring = self._ports.get(key)
            if ring is None:
                ring = Track(self.max_samples, self._spacing, SampleColumns(PortSample))
                self._ports[key] = ring
            ring.append(reading.time, port)
        for function in reading.pcie_functions or ():
            functions = self._functions.get(function.address)
            if functions is None:
                by_field = SampleColumns(PcieFunctionSample)
                functions = Track(self.max_samples, self._spacing, by_field)
                self._functions[function.address] = functions
            functions.append(reading.time, function)
        self._xids.extend(reading.xid_events)
        self._sxids.extend(reading.sxid_events)
        self._expire()

    def _expire(self) -> None:
        oldest = self.now - self.max_age_seconds
        for gpu in self._gpus.values():
            gpu.expire(oldest)
        for port in self._ports.values():
            port.expire(oldest)
        for function in self._functions.values():
            function.expire(oldest)
        while self._xids and self._xids[0].time < oldest:
            self._xids.popleft()
        while self._sxids and self._sxids[0].time < oldest:
            self._sxids.popleft()

    def gpu_indices(self) -> list[int]:
        return sorted(self._gpus)

    def gpu(self, index: int) -> Sequence[tuple[float, GpuSample]]:
        track = self._gpus.get(index)
        return track.items() if track is not None else ()

    def gpu_track(self, index: int) -> Track[GpuSample]:
        """The GPU's samples with what checks derive from them (an empty
        track for a GPU never seen)."""
        return self._gpus.get(index) or Track(self.max_samples)

    def latest_gpu(self, index: int) -> GpuSample | None:
        track = self._gpus.get(index)
        return track.latest() if track is not None else None

    def port_keys(self) -> list[tuple[str, int]]:
        return sorted(self._ports)

    def port(self, device: str, port: int) -> Sequence[tuple[float, PortSample]]:
        track = self._ports.get((device, port))
        return track.items() if track is not None else ()

    def port_track(self, device: str, port: int) -> Track[PortSample]:
        """The port's samples with what checks derive from them."""
        return self._ports.get((device, port)) or Track(self.max_samples)

    def latest_port(self, device: str, port: int) -> PortSample | None:
        track = self._ports.get((device, port))
        return track.latest() if track is not None else None

    def pcie_addresses(self) -> list[str]:
        return sorted(self._functions)

    def pcie_track(self, address: str) -> Track[PcieFunctionSample]:
        """The PCIe function's samples with what checks derive from them."""
        return self._functions.get(address) or Track(self.max_samples)

    def xid_events(self, since: float = float("-inf")) -> list[XidEvent]:
        return [event for event in self._xids if event.time >= since]

    def sxid_events(self, since: float = float("-inf")) -> list[SxidEvent]:
        return [event for event in self._sxids if event.time >= since]


def _another_board(track: Track[GpuSample], sample: GpuSample) -> bool:
    """Whether `sample` is of another board than the track's (NVML numbered the
    GPUs anew): a track holds one board, so no window or counter of one board
    is ever judged with another's samples."""
    latest = track.latest()
    return latest is not None and bool(latest.uuid and sample.uuid) and latest.uuid != sample.uuid


def series(
    samples: Iterable[tuple[float, T]], value: Callable[[T], V | None]
) -> list[tuple[float, V | None]]:
    """(time, value) points of one field, for the counter helpers."""
    return [(time, value(sample)) for time, sample in samples]
