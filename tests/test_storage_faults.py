"""The state database failing under the running daemon: read-only (as after
an errors=remount-ro), removed, damaged at rest, its -shm file made
unwritable. The daemon keeps monitoring, says that state is not saved, keeps
its decisions with their journal rows and webhook events in memory and
writes them once it can."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from actions_support import daemon_process, fake_scontrol, free_port, write_config
from click.testing import CliRunner
from daemon_support import SimulatedDaemon, simulated_daemon

from gpuwatchd.actions.fleet import FleetSafetyConfig
from gpuwatchd.actions.slurm import SlurmConfig
from gpuwatchd.actions.webhook import WebhookConfig
from gpuwatchd.cli import main
from gpuwatchd.config import ActionsConfig, Config
from gpuwatchd.daemon import open_store
from gpuwatchd.model import Health
from gpuwatchd.store import Store, StoreError

SCENARIO = (
    "node: {gpus: 4, nvlinks: 4, hcas: 2}\nfaults: [{at: 10s, kind: ecc_uncorrectable, gpu: 1}]\n"
)
CALM = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"
# A receiver nobody listens on: events stay in the outbox, where the test counts them.
HOOK = WebhookConfig(name="ops", url="http://127.0.0.1:9/hook", format="json")
CONFIG = Config(actions=ActionsConfig(node_name="node-7", webhooks=(HOOK,)))


def _read_only(sim: SimulatedDaemon, on: bool) -> None:
    # sqlite's own read-only mode: every write fails as on a read-only mount.
    sim.daemon.store._database._db.execute(f"PRAGMA query_only = {int(on)}")


def _journal(state_dir: Path) -> list[tuple[str, str]]:
    store = Store.open(str(state_dir))
    try:
        return [(e.kind, e.subject) for e in store.journal.entries(limit=10_000)]
    finally:
        store.close()


def test_decisions_made_while_the_database_is_read_only_are_written_with_their_events_later(
    tmp_path: Path,
) -> None:
    with simulated_daemon(SCENARIO, tmp_path, CONFIG) as sim:
        sim.run_until(5)
        _read_only(sim, True)
        during = sim.run_until(40)
        assert not during.state_persisted
        assert {q.subject for q in during.quarantines} == {"gpu:1", "node"}
        assert during.health["gpu:1"] is Health.QUARANTINED
        assert sim.daemon.store.outbox.counts() == {}
        _read_only(sim, False)
        after = sim.run_until(50)
        assert after.state_persisted
        counts = sim.daemon.store.outbox.counts()
        assert counts["ops"].pending >= 3
    journal = _journal(tmp_path / "state")
    assert ("quarantine", "gpu:1") in journal
    assert ("quarantine", "node") in journal
    assert ("finding_raised", "gpu:1") in journal
    reopened = Store.open(str(tmp_path / "state"))
    assert {q.subject for q in reopened.quarantines()} == {"gpu:1", "node"}
    reopened.close()


def test_a_database_removed_under_the_daemon_is_written_anew_from_memory(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    with simulated_daemon(CALM, tmp_path) as sim:
        sim.run_until(10)
        sim.daemon.quarantine("gpu:2", "fan noise", "alice")
        for suffix in ("", "-wal", "-shm"):
            (state_dir / f"state.db{suffix}").unlink(missing_ok=True)
        sim.daemon.quarantine("gpu:3", "memory test", "bob")
        snapshot = sim.run_until(30)
        assert snapshot.state_persisted
        assert {q.subject for q in snapshot.quarantines} == {"gpu:2", "gpu:3", "node"}
    reopened = Store.open(str(state_dir))
    assert {q.subject for q in reopened.quarantines()} == {"gpu:2", "gpu:3", "node"}
    reopened.close()


def test_a_damaged_database_is_moved_aside_with_a_finding_on_the_node(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.db").write_bytes(b"this is not sqlite\n" * 500)
    with simulated_daemon(CALM, tmp_path) as sim:
        snapshot = sim.run_until(10)
        assert snapshot.state_persisted
        lost = [f for f in snapshot.findings if f.code == "state_lost"]
        assert len(lost) == 1 and lost[0].subject == "node"
        assert (
            "moved aside to" in lost[0].message and "check this node's scheduler" in lost[0].message
        )
        assert sim.run_until(400).health["node"] is Health.DEGRADED
    aside = [p.name for p in state_dir.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1
    assert (state_dir / aside[0]).read_bytes().startswith(b"this is not sqlite")
    assert ("state_lost", "node") in _journal(state_dir)


def test_state_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        store = Store.open(str(tmp_path / "state"))
        store.quarantine("gpu:1", "x", "alice", 1.0)
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "state").iterdir()}
        store.close()
    finally:
        os.umask(previous)
    assert modes["state.db"] == 0o600
    assert all(mode & 0o077 == 0 for mode in modes.values()), modes
    assert (tmp_path / "state").stat().st_mode & 0o077 == 0


def test_a_daemon_that_lost_its_state_keeps_its_slurm_drain_of_a_hardware_fault(
    tmp_path: Path,
) -> None:
    scontrol = fake_scontrol(tmp_path / "slurm")
    slurm = SlurmConfig(enabled=True, node_name="node01", scontrol=str(scontrol.path))
    fleet = FleetSafetyConfig(enabled=False)
    config = Config(actions=ActionsConfig(node_name="node01", slurm=slurm, fleet_safety=fleet))
    with simulated_daemon(SCENARIO, tmp_path / "first", config) as sim:
        sim.run_until(30)
        sim.daemon.actions.run_due(sim.clock.now())
    assert scontrol.state["state"] == "IDLE+DRAIN"
    database = tmp_path / "first" / "state" / "state.db"
    with closing(sqlite3.connect(database)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    damaged = bytearray(database.read_bytes())
    damaged[4096:] = b"\xff" * (len(damaged) - 4096)
    database.write_bytes(bytes(damaged))
    with simulated_daemon(CALM, tmp_path / "first", config) as sim:
        snapshot = sim.run_until(30)
        sim.daemon.actions.run_due(sim.clock.now())
        snapshot = sim.daemon.step()
        codes = {f.code for f in snapshot.findings if f.subject == "node"}
    assert [call for call in scontrol.updates() if "State=RESUME" in call] == []
    assert scontrol.state["state"] == "IDLE+DRAIN"
    assert {"state_lost", "slurm_drain_unexplained"} <= codes


# Writes a quarantine, says whether a -shm file is mapped, makes the -shm
# file's pages unbacked as a full tmpfs or `chattr +i` does (review row 186),
# then writes again. "daemon" opens the database as the daemon does,
# "shared" as every process did before (and the CLI does when no daemon runs).
SHM_VICTIM = textwrap.dedent(
    """
    import os, sys
    from gpuwatchd.daemon import open_store
    from gpuwatchd.store import Store
    state_dir, mode = sys.argv[1], sys.argv[2]
    store = open_store(state_dir, 0.0)[0] if mode == "daemon" else Store.open(state_dir)
    store.quarantine("gpu:1", "before", "alice", 1.0)
    shm = os.path.join(state_dir, "state.db-shm")
    with open("/proc/self/maps") as maps:
        mapped = any(line.rstrip().endswith("state.db-shm") for line in maps)
    print(f"mapped={mapped} exists={os.path.exists(shm)}", flush=True)
    with open(shm, "a") as handle:
        handle.truncate(0)
    store.quarantine("gpu:2", "after", "alice", 2.0)
    print("quarantined", *sorted(q.subject for q in store.quarantines()), flush=True)
    """
)


def _shm_victim(state_dir: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SHM_VICTIM, str(state_dir), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_unbacked_shm_page_kills_a_shared_connection_with_sigbus(tmp_path: Path) -> None:
    # The failure of review row 186, reproduced without root: what the
    # daemon's exclusive mode avoids.
    victim = _shm_victim(tmp_path / "state", "shared")
    assert victim.returncode == -signal.SIGBUS, victim.stderr
    assert victim.stdout == "mapped=True exists=True\n"


def test_the_daemon_maps_no_shm_file_and_lives_through_a_hostile_one(tmp_path: Path) -> None:
    victim = _shm_victim(tmp_path / "state", "daemon")
    assert victim.returncode == 0, victim.stderr
    assert victim.stdout.splitlines() == [
        "mapped=False exists=False",
        "quarantined gpu:1 gpu:2",
    ]
    with closing(Store.open(str(tmp_path / "state"))) as store:
        assert [q.subject for q in store.quarantines()] == ["gpu:1", "gpu:2"]


def test_a_running_daemon_leaves_no_shm_file_and_ignores_a_stale_one(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    # An older gpuwatchd killed mid-run: its -wal holds a committed
    # quarantine, and its -shm is left behind.
    older = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from gpuwatchd.store import Store\n"
            "Store.open(sys.argv[1]).quarantine('gpu:3', 'before the upgrade', 'bob', 1.0)\n"
            "print('committed', flush=True)\n"
            "time.sleep(60)\n",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert older.stdout is not None and older.stdout.readline() == "committed\n"
    older.kill()
    older.wait()
    assert (state_dir / "state.db-shm").exists() and (state_dir / "state.db-wal").exists()
    stale = (state_dir / "state.db-shm").read_bytes()
    with simulated_daemon(CALM, tmp_path) as sim:
        sim.daemon.quarantine("gpu:2", "fan noise", "alice")
        snapshot = sim.run_until(60)
        assert snapshot.state_persisted
        assert {"gpu:2", "gpu:3"} <= {q.subject for q in snapshot.quarantines}
        with open("/proc/self/maps") as maps:
            assert not any("state.db-shm" in line for line in maps)
        assert (state_dir / "state.db-shm").read_bytes() == stale  # never touched
        (state_dir / "state.db-shm").unlink()
        sim.daemon.quarantine("gpu:1", "memory test", "alice")
        assert sim.run_until(90).state_persisted
        assert not (state_dir / "state.db-shm").exists()


@contextmanager
def _immutable(path: Path) -> Iterator[None]:
    """`path` made immutable with chattr, as in review row 186; the test is
    skipped where that takes a privilege or a filesystem this run lacks."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("no chattr")
    made = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i refused here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_an_immutable_shm_file_beside_the_running_daemon_changes_nothing(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    config = write_config(tmp_path / "gpuwatchd.yaml", state_dir, free_port(), {})
    with daemon_process(config) as daemon:
        shm = state_dir / "state.db-shm"
        shm.touch()
        with _immutable(shm):
            added = CliRunner().invoke(
                main, ["quarantine", "add", "node", "--reason", "row 186", "--config", str(config)]
            )
            assert added.exit_code == 0, added.output
            assert "gpuwatchd_state_persisted 1.0" in daemon.metrics()
        assert daemon.process.poll() is None
        log = daemon.stop()
    assert daemon.process.returncode == 0, log
    with closing(Store.open(str(state_dir))) as store:
        assert [q.subject for q in store.quarantines()] == ["node"]


def test_a_second_daemon_on_the_same_state_directory_is_refused(tmp_path: Path) -> None:
    with simulated_daemon(CALM, tmp_path) as sim:
        sim.run_until(10)
        with pytest.raises(StoreError) as refused:
            open_store(str(tmp_path / "state"), sim.clock.now())
        assert refused.value.held
        assert "held by another process" in str(refused.value)
        # The running daemon is unaffected.
        assert sim.run_until(20).state_persisted
