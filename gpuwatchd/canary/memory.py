"""A short HBM pattern test on a bounded slice of free memory.

Three classic tests over 64-bit words, each catching what the others miss:
- walking ones: every word holds 1 << b, for each bit b in turn (a bit stuck
  at 0 when b reaches it, at 1 in every other pass);
- own address: every word holds its own index, then its complement (an
  address line that is stuck or shorted makes two words alias; a uniform
  pattern cannot see that);
- moving inversions: fill, then sweep up reading the pattern and writing its
  inverse, then down reading the inverse and writing the pattern back (both
  polarities of every cell, and writes next to freshly written neighbours).

The tests are written once against `MemoryRegion`; `ArrayRegion` implements
it over any array module with NumPy's interface, so the same code runs on a
CuPy device buffer (the work stays on the GPU; only mismatching words come
back) and on a NumPy host buffer. Sweeps go chunk by chunk: each chunk is one
vectorised read-verify-write, and the chunk order keeps the up and down
directions. A read first asks only whether the words agree (one count on the
device, a one-byte temporary a word); the words that differ are found only
when some do. Every call is a round trip of the host's (a launch and a
sync), so a constant pattern is written and checked over the whole region at
once: walking ones takes 128 of them, not thousands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any, Literal, Protocol

from gpuwatchd.canary.compare import Comparison, ToHost, compare_bits

ALL_ONES = (1 << 64) - 1
CHECKERBOARD = 0x5555_5555_5555_5555
SWEEP_CHUNKS = 16
WORD_BYTES = 8


@dataclass(frozen=True)
class Pattern:
    """`constant`: every word is `value`; `address`: word i is i XOR `value`."""

    kind: Literal["constant", "address"]
    value: int

    def inverted(self) -> Pattern:
        return Pattern(self.kind, self.value ^ ALL_ONES)


class MemoryRegion(Protocol):
    @property
    def words(self) -> int: ...

    def fill(self, pattern: Pattern, start: int, stop: int) -> None: ...

    def verify(self, pattern: Pattern, start: int, stop: int) -> Comparison: ...

    def agrees(self, pattern: Pattern, start: int, stop: int) -> bool:
        """Whether every word of [start, stop) holds the pattern."""
        ...

    def peek(self, index: int) -> int:
        """One word as stored (fault injection reads and rewrites cells)."""
        ...

    def poke(self, index: int, value: int) -> None: ...


class ArrayRegion:
    """A buffer of uint64 words in `xp`'s memory."""

    def __init__(self, xp: ModuleType, words: int, to_host: ToHost) -> None:
        self._xp = xp
        self._to_host = to_host
        self._buffer: Any = xp.empty(words, dtype=xp.uint64)

    @property
    def words(self) -> int:
        return int(self._buffer.size)

    def _expected(self, pattern: Pattern, start: int, stop: int) -> Any:
        """The pattern's words over [start, stop): one int for a constant
        pattern (no buffer-sized temporary), else an array."""
        if pattern.kind == "constant":
            return pattern.value
        xp = self._xp
        return xp.arange(start, stop, dtype=xp.uint64) ^ xp.uint64(pattern.value)

    def fill(self, pattern: Pattern, start: int, stop: int) -> None:
        expected = self._expected(pattern, start, stop)
        self._buffer[start:stop] = self._word(expected) if isinstance(expected, int) else expected

    def verify(self, pattern: Pattern, start: int, stop: int) -> Comparison:
        expected = self._expected(pattern, start, stop)
        return compare_bits(self._xp, self._buffer[start:stop], expected, self._to_host, start)

    def agrees(self, pattern: Pattern, start: int, stop: int) -> bool:
        expected = self._expected(pattern, start, stop)
        if isinstance(expected, int):
            expected = self._word(expected)
        return int(self._xp.count_nonzero(self._buffer[start:stop] != expected)) == 0

    def peek(self, index: int) -> int:
        return int(self._buffer[index])

    def poke(self, index: int, value: int) -> None:
        self._buffer[index] = self._word(value)

    def _word(self, value: int) -> Any:
        # A typed word: a bare Python int above 2^63 does not fit every
        # array module's default integer.
        return self._xp.uint64(value)


class TimedRegion:
    """A region whose every call is device time, measured by `timed` (a
    backend's timer: CUDA events, or the host's clock)."""

    def __init__(
        self, inner: MemoryRegion, timed: Callable[[], AbstractContextManager[None]]
    ) -> None:
        self._inner = inner
        self._timed = timed

    @property
    def words(self) -> int:
        return self._inner.words

    def fill(self, pattern: Pattern, start: int, stop: int) -> None:
        with self._timed():
            self._inner.fill(pattern, start, stop)

    def verify(self, pattern: Pattern, start: int, stop: int) -> Comparison:
        with self._timed():
            return self._inner.verify(pattern, start, stop)

    def agrees(self, pattern: Pattern, start: int, stop: int) -> bool:
        with self._timed():
            return self._inner.agrees(pattern, start, stop)

    def peek(self, index: int) -> int:
        with self._timed():
            return self._inner.peek(index)

    def poke(self, index: int, value: int) -> None:
        with self._timed():
            self._inner.poke(index, value)


def _chunks(words: int) -> list[tuple[int, int]]:
    size = max(1, -(-words // SWEEP_CHUNKS))
    return [(start, min(start + size, words)) for start in range(0, words, size)]


def _read(region: MemoryRegion, pattern: Pattern, start: int, stop: int) -> Comparison:
    """The words of [start, stop) against the pattern: one count on the
    device when they agree; the mismatching words, chunk by chunk, when not
    (comparing a whole region at once takes a temporary as big as it)."""
    if region.agrees(pattern, start, stop):
        return Comparison(width=64)
    result = Comparison(width=64)
    for first, last in _chunks(stop - start):
        result = result.merge(region.verify(pattern, start + first, start + last))
    return result


def _spans(region: MemoryRegion, pattern: Pattern) -> list[tuple[int, int]]:
    """How a pattern is written and read: a constant one over the whole
    region at once; an address pattern chunk by chunk (its words are
    computed, and a region-sized temporary would double the memory taken)."""
    if pattern.kind == "constant":
        return [(0, region.words)]
    return _chunks(region.words)


def _fill_and_verify(region: MemoryRegion, patterns: tuple[Pattern, ...]) -> Comparison:
    result = Comparison(width=64)
    for pattern in patterns:
        spans = _spans(region, pattern)
        for start, stop in spans:
            region.fill(pattern, start, stop)
        for start, stop in spans:
            result = result.merge(_read(region, pattern, start, stop))
    return result


def walking_ones(region: MemoryRegion) -> Comparison:
    return _fill_and_verify(region, tuple(Pattern("constant", 1 << bit) for bit in range(64)))


def own_address(region: MemoryRegion) -> Comparison:
    return _fill_and_verify(region, (Pattern("address", 0), Pattern("address", ALL_ONES)))


def moving_inversions(region: MemoryRegion) -> Comparison:
    result = Comparison(width=64)
    chunks = _chunks(region.words)
    for base in (Pattern("constant", 0), Pattern("constant", CHECKERBOARD)):
        region.fill(base, 0, region.words)
        sweeps = ((base, base.inverted(), chunks), (base.inverted(), base, chunks[::-1]))
        for read, write, order in sweeps:
            for start, stop in order:
                result = result.merge(_read(region, read, start, stop))
                region.fill(write, start, stop)
    return result


PATTERN_TESTS: Mapping[str, Callable[[MemoryRegion], Comparison]] = MappingProxyType(
    {
        "hbm_walking_ones": walking_ones,
        "hbm_own_address": own_address,
        "hbm_moving_inversions": moving_inversions,
    }
)
