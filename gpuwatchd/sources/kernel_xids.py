"""XIDs of the kernel log merged with NVML's XID events, and the NVSwitch
SXids beside them.

Owns the merge; `sources/kmsg.py` reads and parses the records. The NVML
source builds KernelXids before it registers for XID events, and calls
`merge` each poll with the events NVML gave and the GPUs' PCI bus ids.

The driver handles a GPU's loss once (osHandleGpuLost returns at once when
it has), so the log's reports of one bus falling off (the XID 79 line, the
`GPU has fallen off the bus.` line it prints just after, the probe's form)
are one XID 79 a boot, whatever their forms.

NVML replays nothing from before its registration, and the driver logs
every XID it reports. So what the ring holds when this is built, read
before NVML registers, comes from the log alone, stamped with its own kernel
time. After it, each XID counts once: NVML's event as it comes, with what
the log's record of it adds (an NVLink5 XID's link and severity, a 154's
new action) when that record has been read by then (each poll reads the log
after it has drained NVML's events; an event whose record comes later keeps
NVML's code alone), and a logged XID alone only when, `GRACE_SECONDS` after
it was read, NVML has not reported it (a GPU not registered, a wait that
failed). Records and events are matched by the order in which they are
read, never by comparing the kernel's time with CLOCK_MONOTONIC: printk's
clock is not NTP-slewed, and on a node up for months the two can differ by
minutes, which is as far off as a record from before the start may be
stamped. Counts per GPU and code are then the boot's, not the daemon's.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from gpuwatchd.clock import Clock
from gpuwatchd.model import SxidEvent, XidEvent
from gpuwatchd.sources.kmsg import (
    FALLEN_OFF_BUS,
    KernelLog,
    KernelRecord,
    KernelSxid,
    KernelXid,
    system_uptime,
)

log = logging.getLogger(__name__)

# Seconds a logged XID waits for NVML's event of it before it counts alone.
GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class KernelEvents:
    """One poll's XIDs (NVML's, with what the log adds, and the log's own)
    and the NVSwitch errors logged since the last poll."""

    xids: tuple[XidEvent, ...]
    sxids: tuple[SxidEvent, ...]


@dataclass(frozen=True)
class _Waiting:
    """A logged XID read after NVML registered, waiting for NVML's event of it."""

    record: KernelXid
    gpu: int
    uuid: str | None
    read_at: float

    @property
    def key(self) -> tuple[int, int]:
        return (self.gpu, self.record.code)

    def event(self) -> XidEvent:
        return _event(self.record, (self.gpu, self.uuid), self.read_at)


class KernelXids:
    """Merges the kernel log's XIDs with NVML's events (see the module's docstring).

    Built before NVML's XID registration: it reads the ring then. `uptime`
    gives the kernel time now, to stamp those records on `clock`.
    """

    def __init__(
        self, path: str, clock: Clock, uptime: Callable[[], float] = system_uptime
    ) -> None:
        self._log = KernelLog(path)
        self._clock = clock
        self._uptime = uptime
        self._before: list[KernelRecord] = self._log.read()
        self._waiting: list[_Waiting] = []
        # NVML's events that no logged record has matched yet, by (GPU, code).
        self._unmatched: Counter[tuple[int, int]] = Counter()
        self._fallen: set[str] = set()
        self._unknown: set[str] = set()

    def merge(
        self, nvml_events: Iterable[XidEvent], gpus: Mapping[str, tuple[int, str | None]]
    ) -> KernelEvents:
        """This poll's XID events and SXids. `gpus`: each GPU's PCI address
        (`nvml_address`) to its index and UUID."""
        now = self._clock.now()
        xids, sxids = self._logged_before(now, gpus)
        for record in self._first_reports(self._log.read()):
            if isinstance(record, KernelSxid):
                sxids.append(_sxid_event(record, now))
            elif (gpu := self._gpu(record, gpus)) is not None:
                self._waiting.append(_Waiting(record, *gpu, now))
        xids.extend(self._matched(nvml_events))
        xids.extend(self._unreported(now))
        return KernelEvents(tuple(xids), tuple(sxids))

    def _logged_before(
        self, now: float, gpus: Mapping[str, tuple[int, str | None]]
    ) -> tuple[list[XidEvent], list[SxidEvent]]:
        """The records read before NVML registered (at the first merge; none
        after), each stamped with its kernel time on the daemon's clock."""
        xids: list[XidEvent] = []
        sxids: list[SxidEvent] = []
        if self._before:
            uptime_now = self._uptime()
            for record in self._first_reports(self._before):
                when = now - max(0.0, uptime_now - record.uptime)
                if isinstance(record, KernelSxid):
                    sxids.append(_sxid_event(record, when))
                elif (gpu := self._gpu(record, gpus)) is not None:
                    xids.append(_event(record, gpu, when))
            self._before = []
        return xids, sxids

    def _first_reports(self, records: Iterable[KernelRecord]) -> list[KernelRecord]:
        """The records less the second and later reports of one bus falling
        off the bus (the driver's loss handler runs once a GPU)."""
        first: list[KernelRecord] = []
        for record in records:
            if isinstance(record, KernelXid) and record.code == FALLEN_OFF_BUS:
                if record.address in self._fallen:
                    continue
                self._fallen.add(record.address)
            first.append(record)
        return first

    def _matched(self, nvml_events: Iterable[XidEvent]) -> list[XidEvent]:
        """NVML's events, each with what the first waiting record of the same
        GPU and code adds (that record then counts as NVML's)."""
        events = []
        for event in nvml_events:
            key = (event.gpu, event.code)
            waiting = next((w for w in self._waiting if w.key == key), None)
            if waiting is None:
                self._unmatched[key] += 1
                events.append(event)
                continue
            self._waiting.remove(waiting)
            record = waiting.record
            events.append(
                replace(event, nvlink=record.nvlink, recovery_action=record.recovery_action)
            )
        return events

    def _unreported(self, now: float) -> list[XidEvent]:
        """Waiting records that NVML reported before they were read (dropped),
        and those past their grace that NVML has not reported (counted)."""
        still: list[_Waiting] = []
        added: list[XidEvent] = []
        for waiting in self._waiting:
            if self._unmatched[waiting.key] > 0:
                self._unmatched[waiting.key] -= 1
            elif waiting.read_at > now - GRACE_SECONDS:
                still.append(waiting)
            else:
                added.append(waiting.event())
        self._waiting = still
        return added

    def _gpu(
        self, record: KernelXid, gpus: Mapping[str, tuple[int, str | None]]
    ) -> tuple[int, str | None] | None:
        gpu = gpus.get(record.address)
        if gpu is None and record.address not in self._unknown:
            self._unknown.add(record.address)
            log.warning(
                "kernel log: XID %d on PCI %s, which is no GPU NVML lists; not counted",
                record.code,
                record.address,
            )
        return gpu

    def close(self) -> None:
        self._log.close()


def _sxid_event(record: KernelSxid, when: float) -> SxidEvent:
    return SxidEvent(
        record.switch, record.address, record.code, record.severity, when, record.description
    )


def _event(record: KernelXid, gpu: tuple[int, str | None], when: float) -> XidEvent:
    """A logged XID as an event of the GPU (index, UUID) at its address."""
    return XidEvent(gpu[0], record.code, when, gpu[1], record.nvlink, record.recovery_action)
