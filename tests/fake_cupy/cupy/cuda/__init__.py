"""cupy.cuda of the fake: one GPU, events that time nothing."""

from __future__ import annotations

import time

from cupy.cuda import device, runtime


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

    def record(self) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass


def get_elapsed_time(start: Event, stop: Event) -> float:
    """Milliseconds, as cupy.cuda.get_elapsed_time."""
    assert start.time is not None and stop.time is not None
    return (stop.time - start.time) * 1000.0


__all__ = ["CUDADriverError", "Device", "Event", "device", "get_elapsed_time", "runtime"]
