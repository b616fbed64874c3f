"""Policy's state between polls: every subject's health tracking and the
quarantines in force, with the revision that tells a poll whether an
operator changed them since it read them (store.StateConflict)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from gpuwatchd.model import Quarantine
from gpuwatchd.policy import PolicyState, SubjectState, decode_subjects, encode_subjects


class SubjectsText:
    """`encode_subjects`, remembering its last answer: policy keeps a quiet
    subject's state object from poll to poll, so most polls hand over the
    very objects of the last one, whose text is then not made again. Keyed
    by the objects themselves (frozen, and held here, so never another's)."""

    def __init__(self) -> None:
        self._subjects: Sequence[SubjectState] = ()
        self._text = encode_subjects(())

    def __call__(self, subjects: Sequence[SubjectState]) -> str:
        same = len(subjects) == len(self._subjects) and all(
            a is b for a, b in zip(subjects, self._subjects, strict=True)
        )
        if not same:
            self._subjects, self._text = subjects, encode_subjects(subjects)
        return self._text


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


def write(
    db: sqlite3.Connection,
    state: PolicyState,
    encode: Callable[[Sequence[SubjectState]], str] = encode_subjects,
) -> bool:
    """Write what differs from the database; True when anything did.
    `encode`: how the subjects become text (a SubjectsText where one writer
    writes poll after poll)."""
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
    subjects = encode(state.subjects)
    stored = db.execute("SELECT subjects FROM policy_state").fetchone()[0]
    if subjects != stored:
        db.execute("UPDATE policy_state SET subjects = ?", (subjects,))
    return before != after or subjects != stored
