"""Every scenario kind through the whole daemon: the simulated node, the
production sources, the checks, policy and the store, on an injected clock.

Each row states the finding a kind must raise, the health it must bring its
subject to, whether that ends in a quarantine, and when: seconds from the
fault to its finding and to that health, at the default 10 s poll and
default policy, on a daemon that has run for its whole history before the
fault began, as on a node in service. The README's decision table shows
these figures, and a test here holds it to them. A fault already there when
the daemon starts is decided within a poll of that.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from daemon_support import SimulatedDaemon, simulated_daemon
from kmsg_support import GPU1, on_bus, real

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.model import Health, Severity
from gpuwatchd.snapshot import Snapshot

README = Path(__file__).parent.parent / "README.md"
# A fault there when the daemon starts (a restart onto a faulty node).
FAULT_AT = 10.0
# A node in service: the daemon has kept its whole history (an hour, as
# long as the longest check window) when the fault begins, so every window
# is full and a fault's first errors are weighed against an hour of calm.
LONG_RUNNING = DaemonConfig().history + FAULT_AT
NODE = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"


@dataclass(frozen=True)
class Expected:
    fault: str
    subject: str
    code: str
    severity: Severity
    health: Health
    # Seconds after the fault began, on a long-running daemon: its code
    # first raised (at any severity), and `health` reached.
    finding: float
    decision: float
    node_quarantined: bool = False
    # The README decision table's row (its first cell) that shows this kind.
    row: str | None = None
    # Faults on the node from its start, beside the one measured.
    beside: str = ""


@dataclass(frozen=True)
class Decided:
    finding: float | None
    decision: float | None


def _kernel_line(name: str) -> str:
    """A kernel_line fault of a real record on GPU 1's bus (its `at` added later)."""
    return "{kind: kernel_line, text: " + json.dumps(on_bus(real(name), GPU1)) + "}"


FALLEN_OFF_BUS_ROW = (
    "`kernel_line`: `NVRM: GPU <bus>: GPU has fallen off the bus.`, or the probe's"
    " three-line `The NVIDIA GPU <bus> ... has fallen off the bus` (no `Xid`)"
)

CASES: dict[str, Expected] = {
    "thermal_throttle": Expected(
        "{kind: thermal_throttle, gpu: 1}",
        "gpu:1",
        "thermal_throttling",
        Severity.WARN,
        Health.DEGRADED,
        finding=50,
        decision=50,
        row="`thermal_throttle`, `row_remap_pending`, `row_remap_exhausted`, `ib_congestion`",
    ),
    "power_brake": Expected(
        "{kind: power_brake, gpu: 1}",
        "gpu:1",
        "hw_slowdown_while_cool",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=70,
        decision=370,
        node_quarantined=True,
        row="`power_brake` (GPU cool)",
    ),
    "clock_drift": Expected(
        "{kind: clock_drift, gpu: 1}",
        "gpu:1",
        "clock_drift",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=10,
        decision=1150,
        node_quarantined=True,
        row="`clock_drift`",
    ),
    # An operator's lock with one GPU busy and its peers idle all along: no
    # second reference tells the lock from a fault (checks/clocks.py).
    "clocks_locked_one_gpu_busy": Expected(
        "{kind: clocks_locked, mhz: 1410}",
        "gpu:0",
        "clock_drift",
        Severity.WARN,
        Health.DEGRADED,
        finding=40,
        decision=70,
        row="`clocks_locked` with one GPU busy, the others `gpu_idle` all along",
        beside=", ".join(f"{{at: 0s, kind: gpu_idle, gpu: {gpu}}}" for gpu in (1, 2, 3)),
    ),
    "pcie_downtrained": Expected(
        "{kind: pcie_downtrained, gpu: 1, width: 8}",
        "gpu:1",
        "pcie_downtrained",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=50,
        decision=1190,
        node_quarantined=True,
        row="`pcie_downtrained` (busy GPU below its maximum width or generation)",
    ),
    "fabric_unregistered": Expected(
        "{kind: fabric_unregistered, gpu: 1}",
        "gpu:1",
        "fabric_unregistered",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=300,
        decision=600,
        node_quarantined=True,
        row=(
            "`fabric_unregistered` (NVSwitch registration not completed; "
            "with `code`, completed with that error)"
        ),
    ),
    "fabric_health_route_unhealthy": Expected(
        "{kind: fabric_health, gpu: 1, mask: 0x10}",
        "gpu:1",
        "fabric_unhealthy",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=300,
        node_quarantined=True,
        row=(
            "`fabric_health` (`mask`: `0x10` route unhealthy; `0x500`..., an incorrect "
            "configuration, on R580)"
        ),
    ),
    "fabric_health_degraded_bandwidth": Expected(
        "{kind: fabric_health, gpu: 1, mask: 0x1}",
        "gpu:1",
        "fabric_degraded",
        Severity.WARN,
        Health.DEGRADED,
        finding=0,
        decision=30,
        row=(
            "`fabric_health` (`mask`: `0x1` degraded bandwidth; `0x4`, `0x40`: a route or "
            "access timeout recovery)"
        ),
    ),
    "pcie_replay_storm": Expected(
        "{kind: pcie_replay_storm, gpu: 1, rate: 10/s}",
        "gpu:1",
        "pcie_replay_storm",
        Severity.WARN,
        Health.DEGRADED,
        finding=10,
        decision=40,
        row="`pcie_replay_storm` 10/s (over DCGM's 31/min on Gen5 x16)",
    ),
    # A fatal PCIe error: critical, confirmed by policy before the quarantine
    # (a link reset recovers it; never definitive).
    "aer_errors_fatal_gpu": Expected(
        "{kind: aer_errors, gpu: 1, severity: fatal}",
        "gpu:1",
        "aer_fatal_errors",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=300,
        node_quarantined=True,
        row="`aer_errors` `severity: fatal` on a GPU (or an HCA: its ports)",
    ),
    "aer_errors_nonfatal_hca": Expected(
        "{kind: aer_errors, hca: mlx5_1, severity: nonfatal, count: 2}",
        "ib:mlx5_1/1",
        "aer_nonfatal_errors",
        Severity.WARN,
        Health.DEGRADED,
        finding=0,
        decision=30,
        row="`aer_errors` `severity: nonfatal`",
    ),
    # 60 a minute on a Gen5 x16 link, over the 31 a 1e-12 BER gives: a warning, never more.
    "aer_errors_correctable_storm": Expected(
        "{kind: aer_errors, gpu: 1, severity: correctable, rate: 60/min}",
        "gpu:1",
        "aer_correctable_storm",
        Severity.WARN,
        Health.DEGRADED,
        finding=40,
        decision=70,
        row=(
            "`aer_errors` `severity: correctable` 60/min"
            " (over the 31/min a 1e-12 BER gives Gen5 x16)"
        ),
    ),
    # Warning only: the GPUs work, and the daemon never changes a setting.
    # These settings are read with the GPU's static values (nvml.static_refresh,
    # 10 min); the fault begins 10 s after a read, the longest wait but one poll.
    "config_drift": Expected(
        "{kind: config_drift, gpu: 1, setting: ecc_mode}",
        "node",
        "config_drift",
        Severity.WARN,
        Health.DEGRADED,
        finding=590,
        decision=620,
        row=(
            "`config_drift` (`setting`: `vbios_version`, `ecc_mode`, `mig_mode` or"
            " `power_limit`, read every `nvml.static_refresh`, 10 min; optional `value`)"
        ),
    ),
    # Persistence can change while the driver runs (nvidia-smi -pm): read every poll.
    "config_drift_persistence": Expected(
        "{kind: config_drift, gpu: 1, setting: persistence_mode}",
        "node",
        "config_drift",
        Severity.WARN,
        Health.DEGRADED,
        finding=0,
        decision=30,
        row="`config_drift` with `setting: persistence_mode` (read every poll)",
    ),
    "nvlink_crc_storm": Expected(
        "{kind: nvlink_crc_storm, gpu: 1, link: 2, rate: 2000/s}",
        "nvlink:1/2",
        "nvlink_crc_storm",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=130,
        decision=430,
        node_quarantined=True,
        row="`nvlink_crc_storm` 2000/s",
    ),
    "nvlink_down": Expected(
        "{kind: nvlink_down, gpu: 1, link: 2}",
        "nvlink:1/2",
        "nvlink_down",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=300,
        node_quarantined=True,
        row="`nvlink_down`",
    ),
    "ecc_sbe_storm": Expected(
        "{kind: ecc_sbe_storm, gpu: 1, rate: 1/s}",
        "gpu:1",
        "ecc_sbe_storm",
        Severity.WARN,
        Health.DEGRADED,
        finding=100,
        decision=130,
        row="`ecc_sbe_storm` 1/s",
    ),
    "ecc_uncorrectable": Expected(
        "{kind: ecc_uncorrectable, gpu: 1}",
        "gpu:1",
        "ecc_uncorrectable",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=0,
        node_quarantined=True,
        row="`ecc_uncorrectable` (`code` 94: contained)",
    ),
    "row_remap_pending": Expected(
        "{kind: row_remap_pending, gpu: 1}",
        "gpu:1",
        "row_remap_pending",
        Severity.WARN,
        Health.DEGRADED,
        finding=0,
        decision=30,
        row="`thermal_throttle`, `row_remap_pending`, `row_remap_exhausted`, `ib_congestion`",
    ),
    # Not NVIDIA's RMA criterion: the failure flag the next error there sets is.
    "row_remap_exhausted": Expected(
        "{kind: row_remap_exhausted, gpu: 1, bank: 17}",
        "gpu:1",
        "row_remap_exhausted",
        Severity.WARN,
        Health.DEGRADED,
        finding=0,
        decision=30,
        row="`thermal_throttle`, `row_remap_pending`, `row_remap_exhausted`, `ib_congestion`",
    ),
    "row_remap_failure": Expected(
        "{kind: row_remap_failure, gpu: 1}",
        "gpu:1",
        "row_remap_failure",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=0,
        node_quarantined=True,
        row="`row_remap_failure`",
    ),
    "xid_hardware": Expected(
        "{kind: xid, gpu: 1, code: 79}",
        "gpu:1",
        "xid_hardware",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=0,
        node_quarantined=True,
        row="`xid` 79, `gpu_lost`",
    ),
    "xid_application": Expected(
        "{kind: xid, gpu: 1, code: 13}",
        "gpu:1",
        "xid_application",
        Severity.OK,
        Health.HEALTHY,
        finding=0,
        decision=0,
        row=None,
    ),
    # NVIDIA's memory error guide: a DBE drains the GPU for a reset (confirmed,
    # released once quiet); only the RMA criteria condemn it for good.
    "xid_memory_reset": Expected(
        "{kind: xid, gpu: 1, code: 48}",
        "gpu:1",
        "xid_hardware",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=300,
        node_quarantined=True,
        row="`xid` 48 (and 95, 64, 109, 119, 120: NVIDIA resets the GPU)",
    ),
    # NVIDIA's catalog: ignore now (157, resource retirement failure).
    "xid_informational": Expected(
        "{kind: xid, gpu: 1, code: 157}",
        "gpu:1",
        "xid_informational",
        Severity.OK,
        Health.HEALTHY,
        finding=0,
        decision=0,
        row=None,
    ),
    "xid_recovery_action": Expected(
        "{kind: xid, gpu: 1, code: 154}",
        "gpu:1",
        "xid_recovery_action",
        Severity.WARN,
        Health.DEGRADED,
        finding=0,
        decision=30,
        row="`xid` 154",
    ),
    # A real driver's records (tests/fixtures/kmsg/) on GPU 1's bus, which
    # NVML does not report: a logged XID counts after its 30 s grace.
    "kernel_line_fallen_off_bus": Expected(
        _kernel_line("fallen_off_bus"),
        "gpu:1",
        "xid_hardware",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=30,
        decision=30,
        node_quarantined=True,
        row=FALLEN_OFF_BUS_ROW,
    ),
    "kernel_line_fallen_off_bus_probe": Expected(
        _kernel_line("fallen_off_bus_probe"),
        "gpu:1",
        "xid_hardware",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=30,
        decision=30,
        node_quarantined=True,
        row=FALLEN_OFF_BUS_ROW,
    ),
    "kernel_line_nvlink5_fatal": Expected(
        _kernel_line("gb200_149_fatal_link_01"),
        "nvlink:1/1",
        "xid_nvlink",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=30,
        decision=330,
        node_quarantined=True,
        row="`kernel_line`: an NVLink5 XID (144-150) `Fatal` on `Link N` (a GB200 line)",
    ),
    "kernel_line_nvlink5_nonfatal": Expected(
        _kernel_line("gb200_145_nonfatal_link_03"),
        "nvlink:1/3",
        "xid_nvlink",
        Severity.WARN,
        Health.DEGRADED,
        finding=30,
        decision=60,
        row="`kernel_line`: an NVLink5 XID `Nonfatal` on `Link N`",
    ),
    "kernel_line_sxid_fatal": Expected(
        _kernel_line("sxid_fatal"),
        "node",
        "nvswitch_sxid",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=300,
        node_quarantined=True,
        row="`kernel_line`: an NVSwitch `SXid` the driver calls `Fatal`",
    ),
    "kernel_line_sxid_nonfatal": Expected(
        _kernel_line("sxid_nonfatal"),
        "node",
        "nvswitch_sxid",
        Severity.WARN,
        Health.DEGRADED,
        finding=0,
        decision=30,
        row="`kernel_line`: an NVSwitch `SXid` `Non-fatal` or `Correctable`",
    ),
    "kernel_line_154_to_none": Expected(
        _kernel_line("154_to_none"),
        "gpu:1",
        "xid_recovery_action",
        Severity.OK,
        Health.HEALTHY,
        finding=30,
        decision=30,
        row=None,
    ),
    "gpu_lost": Expected(
        "{kind: gpu_lost, gpu: 1}",
        "gpu:1",
        "gpu_lost",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=0,
        node_quarantined=True,
        row="`xid` 79, `gpu_lost`",
    ),
    "reset_required": Expected(
        "{kind: reset_required, gpu: 1}",
        "gpu:1",
        "gpu_reset_required",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=0,
        node_quarantined=True,
        row="`reset_required`, `nvml_error` with `code: reset_required`",
    ),
    "recovery_action": Expected(
        "{kind: recovery_action, gpu: 1, action: gpu_reset}",
        "gpu:1",
        "gpu_recovery_action",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=0,
        node_quarantined=True,
        row="`recovery_action` (`gpu_reset`, `node_reboot`, `drain_p2p`, `drain_and_reset`)",
    ),
    "nvml_error_reset_required": Expected(
        "{kind: nvml_error, gpu: 1, call: nvmlDeviceGetRemappedRows, code: reset_required}",
        "gpu:1",
        "gpu_reset_required",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=0,
        node_quarantined=True,
        row="`reset_required`, `nvml_error` with `code: reset_required`",
    ),
    "ib_symbol_errors": Expected(
        "{kind: ib_symbol_errors, hca: mlx5_1, port: 1, rate: 50/s}",
        "ib:mlx5_1/1",
        "ib_symbol_errors",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=10,
        decision=650,
        row="`ib_symbol_errors` 50/s",
    ),
    "ib_link_flap": Expected(
        "{kind: ib_link_flap, hca: mlx5_1, port: 1, rate: 1/min}",
        "ib:mlx5_1/1",
        "ib_link_flapping",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=360,
        row="`ib_link_flap` 1/min",
    ),
    "ib_port_down": Expected(
        "{kind: ib_port_down, hca: mlx5_1, port: 1}",
        "ib:mlx5_1/1",
        "ib_port_down",
        Severity.CRITICAL,
        Health.QUARANTINED,
        finding=0,
        decision=300,
        row="`ib_port_down`",
    ),
    "ib_congestion": Expected(
        "{kind: ib_congestion, hca: mlx5_1, port: 1, rate: 20000000/s}",
        "ib:mlx5_1/1",
        "ib_xmit_discards",
        Severity.WARN,
        Health.DEGRADED,
        finding=10,
        decision=40,
        row="`thermal_throttle`, `row_remap_pending`, `row_remap_exhausted`, `ib_congestion`",
    ),
    # Filled within one poll while watched: a live fault. (Pinned before the
    # daemon started, it is severity ok and the port stays healthy: see
    # tests/test_infiniband_daemon.py.)
    "ib_counter_pinned": Expected(
        "{kind: ib_counter_pinned, hca: mlx5_1, port: 1, counter: excessive_buffer_overrun_errors}",
        "ib:mlx5_1/1",
        "ib_counter_saturated",
        Severity.WARN,
        Health.DEGRADED,
        finding=0,
        decision=30,
        row="`ib_counter_pinned` filling while watched",
    ),
}


def _scenario(fault: str, at: float = FAULT_AT, beside: str = "") -> str:
    faults = f"{beside}, " if beside else ""
    return NODE + f"faults: [{faults}{fault[:-1]}, at: {at:g}s}}]\n"


def _run_to_decision(sim: SimulatedDaemon, expected: Expected, fault_at: float) -> Decided:
    """Poll until the subject reaches the expected health with its finding;
    seconds after the fault of both (negative: before the fault began)."""
    interval = sim.daemon.config.daemon.poll_interval
    finding = None
    while (elapsed := sim.clock.now() - sim.start - fault_at) <= expected.decision + interval:
        snapshot = sim.daemon.step()
        found = any(
            f.subject == expected.subject and f.code == expected.code for f in snapshot.findings
        )
        if found and finding is None:
            finding = elapsed
        if found and snapshot.health.get(expected.subject) == expected.health:
            return Decided(finding, elapsed)
        sim.clock.advance(interval)
    return Decided(finding, None)


def _assert_outcome(snapshot: Snapshot, expected: Expected) -> None:
    finding = next(
        f for f in snapshot.findings if f.subject == expected.subject and f.code == expected.code
    )
    assert finding.severity == expected.severity and finding.check
    quarantined = {q.subject for q in snapshot.quarantines}
    assert (expected.subject in quarantined) == (expected.health is Health.QUARANTINED)
    assert ("node" in quarantined) == expected.node_quarantined
    # Nothing else on the node is judged unwell.
    others = {
        subject
        for subject, health in snapshot.health.items()
        if health is not Health.HEALTHY and subject not in (expected.subject, "node")
    }
    assert others == set()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_on_a_long_running_daemon_each_kind_is_found_and_decided_as_measured(
    kind: str, tmp_path: Path
) -> None:
    expected = CASES[kind]
    scenario = _scenario(expected.fault, LONG_RUNNING, expected.beside)
    with simulated_daemon(scenario, tmp_path) as sim:
        decided = _run_to_decision(sim, expected, LONG_RUNNING)
        assert decided.decision is not None, f"{kind}: never {expected.health.label}"
        _assert_outcome(sim.daemon.snapshot, expected)
    assert decided == Decided(expected.finding, expected.decision)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_fault_there_when_the_daemon_starts_is_decided_as_soon_give_or_take_a_poll(
    kind: str, tmp_path: Path
) -> None:
    expected = CASES[kind]
    with simulated_daemon(_scenario(expected.fault, beside=expected.beside), tmp_path) as sim:
        decided = _run_to_decision(sim, expected, FAULT_AT)
        assert decided.decision is not None, f"{kind}: never {expected.health.label}"
        _assert_outcome(sim.daemon.snapshot, expected)
    # Found later at times (a BER needs a minute of data first); decided
    # within a poll of a long-running daemon (a share of the window counts
    # the time before the first sample as clean).
    assert decided.finding is not None and decided.finding >= 0
    assert decided.decision <= expected.decision + sim.daemon.config.daemon.poll_interval


def _duration(seconds: float) -> str:
    if seconds == 0:
        return "first poll"
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f"{rest} s"
    return f"{minutes} min" + (f" {rest} s" if rest else "")


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return _duration(low) if low == high else f"{_duration(low)} to {_duration(high)}"


def test_the_readme_decision_table_shows_the_long_running_figures() -> None:
    table = {
        cells[0]: cells
        for line in README.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `") and len(cells := line.strip("| ").split(" | ")) == 5
    }
    rows: dict[str, list[Expected]] = defaultdict(list)
    for expected in CASES.values():
        if expected.row is not None:
            rows[expected.row].append(expected)
    for row, cases in rows.items():
        assert row in table, f"the README's decision table has no row {row}"
        found = _span([case.finding for case in cases])
        decided = _span([case.decision for case in cases])
        assert table[row][3:] == [found, decided], row


def test_power_cap_is_not_a_fault(tmp_path: Path) -> None:
    with simulated_daemon(_scenario("{kind: power_cap, gpu: 1}"), tmp_path) as sim:
        snapshot = sim.run_until(900)
    assert snapshot.node_health is Health.HEALTHY
    assert [f for f in snapshot.findings if f.severity is not Severity.OK] == []


def test_an_idle_gpu_beside_busy_ones_is_not_a_fault(tmp_path: Path) -> None:
    with simulated_daemon(_scenario("{kind: gpu_idle, gpu: 1}"), tmp_path) as sim:
        snapshot = sim.run_until(900)
    idle = next(g for g in snapshot.gpus if g.index == 1)
    assert idle.utilization_gpu_ratio == 0.0
    assert snapshot.node_health is Health.HEALTHY
    assert [f for f in snapshot.findings if f.severity is not Severity.OK] == []


def test_calm_node_stays_healthy_for_an_hour(tmp_path: Path) -> None:
    polls = Config(daemon=DaemonConfig(poll_interval=30))
    with simulated_daemon(NODE + "faults: []\n", tmp_path, polls) as sim:
        snapshot = sim.run_until(3600)
    assert snapshot.node_health is Health.HEALTHY
    assert snapshot.findings == () and snapshot.quarantines == ()


def test_a_single_short_nvlink_burst_does_not_quarantine(tmp_path: Path) -> None:
    burst = "{kind: nvlink_crc_storm, gpu: 1, link: 2, rate: 2000/s, for: 30s}"
    with simulated_daemon(_scenario(burst), tmp_path) as sim:
        worst = max(
            (sim.run_until(t).health.get("nvlink:1/2", Health.HEALTHY) for t in range(0, 900, 60)),
        )
        snapshot = sim.run_until(900)
    assert worst is Health.DEGRADED
    assert snapshot.quarantines == ()


def test_degraded_gpu_recovers_only_after_a_longer_quiet_period(tmp_path: Path) -> None:
    throttle = "{kind: thermal_throttle, gpu: 1, for: 2m}"
    with simulated_daemon(_scenario(throttle), tmp_path) as sim:
        assert sim.run_until(120).health["gpu:1"] is Health.DEGRADED
        # The throttle ended at 130 s; the 5-minute thermal window still holds it
        # and recovery then needs 5 quiet minutes (recover_after) on top.
        assert sim.run_until(600).health["gpu:1"] is Health.DEGRADED
        assert sim.run_until(1200).health["gpu:1"] is Health.HEALTHY


def test_an_xid_that_asks_for_a_reset_drains_the_gpu_until_it_is_quiet(tmp_path: Path) -> None:
    with simulated_daemon(_scenario("{kind: xid, gpu: 1, code: 48}"), tmp_path) as sim:
        drained = next(q for q in sim.run_until(400).quarantines if q.subject == "gpu:1")
        # The XID's finding lasts its 10-minute window; an hour of quiet
        # (policy.release_after) later the drain ends by itself.
        released = sim.run_until(FAULT_AT + 600 + 3600 + 60)
    assert not drained.hardware
    assert released.quarantines == ()


def test_hardware_quarantine_survives_restart_and_is_never_auto_released(tmp_path: Path) -> None:
    scenario = _scenario("{kind: row_remap_failure, gpu: 1, for: 20s}")
    with simulated_daemon(scenario, tmp_path) as sim:
        assert "gpu:1" in {q.subject for q in sim.run_until(30).quarantines}
    # A new daemon on the same state directory: the fault is long gone from the
    # counters' window, but the quarantine stays, hours later.
    slow_polls = Config(daemon=DaemonConfig(poll_interval=60))
    with simulated_daemon(NODE + "faults: []\n", tmp_path, slow_polls) as sim:
        first = sim.daemon.step()
        assert {q.subject for q in first.quarantines} >= {"gpu:1", "node"}
        later = sim.run_until(3 * 3600)
    quarantine = next(q for q in later.quarantines if q.subject == "gpu:1")
    assert quarantine.hardware and quarantine.source == "auto"
    assert later.health["gpu:1"] is Health.QUARANTINED


def test_uncorrectable_error_drains_until_reset_then_returns_to_service(tmp_path: Path) -> None:
    # The fault's end is the GPU's reset: nothing pending, the row remapped.
    polls = Config(daemon=DaemonConfig(poll_interval=60))
    # XID 94: on A100 and later the driver contains the error (NVIDIA XID catalog).
    fault = "{kind: ecc_uncorrectable, gpu: 1, code: 94, for: 20m}"
    with simulated_daemon(_scenario(fault), tmp_path, polls) as sim:
        drained = sim.run_until(60)
        held = sim.run_until(1200)
        back = sim.run_until(1200 + 600 + 3600 + 120)
    quarantine = next(q for q in drained.quarantines if q.subject == "gpu:1")
    assert not quarantine.hardware and quarantine.code == "ecc_uncorrectable"
    # Still pending 20 minutes on, long after the error left the counters' window.
    assert held.health["gpu:1"] is Health.QUARANTINED
    assert back.quarantines == () and back.node_health is Health.HEALTHY


def test_a_refused_nvml_value_changes_no_health(tmp_path: Path) -> None:
    fault = "{kind: nvml_error, gpu: 1, call: nvmlDeviceGetRemappedRows, code: not_supported}"
    with simulated_daemon(_scenario(fault), tmp_path) as sim:
        snapshot = sim.run_until(900)
    assert snapshot.node_health is Health.HEALTHY and snapshot.quarantines == ()
    assert next(g for g in snapshot.gpus if g.index == 1).row_remap_pending is None


def test_gpu_returning_after_loss_stays_quarantined(tmp_path: Path) -> None:
    with simulated_daemon(_scenario("{kind: gpu_lost, gpu: 1, for: 60s}"), tmp_path) as sim:
        snapshot = sim.run_until(600)
    assert next(g for g in snapshot.gpus if g.index == 1).up
    assert snapshot.health["gpu:1"] is Health.QUARANTINED


def test_infiniband_counter_reset_raises_nothing(tmp_path: Path) -> None:
    with simulated_daemon(NODE + "faults: []\n", tmp_path) as sim:
        sim.run_until(300)
        sim.node.fabric.reset_counters("mlx5_0", sim.clock.now())
        snapshot = sim.run_until(900)
    assert [f for f in snapshot.findings if f.severity is not Severity.OK] == []


def test_sdc_ends_in_a_confirmed_quarantine_of_that_gpu_and_nothing_else(
    tmp_path: Path,
) -> None:
    # Bursts every minute so the test needs few polls; the canary agent runs
    # the production suite on the CPU backend standing in for each GPU.
    config = Config(canary=CanaryConfig(interval=60.0))
    with simulated_daemon(_scenario("{kind: sdc, gpu: 2}"), tmp_path, config, canary=True) as sim:
        snapshot = sim.run_until(300)
    finding = next(f for f in snapshot.findings if f.code == "sdc_confirmed")
    assert finding.subject == "gpu:2" and finding.definitive
    quarantined = {q.subject: q for q in snapshot.quarantines}
    assert quarantined["gpu:2"].hardware
    # The node follows its GPU (node_quarantine_ratio), nothing else is touched.
    assert set(quarantined) == {"gpu:2", "node"}
    assert snapshot.canary is not None


def test_a_calm_node_as_real_hardware_answers_stays_healthy_for_an_hour(tmp_path: Path) -> None:
    # Clocks locked by an operator, IB counters pinned before the daemon came,
    # one link whose counters the driver refuses, a restricted counter file:
    # each is how shipped hardware answers, none is a fault.
    faults = """faults:
      - {at: 0s, kind: clocks_locked, mhz: 1410}
      - {at: 0s, kind: ib_counter_pinned, hca: mlx5_0, port: 1, counter: link_downed}
      - {at: 0s, kind: ib_counter_pinned, hca: mlx5_1, port: 1, counter: port_xmit_wait}
      - {at: 0s, kind: ib_counter_einval, hca: mlx5_1, port: 1, counter: port_rcv_errors}
      - {at: 0s, kind: nvml_error, gpu: 1, call: nvmlDeviceGetNvLinkErrorCounter,
         code: not_supported, link: 2}
    """
    polls = Config(daemon=DaemonConfig(poll_interval=30))
    with simulated_daemon(NODE + faults, tmp_path, polls) as sim:
        snapshot = sim.run_until(3600)
    assert snapshot.node_health is Health.HEALTHY and snapshot.quarantines == ()
    assert {f.code for f in snapshot.findings if f.severity is not Severity.OK} == set()
    gpu1 = next(g for g in snapshot.gpus if g.index == 1)
    link2 = next(link for link in gpu1.nvlinks if link.link == 2)
    assert link2.up and "crc_flit" not in link2.errors
