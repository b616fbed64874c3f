"""The simulated node's PCIe functions: a real sysfs tree driven by a scenario.

Owns, under `<sysfs_root>/bus/pci/devices/<address>/`, each GPU's and each
HCA's function as the kernel shows it: `vendor`, `class`, the current link
(`current_link_speed`, `current_link_width`), and the AER counters
`aer_dev_correctable`, `aer_dev_nonfatal` and `aer_dev_fatal` in the format
of drivers/pci/pcie/aer.c (`aer_stats_attrs`): a `NAME count` line for each
error name the kernel knows, then the `TOTAL_ERR_*` line. Each HCA's
`class/infiniband/<hca>/device` is a link to its function, as on a real node.
`gpuwatchd.sources.pcie` reads this tree exactly as it reads `/sys`.

A healthy node's functions show a few correctable receiver errors from link
training at boot, and nothing else (the usual picture of `lspci -vv` on a
healthy HGX node). The scenario's `aer_errors` faults add errors of one
severity to one GPU's or HCA's function: `count` at once, or `rate` while the
fault lasts; each is counted under one error name typical of its severity.
Every value is a closed-form function of the seed and the time since start.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuwatchd.model import AER_SEVERITIES, canonical_address
from gpuwatchd.sim.scenario import Fault, Scenario
from gpuwatchd.sim.sysfs import TreeWriter

# The error names of each file, in aer.c's order (aer_correctable_error_string,
# aer_uncorrectable_error_string; the same names for nonfatal and fatal).
CORRECTABLE_ERRORS = (
    "RxErr",
    "BadTLP",
    "BadDLLP",
    "Rollover",
    "Timeout",
    "NonFatalErr",
    "CorrIntErr",
    "HeaderOF",
)
UNCORRECTABLE_ERRORS = (
    "Undefined",
    "DLP",
    "SDES",
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
    "UncorrIntErr",
    "BlockedTLP",
    "AtomicOpBlocked",
    "TLPBlockedErr",
    "PoisonTLPBlocked",
)
NAMES = {
    "correctable": CORRECTABLE_ERRORS,
    "nonfatal": UNCORRECTABLE_ERRORS,
    "fatal": UNCORRECTABLE_ERRORS,
}
# The error a fault of each severity is counted as: a bad TLP (replayed),
# a completion timeout (the commonest non-fatal one on GPUs), a data link
# protocol error (a fatal link failure).
FAULT_ERROR = {"correctable": "BadTLP", "nonfatal": "CmpltTO", "fatal": "DLP"}

NVIDIA_VENDOR = "0x10de"
MELLANOX_VENDOR = "0x15b3"
GPU_CLASS = "0x030200"  # 3D controller
HCA_CLASS = "0x020700"  # InfiniBand controller
# H100 SXM and ConnectX-7 both train Gen5 x16.
LINK_SPEED = "32.0 GT/s PCIe"
LINK_WIDTH = "16"
# Receiver errors a function logs while its link trains at boot.
BOOT_RECEIVER_ERRORS = (0, 3)


def hca_address(index: int) -> str:
    """An HCA's PCIe address: beside its GPU's PCIe switch on HGX boards."""
    return f"0000:{0xC0 + index:02x}:00.0"


class _Function:
    def __init__(
        self, address: str, vendor: str, pci_class: str, faults: Sequence[Fault], boot: int
    ) -> None:
        self.address = address
        self.vendor = vendor
        self.pci_class = pci_class
        self.faults = tuple(faults)
        self.boot = boot

    def files(self, t: float) -> dict[str, str]:
        files = {
            "vendor": self.vendor,
            "class": self.pci_class,
            "current_link_speed": LINK_SPEED,
            "current_link_width": LINK_WIDTH,
        }
        for severity, (file, total_name) in AER_SEVERITIES.items():
            counts = dict.fromkeys(NAMES[severity], 0)
            if severity == "correctable":
                counts["RxErr"] = self.boot
            for fault in self.faults:
                if fault.severity == severity:
                    counts[FAULT_ERROR[severity]] += _errors(fault, t)
            lines = [f"{name} {count}" for name, count in counts.items()]
            lines.append(f"{total_name} {sum(counts.values())}")
            files[file] = "\n".join(lines)
        return files


def _errors(fault: Fault, t: float) -> int:
    if t < fault.at:
        return 0
    if fault.rate is not None:
        return int(fault.rate * fault.elapsed(t))
    return fault.count or 1


class SimulatedPcie:
    """The GPUs' and HCAs' PCIe functions of `scenario.node` under `sysfs_root`.

    `gpu_bus_ids` are the GPUs' NVML PCI bus ids, in index order, so that
    sysfs and NVML name the same functions.
    """

    def __init__(
        self, scenario: Scenario, sysfs_root: Path, start: float, gpu_bus_ids: Sequence[str]
    ) -> None:
        self.root = Path(sysfs_root)
        self.start = start
        self._tree = TreeWriter(self.root, "pcie")
        rng = random.Random(f"{scenario.seed}/pcie")
        faults = scenario.faults_of("aer_errors")
        self._functions: list[_Function] = []
        for index, bus_id in enumerate(gpu_bus_ids):
            address = canonical_address(bus_id) or f"0000:{index + 1:02x}:00.0"
            mine = [fault for fault in faults if fault.gpu == index]
            boot = rng.randint(*BOOT_RECEIVER_ERRORS)
            self._functions.append(_Function(address, NVIDIA_VENDOR, GPU_CLASS, mine, boot))
        self._hcas: Mapping[str, str] = {
            name: hca_address(index) for index, name in enumerate(scenario.node.hca_names)
        }
        for name, address in self._hcas.items():
            mine = [fault for fault in faults if fault.hca == name]
            boot = rng.randint(*BOOT_RECEIVER_ERRORS)
            self._functions.append(_Function(address, MELLANOX_VENDOR, HCA_CLASS, mine, boot))
        self.advance(start)

    def advance(self, now: float) -> None:
        t = max(0.0, now - self.start)
        devices = self.root / "bus" / "pci" / "devices"
        for function in self._functions:
            self._tree.write_all(devices / function.address, function.files(t))
        for name, address in self._hcas.items():
            link = self.root / "class" / "infiniband" / name / "device"
            self._tree.link(link, f"../../../bus/pci/devices/{address}")
