"""Counter maths, in one place: increases and rates over a window of samples.

Hardware counters are cumulative but not well behaved: a driver reload or GPU
reset sets them back to zero, and the narrow IBTA error counters saturate at
2**bits - 1 instead of wrapping. Every check takes its deltas from here, so
that no check ever sees a negative or absurd rate.

Semantics follow Prometheus' `increase()`: a value lower than the previous one
is a reset, and the new value is what was counted since the reset. A value at
the saturation maximum means "at least this many, the true delta is unknown
since": the increase up to the saturation point is kept and the result is
flagged `saturated`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Increase:
    """How much a counter grew over `seconds`, with what made that uncertain."""

    increase: float
    seconds: float
    resets: int = 0
    saturated: bool = False

    @property
    def rate(self) -> float:
        """Per second; zero over an empty interval rather than a division by zero."""
        return self.increase / self.seconds if self.seconds > 0 else 0.0


def saturation_max(bits: int | None) -> int | None:
    return None if bits is None else (1 << bits) - 1


def is_saturated(value: int | float | None, bits: int | None) -> bool:
    """True when a counter `bits` wide stands at its maximum: from here on it
    counts nothing until someone clears it, so its increases are unknown."""
    limit = saturation_max(bits)
    return limit is not None and value is not None and value >= limit


def increase(
    points: Sequence[tuple[float, int | float | None]],
    *,
    bits: int | None = None,
    lifetime: bool = False,
) -> Increase:
    """The increase over the given (time, value) points, oldest first.

    Absent values (None) are skipped: the next present value is compared with
    the last present one. `bits` is the counter's width where it saturates.
    `lifetime`: a counter that never goes back on its device (a GPU's
    aggregate ECC counts, kept in its InfoROM), so a lower value is another
    device or a cleared store: a reset that counts nothing, not the new value.
    """
    total = 0.0
    resets = 0
    saturated = False
    first_time: float | None = None
    last_time = 0.0
    previous: float | None = None
    for time, value in points:
        if value is None:
            continue
        if first_time is None:
            first_time = time
        last_time = time
        if is_saturated(value, bits):
            saturated = True
        if previous is not None:
            if value >= previous:
                total += value - previous
            else:
                resets += 1
                total += 0 if lifetime else value
        previous = value
    seconds = 0.0 if first_time is None else last_time - first_time
    return Increase(increase=total, seconds=seconds, resets=resets, saturated=saturated)


def window(
    points: Sequence[tuple[float, T]], now: float, seconds: float
) -> Sequence[tuple[float, T]]:
    """The points (or timed samples) of the last `seconds`, plus the one just
    before, so that the first interval of the window is counted too."""
    start = now - seconds
    first = 0
    for position, (time, _) in enumerate(points):
        if time >= start:
            first = max(0, position - 1)
            break
    else:
        first = max(0, len(points) - 1)
    return points[first:]


def increase_over(
    points: Sequence[tuple[float, int | float | None]],
    now: float,
    seconds: float,
    *,
    bits: int | None = None,
) -> Increase:
    """The increase within the last `seconds` before `now`."""
    return increase(window(points, now, seconds), bits=bits)


def until_saturated(
    points: Sequence[tuple[float, int | float | None]], bits: int | None
) -> Sequence[tuple[float, int | float | None]]:
    """The points up to and including the first at the saturation maximum.

    Past that point a saturated counter says nothing, so a rate judged over the
    whole window would be diluted by time in which counting had stopped; over
    this prefix it is a lower bound of the true rate instead.
    """
    for position, (_, value) in enumerate(points):
        if is_saturated(value, bits):
            return points[: position + 1]
    return points


def since_cleared(
    points: Sequence[tuple[float, int | float | None]], bits: int | None
) -> Sequence[tuple[float, int | float | None]]:
    """The points after the counter last came down from its saturation maximum
    (someone cleared it, `perfquery -R`), or all of them if it never did.

    Before that, a saturated counter counted nothing; after it, it counts from
    zero again, and that stretch is what a rate can be judged over.
    """
    start = 0
    previous: int | float | None = None
    for position, (_, value) in enumerate(points):
        if value is None:
            continue
        if is_saturated(previous, bits) and not is_saturated(value, bits):
            start = position
        previous = value
    return points[start:]


def gauge_integral(points: Sequence[tuple[float, int | float | None]]) -> float:
    """The area under a gauge over (time, value) points, oldest first.

    Each interval counts at the lower of its two end values, so a quantity that
    changed between samples (a link rate that dropped) is never overstated; an
    interval with an absent end counts nothing, since what it held is unknown.
    """
    total = 0.0
    for (start, first), (end, second) in pairwise(points):
        if first is not None and second is not None and end > start:
            total += min(first, second) * (end - start)
    return total
