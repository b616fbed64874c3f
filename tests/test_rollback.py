"""A gpuwatchd older than its state database, as after a rollback past a
release whose schema is newer (CHANGELOG.md, "Upgrade and rollback"): the
daemon does not start (without the database it would know none of its
quarantines) and leaves the file as it was for the newer gpuwatchd; the CLI
refuses it offline with what to do. The newer database is made here by raising a
database's schema version past this gpuwatchd's, which is what an older
gpuwatchd finds."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from actions_support import free_port, write_config
from click.testing import CliRunner

from gpuwatchd.cli import main
from gpuwatchd.daemon import open_store
from gpuwatchd.store import DB_NAME, Store, StoreError
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


def test_an_older_daemon_does_not_start_on_a_newer_database_and_says_why(tmp_path: Path) -> None:
    # Run without it, the daemon would know none of its quarantines: the node
    # quarantined by hand in the newer release would read healthy and be
    # given work. A daemon that does not start is seen (GpuwatchdDown, a
    # stale slurm-healthcheck that fails closed).
    path = _newer_database(tmp_path / "state")
    with pytest.raises(StoreError, match=f"schema version {NEWER} is newer") as raised:
        open_store(str(tmp_path / "state"), 2.0)
    assert raised.value.newer and not raised.value.damaged and not raised.value.held
    # Not taken for a damaged database: nothing moved aside, nothing migrated.
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [DB_NAME]
    assert _schema_and_quarantines(path) == (NEWER, ["node"])


def test_gpuwatchd_run_on_a_newer_database_exits_with_what_to_do(tmp_path: Path) -> None:
    path = _newer_database(tmp_path / "state")
    result = CliRunner().invoke(
        main, ["run", "--simulate", "calm", "--state-dir", str(tmp_path / "state")]
    )
    assert result.exit_code == 1, result.output
    assert f"schema version {NEWER} is newer than this gpuwatchd knows" in result.output
    assert "restore the copy taken before the upgrade" in result.output
    assert "would know none of its quarantines" in result.output
    assert _schema_and_quarantines(path) == (NEWER, ["node"])


def test_the_cli_refuses_a_newer_database_offline_and_says_what_to_do(tmp_path: Path) -> None:
    _newer_database(tmp_path / "state")
    config = write_config(tmp_path / "gpuwatchd.yaml", tmp_path / "state", free_port(), {})
    listed = CliRunner().invoke(main, ["quarantine", "list", "--config", str(config)])
    assert listed.exit_code == 1, listed.output
    assert f"schema version {NEWER} is newer than this gpuwatchd knows" in listed.output
    assert "run the newer gpuwatchd or restore the copy taken before the upgrade" in listed.output
