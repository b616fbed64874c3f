"""The daemon's clock, injectable so that tests advance time instead of sleeping.

`now()` is the daemon's reckoning of time in seconds since the epoch: the wall
clock when the clock was made, advanced by monotonic time since. Windows,
rates, confirmation and the poll loop use it, so a step of the wall clock (an
NTP step, `date -s`) changes none of them; `wall()` is the wall clock as it
is now, so that the daemon can say when the two part. `wait(stop, seconds)`
blocks until the stop event is set or the time has passed. The fake clock's
`wait` advances time and returns at once. `wait_until(done, deadline)` waits
for work another thread does, up to a deadline on this clock: the fake
clock's waits until the work is done or another thread (a test) has moved
time to the deadline, so that a test decides when a deadline has passed, not
the machine's speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

# How often a fake clock's `wait_for` looks whether time has passed its
# deadline, in real seconds.
_FAKE_DEADLINE_LOOK_S = 0.005


class Clock(Protocol):
    def now(self) -> float: ...

    def wall(self) -> float: ...

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait up to `seconds`; True when `stop` was set."""
        ...

    def wait_until(self, done: threading.Event, deadline: float) -> bool:
        """Wait until `done` is set, or `now()` reaches `deadline`; True when it was set."""
        ...


class SteadyClock:
    """`now()`: the wall time at construction plus the monotonic time since."""

    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._anchor_monotonic = monotonic()
        self._anchor_wall = wall()

    def now(self) -> float:
        return self._anchor_wall + (self._monotonic() - self._anchor_monotonic)

    def wall(self) -> float:
        return self._wall()


class SystemClock(SteadyClock):
    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(wall, monotonic)

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        # Event.wait times out on the monotonic clock.
        return stop.wait(max(0.0, seconds))

    def wait_until(self, done: threading.Event, deadline: float) -> bool:
        return self.wait(done, deadline - self.now())


class FakeClock(SteadyClock):
    """A clock that moves only when told to (tests, fast-forwarded simulations).
    `advance` moves time; `step_wall` moves only the wall clock, as an NTP
    step does."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._lock = threading.Lock()
        self._elapsed = 0.0
        self._stepped = 0.0
        self._start = start
        super().__init__(self._fake_wall, self._fake_monotonic)

    def _fake_monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def _fake_wall(self) -> float:
        with self._lock:
            return self._start + self._elapsed + self._stepped

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._elapsed += seconds

    def step_wall(self, seconds: float) -> None:
        with self._lock:
            self._stepped += seconds

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        if stop.is_set():
            return True
        self.advance(max(0.0, seconds))
        return stop.is_set()

    def wait_until(self, done: threading.Event, deadline: float) -> bool:
        # Time moves only when another thread advances it: look at it between
        # short real waits for the work.
        while not done.wait(_FAKE_DEADLINE_LOOK_S):
            if self.now() >= deadline:
                return done.is_set()
        return True
