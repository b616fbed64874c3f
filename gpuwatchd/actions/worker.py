"""A thread that runs one action's `run_once(now)` when woken or when due.

Every action (a webhook's queue, a scheduler) is written as `run_once(now)`,
which does what is due at `now` and returns when it wants to run next (None:
only when woken). Tests call `run_once` with a fake clock; the daemon runs it
here, so no action ever blocks the poll loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuwatchd.clock import Clock

log = logging.getLogger(__name__)

RunOnce = Callable[[float], float | None]

# Sleep at most this long without being woken: a fallback in case a wake-up is
# ever missed, cheap enough to cost nothing.
MAX_IDLE_SECONDS = 60.0


class Worker:
    def __init__(self, name: str, run_once: RunOnce, clock: Clock) -> None:
        self.name = name
        self._run_once = run_once
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Stop after the current step; a request in flight ends by its own timeout."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("%s did not stop within %.0fs", self.name, timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                due = self._run_once(self._clock.now())
            except Exception:  # an action's bug must not end its thread for good
                log.exception("%s failed", self.name)
                due = self._clock.now() + MAX_IDLE_SECONDS
            delay = MAX_IDLE_SECONDS if due is None else due - self._clock.now()
            # Real time, not the clock's wait: a fake clock's wait jumps time
            # forward, which would race with the poll loop that owns that clock.
            self._wake.wait(min(max(delay, 0.0), MAX_IDLE_SECONDS))
            self._wake.clear()
