"""Bit-for-bit comparison of an output with its known answer.

Works on any array module with NumPy's interface (NumPy for host arrays,
CuPy for the HBM test's device buffers): the mismatch count and first index
are reduced where the data lives, and only the mismatching words travel to
the host for the bit histogram.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

# At most this many mismatching words feed the bit histogram: enough to see
# which bits a fault flips, bounded however much of a buffer is wrong.
HISTOGRAM_SAMPLE = 1 << 20

ToHost = Callable[[Any], NDArray[Any]]


@dataclass(frozen=True)
class Comparison:
    count: int = 0
    first_index: int | None = None
    first_expected: int | None = None
    first_actual: int | None = None
    histogram: tuple[int, ...] = ()  # per bit position, LSB first
    width: int = 32  # bits per word

    def merge(self, other: Comparison) -> Comparison:
        """Both comparisons together: counts and histograms add up, and the
        first mismatch is the one at the lower index."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        first = self if _lower(self.first_index, other.first_index) else other
        return Comparison(
            count=self.count + other.count,
            first_index=first.first_index,
            first_expected=first.first_expected,
            first_actual=first.first_actual,
            histogram=tuple(a + b for a, b in zip(self.histogram, other.histogram, strict=True)),
            width=self.width,
        )


def _lower(a: int | None, b: int | None) -> bool:
    return b is None or (a is not None and a <= b)


def as_bits(values: NDArray[Any]) -> NDArray[np.unsignedinteger[Any]]:
    """The raw bit patterns of an array (a view, same width)."""
    width = values.dtype.itemsize * 8
    return values.view(np.dtype(f"<u{width // 8}"))


def bit_histogram(diff: NDArray[np.unsignedinteger[Any]]) -> tuple[int, ...]:
    """For each bit position (LSB first), how many words have it set."""
    width = diff.dtype.itemsize * 8
    little = np.ascontiguousarray(diff, dtype=diff.dtype.newbyteorder("<"))
    bits = np.unpackbits(little.view(np.uint8), bitorder="little").reshape(-1, width)
    return tuple(int(n) for n in bits.sum(axis=0))


def compare_bits(
    xp: ModuleType,
    actual: Any,
    expected: Any,
    to_host: ToHost = np.asarray,
    offset: int = 0,
) -> Comparison:
    """Compare an array of unsigned words with an array of the same width, or
    with one word everywhere (an int); `offset` is added to indices (a slice
    of a larger buffer)."""
    width = int(actual.dtype.itemsize) * 8
    actual = actual.reshape(-1)
    uniform = isinstance(expected, int)
    if not uniform:
        expected = expected.reshape(-1)
    diff = actual ^ (actual.dtype.type(expected) if uniform else expected)
    bad = xp.flatnonzero(diff)
    count = int(bad.size)
    if count == 0:
        return Comparison(width=width)
    first = int(bad[0])
    sample = to_host(diff[bad[:HISTOGRAM_SAMPLE]])
    return Comparison(
        count=count,
        first_index=offset + first,
        first_expected=expected if uniform else int(expected[first]),
        first_actual=int(actual[first]),
        histogram=bit_histogram(sample),
        width=width,
    )


def compare_values(actual: NDArray[Any], expected: NDArray[Any]) -> Comparison:
    """Host arrays of the same dtype (floats or integers), compared bit for bit."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        raise ValueError(
            f"output {actual.dtype}{actual.shape} does not match "
            f"reference {expected.dtype}{expected.shape}"
        )
    return compare_bits(
        np, as_bits(np.ascontiguousarray(actual)), as_bits(np.ascontiguousarray(expected))
    )


def mismatching_indices(actual: NDArray[Any], expected: NDArray[Any]) -> NDArray[np.intp]:
    return np.flatnonzero(
        as_bits(np.ascontiguousarray(actual)) != as_bits(np.ascontiguousarray(expected))
    )
