"""A gpuwatchd older than its state database, as after a rollback past a
release whose schema is newer (CHANGELOG.md, "Upgrade and rollback"): the
daemon runs without the database, knowing none of its quarantines, and
leaves the file as it was for the newer gpuwatchd; the CLI refuses it
offline with what to do. The newer database is made here by raising a
database's schema version past this gpuwatchd's, which is what an older
gpuwatchd finds."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from actions_support import free_port, write_config
from click.testing import CliRunner
from daemon_support import simulated_daemon

from gpuwatchd.cli import main
from gpuwatchd.daemon import open_store
from gpuwatchd.model import Health
from gpuwatchd.store import DB_NAME, Store
from gpuwatchd.store.schema import SCHEMA_VERSION

NEWER = SCHEMA_VERSION + 1
CALM = "node: {gpus: 2, nvlinks: 2, hcas: 1}\n"


def _newer_database(state_dir: Path) -> Path:
    """A database with the node quarantined by hand, at a schema version
    this gpuwatchd does not know."""
    with closing(Store.open(str(state_dir))) as store:
        store.quarantine("node", "RMA ticket 4711", "alice", 1.0)
    path = state_dir / DB_NAME
    with closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA user_version = {NEWER}")
    return path


def _schema_and_quarantines(path: Path) -> tuple[int, list[str]]:
    with closing(sqlite3.connect(path)) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        subjects = [row[0] for row in db.execute("SELECT subject FROM quarantines")]
    return version, subjects


def test_an_older_daemon_runs_without_a_newer_database_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _newer_database(tmp_path / "state")
    with caplog.at_level(logging.ERROR):
        store, lost = open_store(str(tmp_path / "state"), 2.0)
    store.close()
    assert not store.persistent and lost is None
    [record] = [r for r in caplog.records if "newer than this gpuwatchd" in r.getMessage()]
    assert f"schema version {NEWER}" in record.getMessage()
    assert "decisions will not survive a restart" in record.getMessage()
    # Not taken for a damaged database: nothing moved aside, nothing migrated.
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [DB_NAME]
    assert _schema_and_quarantines(path) == (NEWER, ["node"])


def test_an_older_daemon_knows_none_of_a_newer_databases_quarantines(tmp_path: Path) -> None:
    path = _newer_database(tmp_path / "state")
    with simulated_daemon(CALM, tmp_path) as sim:
        snapshot = sim.run_until(30)
        assert not snapshot.state_persisted
        # What the rollback note warns of: the node quarantined by hand in the
        # newer release is healthy here, until the newer gpuwatchd is back.
        assert snapshot.health["node"] is Health.HEALTHY
        sim.daemon.store.quarantine("gpu:0", "while rolled back", "bob", sim.clock.now())
    # What it decided meanwhile is in memory only; the newer database is untouched.
    assert _schema_and_quarantines(path) == (NEWER, ["node"])


def test_the_cli_refuses_a_newer_database_offline_and_says_what_to_do(tmp_path: Path) -> None:
    _newer_database(tmp_path / "state")
    config = write_config(tmp_path / "gpuwatchd.yaml", tmp_path / "state", free_port(), {})
    listed = CliRunner().invoke(main, ["quarantine", "list", "--config", str(config)])
    assert listed.exit_code == 1, listed.output
    assert f"schema version {NEWER} is newer than this gpuwatchd knows" in listed.output
    assert "run the newer gpuwatchd or restore an older copy" in listed.output
