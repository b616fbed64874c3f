"""Parsing of the human-written quantities used in config and scenario files.

Durations (`500ms`, `10s`, `5m`, `2h`, `1d`, or a bare number of seconds) and
rates (`N/s`, `N/min`, `N/h`) become floats in base units: seconds and events
per second.
"""

from __future__ import annotations

import math
import re

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_RATE_UNITS = {"s": 1.0, "sec": 1.0, "min": 1 / 60.0, "m": 1 / 60.0, "h": 1 / 3600.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h|d)\s*$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|min|m|h)\s*$")
# Ten years: longer than any window or retention means anything, short
# enough that now + it is still a time the platform can represent.
MAX_DURATION_SECONDS = 10 * 365 * 86400.0
# A billion events a second: no counter of a GPU or a port goes faster.
MAX_RATE_PER_SECOND = 1e9


def parse_duration(value: object) -> float:
    """Seconds from `500ms`, `10s`, `5m`, `2h`, `1d` or a plain non-negative number."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 10s, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value!r}")
        return _bounded(value, MAX_DURATION_SECONDS, "a duration", value)
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            return _bounded(seconds, MAX_DURATION_SECONDS, "a duration", value)
    raise ValueError(f"expected a duration such as 500ms, 10s, 5m or 2h, got {value!r}")


def parse_moment(value: str, now: float) -> float:
    """Seconds since the epoch from `1796080000` (itself) or a duration back
    from `now` (`1h`), as the journal's `since` and `until` take them."""
    try:
        return float(value)
    except ValueError:
        pass  # not a timestamp: a duration, then
    try:
        return now - parse_duration(value)
    except ValueError as error:
        raise ValueError(f"{error}, or seconds since the epoch") from error


def _bounded(number: float, limit: float, what: str, written: object) -> float:
    """`number` when it is finite and at most `limit` (NaN, infinity and
    400-digit numbers would stall or crash what uses them). A whole number
    is compared before it becomes a float, which one of 400 digits cannot."""
    if number > limit or not math.isfinite(number):
        shown = written if len(repr(written)) <= 40 else f"{repr(written)[:40]}..."
        raise ValueError(f"{what} must be a finite number up to {limit:g}, got {shown}")
    return float(number)


def parse_rate(value: object) -> float:
    """Events per second from `N/s`, `N/min` or `N/h`."""
    if isinstance(value, str):
        match = _RATE_RE.match(value)
        if match:
            rate = float(match.group(1)) * _RATE_UNITS[match.group(2)]
            return _bounded(rate, MAX_RATE_PER_SECOND, "a rate", value)
    raise ValueError(f"expected a rate such as 50/s, 10/min or 2/h, got {value!r}")


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of a duration, for messages and the status table."""
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{int(seconds // 86400)}d"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    if seconds >= 1 or seconds == 0:
        return f"{seconds:g}s"
    return f"{seconds * 1000:g}ms"
