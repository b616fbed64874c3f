"""Sources: one per hardware interface. A source turns what the hardware says
into model objects and knows nothing about health."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpuwatchd.model import Reading
from gpuwatchd.settings import Seconds


@dataclass(frozen=True)
class NvmlSourceConfig:
    enabled: bool = True
    # Listen for XID critical errors through an NVML event set.
    xid_events: bool = True
    # The kernel log whose `NVRM: Xid` lines count the boot's XIDs from before
    # the daemon started, and any NVML did not report; null: NVML's events only.
    kernel_log: str | None = "/dev/kmsg"
    # How long one GPU's read may take before the poll goes on without it and
    # reports it unreadable (gpu_read_hung). A read is some hundred NVML calls
    # of a millisecond or less; one stuck in the driver may never return.
    read_timeout: Seconds = 5.0
    # Values a GPU keeps while the driver stays loaded, or that change only by
    # an operator's hand or a GPU reset (maximum clocks and PCIe link, default
    # application clock, power limit, VBIOS, ECC and MIG mode, temperature
    # thresholds): read at the first poll, when a GPU answers again, and this
    # often. A change is seen within this time.
    static_refresh: Seconds = 600.0
    # Hopper and older report NVLink errors one call a link and counter (54
    # calls an H100). Those are read when the driver's NVLink DL fields (one
    # field batch, every poll) say a count moved, and this often otherwise:
    # DCGM's exporter collects every 30 s. Where the DL fields answer and have
    # followed the counters, only every `static_refresh`, to check that they do.
    link_counter_interval: Seconds = 30.0

    def __post_init__(self) -> None:
        if self.read_timeout <= 0:
            raise ValueError("read_timeout must be more than 0s")
        if self.static_refresh <= 0 or self.link_counter_interval <= 0:
            raise ValueError("static_refresh and link_counter_interval must be more than 0s")


@dataclass(frozen=True)
class InfinibandSourceConfig:
    enabled: bool = True
    # The root under which class/infiniband is read; a captured tree works too.
    sysfs_root: str = "/sys"
    # HCAs not to read at all (some restricted ConnectX-7 functions flood the
    # kernel log with ACCESS_REG errors when their counters are read).
    exclude_devices: tuple[str, ...] = ()
    # Every poll reads what the infiniband check judges at once: each port's
    # state, physical state and rate, its IBTA error counters and received
    # packets, and the data counters the dashboards graph. The rest (the other
    # packet counters, hw_counters/,
    # link layer and the device's facts) is read this often, as DCGM's
    # exporter collects every 30 s (on mlx5 each counter read is a firmware
    # query), and at once for a port whose state or rate changed, that
    # flapped or whose counters were reset, and for a new or re-created device.
    counter_interval: Seconds = 30.0

    def __post_init__(self) -> None:
        if self.counter_interval <= 0:
            raise ValueError("counter_interval must be more than 0s")


@dataclass(frozen=True)
class PcieSourceConfig:
    enabled: bool = True
    # The root under which bus/pci/devices and class/infiniband are read.
    sysfs_root: str = "/sys"


class SourceUnavailable(RuntimeError):
    """The source cannot run on this machine at all (no NVML library, say).
    `problem` is what is wrong; the message adds what to do with the daemon."""

    def __init__(self, problem: str, hint: str = "") -> None:
        super().__init__(f"{problem} {hint}".rstrip())
        self.problem = problem


class Source(Protocol):
    name: str

    def poll(self, now: float) -> Reading:
        """One reading. Never raises for a value or device it cannot read."""
        ...

    def close(self) -> None: ...
