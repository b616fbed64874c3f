"""`gpuwatchd status` and /metrics say what an operator needs at 3 a.m.: the
canaries' last passes and what is failing now, evidence a person can read,
and the agent's own cost."""

from __future__ import annotations

from pathlib import Path

from daemon_support import simulated_daemon
from prometheus_client import generate_latest

from gpuwatchd.status import render_table, to_json

SDC = "node: {gpus: 2, nvlinks: 2, hcas: 1}\nfaults: []\n"


def test_status_shows_each_gpus_last_canary_pass_and_its_runs(tmp_path: Path) -> None:
    with simulated_daemon(SDC, tmp_path, canary=True) as sim:
        snapshot = sim.run_until(660)
    document = to_json(snapshot)
    canaries = {c["target"]: c for c in document["canaries"]}
    assert set(canaries) >= {"gpu:0", "gpu:1"}
    for target in ("gpu:0", "gpu:1"):
        assert canaries[target]["last_pass"] is not None
        assert canaries[target]["runs"]["pass"] > 0 and canaries[target]["not_passing"] == {}
    table = render_table(document)
    assert "CANARY TARGET" in table
    assert any(line.startswith("gpu:0 ") and " pass " in line for line in table.splitlines())


def test_status_without_canaries_says_nothing_of_them(tmp_path: Path) -> None:
    with simulated_daemon(SDC, tmp_path) as sim:
        snapshot = sim.run_until(20)
    document = to_json(snapshot)
    assert document["canaries"] is None
    assert "CANARY" not in render_table(document)


def test_evidence_is_printed_to_four_significant_digits(tmp_path: Path) -> None:
    faults = "faults: [{at: 0s, kind: ib_symbol_errors, hca: mlx5_0, port: 1, rate: 50/s}]"
    with simulated_daemon(SDC.replace("faults: []", faults), tmp_path) as sim:
        document = to_json(sim.run_until(120))
    [finding] = [
        f for s in document["subjects"] for f in s["findings"] if f["code"] == "ib_symbol_errors"
    ]
    # As a real clock leaves them (the review's daemon printed these).
    finding["evidence"].update(window_seconds=400.0086441040039, ratio=5.31301018446848e-11)
    [line] = [x for x in render_table(document).splitlines() if "/ib_symbol_errors:" in x]
    assert "window_seconds=400 " in line and "ratio=5.313e-11 " in line
    assert "errors=6000 " in line


def test_metrics_carry_the_agents_own_cpu_and_memory(tmp_path: Path) -> None:
    with simulated_daemon(SDC, tmp_path) as sim:
        sim.run_until(10)
        metrics = generate_latest(sim.daemon.registry).decode()
    assert "\nprocess_cpu_seconds_total " in metrics
    assert "\nprocess_resident_memory_bytes " in metrics
