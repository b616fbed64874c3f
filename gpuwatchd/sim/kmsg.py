"""The simulated node's kernel log: a file of /dev/kmsg records.

The driver logs every XID it raises (NVIDIA's XID documentation: "the XID
message is written to the kernel log"), so each XID the simulated GPUs raise
through the fake NVML library is also appended here as the line the driver
writes (`NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>,
...`, the form gpud's kmsg.go quotes), in /dev/kmsg's record format
(`prio,seq,usec,flags;message`, Documentation/ABI/testing/dev-kmsg) with a
continuation line, as the kernel adds for device messages. The scenario's
`kernel_xid` faults are XIDs logged before the daemon started (`ago`), which
NVML never reports: only the log knows them. The node booted `BOOT_UPTIME`
seconds before the scenario's start; `uptime(now)` is the kernel's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuwatchd.checks.xid_catalog import lookup
from gpuwatchd.sim.gpu import XID_FALLEN_OFF_BUS, SimulatedGpus
from gpuwatchd.sim.scenario import Scenario
from gpuwatchd.sources.kmsg import nvml_address

BOOT_UPTIME = 3600.0
KERN_ERR, KERN_WARNING, KERN_INFO = 3, 4, 6
# What every boot of the node logs before any XID: lines that are no XID.
BOOT_LINES = (
    (KERN_INFO, 20.5, "nvidia-nvlink: Nvlink Core is being initialized, major device number 234"),
    (KERN_INFO, 21.0, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.172.08"),
)
DEFAULT_AGO = 60.0


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
        before = sorted(
            (BOOT_UPTIME - (fault.ago or DEFAULT_AGO), fault.gpu or 0, fault.code or 0)
            for fault in scenario.faults_of("kernel_xid")
        )
        for uptime, gpu, code in before:
            self._xid(gpu, code, max(uptime, BOOT_LINES[-1][1] + 1))

    def uptime(self, now: float) -> float:
        return BOOT_UPTIME + (now - self.start)

    def advance(self, now: float) -> None:
        """Log the XIDs the GPUs raised up to `now` (after `gpus.advance(now)`)."""
        records = self._gpus.xids_from(self._cursor)
        self._cursor += len(records)
        for record in records:
            self._xid(record.gpu, record.code, BOOT_UPTIME + record.time)

    def _xid(self, gpu: int, code: int, uptime: float) -> None:
        address = self._addresses[gpu] if gpu < len(self._addresses) else None
        if address is None:
            return
        level = KERN_ERR if code == XID_FALLEN_OFF_BUS else KERN_WARNING
        text = f"NVRM: Xid (PCI:{address}): {code}, pid='<unknown>', name=<unknown>, "
        self._append(level, uptime, text + lookup(code).name)

    def _append(self, level: int, uptime: float, text: str) -> None:
        self._sequence += 1
        record = f"{level},{self._sequence},{int(uptime * 1e6)},-;{text}\n"
        with self.path.open("a", encoding="utf-8") as log:
            log.write(record + " SUBSYSTEM=pci\n")
