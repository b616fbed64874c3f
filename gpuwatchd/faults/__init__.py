"""The fault code catalog: one stable id (`GW-1103`) for every finding code,
with what it means, the evidence it rests on, what to do about it, and
NVIDIA's matching XID or RMA criterion where NVIDIA has one.

A fault code is what an operator puts in a ticket: finding codes name checks
and may be renamed, fault codes are never reused for another meaning. A
finding code that goes away keeps its entry, `retired`; a new meaning gets a
new id. Ids are `GW-` + the block (two digits, the area: BLOCKS) + a number
within it. docs/fault-codes.md is written from this catalog
(scripts/make-fault-codes) and tests/test_fault_codes.py holds it to the
finding codes the source can make.

Reads nothing: plain data, below every other layer (model.Finding derives
its fault code here).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.faults.code import ID_PATTERN, Block, FaultCode
from gpuwatchd.faults.gpu import MEMORY, THERMAL_AND_CLOCKS, XIDS
from gpuwatchd.faults.interconnect import INFINIBAND, NVLINK_AND_FABRIC, PCIE_AND_AER
from gpuwatchd.faults.node import CANARIES, DCGM, NODE_AND_DAEMON, PRESENCE_AND_DRIVER

__all__ = ["BLOCKS", "CATALOG", "ENTRIES", "ID_PATTERN", "Block", "FaultCode", "fault_code"]

BLOCKS = (
    Block(10, "GPU thermal and clocks"),
    Block(11, "GPU memory: ECC, row remapping, page retirement"),
    Block(12, "XIDs"),
    Block(13, "NVLink and the NVSwitch fabric"),
    Block(14, "InfiniBand"),
    Block(15, "PCIe and AER"),
    Block(16, "Canaries: silent data corruption"),
    Block(17, "DCGM diagnostics: the offline tier"),
    Block(18, "GPU presence, the driver and NVML"),
    Block(19, "The node, the daemon and its actions"),
)

ENTRIES: tuple[FaultCode, ...] = (
    *THERMAL_AND_CLOCKS,
    *MEMORY,
    *XIDS,
    *NVLINK_AND_FABRIC,
    *INFINIBAND,
    *PCIE_AND_AER,
    *CANARIES,
    *DCGM,
    *PRESENCE_AND_DRIVER,
    *NODE_AND_DAEMON,
)

# By finding code. A retired entry keeps its code, so an old journal entry still reads.
CATALOG: Mapping[str, FaultCode] = MappingProxyType({entry.code: entry for entry in ENTRIES})


def fault_code(code: str | None) -> str | None:
    """The fault code of a finding code; None for no code, or one this
    version's catalog does not know (a journal entry a newer version wrote)."""
    entry = CATALOG.get(code) if code else None
    return entry.id if entry is not None else None
