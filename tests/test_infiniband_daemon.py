"""InfiniBand through the whole daemon on a simulated node: the ports a node
learns it must keep, a node without InfiniBand, and real ConnectX-7 oddities
(pinned counters, files that refuse their read) on a calm node."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from daemon_support import simulated_daemon

from gpuwatchd.checks.infiniband import InfinibandCheckConfig
from gpuwatchd.checks.registry import ChecksConfig
from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.model import Health, Severity
from gpuwatchd.snapshot import Snapshot

NODE = "node: {gpus: 2, nvlinks: 2, hcas: %d}\n"


def worrying(snapshot: Snapshot) -> list[tuple[str, str, str]]:
    return [
        (f.subject, f.code, f.severity.label)
        for f in snapshot.findings
        if f.severity is not Severity.OK
    ]


def restarted(state: Path, node: str, config: Config | None = None) -> Snapshot:
    """The first poll of a daemon restarted on `node` hours after a healthy
    start on two HCAs, on the same state database."""
    with simulated_daemon(NODE % 2 + "faults: []\n", state, config) as sim:
        sim.run_until(30)
        # Long after: the history window holds nothing of the first run.
        restart = sim.clock.now() + 6 * 3600
    shutil.rmtree(state / "sysfs")
    with simulated_daemon(node, state, config, start=restart) as sim:
        return sim.run_until(0)


def test_a_port_learned_healthy_and_gone_after_a_restart_is_missed_by_name(
    tmp_path: Path,
) -> None:
    # The node comes back with one HCA (the other lost, or its driver not loaded).
    snapshot = restarted(tmp_path, NODE % 1 + "faults: []\n")
    assert worrying(snapshot) == [("ib:mlx5_1/1", "ib_port_missing", "critical")]
    missing = next(f for f in snapshot.findings if f.code == "ib_port_missing")
    assert "seen ACTIVE on this node before" in missing.message
    assert missing.evidence["learned"] == 1
    assert snapshot.health["ib:mlx5_1/1"] is not Health.HEALTHY


def test_a_learned_port_that_stays_down_after_a_restart_is_down_not_forgotten(
    tmp_path: Path,
) -> None:
    down = "faults: [{at: 0s, kind: ib_port_down, hca: mlx5_0, port: 1}]\n"
    snapshot = restarted(tmp_path, NODE % 2 + down)
    assert worrying(snapshot) == [("ib:mlx5_0/1", "ib_port_down", "critical")]


def test_without_learning_a_port_down_since_start_is_not_expected(tmp_path: Path) -> None:
    infiniband = InfinibandCheckConfig(expect_ports_seen_active=False)
    config = Config(checks=ChecksConfig(infiniband=infiniband))
    assert worrying(restarted(tmp_path, NODE % 1 + "faults: []\n", config)) == []


def test_a_host_with_no_infiniband_is_not_infiniband_up_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO), simulated_daemon(NODE % 0, tmp_path) as sim:
        snapshot = sim.run_until(60)
    assert snapshot.source_up["infiniband"] is False
    assert "no RDMA driver loaded" in snapshot.source_errors["infiniband"]
    assert snapshot.ports == () and worrying(snapshot) == []
    assert snapshot.node_health is Health.HEALTHY
    said = [r for r in caplog.records if "source infiniband:" in r.getMessage()]
    assert len(said) == 1


def test_a_node_whose_infiniband_vanished_misses_every_learned_port(tmp_path: Path) -> None:
    snapshot = restarted(tmp_path, NODE % 0)
    assert snapshot.source_up["infiniband"] is False
    assert sorted(worrying(snapshot)) == [
        ("ib:mlx5_0/1", "ib_port_missing", "critical"),
        ("ib:mlx5_1/1", "ib_port_missing", "critical"),
    ]


CALM_CX7 = (
    NODE % 2
    + "faults:\n"
    + "".join(
        f"  - {{at: 0s, kind: {kind}, hca: mlx5_{hca}, port: 1, counter: {counter}}}\n"
        for kind, hca, counter in (
            # What gpud PR #943 showed on a real ConnectX-7 port.
            ("ib_counter_pinned", 0, "link_downed"),
            ("ib_counter_pinned", 0, "port_xmit_discards"),
            ("ib_counter_pinned", 0, "port_xmit_wait"),
            ("ib_counter_pinned", 0, "excessive_buffer_overrun_errors"),
            # A restricted function's refusals (DGX OS 7 known issue).
            ("ib_counter_einval", 1, "port_xmit_wait"),
            ("ib_counter_einval", 1, "out_of_buffer"),
        )
    )
)


def test_a_calm_connectx7_node_with_pinned_and_refusing_counters_stays_healthy_an_hour(
    tmp_path: Path,
) -> None:
    polls = Config(daemon=DaemonConfig(poll_interval=30))
    with simulated_daemon(CALM_CX7, tmp_path, polls) as sim:
        for minute in range(0, 61, 5):
            snapshot = sim.run_until(minute * 60)
            assert snapshot.node_health is Health.HEALTHY
            assert set(snapshot.health.values()) == {Health.HEALTHY}
            assert [(f.subject, f.code, f.severity) for f in snapshot.findings] == [
                ("ib:mlx5_0/1", "ib_counter_saturated", Severity.OK)
            ]
    assert snapshot.quarantines == ()
    assert snapshot.source_up["infiniband"] is True
    refusing = next(p for p in snapshot.ports if p.device == "mlx5_1")
    assert "port_xmit_wait" not in refusing.counters
    assert "out_of_buffer" not in refusing.hw_counters


def test_real_faults_on_a_port_with_pinned_counters_are_still_decided(tmp_path: Path) -> None:
    flap = "  - {at: 60s, kind: ib_link_flap, hca: mlx5_0, port: 1, rate: 1/min}\n"
    with simulated_daemon(CALM_CX7 + flap, tmp_path) as sim:
        snapshot = sim.run_until(480)
    assert ("ib:mlx5_0/1", "ib_link_flapping", "critical") in worrying(snapshot)
    assert snapshot.health["ib:mlx5_0/1"] is Health.QUARANTINED
