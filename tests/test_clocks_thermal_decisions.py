"""Locked clocks and power brake through the whole daemon: the simulated node,
the production sources, the checks, policy and the store, on an injected clock."""

from __future__ import annotations

from pathlib import Path

from daemon_support import simulated_daemon

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
