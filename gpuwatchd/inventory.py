"""What each board on the node is, as NVML names it now: UUID, serial and
part number, VBIOS, and the driver that runs it. For the CLI's offline
tools (`report`, `canary --dcgm`), which need a board's identity, not its
health: one poll of the NVML source, the same reads the daemon makes.

A board NVML does not enumerate now (gone from the bus, or NVML down) has
no identity here; `report` falls back on its last saved sample.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwatchd.clock import Clock
from gpuwatchd.evidence import BoardIdentity
from gpuwatchd.sources import NvmlSourceConfig, SourceUnavailable
from gpuwatchd.sources.nvml import NvmlSource


@dataclass(frozen=True)
class Inventory:
    boards: tuple[BoardIdentity, ...]
    # Why NVML gave no boards (it cannot start, or reads none); None when it did.
    unavailable: str | None = None

    def find(self, uuid: str) -> BoardIdentity | None:
        return next((b for b in self.boards if b.uuid.lower() == uuid.lower()), None)

    def at(self, index: int) -> BoardIdentity | None:
        return next((b for b in self.boards if b.index == index), None)


def read_inventory(clock: Clock, config: NvmlSourceConfig) -> Inventory:
    """The boards NVML enumerates now (one poll of the NVML source: no XID
    listener, no kernel log)."""
    if not config.enabled:
        return Inventory((), "the NVML source is disabled in the config")
    config = replace(config, kernel_log=None, xid_events=False)
    try:
        source = NvmlSource(clock, config, xid_thread=False)
    except SourceUnavailable as error:
        return Inventory((), str(error))
    try:
        reading = source.poll(clock.now())
    finally:
        source.close()
    if reading.nvml_unavailable is not None or reading.error is not None:
        return Inventory((), reading.error or "NVML cannot start")
    boards = [BoardIdentity.of(gpu, reading.driver_version) for gpu in reading.gpus or ()]
    return Inventory(tuple(board for board in boards if board is not None))
