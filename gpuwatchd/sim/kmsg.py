"""The simulated node's kernel log: a file of /dev/kmsg records.

The driver logs every XID it raises (NVIDIA's XID documentation: "the XID
message is written to the kernel log"), so each XID the simulated GPUs raise
through the fake NVML library is also appended here as the line the driver
writes (`NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>,
...`, the form gpud's kmsg.go quotes), in /dev/kmsg's record format
(`prio,seq,usec,flags;message`, Documentation/ABI/testing/dev-kmsg) with a
continuation line, as the kernel adds for device messages. The scenario's
`kernel_xid` faults are XIDs logged before the daemon started (`ago`), which
NVML never reports: only the log knows them. Its `kernel_line` faults are
records in any form a driver writes (the fallen-off-the-bus lines without
`Xid`, NVLink5 XIDs with their tail, NVSwitch SXids), written as given at
`at`, or `ago` before the start; NVML reports none of them. A text of
several lines is one record, as one printk is, its line breaks escaped as
devkmsg escapes them. The node booted `BOOT_UPTIME` seconds before the
scenario's start; `uptime(now)` is the kernel's time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from gpuwatchd.checks.xid_catalog import lookup
from gpuwatchd.sim.gpu import XID_FALLEN_OFF_BUS, SimulatedGpus
from gpuwatchd.sim.scenario import Fault, Scenario
from gpuwatchd.sources.kmsg import nvml_address

BOOT_UPTIME = 3600.0
KERN_ERR, KERN_WARNING, KERN_INFO = 3, 4, 6
# What every boot of the node logs before any XID: lines that are no XID.
BOOT_LINES = (
    (KERN_INFO, 20.5, "nvidia-nvlink: Nvlink Core is being initialized, major device number 234"),
    (KERN_INFO, 21.0, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.172.08"),
)
DEFAULT_AGO = 60.0
# printk's level prefix (KERN_ERR is "<3>"), where a kernel_line's text has one.
_LEVEL_RE = re.compile(r"^<([0-7])>")

# (kernel time, level, message) of one record to write.
_Record = tuple[float, int, str]


class SimulatedKernelLog:
    """`path` holds the node's kernel log; `advance(now)` appends what was logged since."""

    def __init__(self, scenario: Scenario, gpus: SimulatedGpus, path: Path) -> None:
        self.path = Path(path)
        self.start = gpus.start
        self._gpus = gpus
        self._addresses: Sequence[str | None] = [nvml_address(g.pci_bus_id) for g in gpus.gpus]
        self._sequence = 0
        self._cursor = 0
        self.path.write_text("")
        for level, uptime, text in BOOT_LINES:
            self._append(level, uptime, text)
        lines = scenario.faults_of("kernel_line")
        before = [
            record
            for fault in scenario.faults_of("kernel_xid")
            for record in self._xid(
                fault.gpu or 0, fault.code or 0, BOOT_UPTIME - (fault.ago or DEFAULT_AGO)
            )
        ]
        before += [_line(fault, BOOT_UPTIME - fault.ago) for fault in lines if fault.ago]
        for uptime, level, text in sorted(before):
            self._append(level, max(uptime, BOOT_LINES[-1][1] + 1), text)
        # The kernel_line faults logged while the daemon runs, by their time.
        self._later = sorted((fault for fault in lines if not fault.ago), key=lambda f: f.at)

    def uptime(self, now: float) -> float:
        return BOOT_UPTIME + (now - self.start)

    def advance(self, now: float) -> None:
        """Log the XIDs the GPUs raised and the kernel lines due up to `now`
        (after `gpus.advance(now)`)."""
        records = self._gpus.xids_from(self._cursor)
        self._cursor += len(records)
        due = [x for r in records for x in self._xid(r.gpu, r.code, BOOT_UPTIME + r.time)]
        while self._later and self._later[0].at <= now - self.start:
            fault = self._later.pop(0)
            due.append(_line(fault, BOOT_UPTIME + fault.at))
        for uptime, level, text in sorted(due):
            self._append(level, uptime, text)

    def _xid(self, gpu: int, code: int, uptime: float) -> list[_Record]:
        """The driver's line of an XID on a GPU (none for a GPU with no bus)."""
        address = self._addresses[gpu] if gpu < len(self._addresses) else None
        if address is None:
            return []
        level = KERN_ERR if code == XID_FALLEN_OFF_BUS else KERN_WARNING
        text = f"NVRM: Xid (PCI:{address}): {code}, pid='<unknown>', name=<unknown>, "
        return [(uptime, level, text + lookup(code).name)]

    def _append(self, level: int, uptime: float, text: str) -> None:
        self._sequence += 1
        record = f"{level},{self._sequence},{int(uptime * 1e6)},-;{_escaped(text)}\n"
        with self.path.open("a", encoding="utf-8") as log:
            log.write(record + " SUBSYSTEM=pci\n")


def _line(fault: Fault, uptime: float) -> _Record:
    """A kernel_line fault's record: its level from the text's prefix, else KERN_ERR."""
    text = fault.text or ""
    level = _LEVEL_RE.match(text)
    if level is None:
        return (uptime, KERN_ERR, text)
    return (uptime, int(level.group(1)), text[level.end() :])


def _escaped(text: str) -> str:
    """The message as devkmsg shows it: each byte below 0x20, from 0x7f on,
    and the backslash as `\\xHH` (kernel/printk/printk.c)."""
    return "".join(
        chr(byte) if 0x20 <= byte < 0x7F and byte != 0x5C else f"\\x{byte:02x}"
        for byte in text.encode()
    )
