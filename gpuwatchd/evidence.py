"""What the state database keeps of one board beyond the journal, for
`gpuwatchd report`: its last saved sample (which names it when NVML no
longer does), the canaries' mismatch records, the DCGM runs that included
it. The daemon answers it at /api/v1/evidence/<UUID> (it holds the
database while it runs); the CLI reads the database itself when it is down.

For the node, the records of the host's CPU cores (`cpu:<core>` targets,
whose confirmed faults are the node's).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from gpuwatchd.canary.confirm import board_of
from gpuwatchd.model import GpuSample
from gpuwatchd.policy import NODE
from gpuwatchd.store import Store


@dataclass(frozen=True)
class BoardIdentity:
    """One GPU board: what a vendor's ticket names it by. `index` is where
    NVML enumerated it when it was read, for display only."""

    uuid: str
    index: int
    name: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    board_part_number: str | None = None
    vbios_version: str | None = None
    driver_version: str | None = None

    @classmethod
    def of(cls, sample: GpuSample, driver_version: str | None) -> BoardIdentity | None:
        """The identity a sample gives; None when NVML gave it no UUID."""
        if not sample.uuid:
            return None
        return cls(
            uuid=sample.uuid,
            index=sample.index,
            name=sample.name,
            pci_bus_id=sample.pci_bus_id,
            serial=sample.serial,
            board_part_number=sample.board_part_number,
            vbios_version=sample.vbios_version,
            driver_version=driver_version,
        )


def board_evidence(store: Store, board: str) -> dict[str, Any]:
    """The records of `board` (a GPU's UUID, or `node`) as JSON."""
    mismatches = [row for row in store.canary.since(-math.inf) if _of(row, board)]
    last = store.samples.gpu(board) if board != NODE else None
    identity = BoardIdentity.of(last[1], None) if last is not None else None
    return {
        "board": board,
        "canary_mismatches": mismatches,
        "dcgm_runs": store.dcgm.of_board(board) if board != NODE else [],
        "last_seen": None
        if last is None or identity is None
        else {"time": last[0], **asdict(identity)},
    }


def _of(row: dict[str, Any], board: str) -> bool:
    """Whether a mismatch record is the board's (the node's: a host core's)."""
    target = str(row.get("target", ""))
    if board == NODE:
        return target.startswith("cpu:")
    uuid = row.get("uuid")
    return isinstance(uuid, str) and board_of(target, uuid) == board
