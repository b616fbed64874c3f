"""What the GPU checks share: subject names, labels, windows over History.

Reads History and the counter maths; owns no threshold. A window here is the
half-open interval (start, end]: a sample belongs to the window its time ends
in, so consecutive windows never count the same interval twice.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import TypeVar

from gpuwatchd.counters import Increase, increase
from gpuwatchd.model import GpuSample

T = TypeVar("T")
Point = tuple[float, int | float | None]

NODE = "node"


def gpu_subject(index: int) -> str:
    return f"gpu:{index}"


def link_subject(gpu: int, link: int) -> str:
    return f"nvlink:{gpu}/{link}"


def gpu_labels(sample: GpuSample) -> dict[str, str]:
    """`gpu`, and `uuid` where NVML gave it (absent is not an empty UUID)."""
    labels = {"gpu": str(sample.index)}
    if sample.uuid:
        labels["uuid"] = sample.uuid
    return labels


def windows(now: float, seconds: float, count: int) -> list[tuple[float, float]]:
    """The last `count` windows of `seconds` before `now`, newest first."""
    return [(now - (k + 1) * seconds, now - k * seconds) for k in range(count)]


def tail_from(samples: Sequence[tuple[float, T]], start: float) -> Sequence[tuple[float, T]]:
    """The samples from the last one at or before `start` on (all, when none
    is that old): what every window from `start` on needs, and no more."""
    first = bisect_right([time for time, _ in samples], start)
    return samples[max(0, first - 1) :]


def points_between(points: Sequence[Point], start: float, end: float) -> list[Point]:
    """The counter points that bound the intervals ending in (start, end]: the
    last point at or before `start`, then every point up to `end`.

    Unlike `counters.window`, a point exactly at `start` opens the window by
    itself, so the interval before it is not counted in this window as well.
    """
    return [(time, value) for time, value in tail_from(points, start) if time <= end]


def increase_between(points: Sequence[Point], start: float, end: float) -> Increase:
    """How much a counter grew over the intervals ending in (start, end]."""
    return increase(points_between(points, start, end))
