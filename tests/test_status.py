"""`gpuwatchd status` and /metrics say what an operator needs at 3 a.m.: the
canaries' last passes, what is failing now and which GPUs are under doubt,
evidence a person can read, and the agent's own cost."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

from daemon_support import SimulatedDaemon, simulated_daemon
from prometheus_client import generate_latest

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.stats import CanaryStats
from gpuwatchd.config import Config
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.status import render_table, to_json

SDC = "node: {gpus: 2, nvlinks: 2, hcas: 1}\nfaults: []\n"
# A burst a minute, so that a lead opens within the first polls.
MINUTE_BURSTS = Config(canary=CanaryConfig(interval=60.0))


def _poll_until_canary(sim: SimulatedDaemon, key: str, polls: int = 12) -> dict[str, Any]:
    """Poll until a canary target's `key` (suspect, watch) is set; its status entry."""
    for _ in range(polls):
        document = to_json(sim.daemon.step())
        sim.clock.advance(sim.daemon.config.daemon.poll_interval)
        doubtful = [c for c in document["canaries"] if c[key] is not None]
        if doubtful:
            [canary] = doubtful
            canary["table"] = render_table(document)
            return canary
    raise AssertionError(f"no canary target got a {key} in {polls} polls")


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


def test_status_names_a_suspect_gpu_its_sibling_and_the_reruns_it_waits_for(
    tmp_path: Path,
) -> None:
    scenario = "node: {gpus: 3, nvlinks: 2, hcas: 1}\nfaults: [{at: 0s, kind: sdc, gpu: 1}]\n"
    with simulated_daemon(scenario, tmp_path, MINUTE_BURSTS, canary=True) as sim:
        canary = _poll_until_canary(sim, "suspect")
        settled = to_json(sim.daemon.step())
    assert canary["target"] == "gpu:1" and canary["watch"] is None
    suspect = canary["suspect"]
    assert suspect["sibling"] == "gpu:2" and suspect["reruns_pending"] == ["gpu:1", "gpu:2"]
    assert "gemm_exact_fp16" in suspect["canaries"]
    [line] = [x for x in canary["table"].splitlines() if x.startswith("  gpu:1: suspect since ")]
    assert "sibling gpu:2; re-runs pending on gpu:1, gpu:2" in line
    # The re-runs came back: confirmed, so no longer a suspect.
    gpu1 = next(c for c in settled["canaries"] if c["target"] == "gpu:1")
    assert gpu1["suspect"] is None and gpu1["watch"] is None
    assert "canaries under doubt" not in render_table(settled)


def test_status_names_a_watched_gpu_and_the_offline_diagnostic_it_needs(tmp_path: Path) -> None:
    # One GPU: no sibling can tell its fault from a software one, so it is
    # watched, never confirmed.
    scenario = "node: {gpus: 1, nvlinks: 2, hcas: 1}\nfaults: [{at: 0s, kind: sdc, gpu: 0}]\n"
    with simulated_daemon(scenario, tmp_path, MINUTE_BURSTS, canary=True) as sim:
        canary = _poll_until_canary(sim, "watch")
        now = sim.clock.now()
    watch = canary["watch"]
    assert watch["offline_diagnostic"] == "gpuwatchd canary --dcgm 3" and watch["until"] > now
    assert watch["canary"] in canary["not_passing"]
    [line] = [x for x in canary["table"].splitlines() if x.startswith("  gpu:0: watched until ")]
    assert line.endswith("; run gpuwatchd canary --dcgm 3")


def test_status_lists_the_canaries_among_the_sources(tmp_path: Path) -> None:
    with simulated_daemon(SDC, tmp_path, canary=True) as sim:
        document = to_json(sim.run_until(10))
    assert document["sources"]["canary"] == {"up": True, "error": None}
    assert "sources: canary up, infiniband up, nvml up" in render_table(document)


def test_status_says_the_canaries_are_down_when_gpus_have_no_backend() -> None:
    # What the agent reports on a node whose GPUs CUDA cannot use.
    unchecked = MappingProxyType({0: ("no_backend", 5.0), 1: ("no_backend", 5.0)})
    document = to_json(Snapshot(time=10.0, canary=CanaryStats(unchecked=unchecked)))
    assert document["sources"]["canary"] == {
        "up": False,
        "error": "no GPU backend: GPU(s) 0, 1 unchecked",
    }
    assert "canary DOWN (no GPU backend: GPU(s) 0, 1 unchecked)" in render_table(document)
