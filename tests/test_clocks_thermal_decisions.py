"""Locked clocks and power brake through the whole daemon: the simulated node,
the production sources, the checks, policy and the store, on an injected clock."""

from __future__ import annotations

from pathlib import Path

from daemon_support import SimulatedDaemon, simulated_daemon

from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.model import Health, Severity

NODE = "node: {gpus: 8, nvlinks: 4, hcas: 2}\n"
LOCKED = "{at: 0s, kind: clocks_locked, mhz: 1410}"


def test_eight_busy_gpus_locked_at_1410_mhz_stay_healthy_for_an_hour(tmp_path: Path) -> None:
    polls = Config(daemon=DaemonConfig(poll_interval=30))
    with simulated_daemon(NODE + f"faults: [{LOCKED}]\n", tmp_path, polls) as sim:
        snapshot = sim.run_until(3600)
        gpus = sim.node.gpus
        assert all(gpus.state(i).sm_clock_mhz == 1410 for i in range(8))
    assert snapshot.node_health is Health.HEALTHY
    assert snapshot.findings == () and snapshot.quarantines == ()


def test_a_gpu_drifting_below_its_locked_peers_is_quarantined(tmp_path: Path) -> None:
    drift = "{at: 10s, kind: clock_drift, gpu: 3}"
    with simulated_daemon(NODE + f"faults: [{LOCKED}, {drift}]\n", tmp_path) as sim:
        warned = sim.run_until(120)
        snapshot = sim.run_until(1200)
    assert [(f.subject, f.code, f.severity) for f in warned.findings] == [
        ("gpu:3", "clock_drift", Severity.WARN)
    ]
    gpu_findings = [(f.subject, f.severity) for f in snapshot.findings if f.subject != "node"]
    assert gpu_findings == [("gpu:3", Severity.CRITICAL)]
    assert snapshot.health["gpu:3"] is Health.QUARANTINED
    assert {s for s, h in snapshot.health.items() if h is not Health.HEALTHY} == {"gpu:3", "node"}


def idle(gpus: range, at: str = "0s") -> str:
    return ", ".join(f"{{at: {at}, kind: gpu_idle, gpu: {gpu}}}" for gpu in gpus)


def clock_drift_severities(sim: SimulatedDaemon, until: float) -> list[Severity]:
    """The clock_drift severities of every poll up to `until`."""
    interval = sim.daemon.config.daemon.poll_interval
    return [
        finding.severity
        for poll in range(round(until / interval) + 1)
        for finding in sim.run_until(poll * interval).findings
        if finding.code == "clock_drift"
    ]


def test_a_locked_node_with_only_gpu_0_busy_for_an_hour_warns_at_most(tmp_path: Path) -> None:
    scenario = NODE + f"faults: [{LOCKED}, {idle(range(1, 8))}]\n"
    with simulated_daemon(scenario, tmp_path) as sim:
        severities = clock_drift_severities(sim, 3600)
        snapshot = sim.daemon.snapshot
    # No peer was busy within the history: nothing tells the lock from a fault.
    assert set(severities) == {Severity.WARN}
    (finding,) = snapshot.findings
    assert finding.subject == "gpu:0" and finding.evidence["second_reference"] == "none"
    assert "no second reference" in finding.message
    assert snapshot.health["gpu:0"] is Health.DEGRADED and snapshot.quarantines == ()


def test_a_lone_gpu_at_the_locked_clock_its_peers_ran_at_earlier_raises_nothing(
    tmp_path: Path,
) -> None:
    scenario = NODE + f"faults: [{LOCKED}, {idle(range(1, 8), at='10m')}]\n"
    with simulated_daemon(scenario, tmp_path) as sim:
        severities = clock_drift_severities(sim, 3600)
        snapshot = sim.daemon.snapshot
        busy = [sim.node.gpus.state(i).utilization_gpu_percent > 0 for i in range(8)]
    assert busy == [True] + [False] * 7
    assert severities == []
    assert snapshot.node_health is Health.HEALTHY and snapshot.findings == ()


def test_a_lone_gpu_well_below_its_peers_last_busy_clocks_is_critical_after_15_windows(
    tmp_path: Path,
) -> None:
    drift = "{at: 5m, kind: clock_drift, gpu: 0}"
    scenario = NODE + f"faults: [{LOCKED}, {drift}, {idle(range(1, 8), at='5m')}]\n"
    with simulated_daemon(scenario, tmp_path) as sim:
        warned = sim.run_until(300 + 14 * 60)
        snapshot = sim.run_until(300 + 16 * 60)
    assert [(f.subject, f.severity) for f in warned.findings] == [("gpu:0", Severity.WARN)]
    finding = next(f for f in snapshot.findings if f.subject == "gpu:0")
    assert finding.severity is Severity.CRITICAL
    assert finding.evidence["second_reference"] == "peers_last_busy"
    assert finding.evidence["peers_last_busy_hertz"] == 1410e6
