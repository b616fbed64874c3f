"""The canaries' mismatch history (canary/confirm.py: Mismatch), which
confirms an intermittent fault across restarts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from gpuwatchd.store.database import Database


class CanaryMismatches:
    def __init__(self, database: Database) -> None:
        self._database = database

    def since(self, since: float) -> list[dict[str, Any]]:
        """The records from `since` on, oldest first."""
        with self._database.reading() as db:
            rows = db.execute(
                "SELECT data FROM canary_mismatches WHERE time >= ? ORDER BY id", (since,)
            ).fetchall()
        return [json.loads(row[0]) for row in rows]

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append records (each with `time` and `target`)."""
        with self._database.writing() as db:
            db.executemany(
                "INSERT INTO canary_mismatches (time, target, data) VALUES (?, ?, ?)",
                [(row["time"], row["target"], json.dumps(dict(row))) for row in rows],
            )
