"""Durable state: one sqlite file in the state directory, a module per concern.

- database.py: the connection they share (WAL, synchronous=FULL, the
  daemon's exclusive lock, the messages of StoreError) and schema.py, the
  one list of migrations;
- policy_state.py: quarantines and every subject's health tracking;
- journal.py: findings, health changes, decisions and actions;
- outbox.py: the webhook events waiting for delivery;
- boots.py: the boots seen and the XIDs of each;
- facts.py: what the node learned about its hardware;
- canary.py: the canaries' mismatch history;
- dcgm.py: the DCGM diagnostics `canary --dcgm` ran, by board;
- samples.py: the last sample of every GPU, port and PCIe function;
- store.py: `Store`, which holds them and writes a poll in one transaction.
"""

from gpuwatchd.store.boots import read_boot_id
from gpuwatchd.store.database import DB_NAME, LOCK_WAIT_SECONDS, StoreError
from gpuwatchd.store.journal import JournalEntry
from gpuwatchd.store.outbox import OpenAlert, OutboxCounts, OutboxEvent, OutboxItem
from gpuwatchd.store.store import EventsOf, StateConflict, Store, UnsavedPoll

__all__ = [
    "DB_NAME",
    "LOCK_WAIT_SECONDS",
    "EventsOf",
    "JournalEntry",
    "OpenAlert",
    "OutboxCounts",
    "OutboxEvent",
    "OutboxItem",
    "StateConflict",
    "Store",
    "StoreError",
    "UnsavedPoll",
    "read_boot_id",
]
