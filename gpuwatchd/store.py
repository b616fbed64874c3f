"""Durable state: one sqlite file in the state directory, in WAL mode.

Owns quarantines, the append-only journal (findings raised and cleared, health
changes, decisions, what the actions did), the policy state, the boots seen
and the XIDs of each, the last sample of every GPU and port (so that rates
are right across a restart), facts learned about the node (its GPUs at the
first healthy start) and the webhook outbox: events written in the
same transaction as the decisions they report, delivered in order per
webhook by the senders in `gpuwatchd.actions.webhook`. Every write is one
transaction with `synchronous=FULL`: a process killed at any moment,
SIGKILL included, loses no committed quarantine.

It also keeps the hardware the node learned it must keep (`expect`), so that
a part gone after a restart or reboot is missed by name.

A database that cannot be opened, read or written raises `StoreError`, whose
message names the file and what to do; the daemon can go on monitoring with
`Store.in_memory()` (`persistent` is False) and export that it cannot persist.

The daemon opens it `exclusive`: sqlite's exclusive locking mode, set before
the first access in WAL mode, keeps the WAL index in the process's heap
instead of a memory-mapped `-shm` file (sqlite.org/wal.html, "Use of WAL
Without Shared-Memory"). A `-shm` file whose pages cannot be written (made
immutable, or on a full tmpfs) killed the daemon with SIGBUS inside sqlite's
mapping of it; now there is none to map. The price: while the daemon runs no
other process can open the database (`StoreError.held`, after
`LOCK_WAIT_SECONDS`), so the CLI reads and writes through the daemon's API
and uses the database itself, with `quarantine()` and `release()`, only when
no daemon runs. The policy state carries the store's revision, and
`save_poll` refuses (`StateConflict`) to overwrite a manual change made since
it was read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from typing import Any

from gpuwatchd.checks.xid import BootRecord, BootXid
from gpuwatchd.model import (
    Decision,
    GpuSample,
    LinkSample,
    PcieFunctionSample,
    PortSample,
    Quarantine,
    Reading,
)
from gpuwatchd.policy import (
    D,
    ManualResult,
    PolicyResult,
    PolicyState,
    decode_subjects,
    encode_subjects,
    quarantine_manually,
    release_manually,
)

log = logging.getLogger(__name__)

DB_NAME = "state.db"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# A boot id is a UUID; read a little more, so that a longer file is refused.
_MAX_BOOT_ID_BYTES = 64
_BOOT_ID_RE = re.compile(r"[0-9A-Za-z-]{1,64}")

# Schema migrations: entry N takes a database from version N to N + 1
# (`PRAGMA user_version`). Append, never edit.
MIGRATIONS: tuple[str, ...] = (
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
)
SCHEMA_VERSION = len(MIGRATIONS)

# How long an open waits for another process's lock before giving up with
# `StoreError.held`. Other processes hold the database for milliseconds (one
# CLI command); the daemon holds it while it runs, so waiting longer would
# only delay the message.
LOCK_WAIT_SECONDS = 2.0
_HELD = "held by another process"

PENDING = "pending"
DEAD_LETTER = "dead_letter"


class StoreError(RuntimeError):
    """The state database cannot be used; the message says which file and why."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"state database {path}: {problem}")
        self.path = path
        self.problem = problem

    @property
    def damaged(self) -> bool:
        """The file is not a sound sqlite database (as opposed to one that
        cannot be reached, written or is newer than this gpuwatchd)."""
        return self.problem.startswith(
            ("not a readable sqlite database", "the database is damaged")
        )

    @property
    def held(self) -> bool:
        """Another process holds the database (a running daemon keeps it
        locked while it runs)."""
        return self.problem.startswith(_HELD)


@dataclass(frozen=True)
class UnsavedPoll:
    """What a poll wanted written beside the state when the database could
    not take it: kept by the daemon and written with a later poll."""

    result: PolicyResult
    now: float
    boot_id: str | None
    readings: tuple[Reading, ...]  # those with XID events
    events: tuple[OutboxEvent, ...]

    @property
    def empty(self) -> bool:
        r = self.result
        return not (
            r.raised or r.cleared or r.changes or r.decisions or self.events or self.readings
        )


class StateConflict(RuntimeError):
    """The state changed in the database (a manual quarantine or release) since
    it was read: load it again and evaluate again."""


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


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot (a UUID); it changes at every reboot.
    OSError when it cannot be read, ValueError when it is not such an id."""
    with open(path, "rb") as handle:
        text = handle.read(_MAX_BOOT_ID_BYTES + 1).decode("ascii", "replace").strip()
    if not _BOOT_ID_RE.fullmatch(text):
        raise ValueError(f"{path} does not hold a boot id: {text[:40]!r}")
    return text


class Store:
    """The state database. Open with `Store.open(state_dir)`; one instance may
    be shared by threads (calls are serialised)."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        path: str,
        persistent: bool,
        exclusive: bool = False,
    ) -> None:
        self._db = connection
        self._lock = threading.RLock()
        self.path = path
        self.persistent = persistent
        self.exclusive = exclusive
        self._identity: tuple[int, int] | None = None

    @classmethod
    def open(
        cls, state_dir: str, *, exclusive: bool = False, wait: float = LOCK_WAIT_SECONDS
    ) -> Store:
        """The database in `state_dir`, made when missing. `exclusive` (the
        daemon's): held, with no -shm file, until closed. `wait`: how long to
        wait for another process's lock (StoreError.held after that)."""
        path = os.path.join(state_dir, DB_NAME)
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
        except OSError as error:
            raise StoreError(
                path, f"cannot create the state directory: {error.strerror}"
            ) from error
        store = cls(_connect(path, exclusive, wait), path, persistent=True, exclusive=exclusive)
        try:
            store._prepare(wal=True)
        except StoreError:
            store.close()
            raise
        return store

    def reopen_if_replaced(self) -> bool:
        """When the database file was removed or replaced since it was opened
        (sqlite would go on writing to the removed file, lost at exit), start
        a new one at its path and return True: the caller writes its state
        into it. Raises StoreError when that cannot be done."""
        if not self.persistent or self._identity == _identity(self.path):
            return False
        with self._lock:
            self._db.close()
            self._db = _connect(self.path, self.exclusive, LOCK_WAIT_SECONDS)
            self._prepare(wal=True)
        return True

    @classmethod
    def in_memory(cls) -> Store:
        """A store that forgets at exit: for a daemon whose database is unusable,
        so that policy goes on working while `persistent` says it is not kept."""
        connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        store = cls(connection, ":memory:", persistent=False)
        store._prepare(wal=False)
        return store

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- canary mismatch history ----------------------------------------------

    def canary_mismatches(self, since: float) -> list[dict[str, Any]]:
        """The canaries' mismatch records from `since` on, oldest first."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT data FROM canary_mismatches WHERE time >= ? ORDER BY id", (since,)
            ).fetchall()
        return [json.loads(row[0]) for row in rows]

    def record_canary_mismatches(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append mismatch records (each with `time` and `target`)."""
        with self._writing() as db:
            db.executemany(
                "INSERT INTO canary_mismatches (time, target, data) VALUES (?, ?, ?)",
                [(row["time"], row["target"], json.dumps(dict(row))) for row in rows],
            )

    # --- policy state and quarantines ---------------------------------------

    def load_state(self) -> PolicyState:
        with self._reading() as db:
            return self._state(db)

    def quarantines(self) -> tuple[Quarantine, ...]:
        with self._reading() as db:
            return self._quarantines(db)

    def save_poll(
        self,
        result: PolicyResult,
        *,
        now: float,
        boot_id: str | None = None,
        readings: Iterable[Reading] = (),
        events: Sequence[OutboxEvent] = (),
        earlier: Sequence[UnsavedPoll] = (),
    ) -> PolicyState:
        """Write one poll in one transaction: its quarantines, policy state,
        journal, XIDs (under `boot_id`), the readings' samples and the webhook
        events it raised, after the journal, XIDs and events of the `earlier`
        polls that could not be written. Raises StateConflict, writing
        nothing, when the state changed since it was read."""
        readings = tuple(readings)
        with self._writing() as db:
            revision = self._revision(db)
            if revision != result.state.revision:
                raise StateConflict(
                    f"state revision {revision} in the database, {result.state.revision} evaluated"
                )
            changed = self._write_state(db, result.state)
            for poll in (*earlier, UnsavedPoll(result, now, boot_id, readings, tuple(events))):
                self._journal_poll(db, poll.result, poll.now)
                if poll.boot_id is not None:
                    self._record_xids(db, poll.boot_id, poll.readings, poll.now)
                _enqueue(db, poll.events)
            self._record_samples(db, readings)
            if changed:
                revision += 1
                db.execute("UPDATE policy_state SET revision = ?", (revision,))
        return PolicyState(result.state.subjects, result.state.quarantines, revision)

    def restore(self, state: PolicyState) -> PolicyState:
        """Write a state kept in memory into a database that lost it (one
        made anew by `reopen_if_replaced`); the state with its new revision."""
        with self._writing() as db:
            self._write_state(db, state)
            db.execute("UPDATE policy_state SET revision = revision + 1")
            revision = self._revision(db)
        return PolicyState(state.subjects, state.quarantines, revision)

    def quarantine(
        self,
        subject: str,
        reason: str,
        operator: str,
        now: float,
        events: EventsOf | None = None,
    ) -> Decision | None:
        """Quarantine a subject by hand (the CLI, with or without the daemon);
        `events` gives the webhook events of the decision, written with it.
        None when it is already quarantined (nothing is changed)."""
        return self._manual(
            lambda state: quarantine_manually(state, subject, reason, operator, now),
            operator,
            events,
        )

    def release(
        self,
        subject: str,
        operator: str,
        now: float,
        reason: str = "",
        events: EventsOf | None = None,
    ) -> Decision | None:
        """Release a subject by hand; None when it was not quarantined."""
        return self._manual(
            lambda state: release_manually(state, subject, operator, now, reason),
            operator,
            events,
        )

    # --- journal --------------------------------------------------------------

    def journal(
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
        with self._reading() as db:
            rows = db.execute(query, [*parameters, max(0, limit)]).fetchall()
        return tuple(_entry(row) for row in reversed(rows))

    def prune_journal(self, before: float, keep_kinds: Iterable[str]) -> int:
        """Delete journal entries older than `before`, except those of
        `keep_kinds`; how many were deleted."""
        keep = tuple(keep_kinds)
        marks = ", ".join("?" * len(keep)) or "NULL"
        with self._writing() as db:
            cursor = db.execute(
                f"DELETE FROM journal WHERE time < ? AND kind NOT IN ({marks})", (before, *keep)
            )
        return cursor.rowcount

    def notes(self, kind: str, prefix: str) -> tuple[str, ...]:
        """The messages of the journal entries of `kind` that start with `prefix`."""
        with self._reading() as db:
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
        with self._writing() as db:
            _insert(
                db,
                kind=kind,
                time=now,
                subject=subject,
                message=message,
                operator=operator,
                dry_run=dry_run,
                data=data,
            )

    # --- webhook outbox ---------------------------------------------------------------

    def outbox_head(self, webhook: str) -> OutboxItem | None:
        """The oldest pending event of `webhook`: its queue is strictly in order."""
        with self._reading() as db:
            row = db.execute(
                f"{_OUTBOX_ITEMS} WHERE o.webhook = ? AND o.state = ? ORDER BY o.event_id LIMIT 1",
                (webhook, PENDING),
            ).fetchone()
        return None if row is None else _outbox_item(row)

    def outbox_remove(
        self, item: OutboxItem, alert: str | None = None, opened: OpenAlert | None = None
    ) -> None:
        """Take a delivered (or skipped) event off its queue. With `alert`, the
        webhook now has that alert `opened`, or closed when None."""
        with self._writing() as db:
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

    def outbox_retry(self, item: OutboxItem, next_attempt: float, error: str) -> None:
        with self._writing() as db:
            db.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_attempt = ?, last_error = ?"
                " WHERE webhook = ? AND event_id = ?",
                (next_attempt, error, item.webhook, item.event_id),
            )

    def outbox_dead_letter(self, item: OutboxItem, now: float, error: str) -> None:
        """Give up on an event: it stays, out of the queue, for `status` to show."""
        with self._writing() as db:
            db.execute(
                "UPDATE outbox SET state = ?, attempts = attempts + 1, last_error = ?,"
                " done_time = ? WHERE webhook = ? AND event_id = ?",
                (DEAD_LETTER, error, now, item.webhook, item.event_id),
            )

    def open_alert(self, webhook: str, alert: str) -> OpenAlert | None:
        """`alert` as `webhook` was last sent it firing; None when it is not open."""
        with self._reading() as db:
            row = db.execute(
                "SELECT since, severity FROM webhook_alerts WHERE webhook = ? AND alert = ?",
                (webhook, alert),
            ).fetchone()
        return None if row is None else OpenAlert(row["since"], row["severity"])

    def outbox_counts(self) -> dict[str, OutboxCounts]:
        """Pending and dead-lettered events per webhook."""
        with self._reading() as db:
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

    def outbox_prune(self, webhooks: Iterable[str], now: float, keep_dead_letters: float) -> int:
        """Drop the queues of webhooks no longer configured (returns how many
        events they held) and dead letters older than `keep_dead_letters`."""
        names = sorted(set(webhooks))
        marks = ", ".join("?" for _ in names)
        with self._writing() as db:
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

    # --- boots and XIDs -----------------------------------------------------------

    def record_boot(self, boot_id: str, now: float) -> None:
        with self._writing() as db:
            db.execute(
                "INSERT OR IGNORE INTO boots (boot_id, first_seen) VALUES (?, ?)", (boot_id, now)
            )

    def boot_record(self, boots: int = 16) -> BootRecord:
        """The last `boots` boots (the current one last) and the XIDs seen in them."""
        with self._reading() as db:
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

    # --- facts learned about the node ----------------------------------------------

    def fact(self, key: str) -> Any:
        """The JSON value recorded under `key`, or None."""
        with self._reading() as db:
            row = db.execute("SELECT data FROM facts WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row["data"])

    def record_fact(self, key: str, value: Any, now: float) -> None:
        with self._writing() as db:
            db.execute(
                "INSERT INTO facts (key, time, data) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET time = excluded.time, data = excluded.data",
                (key, now, json.dumps(value, sort_keys=True)),
            )

    # --- samples across restarts --------------------------------------------------

    def last_readings(self, now: float, max_age: float) -> tuple[Reading, ...]:
        """The last saved sample of every GPU, port and PCIe function no older than `max_age`,
        as readings to record into History before the first poll."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT kind, time, data FROM last_samples WHERE time >= ? ORDER BY time",
                (now - max_age,),
            ).fetchall()
        gpus: dict[float, list[GpuSample]] = defaultdict(list)
        ports: dict[float, list[PortSample]] = defaultdict(list)
        functions: dict[float, list[PcieFunctionSample]] = defaultdict(list)
        for row in rows:
            try:
                data = json.loads(row["data"])
                if row["kind"] == "gpu":
                    gpus[row["time"]].append(_decode_gpu(data))
                elif row["kind"] == "pcie":
                    functions[row["time"]].append(_decode_pcie(data))
                else:
                    ports[row["time"]].append(_decode_port(data))
            except (ValueError, TypeError, KeyError) as error:
                # A baseline that no longer decodes (an older model) only costs one rate.
                log.warning("skipping a saved sample that does not decode: %s", error)
        return tuple(
            Reading(
                source="store",
                time=time,
                gpus=tuple(gpus[time]) if time in gpus else None,
                ports=tuple(ports[time]) if time in ports else None,
                pcie_functions=tuple(functions[time]) if time in functions else None,
            )
            for time in sorted(gpus.keys() | ports.keys() | functions.keys())
        )

    # --- internals ------------------------------------------------------------------

    def _prepare(self, wal: bool) -> None:
        self._db.row_factory = sqlite3.Row
        if self.persistent:
            self._identity = _identity(self.path)
        with self._errors():
            if wal:
                mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(self.path, f"cannot use WAL mode (journal mode is {mode})")
            # FULL: a commit is on disk before it returns, across a power loss too.
            self._db.execute("PRAGMA synchronous=FULL")
            check = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StoreError(
                    self.path,
                    f"the database is damaged ({check}); move it aside to start afresh "
                    "(quarantines and the journal in it are then lost) or restore a copy",
                )
            self._migrate()

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                self.path,
                f"schema version {version} is newer than this gpuwatchd knows "
                f"({SCHEMA_VERSION}): run the newer gpuwatchd or restore an older copy",
            )
        with self._writing() as db:
            for number in range(version, SCHEMA_VERSION):
                for statement in _statements(MIGRATIONS[number]):
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as error:
            raise StoreError(self.path, _explain(error)) from error

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query in it sees one committed state."""
        with self._transaction("BEGIN") as db:
            yield db

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """A write transaction. IMMEDIATE takes the write lock up front, so two
        writers (the daemon and the CLI) wait for each other, never deadlock."""
        with self._transaction("BEGIN IMMEDIATE") as db:
            yield db

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        with self._lock, self._errors():
            self._db.execute(begin)
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _manual(
        self,
        change: Callable[[PolicyState], ManualResult[D]],
        operator: str,
        events: EventsOf | None,
    ) -> D:
        with self._writing() as db:
            prior = self._state(db)
            result = change(prior)
            if result.decision is not None:
                self._write_state(db, result.state)
                db.execute("UPDATE policy_state SET revision = revision + 1")
                _journal_decision(db, result.decision, operator)
                _journal_manual_health(db, prior, result.state, result.decision, operator)
                if events is not None:
                    _enqueue(db, events(result.decision))
            return result.decision

    @staticmethod
    def _revision(db: sqlite3.Connection) -> int:
        revision: int = db.execute("SELECT revision FROM policy_state").fetchone()[0]
        return revision

    def _state(self, db: sqlite3.Connection) -> PolicyState:
        row = db.execute("SELECT revision, subjects FROM policy_state").fetchone()
        return PolicyState(
            subjects=decode_subjects(row["subjects"]),
            quarantines=self._quarantines(db),
            revision=row["revision"],
        )

    @staticmethod
    def _quarantines(db: sqlite3.Connection) -> tuple[Quarantine, ...]:
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
            )
            for row in rows
        )

    def _write_state(self, db: sqlite3.Connection, state: PolicyState) -> bool:
        """Write what differs from the database; True when anything did."""
        before = set(self._quarantines(db))
        after = set(state.quarantines)
        for gone in before - after:
            db.execute("DELETE FROM quarantines WHERE subject = ?", (gone.subject,))
        for new in after - before:
            db.execute(
                "INSERT OR REPLACE INTO quarantines VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    new.subject,
                    new.reason,
                    new.source,
                    new.since,
                    int(new.hardware),
                    new.operator,
                    new.code,
                    int(new.dry_run),
                ),
            )
        subjects = encode_subjects(state.subjects)
        stored = db.execute("SELECT subjects FROM policy_state").fetchone()[0]
        if subjects != stored:
            db.execute("UPDATE policy_state SET subjects = ?", (subjects,))
        return before != after or subjects != stored

    @staticmethod
    def _journal_poll(db: sqlite3.Connection, result: PolicyResult, now: float) -> None:
        for finding in result.raised:
            _insert(
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
                    "evidence": dict(finding.evidence),
                },
            )
        for cleared in result.cleared:
            _insert(
                db,
                kind="finding_cleared",
                time=cleared.time,
                subject=cleared.subject,
                message=f"{cleared.check}/{cleared.code} cleared",
                check_name=cleared.check,
                code=cleared.code,
            )
        for change in result.changes:
            before = change.before.label if change.before is not None else "new"
            _journal_health(db, change.time, change.subject, before, change.after.label)
        for decision in result.decisions:
            _journal_decision(db, decision, None)

    @staticmethod
    def _record_xids(
        db: sqlite3.Connection, boot_id: str, readings: Iterable[Reading], now: float
    ) -> None:
        db.execute(
            "INSERT OR IGNORE INTO boots (boot_id, first_seen) VALUES (?, ?)", (boot_id, now)
        )
        for reading in readings:
            for event in reading.xid_events:
                db.execute(
                    """
                    INSERT INTO boot_xids (boot_id, gpu, code, uuid, first_time, last_time, count)
                    VALUES (?, ?, ?, ?, ?, ?, 1)
                    ON CONFLICT (boot_id, gpu, code) DO UPDATE SET
                        last_time = MAX(last_time, excluded.last_time),
                        count = count + 1,
                        uuid = COALESCE(excluded.uuid, uuid)
                    """,
                    (boot_id, event.gpu, event.code, event.uuid, event.time, event.time),
                )

    @staticmethod
    def _record_samples(db: sqlite3.Connection, readings: Iterable[Reading]) -> None:
        readings = tuple(readings)
        # One statement for all rows of a kind: sqlite prepares it once.
        db.executemany(
            "INSERT OR REPLACE INTO last_samples VALUES (?, 'gpu', ?, ?)",
            [
                (gpu.subject, reading.time, json.dumps(_encode_gpu(gpu)))
                for reading in readings
                for gpu in reading.gpus or ()
            ],
        )
        db.executemany(
            "INSERT OR REPLACE INTO last_samples VALUES (?, 'port', ?, ?)",
            [
                (port.subject, reading.time, json.dumps(_encode_port(port)))
                for reading in readings
                for port in reading.ports or ()
            ],
        )
        # The AER counters' baseline: an error while the daemon was down
        # still shows as growth after it starts.
        db.executemany(
            "INSERT OR REPLACE INTO last_samples VALUES (?, 'pcie', ?, ?)",
            [
                (f"pcie:{function.address}", reading.time, json.dumps(_encode_pcie(function)))
                for reading in readings
                for function in reading.pcie_functions or ()
            ],
        )


def _connect(path: str, exclusive: bool, wait: float) -> sqlite3.Connection:
    # The journal holds operators' names and reasons: not for other users.
    # sqlite gives the -wal and -shm files the database's mode. Where this
    # fails, sqlite's own open says why. Only a new file is opened here:
    # closing any descriptor of an existing one would drop this process's
    # POSIX locks on it, a store's exclusive lock among them
    # (sqlite.org/howtocorrupt.html, 2.2).
    with suppress(OSError):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        connection = sqlite3.connect(
            path, timeout=wait, isolation_level=None, check_same_thread=False
        )
        if exclusive:
            # Before the first access in WAL mode (`_prepare`), or sqlite maps
            # a -shm file as it would for shared access.
            connection.execute("PRAGMA locking_mode=EXCLUSIVE")
        return connection
    except sqlite3.DatabaseError as error:
        raise StoreError(path, _explain(error)) from error


def _identity(path: str) -> tuple[int, int] | None:
    """The file at `path` (device, inode); None when there is none."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _insert(
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


def _enqueue(db: sqlite3.Connection, events: Iterable[OutboxEvent]) -> None:
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


def _journal_decision(db: sqlite3.Connection, decision: Decision, operator: str | None) -> None:
    _insert(
        db,
        kind=decision.kind,
        time=decision.time,
        subject=decision.subject,
        message=decision.reason,
        code=decision.code,
        source=decision.source,
        operator=operator,
        dry_run=decision.dry_run,
    )


def _journal_manual_health(
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
        _journal_health(db, decision.time, decision.subject, before, now, decision.source, operator)


def _journal_health(
    db: sqlite3.Connection,
    time: float,
    subject: str,
    before: str,
    after: str,
    source: str | None = None,
    operator: str | None = None,
) -> None:
    _insert(
        db,
        kind="health_changed",
        time=time,
        subject=subject,
        message=f"{before} -> {after}",
        source=source,
        operator=operator,
        data={"before": before, "after": after},
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
    )


def _statements(script: str) -> list[str]:
    # executescript() would commit the open transaction; the migrations hold
    # no semicolons in literals, so splitting on them is exact.
    return [statement.strip() for statement in script.split(";") if statement.strip()]


def _explain(error: sqlite3.DatabaseError) -> str:
    """What a sqlite error means for the operator, and what to do about it."""
    text = str(error)
    if "not a database" in text or "malformed" in text:
        return (
            f"not a readable sqlite database ({text}); move it aside to start afresh "
            "(quarantines and the journal in it are then lost) or restore a copy"
        )
    if "readonly" in text or "unable to open" in text or "disk I/O" in text:
        return f"cannot be written ({text}); check the state directory's permissions and mount"
    if "full" in text:
        return f"cannot be written ({text}); free space on the state directory's filesystem"
    if "locked" in text:
        return (
            f"{_HELD} ({text}): a running gpuwatchd keeps it while it runs, so ask it "
            "through its API, or stop it first"
        )
    return text


def _encode_gpu(sample: GpuSample) -> dict[str, Any]:
    """A GpuSample as JSON: mappings with tuple or int keys become lists."""
    data: dict[str, Any] = {f.name: getattr(sample, f.name) for f in fields(GpuSample)}
    data["throttle_seconds"] = dict(sample.throttle_seconds)
    data["ecc_errors"] = [[kind, scope, n] for (kind, scope), n in sample.ecc_errors.items()]
    data["retired_pages"] = dict(sample.retired_pages)
    data["nvlinks"] = [
        {"link": link.link, "up": link.up, "errors": dict(link.errors), "ber": dict(link.ber)}
        for link in sample.nvlinks
    ]
    data["xid_counts"] = [[code, n] for code, n in sample.xid_counts.items()]
    return data


def _decode_gpu(data: Mapping[str, Any]) -> GpuSample:
    known = {f.name for f in fields(GpuSample)}
    values = {key: value for key, value in data.items() if key in known}
    values["ecc_errors"] = {(kind, scope): n for kind, scope, n in data.get("ecc_errors", ())}
    values["nvlinks"] = tuple(
        LinkSample(
            gpu=data["index"],
            link=link["link"],
            up=link["up"],
            errors=link["errors"],
            ber=link.get("ber", {}),
        )
        for link in data.get("nvlinks", ())
    )
    values["xid_counts"] = {int(code): n for code, n in data.get("xid_counts", ())}
    return GpuSample(**values)


def _encode_port(sample: PortSample) -> dict[str, Any]:
    data: dict[str, Any] = {f.name: getattr(sample, f.name) for f in fields(PortSample)}
    data["counters"] = dict(sample.counters)
    data["hw_counters"] = dict(sample.hw_counters)
    return data


def _encode_pcie(sample: PcieFunctionSample) -> dict[str, Any]:
    data: dict[str, Any] = {f.name: getattr(sample, f.name) for f in fields(PcieFunctionSample)}
    data["aer_errors"] = dict(sample.aer_errors)
    data["aer_causes"] = dict(sample.aer_causes)
    return data


def _decode_pcie(data: Mapping[str, Any]) -> PcieFunctionSample:
    known = {f.name for f in fields(PcieFunctionSample)}
    return PcieFunctionSample(**{key: value for key, value in data.items() if key in known})


def _decode_port(data: Mapping[str, Any]) -> PortSample:
    known = {f.name for f in fields(PortSample)}
    return PortSample(**{key: value for key, value in data.items() if key in known})
