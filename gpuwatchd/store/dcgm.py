"""The DCGM diagnostics `gpuwatchd canary --dcgm` ran (dcgm.py: DcgmRun, as
its JSON), and what each said of every board it ran on, by UUID: the offline
evidence `gpuwatchd report` puts beside the daemon's.

Bounded without the daemon's help: every run that failed a board is kept
(it is the evidence a vendor asks for); of the others, each board keeps its
newest KEPT_PER_BOARD, so a diagnostic in every job's epilog cannot grow
the database without end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpuwatchd.store.database import Database

KEPT_PER_BOARD = 20
FAILED = "fail"


class DcgmRuns:
    def __init__(self, database: Database) -> None:
        self._database = database

    def add(
        self,
        time: float,
        level: int,
        outcome: str,
        boards: Mapping[str, str],
        data: Mapping[str, Any],
    ) -> int:
        """Record a run: its JSON document and each board's outcome (UUID ->
        pass, fail, cannot_run); the run's id."""
        with self._database.writing() as db:
            cursor = db.execute(
                "INSERT INTO dcgm_runs (time, level, outcome, data) VALUES (?, ?, ?, ?)",
                (time, level, outcome, json.dumps(dict(data), sort_keys=True)),
            )
            run_id = cursor.lastrowid
            assert run_id is not None
            db.executemany(
                "INSERT INTO dcgm_run_boards (uuid, run_id, outcome) VALUES (?, ?, ?)",
                [(uuid, run_id, said) for uuid, said in sorted(boards.items())],
            )
            for uuid in boards:
                db.execute(
                    "DELETE FROM dcgm_run_boards WHERE uuid = ? AND outcome != ? AND run_id NOT IN"
                    " (SELECT run_id FROM dcgm_run_boards WHERE uuid = ? AND outcome != ?"
                    "  ORDER BY run_id DESC LIMIT ?)",
                    (uuid, FAILED, uuid, FAILED, KEPT_PER_BOARD),
                )
            db.execute("DELETE FROM dcgm_runs WHERE id NOT IN (SELECT run_id FROM dcgm_run_boards)")
        return run_id

    def of_board(self, uuid: str) -> list[dict[str, Any]]:
        """The runs that included the board, oldest first, each its document
        with the run's `id`."""
        with self._database.reading() as db:
            rows = db.execute(
                "SELECT r.id, r.data FROM dcgm_runs r JOIN dcgm_run_boards b ON b.run_id = r.id"
                " WHERE b.uuid = ? ORDER BY r.id",
                (uuid,),
            ).fetchall()
        return [{**json.loads(row["data"]), "id": row["id"]} for row in rows]
