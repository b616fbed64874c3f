"""The boots the node has seen and what each GPU suffered in each: its XIDs,
by which an XID that comes back after reboots escalates (checks/xid.py).

Rows are keyed by the board (its UUID), never the index, which a reboot can
renumber; an XID of a GPU whose UUID is not known is not recorded, since it
could not be told apart from another board's. A GPU that NVML reports lost
(GPU_IS_LOST) is recorded as XID 79, "GPU has fallen off the bus", which is
what the driver logs for it: so a board lost in boot after boot escalates
whichever of the two the driver gave.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable

from gpuwatchd.checks.xid import FALLEN_OFF_BUS, BootRecord, BootXid
from gpuwatchd.model import Reading
from gpuwatchd.store.database import Database

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# A boot id is a UUID; read a little more, so that a longer file is refused.
_MAX_BOOT_ID_BYTES = 64
_BOOT_ID_RE = re.compile(r"[0-9A-Za-z-]{1,64}")


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot (a UUID); it changes at every reboot.
    OSError when it cannot be read, ValueError when it is not such an id."""
    with open(path, "rb") as handle:
        text = handle.read(_MAX_BOOT_ID_BYTES + 1).decode("ascii", "replace").strip()
    if not _BOOT_ID_RE.fullmatch(text):
        raise ValueError(f"{path} does not hold a boot id: {text[:40]!r}")
    return text


class Boots:
    def __init__(self, database: Database) -> None:
        self._database = database

    def add(self, boot_id: str, now: float) -> None:
        with self._database.writing() as db:
            db.execute(
                "INSERT OR IGNORE INTO boots (boot_id, first_seen) VALUES (?, ?)", (boot_id, now)
            )

    def record(self, boots: int = 16) -> BootRecord:
        """The last `boots` boots (the current one last) and the XIDs seen in them."""
        with self._database.reading() as db:
            recent = "SELECT boot_id, seq FROM boots ORDER BY seq DESC LIMIT ?"
            rows = db.execute(f"SELECT boot_id FROM ({recent}) ORDER BY seq", (boots,)).fetchall()
            xids = db.execute(
                "SELECT boot_id, gpu, uuid, code, last_time FROM boot_xids"
                f" WHERE boot_id IN (SELECT boot_id FROM ({recent}))",
                (boots,),
            ).fetchall()
        return BootRecord(
            boot_ids=tuple(row["boot_id"] for row in rows),
            xids=tuple(
                BootXid(row["boot_id"], row["gpu"], row["uuid"], row["code"], row["last_time"])
                for row in xids
            ),
        )


def record_xids(
    db: sqlite3.Connection, boot_id: str, readings: Iterable[Reading], now: float
) -> None:
    """The readings' XID events and lost GPUs under `boot_id` (the boot made
    known if new)."""
    db.execute("INSERT OR IGNORE INTO boots (boot_id, first_seen) VALUES (?, ?)", (boot_id, now))
    for reading in readings:
        events = [
            (boot_id, event.uuid, event.code, event.gpu, event.time, event.time)
            for event in reading.xid_events
            if event.uuid
        ]
        lost = [
            (boot_id, gpu.uuid, FALLEN_OFF_BUS, gpu.index, reading.time, reading.time)
            for gpu in reading.gpus or ()
            if not gpu.up and gpu.uuid
        ]
        # Most polls have neither: no statement is run for nothing.
        if events:
            db.executemany(
                """
                INSERT INTO boot_xids (boot_id, uuid, code, gpu, first_time, last_time, count)
                VALUES (?, ?, ?, ?, ?, ?, 1)
                ON CONFLICT (boot_id, uuid, code) DO UPDATE SET
                    last_time = MAX(last_time, excluded.last_time),
                    count = count + 1,
                    gpu = excluded.gpu
                """,
                events,
            )
        if lost:
            db.executemany(
                """
                INSERT INTO boot_xids (boot_id, uuid, code, gpu, first_time, last_time, count)
                VALUES (?, ?, ?, ?, ?, ?, 1)
                ON CONFLICT (boot_id, uuid, code) DO UPDATE SET
                    last_time = MAX(last_time, excluded.last_time)
                """,
                lost,
            )
