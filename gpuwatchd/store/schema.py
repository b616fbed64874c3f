"""The state database's schema: one list of migrations for every concern.

Entry N takes a database from version N to N + 1 (`PRAGMA user_version`):
SQL statements, or a function that runs in the same transaction. Append,
never edit: a database of any earlier version is brought up to date step by
step when it is opened (database.py).
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_INDEXED = re.compile(r"^(gpu|nvlink):(\d+)(/\d+)?$")
# A GPU index -> the UUID and PCI bus of the board at it.
Boards = dict[int, tuple[str, str | None]]


def _boards_by_uuid(db: sqlite3.Connection) -> None:
    """Version 4 to 5: GPUs by their board, not their NVML index (identity.py).

    Quarantines and subject states of `gpu:N` and `nvlink:N/L` get the UUID
    and bus of the GPU that was at index N when the database last recorded
    the GPUs (the last samples: the mapping of the run that made them), the
    last samples and the boots' XIDs are keyed by UUID, and rows of an index
    no mapping names are dropped, with one log line a table.
    """
    boards = {
        int(match.group(2)): (str(data["uuid"]), data.get("pci_bus_id"))
        for subject, text in db.execute(
            "SELECT subject, data FROM last_samples WHERE kind = 'gpu'"
        ).fetchall()
        if (match := _INDEXED.match(subject)) is not None
        and isinstance(data := _json(text), dict)
        and data.get("uuid")
    }
    _migrate_quarantines(db, boards)
    _migrate_subject_states(db, boards)
    _migrate_last_samples(db)
    _migrate_boot_xids(db)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _board(subject: str, boards: Boards) -> tuple[str, str | None] | None:
    match = _INDEXED.match(subject)
    return None if match is None else boards.get(int(match.group(2)))


def _dropped(what: str, subjects: list[str]) -> None:
    if subjects:
        log.warning(
            "state database: %s of %s dropped: no GPU UUID is recorded for their index",
            what,
            ", ".join(subjects),
        )


def _migrate_quarantines(db: sqlite3.Connection, boards: Boards) -> None:
    for column in ("uuid TEXT", "last_index INTEGER", "pci_bus_id TEXT"):
        db.execute(f"ALTER TABLE quarantines ADD COLUMN {column}")
    dropped = []
    for (subject,) in db.execute("SELECT subject FROM quarantines").fetchall():
        match = _INDEXED.match(subject)
        if match is None:
            continue
        board = _board(subject, boards)
        if board is None:
            dropped.append(subject)
            db.execute("DELETE FROM quarantines WHERE subject = ?", (subject,))
        else:
            db.execute(
                "UPDATE quarantines SET uuid = ?, last_index = ?, pci_bus_id = ? WHERE subject = ?",
                (board[0], int(match.group(2)), board[1], subject),
            )
    _dropped("the quarantine(s)", dropped)


def _migrate_subject_states(db: sqlite3.Connection, boards: Boards) -> None:
    (text,) = db.execute("SELECT subjects FROM policy_state").fetchone()
    states = _json(text)
    if not isinstance(states, list):
        return
    kept, dropped = [], []
    for state in states:
        subject = state.get("subject", "") if isinstance(state, dict) else ""
        board = _board(subject, boards)
        if _INDEXED.match(subject) is not None and board is None:
            dropped.append(subject)
            continue
        if board is not None:
            state["uuid"] = board[0]
        kept.append(state)
    db.execute("UPDATE policy_state SET subjects = ?", (json.dumps(kept, sort_keys=True),))
    _dropped("the health state(s)", dropped)


def _migrate_last_samples(db: sqlite3.Connection) -> None:
    rows = db.execute("SELECT subject, time, data FROM last_samples WHERE kind = 'gpu'").fetchall()
    db.execute("DELETE FROM last_samples WHERE kind = 'gpu'")
    dropped = []
    for subject, time, text in rows:
        data = _json(text)
        uuid = data.get("uuid") if isinstance(data, dict) else None
        if uuid:
            db.execute(
                "INSERT OR REPLACE INTO last_samples VALUES (?, 'gpu', ?, ?)", (uuid, time, text)
            )
        else:
            dropped.append(subject)
    _dropped("the saved sample(s)", dropped)


def _migrate_boot_xids(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE boot_xids RENAME TO boot_xids_by_index")
    db.execute(
        """
        CREATE TABLE boot_xids (
            boot_id TEXT NOT NULL,
            uuid TEXT NOT NULL,
            code INTEGER NOT NULL,
            gpu INTEGER NOT NULL,
            first_time REAL NOT NULL,
            last_time REAL NOT NULL,
            count INTEGER NOT NULL,
            PRIMARY KEY (boot_id, uuid, code)
        )
        """
    )
    lost = db.execute(
        "SELECT COUNT(*) FROM boot_xids_by_index x WHERE x.uuid IS NULL AND NOT EXISTS ("
        "SELECT 1 FROM boot_xids_by_index y WHERE y.boot_id = x.boot_id AND y.gpu = x.gpu"
        " AND y.uuid IS NOT NULL)"
    ).fetchone()[0]
    # A row without a UUID takes the one another XID of its GPU had in that
    # boot: the mapping recorded at its time.
    db.execute(
        """
        INSERT OR IGNORE INTO boot_xids (boot_id, uuid, code, gpu, first_time, last_time, count)
        SELECT x.boot_id, COALESCE(x.uuid, (
                   SELECT y.uuid FROM boot_xids_by_index y
                   WHERE y.boot_id = x.boot_id AND y.gpu = x.gpu AND y.uuid IS NOT NULL
                   LIMIT 1)) AS board,
               x.code, x.gpu, x.first_time, x.last_time, x.count
        FROM boot_xids_by_index x WHERE board IS NOT NULL
        """
    )
    if lost:
        log.warning("state database: %d XID record(s) of earlier boots dropped: no GPU UUID", lost)
    db.execute("DROP TABLE boot_xids_by_index")


Migration = str | Callable[[sqlite3.Connection], None]

MIGRATIONS: tuple[Migration, ...] = (
    """
    CREATE TABLE quarantines (
        subject TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        source TEXT NOT NULL,
        since REAL NOT NULL,
        hardware INTEGER NOT NULL,
        operator TEXT,
        code TEXT,
        dry_run INTEGER NOT NULL
    );
    CREATE TABLE journal (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time REAL NOT NULL,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        check_name TEXT,
        code TEXT,
        severity TEXT,
        source TEXT,
        operator TEXT,
        dry_run INTEGER NOT NULL DEFAULT 0,
        message TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX journal_time ON journal (time);
    CREATE INDEX journal_subject_time ON journal (subject, time);
    CREATE TABLE policy_state (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        revision INTEGER NOT NULL,
        subjects TEXT NOT NULL
    );
    INSERT INTO policy_state (id, revision, subjects) VALUES (1, 0, '[]');
    CREATE TABLE boots (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        boot_id TEXT NOT NULL UNIQUE,
        first_seen REAL NOT NULL
    );
    CREATE TABLE boot_xids (
        boot_id TEXT NOT NULL,
        gpu INTEGER NOT NULL,
        code INTEGER NOT NULL,
        uuid TEXT,
        first_time REAL NOT NULL,
        last_time REAL NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (boot_id, gpu, code)
    );
    CREATE TABLE last_samples (
        subject TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        time REAL NOT NULL,
        data TEXT NOT NULL
    );
    """,
    # The webhook outbox. An event is written once; each webhook has its own
    # row for it, so that one receiver being down holds back only its own queue.
    # webhook_alerts holds the alerts a webhook was sent as firing, so that it
    # gets their resolution and no resolution of an alert it never saw.
    """
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL UNIQUE,
        time REAL NOT NULL,
        data TEXT NOT NULL
    );
    CREATE TABLE outbox (
        webhook TEXT NOT NULL,
        event_id INTEGER NOT NULL REFERENCES events (id),
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt REAL NOT NULL,
        last_error TEXT,
        done_time REAL,
        PRIMARY KEY (webhook, event_id)
    );
    CREATE INDEX outbox_queue ON outbox (webhook, state, event_id);
    CREATE TABLE webhook_alerts (
        webhook TEXT NOT NULL,
        alert TEXT NOT NULL,
        since REAL NOT NULL,
        severity TEXT NOT NULL,
        PRIMARY KEY (webhook, alert)
    );
    """,
    # Facts learned about the node that later runs compare against (the GPUs
    # of its first healthy start), one JSON document per key.
    """
    CREATE TABLE facts (
        key TEXT PRIMARY KEY,
        time REAL NOT NULL,
        data TEXT NOT NULL
    );
    """,
    # The canaries' mismatch history (canary/confirm.py: Mismatch), which
    # confirms an intermittent fault across restarts.
    """
    CREATE TABLE canary_mismatches (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time REAL NOT NULL,
        target TEXT NOT NULL,
        data TEXT NOT NULL
    );
    CREATE INDEX canary_mismatches_time ON canary_mismatches (time);
    """,
    _boards_by_uuid,
    # When the daemon last wrote a poll (the wall clock): a verdict read from
    # the database is only as fresh as that (slurm-healthcheck).
    "ALTER TABLE policy_state ADD COLUMN last_poll REAL",
    # The DCGM diagnostics `gpuwatchd canary --dcgm` ran (dcgm.py: DcgmRun),
    # and what each said of every board it ran on, by UUID (store/dcgm.py).
    """
    CREATE TABLE dcgm_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time REAL NOT NULL,
        level INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        data TEXT NOT NULL
    );
    CREATE TABLE dcgm_run_boards (
        uuid TEXT NOT NULL,
        run_id INTEGER NOT NULL REFERENCES dcgm_runs (id),
        outcome TEXT NOT NULL,
        PRIMARY KEY (uuid, run_id)
    );
    CREATE INDEX dcgm_run_boards_run ON dcgm_run_boards (run_id);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
