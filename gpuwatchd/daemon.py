"""The poll loop: read every source, keep history, publish a Snapshot.

One thread runs `step()` every poll interval. Everything a step produces is
gathered into a new immutable Snapshot that replaces the old one in a single
assignment, so the HTTP server's threads always read a whole poll.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram

from gpuwatchd.clock import Clock
from gpuwatchd.config import Config
from gpuwatchd.exporter import make_registry
from gpuwatchd.history import History
from gpuwatchd.model import Reading
from gpuwatchd.notify import Notifier
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.sources import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Gathered:
    """The merged readings of one poll."""

    readings: tuple[Reading, ...]

    def snapshot(self, now: float, polls: int) -> Snapshot:
        gpus = tuple(gpu for reading in self.readings for gpu in reading.gpus or ())
        devices = tuple(
            device for reading in self.readings for device in reading.infiniband_devices or ()
        )
        ports = tuple(port for reading in self.readings for port in reading.ports or ())
        driver = next((r.driver_version for r in self.readings if r.driver_version), None)
        return Snapshot(
            time=now,
            gpus=tuple(sorted(gpus, key=lambda gpu: gpu.index)),
            infiniband_devices=tuple(sorted(devices, key=lambda device: device.device)),
            ports=tuple(sorted(ports, key=lambda port: (port.device, port.port))),
            driver_version=driver,
            source_up={reading.source: reading.error is None for reading in self.readings},
            source_errors={r.source: r.error for r in self.readings if r.error is not None},
            polls=polls,
        )


class Daemon:
    def __init__(
        self,
        config: Config,
        sources: Sequence[Source],
        clock: Clock,
        before_poll: Callable[[float], None] | None = None,
    ) -> None:
        self.config = config
        self.sources = list(sources)
        self.clock = clock
        self.before_poll = before_poll
        self.history = History(max_age_seconds=config.daemon.history)
        self.stop_event = threading.Event()
        self._snapshot = Snapshot(time=clock.now())
        self._polls = 0
        self.registry: CollectorRegistry
        self._poll_duration: Histogram
        self.registry, self._poll_duration = make_registry(lambda: self._snapshot)

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def _poll_source(self, source: Source, now: float) -> Reading:
        try:
            return source.poll(now)
        except Exception as error:  # a source bug must not stop the others
            log.exception("source %s failed", source.name)
            return Reading(source=source.name, time=now, error=f"{type(error).__name__}: {error}")

    def step(self) -> Snapshot:
        """One poll of every source; returns the Snapshot it published."""
        started = time.perf_counter()
        now = self.clock.now()
        if self.before_poll is not None:
            self.before_poll(now)
        readings = tuple(self._poll_source(source, now) for source in self.sources)
        for reading in readings:
            if reading.error is not None:
                log.warning("source %s: %s", reading.source, reading.error)
            self.history.record(reading)
        self._polls += 1
        snapshot = _Gathered(readings).snapshot(now, self._polls)
        self._snapshot = snapshot
        self._poll_duration.observe(time.perf_counter() - started)
        return snapshot

    def run(self, notifier: Notifier | None = None) -> None:
        """Poll until `stop()`; each poll starts one interval after the last one started.

        systemd's watchdog is fed from this loop only, so a poll that hangs
        (an NVML call stuck on a broken GPU, say) stops the pings and systemd
        restarts the daemon.
        """
        notifier = notifier or Notifier({})
        interval = self.config.daemon.poll_interval
        ping_every = (notifier.watchdog_seconds or math.inf) / 2
        while not self.stop_event.is_set():
            started = self.clock.now()
            snapshot = self.step()
            if snapshot.polls == 1:
                notifier.ready(f"polling every {interval:g}s")
            notifier.watchdog()
            while not self.stop_event.is_set():
                remaining = interval - (self.clock.now() - started)
                if remaining <= 0:
                    break
                if self.clock.wait(self.stop_event, min(remaining, ping_every)):
                    break
                notifier.watchdog()
        notifier.stopping()

    def stop(self) -> None:
        self.stop_event.set()

    def close(self) -> None:
        for source in self.sources:
            try:
                source.close()
            except Exception:
                log.exception("closing source %s failed", source.name)
