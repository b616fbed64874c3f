"""`gpuwatchd journal`: what happened on the node, read from the state database."""

from __future__ import annotations

import json
from pathlib import Path

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
