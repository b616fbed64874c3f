"""The connection every concern of the state database shares.

One sqlite file in the state directory, in WAL mode, `synchronous=FULL`:
every write is one transaction, on disk before it returns, so a process
killed at any moment, SIGKILL included, loses nothing committed. The schema
is brought up to date when the file is opened (schema.py).

The daemon opens it `exclusive`: sqlite's exclusive locking mode, set before
the first access in WAL mode, keeps the WAL index in the process's heap
instead of a memory-mapped `-shm` file (sqlite.org/wal.html, "Use of WAL
Without Shared-Memory"). A `-shm` file whose pages cannot be written (made
immutable, or on a full tmpfs) killed the daemon with SIGBUS inside sqlite's
mapping of it; now there is none to map. The price: while the daemon runs no
other process can open the database (`StoreError.held`, after
`LOCK_WAIT_SECONDS`), so the CLI reads and writes through the daemon's API
and uses the database itself only when no daemon runs.

A database that cannot be opened, read or written raises `StoreError`, whose
message names the file and what to do.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from gpuwatchd.store.schema import MIGRATIONS, SCHEMA_VERSION

DB_NAME = "state.db"
# How long an open waits for another process's lock before giving up with
# `StoreError.held`. Other processes hold the database for milliseconds (one
# CLI command); the daemon holds it while it runs, so waiting longer would
# only delay the message.
LOCK_WAIT_SECONDS = 2.0
_HELD = "held by another process"
_NEWER = "is newer than this gpuwatchd knows"


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

    @property
    def newer(self) -> bool:
        """The file's schema is newer than this gpuwatchd's (a rollback)."""
        return _NEWER in self.problem


class Database:
    """One connection to the state database, shared by threads (transactions
    are serialised). Open with `Database.open(state_dir)`."""

    def __init__(
        self, connection: sqlite3.Connection, path: str, persistent: bool, exclusive: bool
    ) -> None:
        self._db = connection
        self._lock = threading.RLock()
        self.path = path
        self.persistent = persistent
        self.exclusive = exclusive
        self._identity: tuple[int, int] | None = None

    @classmethod
    def open(cls, state_dir: str, *, exclusive: bool, wait: float) -> Database:
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
        database = cls(_connect(path, exclusive, wait), path, persistent=True, exclusive=exclusive)
        try:
            database._prepare(wal=True)
        except StoreError:
            database.close()
            raise
        return database

    @classmethod
    def in_memory(cls) -> Database:
        """A database that forgets at exit."""
        connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        database = cls(connection, ":memory:", persistent=False, exclusive=False)
        database._prepare(wal=False)
        return database

    def reopen_if_replaced(self) -> bool:
        """When the database file was removed or replaced since it was opened
        (sqlite would go on writing to the removed file, lost at exit), start
        a new one at its path and return True. Raises StoreError when that
        cannot be done."""
        if not self.persistent or self._identity == _identity(self.path):
            return False
        with self._lock:
            self._db.close()
            self._db = _connect(self.path, self.exclusive, LOCK_WAIT_SECONDS)
            self._prepare(wal=True)
        return True

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query in it sees one committed state."""
        with self._transaction("BEGIN") as db:
            yield db

    @contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
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

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as error:
            raise StoreError(self.path, _explain(error)) from error

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
                f"schema version {version} {_NEWER} ({SCHEMA_VERSION}): run the newer "
                "gpuwatchd or restore the copy taken before the upgrade",
            )
        with self.writing() as db:
            for number in range(version, SCHEMA_VERSION):
                migration = MIGRATIONS[number]
                if callable(migration):
                    migration(db)
                    continue
                for statement in _statements(migration):
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


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
