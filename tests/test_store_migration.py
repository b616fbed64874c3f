"""A state database of an earlier version, whose GPUs were keyed by their
NVML index, opened by this gpuwatchd: each row goes to its board by the
index-to-UUID mapping recorded at its time, or is dropped, said in one line."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from gpuwatchd.store import DB_NAME, Store
from gpuwatchd.store.schema import MIGRATIONS, SCHEMA_VERSION

BOARD_3 = "GPU-33333333-3333-3333-3333-333333333333"
BOARD_5 = "GPU-55555555-5555-5555-5555-555555555555"
INDEX_KEYED = 4  # the last schema version that keyed GPUs by index


def _quarantine(db: sqlite3.Connection, subject: str, hardware: bool) -> None:
    db.execute(
        "INSERT INTO quarantines VALUES (?, 'row_remap_failure', 'auto', 100.0, ?, NULL,"
        " 'row_remap_failure', 0)",
        (subject, int(hardware)),
    )


def _sample(db: sqlite3.Connection, index: int, uuid: str | None) -> None:
    data = {"index": index, "up": True, "uuid": uuid, "pci_bus_id": f"00000000:{index:02X}:00.0"}
    db.execute(
        "INSERT INTO last_samples VALUES (?, 'gpu', 500.0, ?)", (f"gpu:{index}", json.dumps(data))
    )


@pytest.fixture
def earlier(tmp_path: Path) -> Path:
    """A version-4 database: GPU 3 (BOARD_3) condemned, its NVLink 3/1 drained,
    GPU 7 quarantined by hand with no sample to name its board, GPU 3's and
    the node's health states, and XIDs of boards 3 and 5 in two boots."""
    state = tmp_path / "state"
    state.mkdir()
    db = sqlite3.connect(state / DB_NAME, isolation_level=None)
    for migration in MIGRATIONS[:INDEX_KEYED]:
        assert isinstance(migration, str)
        for statement in migration.split(";"):
            if statement.strip():
                db.execute(statement)
    db.execute(f"PRAGMA user_version = {INDEX_KEYED}")
    _quarantine(db, "gpu:3", hardware=True)
    _quarantine(db, "nvlink:3/1", hardware=False)
    _quarantine(db, "gpu:7", hardware=False)
    _quarantine(db, "node", hardware=False)
    _sample(db, 3, BOARD_3)
    _sample(db, 4, None)
    states = [
        {"subject": subject, "health": "quarantined", "since": 100.0, "bad_since": None,
         "critical_since": None, "last_bad": 100.0, "findings": [], "acknowledged": []}
        for subject in ("gpu:3", "gpu:7", "node")
    ]  # fmt: skip
    db.execute("UPDATE policy_state SET subjects = ?", (json.dumps(states),))
    db.execute("INSERT INTO boots (boot_id, first_seen) VALUES ('boot-a', 1.0), ('boot-b', 2.0)")
    xids = [
        ("boot-a", 3, 79, BOARD_3),
        ("boot-a", 5, 48, BOARD_5),
        # An XID whose UUID was not known then: board 5's, by its other XID of that boot.
        ("boot-a", 5, 62, None),
        # One no other row of its boot names.
        ("boot-b", 6, 62, None),
    ]
    db.executemany(
        "INSERT INTO boot_xids (boot_id, gpu, code, uuid, first_time, last_time, count)"
        " VALUES (?, ?, ?, ?, 10.0, 10.0, 1)",
        xids,
    )
    db.close()
    return state


def test_index_keyed_quarantines_go_to_the_board_recorded_at_their_index(earlier: Path) -> None:
    store = Store.open(str(earlier))
    try:
        quarantines = {q.subject: q for q in store.quarantines()}
        state = store.load_state()
    finally:
        store.close()
    assert set(quarantines) == {"gpu:3", "nvlink:3/1", "node"}
    condemned = quarantines["gpu:3"]
    assert (condemned.uuid, condemned.last_index, condemned.pci_bus_id) == (
        BOARD_3,
        3,
        "00000000:03:00.0",
    )
    assert condemned.hardware
    assert quarantines["nvlink:3/1"].uuid == BOARD_3
    assert quarantines["node"].uuid is None
    assert {s.subject: s.uuid for s in state.subjects} == {"gpu:3": BOARD_3, "node": None}


def test_rows_of_an_index_no_mapping_names_are_dropped_with_one_line_each(
    earlier: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        Store.open(str(earlier)).close()
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "quarantine" in line] == [
        "state database: the quarantine(s) of gpu:7 dropped: no GPU UUID is recorded for their"
        " index"
    ]
    assert any("health state(s) of gpu:7 dropped" in line for line in lines)
    assert any("saved sample(s) of gpu:4 dropped" in line for line in lines)
    assert any("1 XID record(s) of earlier boots dropped" in line for line in lines)


def test_the_boots_xids_and_the_last_samples_are_keyed_by_board(earlier: Path) -> None:
    store = Store.open(str(earlier))
    try:
        record = store.boots.record()
        boards = store.samples.boards()
    finally:
        store.close()
    assert {(x.boot_id, x.uuid, x.code) for x in record.xids} == {
        ("boot-a", BOARD_3, 79),
        ("boot-a", BOARD_5, 48),
        ("boot-a", BOARD_5, 62),
    }
    assert record.reboots_since_first(BOARD_5, 62, since=0.0) == 1
    assert [(b.uuid, b.index) for b in boards] == [(BOARD_3, 3)]


def test_the_migrated_database_is_of_this_version(earlier: Path) -> None:
    Store.open(str(earlier)).close()
    db = sqlite3.connect(earlier / DB_NAME)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        db.close()
