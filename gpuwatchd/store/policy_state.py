"""Policy's state between polls: every subject's health tracking and the
quarantines in force, with the revision that tells a poll whether an
operator changed them since it read them (store.StateConflict)."""

from __future__ import annotations

import sqlite3

from gpuwatchd.model import Quarantine
from gpuwatchd.policy import PolicyState, decode_subjects, encode_subjects


def load(db: sqlite3.Connection) -> PolicyState:
    row = db.execute("SELECT revision, subjects FROM policy_state").fetchone()
    return PolicyState(
        subjects=decode_subjects(row["subjects"]),
        quarantines=quarantines(db),
        revision=row["revision"],
    )


def revision(db: sqlite3.Connection) -> int:
    number: int = db.execute("SELECT revision FROM policy_state").fetchone()[0]
    return number


def set_revision(db: sqlite3.Connection, number: int) -> None:
    db.execute("UPDATE policy_state SET revision = ?", (number,))


def last_poll(db: sqlite3.Connection) -> float | None:
    """When the daemon last wrote a poll (wall-clock seconds), if ever."""
    value: float | None = db.execute("SELECT last_poll FROM policy_state").fetchone()[0]
    return value


def set_last_poll(db: sqlite3.Connection, wall: float) -> None:
    db.execute("UPDATE policy_state SET last_poll = ?", (wall,))


def quarantines(db: sqlite3.Connection) -> tuple[Quarantine, ...]:
    rows = db.execute("SELECT * FROM quarantines ORDER BY subject").fetchall()
    return tuple(
        Quarantine(
            subject=row["subject"],
            reason=row["reason"],
            source=row["source"],
            since=row["since"],
            hardware=bool(row["hardware"]),
            operator=row["operator"],
            code=row["code"],
            dry_run=bool(row["dry_run"]),
            uuid=row["uuid"],
            last_index=row["last_index"],
            pci_bus_id=row["pci_bus_id"],
        )
        for row in rows
    )


def write(db: sqlite3.Connection, state: PolicyState) -> bool:
    """Write what differs from the database; True when anything did."""
    before = set(quarantines(db))
    after = set(state.quarantines)
    for gone in before - after:
        db.execute("DELETE FROM quarantines WHERE subject = ?", (gone.subject,))
    for new in after - before:
        db.execute(
            "INSERT OR REPLACE INTO quarantines (subject, reason, source, since, hardware,"
            " operator, code, dry_run, uuid, last_index, pci_bus_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                new.subject,
                new.reason,
                new.source,
                new.since,
                int(new.hardware),
                new.operator,
                new.code,
                int(new.dry_run),
                new.uuid,
                new.last_index,
                new.pci_bus_id,
            ),
        )
    subjects = encode_subjects(state.subjects)
    stored = db.execute("SELECT subjects FROM policy_state").fetchone()[0]
    if subjects != stored:
        db.execute("UPDATE policy_state SET subjects = ?", (subjects,))
    return before != after or subjects != stored
