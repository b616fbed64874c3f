"""The daemon's clock, injectable so that tests advance time instead of sleeping.

`now()` is wall time in seconds since the epoch (timestamps in the journal and
in metrics); `wait(stop, seconds)` blocks until the stop event is set or the
time has passed. The fake clock's `wait` advances time and returns at once.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait up to `seconds`; True when `stop` was set."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to (tests, fast-forwarded simulations)."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        if stop.is_set():
            return True
        self.advance(max(0.0, seconds))
        return stop.is_set()
