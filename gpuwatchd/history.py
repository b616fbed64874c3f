"""Bounded history of samples per subject, the input of every check.

The daemon records each poll's readings here; checks read series out of it
and never write. Each subject keeps at most `max_samples` samples and nothing
older than `max_age_seconds`, so memory stays flat however long the daemon runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from gpuwatchd.model import GpuSample, PcieFunctionSample, PortSample, Reading, XidEvent

T = TypeVar("T")
V = TypeVar("V")


class History:
    def __init__(self, max_age_seconds: float, max_samples: int = 4096) -> None:
        self.max_age_seconds = max_age_seconds
        self.max_samples = max_samples
        self._gpus: dict[int, deque[tuple[float, GpuSample]]] = {}
        self._ports: dict[tuple[str, int], deque[tuple[float, PortSample]]] = {}
        self._xids: deque[XidEvent] = deque(maxlen=max_samples)
        self._functions: dict[str, deque[tuple[float, PcieFunctionSample]]] = {}
        self.now = 0.0
        # When a reading last said which ports there are (none is an answer too).
        self.last_port_poll: float | None = None

    def record(self, reading: Reading) -> None:
        self.now = max(self.now, reading.time)
        for gpu in reading.gpus or ():
            self._append(self._gpus.setdefault(gpu.index, self._ring()), reading.time, gpu)
        if reading.ports is not None:
            self.last_port_poll = max(self.last_port_poll or reading.time, reading.time)
        for port in reading.ports or ():
            ring = self._ports.setdefault((port.device, port.port), self._ring())
            self._append(ring, reading.time, port)
        for function in reading.pcie_functions or ():
            functions = self._functions.setdefault(function.address, self._ring())
            self._append(functions, reading.time, function)
        self._xids.extend(reading.xid_events)
        self._expire()

    def _ring(self) -> deque[tuple[float, T]]:
        return deque(maxlen=self.max_samples)

    @staticmethod
    def _append(ring: deque[tuple[float, T]], time: float, sample: T) -> None:
        if ring and ring[-1][0] == time:
            ring[-1] = (time, sample)
        else:
            ring.append((time, sample))

    def _expire(self) -> None:
        oldest = self.now - self.max_age_seconds
        rings: list[
            deque[tuple[float, GpuSample]]
            | deque[tuple[float, PortSample]]
            | deque[tuple[float, PcieFunctionSample]]
        ]
        rings = [*self._gpus.values(), *self._ports.values(), *self._functions.values()]
        for ring in rings:
            # Keep one sample older than the horizon: rates over a full window need it.
            while len(ring) > 1 and ring[1][0] < oldest:
                ring.popleft()
        while self._xids and self._xids[0].time < oldest:
            self._xids.popleft()

    def gpu_indices(self) -> list[int]:
        return sorted(self._gpus)

    def gpu(self, index: int) -> Sequence[tuple[float, GpuSample]]:
        return tuple(self._gpus.get(index, ()))

    def latest_gpu(self, index: int) -> GpuSample | None:
        ring = self._gpus.get(index)
        return ring[-1][1] if ring else None

    def port_keys(self) -> list[tuple[str, int]]:
        return sorted(self._ports)

    def port(self, device: str, port: int) -> Sequence[tuple[float, PortSample]]:
        return tuple(self._ports.get((device, port), ()))

    def latest_port(self, device: str, port: int) -> PortSample | None:
        ring = self._ports.get((device, port))
        return ring[-1][1] if ring else None

    def pcie_addresses(self) -> list[str]:
        return sorted(self._functions)

    def pcie_function(self, address: str) -> Sequence[tuple[float, PcieFunctionSample]]:
        return tuple(self._functions.get(address, ()))

    def xid_events(self, since: float = float("-inf")) -> list[XidEvent]:
        return [event for event in self._xids if event.time >= since]


def series(
    samples: Iterable[tuple[float, T]], value: Callable[[T], V | None]
) -> list[tuple[float, V | None]]:
    """(time, value) points of one field, for the counter helpers."""
    return [(time, value(sample)) for time, sample in samples]
