"""`gpuwatchd journal`: what happened on the node, read from the state
database, or through the daemon's API while the daemon holds the database."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from actions_support import daemon_process, free_port, write_config
from click.testing import CliRunner
from daemon_support import simulated_daemon

from gpuwatchd.cli import main
from gpuwatchd.store import Store, StoreError

SCENARIO = (
    "node: {gpus: 4, nvlinks: 4, hcas: 2}\nfaults: [{at: 10s, kind: ecc_uncorrectable, gpu: 1}]\n"
)


def test_journal_lists_the_finding_and_the_quarantine_of_an_uncorrectable_ecc(
    tmp_path: Path,
) -> None:
    with simulated_daemon(SCENARIO, tmp_path) as sim:
        sim.run_until(30)
    state = str(tmp_path / "state")
    # The fake clock starts on 2026-01-01: look back far enough to see it.
    result = CliRunner().invoke(main, ["journal", "--state-dir", state, "--since", "3650d"])
    assert result.exit_code == 0, result.output
    assert "gpu:1 GW-1101 memory/ecc_uncorrectable critical" in result.output
    assert "quarantine gpu:1" in result.output

    only_node = CliRunner().invoke(
        main, ["journal", "--state-dir", state, "--since", "3650d", "--subject", "node", "--json"]
    )
    entries = [json.loads(line) for line in only_node.output.splitlines()]
    assert entries and {entry["subject"] for entry in entries} == {"node"}
    assert ("quarantine", "gpu_quarantine_ratio", "GW-1901") in {
        (entry["kind"], entry["code"], entry["fault_code"]) for entry in entries
    }


def test_journal_without_a_database_says_where_it_looked(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["journal", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"no state database at {tmp_path}" in result.output


def _times(output: str) -> list[float]:
    return [json.loads(line)["time"] for line in output.splitlines()]


def test_journal_takes_epoch_seconds_until_and_limit_like_the_api(tmp_path: Path) -> None:
    with simulated_daemon(SCENARIO, tmp_path) as sim:
        start = sim.start
        sim.run_until(60)
    state = ["--state-dir", str(tmp_path / "state"), "--json"]
    everything = _times(CliRunner().invoke(main, ["journal", "--since", str(start), *state]).output)
    assert everything and min(everything) >= start
    middle = start + 15
    early = CliRunner().invoke(
        main, ["journal", "--since", str(start), "--until", str(middle), *state]
    )
    assert _times(early.output) == [t for t in everything if t < middle]
    limited = CliRunner().invoke(main, ["journal", "--since", str(start), "--limit", "2", *state])
    assert _times(limited.stdout) == everything[-2:]
    bad = CliRunner().invoke(main, ["journal", "--since", "yesterday", *state])
    assert bad.exit_code == 2 and "or seconds since the epoch" in bad.output


def test_journal_of_another_node_through_its_api(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gpuwatchd.yaml", tmp_path / "state", free_port(), {})
    with daemon_process(config) as daemon:
        added = CliRunner().invoke(
            main, ["quarantine", "add", "gpu:2", "--reason", "drill", "--config", str(config)]
        )
        assert added.exit_code == 0, added.output
        remote = CliRunner().invoke(
            main, ["journal", "--node", daemon.url, "--subject", "gpu:2", "--since", "1h"]
        )
        local = CliRunner().invoke(
            main, ["journal", "--config", str(config), "--subject", "gpu:2", "--since", "1h"]
        )
        newest = CliRunner().invoke(
            main, ["journal", "--node", daemon.url, "--since", "1h", "--limit", "1"]
        )
    assert len(newest.stdout.splitlines()) == 1
    assert "only the newest 1 are shown" in newest.stderr
    assert remote.exit_code == 0, remote.output
    assert "quarantine gpu:2 (manual" in remote.output
    assert remote.output == local.output
    no_scheme = CliRunner().invoke(main, ["journal", "--node", "127.0.0.1:9477"])
    assert no_scheme.exit_code == 2
    assert "'127.0.0.1:9477' is not a URL: write http://127.0.0.1:9477" in no_scheme.output


def _many_entries(tmp_path: Path, count: int) -> tuple[str, float]:
    """A state database whose journal has `count` notes a second apart,
    ending now; (its directory, the time of the oldest)."""
    with simulated_daemon("node: {gpus: 1, nvlinks: 0, hcas: 0}\n", tmp_path) as sim:
        store, now = sim.daemon.store, time.time()
        for n in range(count):
            store.journal.note("note", "node", f"entry {n}", now - count + n)
    return str(tmp_path / "state"), now - count


def test_a_journal_longer_than_the_limit_shows_its_newest_entries_and_says_so(
    tmp_path: Path,
) -> None:
    state, oldest = _many_entries(tmp_path, 1500)
    result = CliRunner().invoke(main, ["journal", "--state-dir", state])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1000
    assert lines[-1].endswith("entry 1499") and lines[0].endswith("entry 500")
    assert (
        "older entries of the window were left out (only the newest 1000 are shown)"
        in result.stderr
    )
    assert "raise --limit" in result.stderr
    # JSON lines stay JSON lines: the notice is on stderr.
    as_json = CliRunner().invoke(
        main, ["journal", "--state-dir", state, "--since", str(oldest + 900), "--json"]
    )
    messages = [json.loads(line)["message"] for line in as_json.stdout.splitlines()]
    assert messages[-1] == "entry 1499" and len(messages) == 600
    assert as_json.stderr == ""


def test_a_journal_that_fits_its_limit_has_no_notice(tmp_path: Path) -> None:
    state, _ = _many_entries(tmp_path, 1000)
    result = CliRunner().invoke(main, ["journal", "--state-dir", state])
    assert len(result.stdout.splitlines()) == 1000
    assert result.stderr == ""


def test_journal_while_the_daemon_runs_answers_through_its_api_as_the_database_would(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "gpuwatchd.yaml", tmp_path / "state", free_port(), {})
    asks = [
        ["--since", "1h"],
        ["--since", "1h", "--subject", "gpu:2", "--json"],
        ["--since", "1h", "--limit", "2"],
    ]
    with daemon_process(config) as daemon:
        for gpu in ("gpu:2", "gpu:5"):
            added = CliRunner().invoke(
                main, ["quarantine", "add", gpu, "--reason", "drill", "--config", str(config)]
            )
            assert added.exit_code == 0, added.output
        # A window that ends now: what the daemon journals later is outside it.
        until = ["--until", repr(time.time())]
        with pytest.raises(StoreError) as held:
            Store.open(str(daemon.state_dir), wait=0.0)
        assert held.value.held
        live = [
            CliRunner().invoke(main, ["journal", "--config", str(config), *ask, *until])
            for ask in asks
        ]
    stopped = [
        CliRunner().invoke(main, ["journal", "--config", str(config), *ask, *until]) for ask in asks
    ]
    for through_api, from_file in zip(live, stopped, strict=True):
        assert through_api.exit_code == 0, through_api.output
        assert (through_api.stdout, through_api.stderr) == (from_file.stdout, from_file.stderr)
    assert "quarantine gpu:5 (manual" in live[0].stdout
    assert {json.loads(line)["subject"] for line in live[1].stdout.splitlines()} == {"gpu:2"}
    assert len(live[2].stdout.splitlines()) == 2
    assert "only the newest 2 are shown" in live[2].stderr


# Whether another process can open the database: it must not while it is held.
PROBE = (
    "import sqlite3, sys\n"
    "db = sqlite3.connect(sys.argv[1], timeout=0)\n"
    "try:\n"
    "    db.execute('SELECT COUNT(*) FROM journal').fetchone()\n"
    "except sqlite3.OperationalError as error:\n"
    "    print(error)\n"
)


def test_a_database_held_by_a_daemon_the_cli_cannot_reach_is_one_message(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    # Nothing listens at the config's address; the database is held as a
    # daemon listening elsewhere (or still starting) holds it.
    port = free_port()
    config = write_config(tmp_path / "gpuwatchd.yaml", state, port, {})
    said = f"is held by a running gpuwatchd, which does not answer at http://127.0.0.1:{port}"
    with closing(Store.open(str(state), exclusive=True)):
        for command in (["journal"], ["quarantine", "add", "node"]):
            extra = ["--reason", "drill"] if command[-1] == "node" else []
            result = CliRunner().invoke(main, [*command, *extra, "--config", str(config)])
            assert result.exit_code == 2, (command, result.output)
            assert result.output.startswith(f"Error: the state database {state / 'state.db'} ")
            assert said in result.output and "--node URL" in result.output
            assert result.exception is None or isinstance(result.exception, SystemExit)
        verdict = CliRunner().invoke(main, ["slurm-healthcheck", "--config", str(config)])
        assert verdict.exit_code == 0
        assert verdict.output.startswith("gpuwatchd: no verdict (not running; the state database")
        # The CLI's attempts in this process left the holder's lock in place.
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, str(state / "state.db")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert probe.stdout == "database is locked\n"


def test_journal_of_a_held_database_never_prints_another_daemons_under_its_name(
    tmp_path: Path,
) -> None:
    # Review adversarial-2, row 289: `journal --state-dir A` with a config
    # whose address is daemon B's printed B's journal as A's.
    a_state, b_state = tmp_path / "a", tmp_path / "b"
    port = free_port()
    b_config = write_config(tmp_path / "b.yaml", b_state, port, {})
    with daemon_process(b_config):
        added = CliRunner().invoke(
            main, ["quarantine", "add", "gpu:2", "--reason", "on B", "--config", str(b_config)]
        )
        assert added.exit_code == 0, added.output
        # A's database, held as its own daemon (listening elsewhere) holds it.
        with closing(Store.open(str(a_state), exclusive=True)) as a_store:
            a_store.journal.note("note", "node", "on A", time.time())
            asked = ["journal", "--since", "1h", "--config", str(b_config)]
            result = CliRunner().invoke(main, [*asked, "--state-dir", str(a_state)])
            own = CliRunner().invoke(main, [*asked, "--state-dir", str(b_state)])
            # Nor are its quarantines listed, or made, as A's.
            on_a = ["--config", str(b_config), "--state-dir", str(a_state)]
            listed = CliRunner().invoke(main, ["quarantine", "list", *on_a])
            made = CliRunner().invoke(main, ["quarantine", "add", "gpu:3", "--reason", "x", *on_a])
        b_quarantines = CliRunner().invoke(main, ["quarantine", "list", "--config", str(b_config)])
    for refused in (listed, made):
        assert refused.exit_code == 2, refused.output
        assert f"(the daemon there holds {b_state})" in refused.output
    assert "gpu:2" not in listed.output
    assert "gpu:3" not in b_quarantines.output and "gpu:2" in b_quarantines.output
    assert result.exit_code == 2, result.output
    assert "on B" not in result.output
    assert result.output.startswith(
        f"Error: the state database {a_state / 'state.db'} is held by a running gpuwatchd, "
        f"which does not answer at http://127.0.0.1:{port} (the daemon there holds {b_state})"
    )
    assert own.exit_code == 0, own.output
    assert "on B" in own.stdout


def test_journal_with_no_database_where_the_config_says_reads_the_daemon_status_reaches(
    tmp_path: Path,
) -> None:
    # The Quick start without its export line: the simulated daemon keeps its
    # database elsewhere and answers at the config's address, as status finds it.
    port = free_port()
    running = write_config(tmp_path / "running.yaml", tmp_path / "sim", port, {})
    default = write_config(tmp_path / "default.yaml", tmp_path / "var-lib", port, {})
    unset = {"GPUWATCHD_STATE_DIR": None, "GPUWATCHD_NODE": None}
    with daemon_process(running):
        added = CliRunner().invoke(
            main, ["quarantine", "add", "gpu:2", "--reason", "drill", "--config", str(running)]
        )
        assert added.exit_code == 0, added.output
        result = CliRunner(env=unset).invoke(
            main, ["journal", "--since", "1h", "--config", str(default)]
        )
    assert result.exit_code == 0, result.output
    assert "quarantine gpu:2 (manual" in result.stdout
    assert result.stderr == (
        f"no state database at {tmp_path / 'var-lib' / 'state.db'}: the journal of the "
        f"gpuwatchd at http://127.0.0.1:{port} (its state directory {tmp_path / 'sim'})\n"
    )
    assert not (tmp_path / "var-lib").exists()  # a read creates nothing
    down = CliRunner(env=unset).invoke(main, ["journal", "--config", str(default)])
    assert down.exit_code == 1
    assert f"no state database at {tmp_path / 'var-lib' / 'state.db'}" in down.output
    assert f"and no daemon answers at http://127.0.0.1:{port}" in down.output
