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

Polls closer together than `max_age_seconds / (max_samples - 2)` (0.88 s for
an hour in 4096 samples) would fill the ring before the hour is covered and
cut every window short. So the kept samples are at least that far apart: the
newest sample is always the last poll's, replacing the one before it while
that one is too close to the sample kept before it. Windows keep their full
length at any poll interval, at the resolution of that spacing; counters lose
nothing (they are cumulative), and each poll's own sample is judged as it comes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from functools import reduce
from operator import add
from typing import Generic, Protocol, TypeVar

from gpuwatchd.counters import Increase, is_saturated
from gpuwatchd.model import (
    NVML_SOURCE,
    GpuSample,
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
        self._bits = bits
        self._lifetime = lifetime
        self.values: list[Number | None] = []
        self._steps: list[Number] = []
        # Running totals up to and including each position. `_whole` adds only
        # the whole, non-negative increments; `_inexact` counts the others.
        self._whole: list[int] = []
        self._inexact: list[int] = []
        self._resets: list[int] = []
        self._saturated: list[int] = []
        self._present: list[int] = []
        # The last present value before the first position kept.
        self._before: Number | None = None
        self.stamps: list[int] = []
        self.skip = 0

    def take(self, samples: Sequence[T], position: int, stamp: int) -> None:
        value = self._value(samples[position])
        previous = next((v for v in reversed(self.values) if v is not None), self._before)
        step: Number = 0
        reset = saturated = present = 0
        if value is not None:
            present = 1
            saturated = int(is_saturated(value, self._bits))
            if previous is not None:
                if value >= previous:
                    step = value - previous
                else:
                    reset, step = 1, 0 if self._lifetime else value
        whole, inexact = (step, 0) if isinstance(step, int) and step >= 0 else (0, 1)
        last = len(self.values) - 1
        self.values.append(value)
        self._steps.append(step)
        self._whole.append(whole + (self._whole[last] if last >= 0 else 0))
        self._inexact.append(inexact + (self._inexact[last] if last >= 0 else 0))
        self._resets.append(reset + (self._resets[last] if last >= 0 else 0))
        self._saturated.append(saturated + (self._saturated[last] if last >= 0 else 0))
        self._present.append(present + (self._present[last] if last >= 0 else 0))
        self.stamps.append(stamp)

    def _lists(self) -> tuple[list[int] | list[Number] | list[Number | None], ...]:
        return (
            self.values,
            self._steps,
            self._whole,
            self._inexact,
            self._resets,
            self._saturated,
            self._present,
            self.stamps,
        )

    def drop_last(self) -> None:
        for kept in self._lists():
            kept.pop()

    def drop_first(self, count: int) -> None:
        self._before = next(
            (v for v in reversed(self.values[:count]) if v is not None), self._before
        )
        for kept in self._lists():
            del kept[:count]

    def present(self, first: int, last: int) -> int:
        """How many of positions first..last hold a value."""
        return self._count(self._present, first + self.skip, last + self.skip)

    def saturated(self, first: int, last: int) -> bool:
        """Whether any of positions first..last stands at the saturation maximum."""
        return self._count(self._saturated, first + self.skip, last + self.skip) > 0

    @staticmethod
    def _count(totals: list[int], first: int, last: int) -> int:
        if last < first:
            return 0
        return totals[last] - (totals[first - 1] if first > 0 else 0)

    def increase(self, first: int, last: int, times: Sequence[float]) -> Increase:
        """`counters.increase` over positions first..last, both included."""
        if last < first:
            return Increase(increase=0.0, seconds=0.0)
        skip = self.skip
        first, last = first + skip, last + skip
        if self._count(self._present, first, last) != last - first + 1:
            # Absent values: the increase runs between the present ones.
            present = [p for p in range(first, last + 1) if self.values[p] is not None]
            if not present:
                return Increase(increase=0.0, seconds=0.0)
            first, last = present[0], present[-1]
        grown = self._whole[last] - self._whole[first]
        if self._inexact[last] != self._inexact[first] or grown >= _EXACT:
            total = reduce(add, self._steps[first + 1 : last + 1], 0.0)
        else:
            total = float(grown)
        return Increase(
            increase=total,
            seconds=times[last - skip] - times[first - skip],
            resets=self._resets[last] - self._resets[first],
            saturated=self._count(self._saturated, first, last) > 0,
        )


class Area(Generic[T]):
    """The area under one gauge of the samples, interval by interval, as
    `counters.gauge_integral` takes it (each interval at the lower of its two
    end values; none where an end is absent)."""

    def __init__(self, value: Callable[[T], Number | None], times: Sequence[float]) -> None:
        self._value = value
        self._times = times
        self._values: list[Number | None] = []
        # The interval ending at each position (nothing at the first kept).
        self._areas: list[float] = []
        self.stamps: list[int] = []
        self.skip = 0

    def take(self, samples: Sequence[T], position: int, stamp: int) -> None:
        value = self._value(samples[position])
        area = 0.0
        if position:
            start, end = self._times[position - 1], self._times[position]
            before = self._values[-1] if self._values else None
            if before is not None and value is not None and end > start:
                area = min(before, value) * (end - start)
        self._values.append(value)
        self._areas.append(area)
        self.stamps.append(stamp)

    def drop_last(self) -> None:
        for kept in (self._values, self._areas, self.stamps):
            kept.pop()

    def drop_first(self, count: int) -> None:
        for kept in (self._values, self._areas, self.stamps):
            del kept[:count]

    def integral(self, first: int, last: int) -> float:
        """`counters.gauge_integral` over positions first..last: the same
        additions in the same order."""
        return reduce(add, self._areas[first + self.skip + 1 : last + self.skip + 1], 0.0)


class Track(Generic[T]):
    """One subject's samples, oldest first, with the Columns and change marks
    checks asked for, brought up to date when next asked."""

    def __init__(self, max_samples: int, spacing: float = 0.0) -> None:
        self.max_samples = max_samples
        # Kept samples are at least this far apart (but the newest): see the
        # module's docstring.
        self.spacing = spacing
        self.times: list[float] = []
        self.samples: list[T] = []
        # A stamp per sample, new for each sample taken in (a replaced one too):
        # what a Column compares to see which samples it has not seen.
        self._stamps: list[int] = []
        self._next_stamp = 0
        self._items: tuple[tuple[float, T], ...] | None = None
        self._columns: dict[Hashable, Column[T]] = {}
        self._changes: dict[Hashable, _Changes[T]] = {}
        self._areas: dict[Hashable, Area[T]] = {}

    def __len__(self) -> int:
        return len(self.samples)

    def append(self, time: float, sample: T) -> None:
        self._items = None
        self._next_stamp += 1
        times = self.times
        if times and (
            times[-1] == time or (len(times) > 1 and times[-1] - times[-2] < self.spacing)
        ):
            times[-1] = time
            self.samples[-1] = sample
            self._stamps[-1] = self._next_stamp
            return
        self.times.append(time)
        self.samples.append(sample)
        self._stamps.append(self._next_stamp)
        if len(self.samples) > self.max_samples:
            self._drop_first(1)

    def expire(self, oldest: float) -> None:
        """Drop what is older than `oldest`, but one: rates over a full window need it."""
        count = 0
        while len(self.times) - count > 1 and self.times[count + 1] < oldest:
            count += 1
        if count:
            self._items = None
            self._drop_first(count)

    def _drop_first(self, count: int) -> None:
        del self.times[:count]
        del self.samples[:count]
        del self._stamps[:count]

    def items(self) -> tuple[tuple[float, T], ...]:
        """(time, sample) pairs, oldest first."""
        if self._items is None:
            self._items = tuple(zip(self.times, self.samples, strict=True))
        return self._items

    def tail(self, first: int) -> list[tuple[float, T]]:
        """(time, sample) pairs from position `first` on."""
        return list(zip(self.times[first:], self.samples[first:], strict=True))

    def latest(self) -> T | None:
        return self.samples[-1] if self.samples else None

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
        return self.samples[bisect_right(self.times, start) : bisect_right(self.times, end)]

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
        if not marks.changed:
            return 0
        position = bisect_left(self._stamps, marks.changed[-1])
        return position if self._stamps[position] == marks.changed[-1] else 0

    def _sync(self, kept: _Derived[T]) -> None:
        """Bring what was derived from the samples up to date with them: the
        samples that left the track out, a last one replaced since redone,
        the new ones in."""
        stamps = self._stamps
        gone = bisect_left(kept.stamps, stamps[0]) if stamps else len(kept.stamps)
        if gone >= _DROP_BATCH or gone == len(kept.stamps):
            kept.drop_first(gone)
            gone = 0
        kept.skip = gone
        if len(kept.stamps) > gone and kept.stamps[-1] != stamps[len(kept.stamps) - gone - 1]:
            kept.drop_last()
        for position in range(len(kept.stamps) - gone, len(stamps)):
            kept.take(self.samples, position, stamps[position])


class _Derived(Protocol[T_contra]):
    # A stamp per sample taken in, oldest first; the first `skip` of them
    # have left the track (dropped in batches, not one by one each poll).
    stamps: list[int]
    skip: int

    def take(self, samples: Sequence[T_contra], position: int, stamp: int) -> None: ...

    def drop_last(self) -> None: ...

    def drop_first(self, count: int) -> None: ...


class _Changes(Generic[T]):
    """The stamps of the samples whose `value` differs from the sample's before."""

    def __init__(self, value: Callable[[T], object]) -> None:
        self._value = value
        self.stamps: list[int] = []
        self.changed: list[int] = []
        self.skip = 0

    def take(self, samples: Sequence[T], position: int, stamp: int) -> None:
        if position and self._value(samples[position]) != self._value(samples[position - 1]):
            self.changed.append(stamp)
        self.stamps.append(stamp)

    def drop_last(self) -> None:
        if self.changed and self.changed[-1] == self.stamps[-1]:
            self.changed.pop()
        self.stamps.pop()

    def drop_first(self, count: int) -> None:
        del self.stamps[:count]
        del self.changed[: bisect_left(self.changed, self.stamps[0]) if self.stamps else None]


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
                track = self._gpus[gpu.index] = Track(self.max_samples, self._spacing)
            track.append(reading.time, gpu)
        if reading.ports is not None:
            self.last_port_poll = max(self.last_port_poll or reading.time, reading.time)
        for port in reading.ports or ():
            key = (port.device, port.port)
            ring = self._ports.get(key)
            if ring is None:
                ring = self._ports[key] = Track(self.max_samples, self._spacing)
            ring.append(reading.time, port)
        for function in reading.pcie_functions or ():
            functions = self._functions.get(function.address)
            if functions is None:
                functions = self._functions[function.address] = Track(
                    self.max_samples, self._spacing
                )
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
