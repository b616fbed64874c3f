"""XIDs from the kernel log: the driver's `NVRM: Xid` lines in `/dev/kmsg`.

Owns reading the kernel log and merging its XIDs with NVML's XID events; the
NVML source calls it each poll with the events NVML gave and the GPUs' PCI
bus ids.

Reading (Documentation/ABI/testing/dev-kmsg): each read() of /dev/kmsg
returns one record, `prio,seq,usec,flags;message`, then continuation lines
that start with a space (` SUBSYSTEM=pci`, skipped). A reader opened at the
start sees every record still in the ring, so the boot's XIDs from before the
daemon started are read too. Reads are non-blocking (EAGAIN: nothing more for
now); a record overwritten before it was read fails the read with EPIPE, and
the next read goes on from the oldest record left: the loss is said once. A
regular file or a FIFO holding such lines reads the same (the tests and the
simulator point `kernel_log` at one): lines are split from whatever each read
returns.

The driver writes one line per XID (gpud's kmsg.go quotes NVIDIA's forms:
`NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has
fallen off the bus.` and the older `NVRM: Xid (0000:03:00): 14, Channel
00000001`); the PCI address (domain, bus, device) names the GPU through
NVML's PCI bus id.

Merging: NVML replays nothing from before its registration, and the driver
logs every XID it reports. So an XID logged before the registration (its
kernel time is before the moment measured just before registering) comes
from the log alone, stamped with its own time; after it, each XID is counted
once: NVML's events as they come, and a logged XID only when, `grace`
seconds on, NVML has reported fewer of that code on that GPU than the log
holds (a GPU not registered, a wait that failed). Counts per GPU and code
are then the boot's, not the daemon's.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuwatchd.clock import Clock
from gpuwatchd.model import XidEvent

log = logging.getLogger(__name__)

# `6,1234,5678901,-;message`: priority and facility, sequence number,
# microseconds since boot, flags (`-`, or `c` for a continued record).
_RECORD_RE = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
# `NVRM: Xid (PCI:0000:05:00): 79, ...` or the older `NVRM: Xid (0000:03:00): 14, ...`.
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?\)"
    r": (\d{1,4}),"
)
KERNEL_FACILITY = 0
# The kernel's records are at most 1 KiB of text (PRINTK_MESSAGE_MAX); a read
# of /dev/kmsg with a smaller buffer fails with EINVAL.
READ_BYTES = 16384
# Reads per poll at most: the ring holds a few thousand records, and a file
# that never stops growing must not hold the poll.
MAX_READS = 10_000
# Seconds a logged XID waits for NVML's event of it before it counts alone.
GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class KernelXid:
    """One `NVRM: Xid` line: the GPU's PCI address (`0000:18:00`), the XID,
    the kernel's time of it (seconds since boot) and its sequence number."""

    address: str
    code: int
    uptime: float
    sequence: int


def parse_xid_record(line: str) -> KernelXid | None:
    """A kmsg record's XID, or None for any other record (or a line that is none).

    Only the kernel's own records count: their facility is 0, and the kernel
    gives every record a process writes to /dev/kmsg a facility of at least
    LOG_USER "to reliably distinguish kernel-generated messages from
    userspace-injected ones" (kernel/printk/printk.c, devkmsg_write), so a
    forged `NVRM: Xid` line cannot condemn a GPU.
    """
    record = _RECORD_RE.match(line)
    if record is None or int(record.group(1)) >> 3 != KERNEL_FACILITY:
        return None
    xid = _XID_RE.search(record.group(4))
    if xid is None:
        return None
    domain, bus, device, code = xid.groups()
    address = f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"
    return KernelXid(address, int(code), int(record.group(3)) / 1e6, int(record.group(2)))


def nvml_address(bus_id: str) -> str | None:
    """NVML's `00000000:18:00.0` -> `0000:18:00`, the form of an XID line."""
    parts = bus_id.strip().lower().replace(".", ":").split(":")
    try:
        domain, bus, device = (int(part, 16) for part in parts[:3])
    except ValueError:
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def system_uptime() -> float:
    """Seconds since boot on the clock the kernel log's times are on."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class KernelLog:
    """The XID lines of a kmsg device (or file, or FIFO), read as they come."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._descriptor: int | None = None
        self._partial = ""
        self._reported: set[str] = set()
        self._last_sequence: int | None = None

    def read(self) -> list[KernelXid]:
        """The XIDs logged since the last read (all of the ring at the first)."""
        if self._descriptor is None and not self._open():
            return []
        text = self._drain()
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        xids = [xid for xid in map(parse_xid_record, lines) if xid is not None]
        return self._new(xids)

    def _new(self, xids: list[KernelXid]) -> list[KernelXid]:
        """Drop records already seen (a file re-read from the start after it was
        replaced) by their sequence numbers, which only grow within a boot."""
        fresh = [x for x in xids if self._last_sequence is None or x.sequence > self._last_sequence]
        if xids:
            self._last_sequence = max(self._last_sequence or 0, *(x.sequence for x in xids))
        return fresh

    def _open(self) -> bool:
        try:
            self._descriptor = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            hint = ""
            if error.errno in (errno.EPERM, errno.EACCES):
                hint = (
                    " (with kernel.dmesg_restrict=1 reading it needs CAP_SYSLOG: see "
                    "systemd/kernel-log-restricted.conf, a drop-in)"
                )
            self._say_once(
                "open",
                f"kernel log {self.path} not read: {error.strerror}{hint}; XIDs are "
                "counted from NVML's events only, from the daemon's start",
            )
            return False
        return True

    def _drain(self) -> str:
        assert self._descriptor is not None
        chunks: list[bytes] = []
        for _ in range(MAX_READS):
            try:
                chunk = os.read(self._descriptor, READ_BYTES)
            except BlockingIOError:
                break
            except OSError as error:
                if error.errno == errno.EPIPE:
                    self._say_once(
                        "overwritten",
                        f"kernel log {self.path}: records were overwritten before they were "
                        "read (a busy log); XIDs among them are counted only if NVML reported "
                        "them",
                    )
                    continue
                self._say_once("read", f"kernel log {self.path}: read failed: {error.strerror}")
                self.close()
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            log.warning("%s", message)

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


class KernelXids:
    """Merges the kernel log's XIDs with NVML's events (see the module's docstring).

    `registered_uptime` is the kernel time just before NVML's XID registration;
    `uptime` gives the kernel time now, to stamp a logged XID on `clock`.
    """

    def __init__(
        self,
        path: str,
        clock: Clock,
        registered_uptime: float,
        uptime: Callable[[], float] = system_uptime,
    ) -> None:
        self._log = KernelLog(path)
        self._clock = clock
        self._registered = registered_uptime
        self._uptime = uptime
        self._nvml: Counter[tuple[int, int]] = Counter()
        self._logged: Counter[tuple[int, int]] = Counter()
        self._pending: list[tuple[tuple[int, int], float, str | None]] = []
        self._unknown: set[str] = set()

    def merge(
        self, nvml_events: Iterable[XidEvent], gpus: Mapping[str, tuple[int, str | None]]
    ) -> tuple[XidEvent, ...]:
        """The logged XIDs to add to this poll's NVML events. `gpus`: each GPU's
        PCI address (`nvml_address`) to its index and UUID."""
        for event in nvml_events:
            self._nvml[(event.gpu, event.code)] += 1
        now = self._clock.now()
        uptime_now = self._uptime()
        added: list[XidEvent] = []
        for xid in self._log.read():
            gpu = gpus.get(xid.address)
            if gpu is None:
                self._unnamed(xid)
                continue
            # The kernel's time of the line, on the daemon's clock.
            when = now - max(0.0, uptime_now - xid.uptime)
            if xid.uptime < self._registered:
                added.append(XidEvent(gpu[0], xid.code, when, gpu[1]))
            else:
                self._pending.append(((gpu[0], xid.code), when, gpu[1]))
        added.extend(self._unreported(now))
        return tuple(added)

    def _unreported(self, now: float) -> list[XidEvent]:
        """Logged XIDs past their grace that NVML has not reported as many of."""
        waiting: list[tuple[tuple[int, int], float, str | None]] = []
        added: list[XidEvent] = []
        for key, when, uuid in self._pending:
            if when > now - GRACE_SECONDS:
                waiting.append((key, when, uuid))
                continue
            self._logged[key] += 1
            if self._logged[key] > self._nvml[key]:
                # NVML missed this one: count it, and count it as reported.
                self._nvml[key] += 1
                added.append(XidEvent(key[0], key[1], when, uuid))
        self._pending = waiting
        return added

    def _unnamed(self, xid: KernelXid) -> None:
        if xid.address in self._unknown:
            return
        self._unknown.add(xid.address)
        log.warning(
            "kernel log: XID %d on PCI %s, which is no GPU NVML lists; not counted",
            xid.code,
            xid.address,
        )

    def close(self) -> None:
        self._log.close()
