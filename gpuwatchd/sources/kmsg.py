"""The NVIDIA drivers' records in the kernel log (`/dev/kmsg`): XIDs, GPUs
fallen off the bus, NVSwitch SXids.

Owns reading the kernel log and parsing the records the GPU and NVSwitch
drivers write; `sources/kernel_xids.py` merges their XIDs with NVML's
events (and says once a boot which reports of a GPU falling off the bus
count).

Reading (Documentation/ABI/testing/dev-kmsg): each read() of /dev/kmsg
returns one record, `prio,seq,usec,flags;message`, then continuation lines
that start with a space (` SUBSYSTEM=pci`, skipped); the message's
non-printable bytes are escaped as `\\xHH`, so the line breaks of one printk
read `\\x0a`. A reader opened at the start sees every record still in the
ring, so the boot's records from before the daemon started are read too.
Reads are non-blocking (EAGAIN: nothing more for now); a record overwritten
before it was read fails the read with EPIPE, and the next read goes on from
the oldest record left: the loss is said once. A regular file or a FIFO
holding such lines reads the same (the tests and the simulator point
`kernel_log` at one): lines are split from whatever each read returns.

The forms read (real ones, with their sources, are tests/fixtures/kmsg/):

- `NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has
  fallen off the bus.`, and the older `NVRM: Xid (0000:03:00): 14, Channel
  00000001`: the PCI address (domain, bus, device) names the GPU through
  NVML's PCI bus id.
- NVLink5 XIDs (144-150) go on with the unit, `Fatal` or `Nonfatal`, the
  link (-1: none) and the values NVIDIA's "XID 144-150 Decode" reads:
  `149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 ...)`.
- XID 154 names the recovery action it changed to: `154, GPU recovery
  action changed from 0x0 (None) to 0x4 (Drain and Reset)`.
- A GPU off the bus without an `Xid` token: `NVRM: GPU 0000:29:00.0: GPU has
  fallen off the bus.`, which the driver's osHandleGpuLost prints just after
  the XID 79 line, and the probe's one printk of three lines for a GPU
  already gone, `NVRM: The NVIDIA GPU 0000:18:00.0` ... `fallen off the bus
  and is not responding to commands.` Both are XID 79 on that bus.
- NVSwitch SXids, `nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028,
  Non-fatal, Link 32 egress non-posted PRIV error (First)`: the nvswitch
  driver heads each error's record with its word for it (`Fatal`,
  `Non-fatal`, `Correctable`: src/common/nvswitch/kernel/inc/
  intr_nvswitch.h); the records it adds with the same SXid (`Severity 1
  Engine instance ...`, `Data {...}`) are that error's detail, not errors.
"""

from __future__ import annotations

import codecs
import errno
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

from gpuwatchd.model import NvlinkXidDetail

log = logging.getLogger(__name__)

# `6,1234,5678901,-;message`: priority and facility, sequence number,
# microseconds since boot, flags (`-`, or `c` for a continued record).
_RECORD_RE = re.compile(r"^(\d{1,4}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$")
_ESCAPE_RE = re.compile(rb"\\x([0-9a-fA-F]{2})")
# A PCI address, the domain optional (gpud's kmsg_test.go has `GPU 18:00.0`).
_ADDRESS = r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
_XID_RE = re.compile(rf"NVRM: Xid \((?:PCI:)?{_ADDRESS}(?:\.[0-7])?\): (\d{{1,4}}),")
_NVLINK_RE = re.compile(
    r"([A-Z][A-Z0-9_]*(?:/[A-Z][A-Z0-9_]*)?)\s+(Fatal|Nonfatal)\s+XC[01]\s+i\d{1,3}\s+"
    r"Link\s+(-?\d{1,3})\s+\((0x[0-9a-fA-F]{1,8})\s+(0x[0-9a-fA-F]{1,8})"
)
_RECOVERY_RE = re.compile(
    r"recovery action changed from 0x[0-9a-fA-F]{1,8}(?: \([^)]*\))? to (0x[0-9a-fA-F]{1,8})"
)
_FALLEN_RE = re.compile(rf"NVRM: GPU {_ADDRESS}\.[0-7]: GPU has fallen off the bus")
_PROBE_FALLEN_RE = re.compile(
    rf"NVRM: The NVIDIA GPU {_ADDRESS}\.[0-7]\s.*?fallen off the bus and is not responding",
    re.DOTALL,
)
_SXID_RE = re.compile(
    r"(nvidia-nvswitch\d{1,3}): SXid \(PCI:([0-9a-fA-F:.]{7,16})\): (\d{1,6}), "
    r"(Fatal|Non-fatal|Correctable), (.*)"
)
KERNEL_FACILITY = 0
FALLEN_OFF_BUS = 79
NVLINK5_XIDS = range(144, 151)
RECOVERY_ACTION_CHANGED = 154
# The kernel's records are at most 1 KiB of text (PRINTK_MESSAGE_MAX); a read
# of /dev/kmsg with a smaller buffer fails with EINVAL.
READ_BYTES = 16384
# A /dev/kmsg record with its escapes is at most CONSOLE_EXT_LOG_MAX (8 KiB):
# a longer line is no record, and is skipped unparsed.
MAX_LINE_CHARS = 8192
# Reads per poll at most: the ring holds a few thousand records, and a file
# that never stops growing must not hold the poll.
MAX_READS = 10_000


@dataclass(frozen=True)
class KernelXid:
    """One XID record: the GPU's PCI address (`0000:18:00`), the XID, what its
    line adds to the code, the kernel's time of it (seconds since boot) and
    its sequence number."""

    address: str
    code: int
    uptime: float
    sequence: int
    nvlink: NvlinkXidDetail | None = None
    recovery_action: int | None = None


@dataclass(frozen=True)
class KernelSxid:
    """One NVSwitch error's record: the switch (`nvidia-nvswitch3`), its PCI
    address, the SXid, the driver's word for it, the rest of its line."""

    switch: str
    address: str
    code: int
    severity: str
    description: str
    uptime: float
    sequence: int


KernelRecord = KernelXid | KernelSxid


@dataclass(frozen=True)
class _Header:
    sequence: int
    uptime: float
    message: str


def _header(line: str) -> _Header | None:
    """A kernel record's sequence, time and unescaped message; None for any
    other line.

    Only the kernel's own records count: their facility is 0, and the kernel
    gives every record a process writes to /dev/kmsg a facility of at least
    LOG_USER "to reliably distinguish kernel-generated messages from
    userspace-injected ones" (kernel/printk/printk.c, devkmsg_write), so a
    forged `NVRM: Xid` line cannot condemn a GPU.
    """
    if len(line) > MAX_LINE_CHARS:
        return None
    record = _RECORD_RE.match(line)
    if record is None or int(record.group(1)) >> 3 != KERNEL_FACILITY:
        return None
    return _Header(int(record.group(2)), int(record.group(3)) / 1e6, _unescaped(record.group(4)))


def _unescaped(message: str) -> str:
    """The message as printk had it: devkmsg writes each byte below 0x20, from
    0x7f on, and the backslash as `\\xHH`."""
    if "\\x" not in message:
        return message
    raw = _ESCAPE_RE.sub(lambda escape: bytes([int(escape.group(1), 16)]), message.encode())
    return raw.decode("utf-8", "replace")


def parse_record(line: str) -> KernelRecord | None:
    """A kmsg record's XID or SXid, or None for any other record (or a line
    that is none)."""
    header = _header(line)
    return _parse_message(header) if header is not None else None


def _parse_message(header: _Header) -> KernelRecord | None:
    message = header.message
    sxid = _SXID_RE.search(message)
    if sxid is not None:
        switch, address, code, severity, description = sxid.groups()
        return KernelSxid(
            switch,
            address.lower(),
            int(code),
            severity,
            description.strip(),
            header.uptime,
            header.sequence,
        )
    xid = _XID_RE.search(message)
    if xid is not None:
        return _xid(xid, header)
    fallen = _FALLEN_RE.search(message) or _PROBE_FALLEN_RE.search(message)
    if fallen is not None:
        address = _address(*fallen.groups())
        return KernelXid(address, FALLEN_OFF_BUS, header.uptime, header.sequence)
    return None


def _xid(xid: re.Match[str], header: _Header) -> KernelXid:
    domain, bus, device, number = xid.groups()
    code = int(number)
    rest = header.message[xid.end() :]
    nvlink = None
    if code in NVLINK5_XIDS and (tail := _NVLINK_RE.search(rest)) is not None:
        unit, word, link, intrinfo, status = tail.groups()
        fatal = word == "Fatal"
        nvlink = NvlinkXidDetail(unit, fatal, int(link), int(intrinfo, 16), int(status, 16))
    action = None
    if code == RECOVERY_ACTION_CHANGED and (changed := _RECOVERY_RE.search(rest)) is not None:
        action = int(changed.group(1), 16)
    address = _address(domain, bus, device)
    return KernelXid(address, code, header.uptime, header.sequence, nvlink, action)


def _address(domain: str | None, bus: str, device: str) -> str:
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


def nvml_address(bus_id: str) -> str | None:
    """NVML's `00000000:18:00.0` -> `0000:18:00`, the form of an XID line."""
    parts = bus_id.strip().lower().replace(".", ":").split(":")
    try:
        domain, bus, device = (int(part, 16) for part in parts[:3])
    except ValueError:
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def system_uptime() -> float:
    """Seconds since boot on the clock nearest the kernel log's (printk's own
    is not readable from user space): only to stamp records from before the
    start."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class KernelLog:
    """The driver records of a kmsg device (or file, or FIFO), read as they come."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._descriptor: int | None = None
        self._partial = ""
        # A line past MAX_LINE_CHARS is dropped up to its end, wherever that is.
        self._dropping = False
        self._reported: set[str] = set()
        # The last record read, and what had been read when the log was
        # opened again (its records come again from the start of the ring).
        self._last_sequence = -1
        self._read_before: int | None = None
        # Incremental: a character split between two reads is decoded whole.
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self) -> list[KernelRecord]:
        """The records logged since the last read (all of the ring at the first).
        Holds at most one chunk and one record's worth of text: a line longer
        than any record is dropped as it comes, however long it grows."""
        if self._descriptor is None and not self._open():
            return []
        records = []
        for chunk in self._drain():
            for header in filter(None, map(_header, self._lines(chunk))):
                if self._new(header.sequence) and (record := _parse_message(header)) is not None:
                    records.append(record)
        return records

    def _lines(self, chunk: str) -> list[str]:
        """The whole lines `chunk` ends, with what came before it."""
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        if self._dropping and lines:
            lines, self._dropping = lines[1:], False
        if len(self._partial) > MAX_LINE_CHARS:
            self._partial, self._dropping = "", True  # no record is that long
        return lines

    def _new(self, sequence: int) -> bool:
        """Whether a record is not one already read: after the log was opened
        again, the ring's records up to the last one read come again. Within
        one open the kernel gives each record once, so no sequence, however
        large (a forged file's), hides the records after it."""
        self._last_sequence = max(self._last_sequence, sequence)
        return self._read_before is None or sequence > self._read_before

    def _open(self) -> bool:
        if self._last_sequence >= 0:
            self._read_before = self._last_sequence
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

    def _drain(self) -> Iterator[str]:
        assert self._descriptor is not None
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
            yield self._decoder.decode(chunk)

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            log.warning("%s", message)

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
