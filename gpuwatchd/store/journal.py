"""The journal: an append-only record of findings raised and cleared, health
changes, decisions and what the actions did, for `gpuwatchd journal`, the API
and an operator's audit. Pruned by age, except the kinds a caller keeps."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatchd.faults import fault_code
from gpuwatchd.model import Decision
from gpuwatchd.policy import PolicyResult, PolicyState
from gpuwatchd.store.database import Database


@dataclass(frozen=True)
class JournalEntry:
    id: int
    time: float
    kind: str  # finding_raised, finding_cleared, health_changed, quarantine, release
    subject: str
    message: str
    check: str | None = None
    code: str | None = None
    severity: str | None = None
    source: str | None = None
    operator: str | None = None
    dry_run: bool = False
    data: Mapping[str, Any] | None = None
    # The code's fault code (gpuwatchd.faults), derived as the entry is read.
    fault_code: str | None = None


class Journal:
    def __init__(self, database: Database) -> None:
        self._database = database

    def entries(
        self,
        since: float | None = None,
        subject: str | None = None,
        limit: int = 1000,
        until: float | None = None,
    ) -> tuple[JournalEntry, ...]:
        """Entries from `since` on, before `until`, of one subject or all: the
        newest `limit` of them (a window with more leaves its oldest out),
        oldest first."""
        conditions = ["1"]
        parameters: list[Any] = []
        if since is not None:
            conditions.append("time >= ?")
            parameters.append(since)
        if until is not None:
            conditions.append("time < ?")
            parameters.append(until)
        if subject is not None:
            conditions.append("subject = ?")
            parameters.append(subject)
        query = f"SELECT * FROM journal WHERE {' AND '.join(conditions)} ORDER BY id DESC LIMIT ?"
        with self._database.reading() as db:
            rows = db.execute(query, [*parameters, max(0, limit)]).fetchall()
        return tuple(_entry(row) for row in reversed(rows))

    def prune(self, before: float, keep_kinds: Iterable[str]) -> int:
        """Delete entries older than `before`, except those of `keep_kinds`;
        how many were deleted."""
        keep = tuple(keep_kinds)
        marks = ", ".join("?" * len(keep)) or "NULL"
        with self._database.writing() as db:
            cursor = db.execute(
                f"DELETE FROM journal WHERE time < ? AND kind NOT IN ({marks})", (before, *keep)
            )
        return cursor.rowcount

    def notes(self, kind: str, prefix: str) -> tuple[str, ...]:
        """The messages of the entries of `kind` that start with `prefix`."""
        with self._database.reading() as db:
            rows = db.execute(
                "SELECT message FROM journal WHERE kind = ? AND substr(message, 1, ?) = ?",
                (kind, len(prefix), prefix),
            ).fetchall()
        return tuple(row["message"] for row in rows)

    def note(
        self,
        kind: str,
        subject: str,
        message: str,
        now: float,
        *,
        operator: str | None = None,
        dry_run: bool = False,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Journal something that is not a poll's: what an action did or would
        do, a refused API request."""
        with self._database.writing() as db:
            insert(
                db,
                kind=kind,
                time=now,
                subject=subject,
                message=message,
                operator=operator,
                dry_run=dry_run,
                data=data,
            )


def insert(
    db: sqlite3.Connection,
    *,
    kind: str,
    time: float,
    subject: str,
    message: str,
    check_name: str | None = None,
    code: str | None = None,
    severity: str | None = None,
    source: str | None = None,
    operator: str | None = None,
    dry_run: bool = False,
    data: Mapping[str, Any] | None = None,
) -> None:
    db.execute(
        "INSERT INTO journal (time, kind, subject, check_name, code, severity, source, operator,"
        " dry_run, message, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            time,
            kind,
            subject,
            check_name,
            code,
            severity,
            source,
            operator,
            int(dry_run),
            message,
            json.dumps(dict(data or {}), sort_keys=True),
        ),
    )


def journal_poll(db: sqlite3.Connection, result: PolicyResult, now: float) -> None:
    """What one poll raised, cleared, changed and decided. An entry of a GPU
    or NVLink subject holds its board's `uuid` (in `data`): the subject is
    named by the index the board had then, which another board may have later."""

    def board(subject: str) -> dict[str, str]:
        state = result.state.subject(subject)
        return {"uuid": state.uuid} if state is not None and state.uuid else {}

    for finding in result.raised:
        insert(
            db,
            kind="finding_raised",
            time=now,
            subject=finding.subject,
            message=finding.message,
            check_name=finding.check,
            code=finding.code,
            severity=finding.severity.label,
            data={
                "action": finding.action.value,
                "definitive": finding.definitive,
                "immediate": finding.immediate,
                "evidence": dict(finding.evidence),
                **board(finding.subject),
            },
        )
    for cleared in result.cleared:
        insert(
            db,
            kind="finding_cleared",
            time=cleared.time,
            subject=cleared.subject,
            message=f"{cleared.check}/{cleared.code} cleared",
            check_name=cleared.check,
            code=cleared.code,
            data=board(cleared.subject),
        )
    for change in result.changes:
        before = change.before.label if change.before is not None else "new"
        _journal_health(
            db, change.time, change.subject, before, change.after.label, board=board(change.subject)
        )
    for decision in result.decisions:
        journal_decision(db, decision, None)


def journal_decision(db: sqlite3.Connection, decision: Decision, operator: str | None) -> None:
    insert(
        db,
        kind=decision.kind,
        time=decision.time,
        subject=decision.subject,
        message=decision.reason,
        code=decision.code,
        source=decision.source,
        operator=operator,
        dry_run=decision.dry_run,
        data={"uuid": decision.uuid} if decision.uuid else None,
    )


def journal_manual_health(
    db: sqlite3.Connection,
    prior: PolicyState,
    after: PolicyState,
    decision: Decision,
    operator: str,
) -> None:
    """The health change a manual decision makes, journaled as a poll's are:
    the next poll starts from the new health and so never reports it."""
    before_state = prior.subject(decision.subject)
    after_state = after.subject(decision.subject)
    if after_state is None:
        return
    before = before_state.health.label if before_state is not None else "new"
    now = after_state.health.label
    if before != now:
        board = {"uuid": after_state.uuid} if after_state.uuid else None
        _journal_health(
            db, decision.time, decision.subject, before, now, decision.source, operator, board
        )


def _journal_health(
    db: sqlite3.Connection,
    time: float,
    subject: str,
    before: str,
    after: str,
    source: str | None = None,
    operator: str | None = None,
    board: Mapping[str, str] | None = None,
) -> None:
    insert(
        db,
        kind="health_changed",
        time=time,
        subject=subject,
        message=f"{before} -> {after}",
        source=source,
        operator=operator,
        data={"before": before, "after": after, **(board or {})},
    )


def _entry(row: sqlite3.Row) -> JournalEntry:
    return JournalEntry(
        id=row["id"],
        time=row["time"],
        kind=row["kind"],
        subject=row["subject"],
        message=row["message"],
        check=row["check_name"],
        code=row["code"],
        severity=row["severity"],
        source=row["source"],
        operator=row["operator"],
        dry_run=bool(row["dry_run"]),
        data=json.loads(row["data"]),
        fault_code=fault_code(row["code"]),
    )
