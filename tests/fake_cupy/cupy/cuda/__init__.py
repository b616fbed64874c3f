"""cupy.cuda of the fake: one GPU, events that time the host's clock (the
fake's device computes on it), and say where they were recorded."""

from __future__ import annotations

import itertools
import time

from cupy._memory import ELAPSED, TIMELINE
from cupy.cuda import device, runtime

_NUMBERS = itertools.count()


class CUDADriverError(RuntimeError):
    pass


class Device:
    def __init__(self, ordinal: int = 0) -> None:
        if not 0 <= ordinal < runtime.getDeviceCount():
            raise runtime.CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        self.id = ordinal

    def use(self) -> None:
        device.current = self.id


class Event:
    def __init__(self) -> None:
        self.time: float | None = None
        self.number = next(_NUMBERS)

    def record(self) -> None:
        self.time = time.perf_counter()
        TIMELINE.append(("event", self.number))

    def synchronize(self) -> None:
        pass


def get_elapsed_time(start: Event, stop: Event) -> float:
    """Milliseconds, as cupy.cuda.get_elapsed_time."""
    assert start.time is not None and stop.time is not None
    ELAPSED.append((start.number, stop.number))
    return (stop.time - start.time) * 1000.0


__all__ = ["CUDADriverError", "Device", "Event", "device", "get_elapsed_time", "runtime"]
