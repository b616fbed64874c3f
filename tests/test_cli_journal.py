"""`gpuwatchd journal`: what happened on the node, read from the state database."""

from __future__ import annotations

import json
import time
from pathlib import Path

from actions_support import daemon_process, free_port, write_config
from click.testing import CliRunner
from daemon_support import simulated_daemon

from gpuwatchd.cli import main

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
    assert "gpu:1 memory/ecc_uncorrectable critical" in result.output
    assert "quarantine gpu:1" in result.output

    only_node = CliRunner().invoke(
        main, ["journal", "--state-dir", state, "--since", "3650d", "--subject", "node", "--json"]
    )
    entries = [json.loads(line) for line in only_node.output.splitlines()]
    assert entries and {entry["subject"] for entry in entries} == {"node"}
    assert any(entry["kind"] == "quarantine" for entry in entries)


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
            store.note("note", "node", f"entry {n}", now - count + n)
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
