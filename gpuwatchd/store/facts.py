"""Facts the node learned that later runs compare against: the GPUs of its
first healthy start, the InfiniBand ports seen active. One JSON document a key."""

from __future__ import annotations

import json
from typing import Any

from gpuwatchd.store.database import Database


class Facts:
    def __init__(self, database: Database) -> None:
        self._database = database

    def get(self, key: str) -> Any:
        """The JSON value recorded under `key`, or None."""
        with self._database.reading() as db:
            row = db.execute("SELECT data FROM facts WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row["data"])

    def put(self, key: str, value: Any, now: float) -> None:
        with self._database.writing() as db:
            db.execute(
                "INSERT INTO facts (key, time, data) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET time = excluded.time, data = excluded.data",
                (key, now, json.dumps(value, sort_keys=True)),
            )
