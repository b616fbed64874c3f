"""The webhook outbox: events written in the same transaction as the
decisions they report, delivered in order per webhook by the senders in
`gpuwatchd.actions.webhook`. An event is written once; each webhook has its
own row for it, so that one receiver being down holds back only its own
queue. `webhook_alerts` holds the alerts a webhook was sent as firing, so
that it gets their resolution and no resolution of an alert it never saw."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatchd.model import Decision
from gpuwatchd.store.database import Database

PENDING = "pending"
DEAD_LETTER = "dead_letter"


@dataclass(frozen=True)
class OutboxEvent:
    """An event for the named webhooks, written in the transaction of the
    decisions it reports. `data` is the event as JSON (gpuwatchd.actions.events)."""

    time: float
    data: Mapping[str, Any]
    webhooks: tuple[str, ...]


# The events of a manual decision, made once the store has decided it.
EventsOf = Callable[[Decision], Sequence[OutboxEvent]]


@dataclass(frozen=True)
class OutboxItem:
    """The oldest pending event of one webhook's queue."""

    webhook: str
    event_id: int
    key: str  # unique per event: the Idempotency-Key of its deliveries
    time: float
    data: Mapping[str, Any]
    attempts: int
    next_attempt: float
    last_error: str | None


@dataclass(frozen=True)
class OpenAlert:
    """An alert a webhook was sent as firing and not yet as resolved."""

    since: float
    severity: str


@dataclass(frozen=True)
class OutboxCounts:
    pending: int = 0
    dead_letters: int = 0


class Outbox:
    def __init__(self, database: Database) -> None:
        self._database = database

    def head(self, webhook: str) -> OutboxItem | None:
        """The oldest pending event of `webhook`: its queue is strictly in order."""
        with self._database.reading() as db:
            row = db.execute(
                f"{_OUTBOX_ITEMS} WHERE o.webhook = ? AND o.state = ? ORDER BY o.event_id LIMIT 1",
                (webhook, PENDING),
            ).fetchone()
        return None if row is None else _outbox_item(row)

    def remove(
        self, item: OutboxItem, alert: str | None = None, opened: OpenAlert | None = None
    ) -> None:
        """Take a delivered (or skipped) event off its queue. With `alert`, the
        webhook now has that alert `opened`, or closed when None."""
        with self._database.writing() as db:
            db.execute(
                "DELETE FROM outbox WHERE webhook = ? AND event_id = ?",
                (item.webhook, item.event_id),
            )
            if alert is not None and opened is not None:
                db.execute(
                    "INSERT OR REPLACE INTO webhook_alerts VALUES (?, ?, ?, ?)",
                    (item.webhook, alert, opened.since, opened.severity),
                )
            elif alert is not None:
                db.execute(
                    "DELETE FROM webhook_alerts WHERE webhook = ? AND alert = ?",
                    (item.webhook, alert),
                )
            _forget_delivered_events(db)

    def retry(self, item: OutboxItem, next_attempt: float, error: str) -> None:
        with self._database.writing() as db:
            db.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_attempt = ?, last_error = ?"
                " WHERE webhook = ? AND event_id = ?",
                (next_attempt, error, item.webhook, item.event_id),
            )

    def dead_letter(self, item: OutboxItem, now: float, error: str) -> None:
        """Give up on an event: it stays, out of the queue, for `status` to show."""
        with self._database.writing() as db:
            db.execute(
                "UPDATE outbox SET state = ?, attempts = attempts + 1, last_error = ?,"
                " done_time = ? WHERE webhook = ? AND event_id = ?",
                (DEAD_LETTER, error, now, item.webhook, item.event_id),
            )

    def open_alert(self, webhook: str, alert: str) -> OpenAlert | None:
        """`alert` as `webhook` was last sent it firing; None when it is not open."""
        with self._database.reading() as db:
            row = db.execute(
                "SELECT since, severity FROM webhook_alerts WHERE webhook = ? AND alert = ?",
                (webhook, alert),
            ).fetchone()
        return None if row is None else OpenAlert(row["since"], row["severity"])

    def counts(self) -> dict[str, OutboxCounts]:
        """Pending and dead-lettered events per webhook."""
        with self._database.reading() as db:
            rows = db.execute(
                "SELECT webhook, state, COUNT(*) AS n FROM outbox GROUP BY webhook, state"
            ).fetchall()
        counts: dict[str, OutboxCounts] = {}
        for row in rows:
            held = counts.get(row["webhook"], OutboxCounts())
            if row["state"] == PENDING:
                counts[row["webhook"]] = OutboxCounts(row["n"], held.dead_letters)
            else:
                counts[row["webhook"]] = OutboxCounts(held.pending, row["n"])
        return counts

    def prune(self, webhooks: Iterable[str], now: float, keep_dead_letters: float) -> int:
        """Drop the queues of webhooks no longer configured (returns how many
        events they held) and dead letters older than `keep_dead_letters`."""
        names = sorted(set(webhooks))
        marks = ", ".join("?" for _ in names)
        with self._database.writing() as db:
            dropped = db.execute(
                f"DELETE FROM outbox WHERE webhook NOT IN ({marks})", names
            ).rowcount
            db.execute(f"DELETE FROM webhook_alerts WHERE webhook NOT IN ({marks})", names)
            db.execute(
                "DELETE FROM outbox WHERE state = ? AND done_time < ?",
                (DEAD_LETTER, now - keep_dead_letters),
            )
            _forget_delivered_events(db)
        return int(dropped)


def enqueue(db: sqlite3.Connection, events: Iterable[OutboxEvent]) -> None:
    for event in events:
        if not event.webhooks:
            continue
        cursor = db.execute(
            "INSERT INTO events (key, time, data) VALUES (?, ?, ?)",
            (uuid.uuid4().hex, event.time, json.dumps(dict(event.data), sort_keys=True)),
        )
        db.executemany(
            "INSERT INTO outbox (webhook, event_id, state, next_attempt) VALUES (?, ?, ?, ?)",
            [(webhook, cursor.lastrowid, PENDING, event.time) for webhook in event.webhooks],
        )


_OUTBOX_ITEMS = (
    "SELECT o.webhook, o.event_id, o.attempts, o.next_attempt, o.last_error,"
    " e.key, e.time, e.data FROM outbox o JOIN events e ON e.id = o.event_id"
)


def _outbox_item(row: sqlite3.Row) -> OutboxItem:
    return OutboxItem(
        webhook=row["webhook"],
        event_id=row["event_id"],
        key=row["key"],
        time=row["time"],
        data=json.loads(row["data"]),
        attempts=row["attempts"],
        next_attempt=row["next_attempt"],
        last_error=row["last_error"],
    )


def _forget_delivered_events(db: sqlite3.Connection) -> None:
    """Events no webhook holds any more (delivered everywhere, or pruned)."""
    db.execute("DELETE FROM events WHERE id NOT IN (SELECT event_id FROM outbox)")
