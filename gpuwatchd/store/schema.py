"""The state database's schema: one list of migrations for every concern.

Entry N takes a database from version N to N + 1 (`PRAGMA user_version`).
Append, never edit: a database of any earlier version is brought up to date
step by step when it is opened (database.py).
"""

from __future__ import annotations

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
