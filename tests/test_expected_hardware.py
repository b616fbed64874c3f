"""Expected hardware through the whole daemon: a node with fewer GPUs than
expected, GPUs whose NVLinks never came up, and a calm node with one link
that refuses everything, on the simulated node and the production code.
The README's scenario table states these decisions."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pynvml
import pytest
from daemon_support import SimulatedDaemon, simulated_daemon
from gpu_history import gpu, record

from gpuwatchd.checks import gpu_lost, nvlink
from gpuwatchd.checks.gpu_lost import GpuLostConfig, KnownGpu
from gpuwatchd.checks.nvlink import NvlinkConfig
from gpuwatchd.checks.registry import ChecksConfig
from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.history import History
from gpuwatchd.model import FABRIC_STATE_COMPLETED, FABRIC_STATE_NOT_SUPPORTED, Health, Severity
from gpuwatchd.sim.scenario import ScenarioError, parse
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.store import Store

EIGHT_GPUS = "node: {gpus: 8, nvlinks: 4, hcas: 2}\nseed: 3\n"
FOUR_GPUS = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"


def _run(sim: SimulatedDaemon, seconds: float) -> list[Snapshot]:
    interval = sim.daemon.config.daemon.poll_interval
    snapshots = []
    while sim.clock.now() - sim.start <= seconds + 1e-9:
        snapshots.append(sim.daemon.step())
        sim.clock.advance(interval)
    return snapshots


def _first(snapshots: list[Snapshot], subject: str, health: Health) -> float | None:
    return next(
        (s.time - snapshots[0].time for s in snapshots if s.health.get(subject) is health), None
    )


def test_node_with_7_of_8_expected_gpus_is_unhealthy_then_quarantined(tmp_path: Path) -> None:
    scenario = EIGHT_GPUS + "faults: [{at: 0s, kind: gpu_missing, gpu: 3}]\n"
    with simulated_daemon(scenario, tmp_path) as sim:
        snapshots = _run(sim, 400)
    first = snapshots[0]
    assert len(first.gpus) == 7
    [finding] = [f for f in first.findings if f.code == "gpu_missing"]
    assert (finding.subject, finding.severity, finding.definitive) == (
        "node",
        Severity.CRITICAL,
        False,
    )
    assert "7 of 8" in finding.message
    assert first.health["node"] is Health.UNHEALTHY
    # Not definitive: policy's confirm_for (5 min) before the node is drained.
    assert _first(snapshots, "node", Health.QUARANTINED) == 300


def test_a_gpu_missing_after_a_healthy_start_is_named_from_the_record(tmp_path: Path) -> None:
    with simulated_daemon(EIGHT_GPUS + "faults: []\n", tmp_path) as sim:
        healthy = sim.daemon.step()
    missing_uuid = healthy.gpus[3].uuid
    assert missing_uuid is not None
    scenario = EIGHT_GPUS + "faults: [{at: 0s, kind: gpu_missing, gpu: 3}]\n"
    with simulated_daemon(scenario, tmp_path) as sim:
        # After the restart: the previous run's samples, restored, are older.
        sim.clock.advance(60)
        snapshot = sim.daemon.step()
    [finding] = [f for f in snapshot.findings if f.code == "gpu_missing"]
    assert missing_uuid in finding.message and "00000000:5D:00.0" in finding.message
    assert missing_uuid not in {g.uuid for g in snapshot.gpus}


@pytest.mark.parametrize(("fields", "present"), [("count: 2", 6), ("", 7)])
def test_the_last_gpus_missing_by_count(tmp_path: Path, fields: str, present: int) -> None:
    scenario = EIGHT_GPUS + f"faults: [{{at: 0s, kind: gpu_missing, {fields}}}]\n"
    with simulated_daemon(scenario, tmp_path) as sim:
        snapshot = sim.daemon.step()
    assert [g.index for g in snapshot.gpus] == list(range(present))
    found = [f.evidence["present"] for f in snapshot.findings if f.code == "gpu_missing"]
    assert found == [present]


def test_a_gpu_whose_nvlinks_never_came_up_is_quarantined_after_confirmation(
    tmp_path: Path,
) -> None:
    scenario = FOUR_GPUS + "faults: [{at: 0s, kind: nvlink_inactive, gpu: 1}]\n"
    with simulated_daemon(scenario, tmp_path) as sim:
        snapshots = _run(sim, 420)
    last = snapshots[-1]
    [finding] = [f for f in last.findings if f.code == "nvlink_missing"]
    assert (finding.subject, finding.severity) == ("gpu:1", Severity.CRITICAL)
    assert finding.evidence == {"expected": 4, "up": 0, "never_up": "0, 1, 2, 3"}
    # One window (1 min) of links never up, then confirm_for (5 min).
    assert _first(snapshots, "gpu:1", Health.UNHEALTHY) == 60
    assert _first(snapshots, "gpu:1", Health.QUARANTINED) == 360
    assert "node" in {q.subject for q in last.quarantines}
    others = {s for s, h in last.health.items() if h is not Health.HEALTHY}
    assert others == {"gpu:1", "node"}


def test_one_inactive_link_is_named_on_its_gpu(tmp_path: Path) -> None:
    scenario = FOUR_GPUS + "faults: [{at: 0s, kind: nvlink_inactive, gpu: 2, link: 1}]\n"
    with simulated_daemon(scenario, tmp_path) as sim:
        snapshot = _run(sim, 70)[-1]
    [finding] = [f for f in snapshot.findings if f.code == "nvlink_missing"]
    assert finding.subject == "gpu:2" and finding.evidence["never_up"] == "1"


def test_calm_node_with_one_refused_link_stays_healthy_for_an_hour(tmp_path: Path) -> None:
    polls = Config(daemon=DaemonConfig(poll_interval=30))
    refused = pynvml.NVML_ERROR_NOT_SUPPORTED
    with simulated_daemon(FOUR_GPUS + "faults: []\n", tmp_path, polls) as sim:
        sim.node.nvml.fail_link(refused, "nvmlDeviceGetNvLinkErrorCounter", link=2, gpu=1)
        sim.daemon.step()
        # Its state too, once it was found: a link of unknown state is not missing.
        sim.node.nvml.fail_link(refused, "nvmlDeviceGetNvLinkState", link=2, gpu=1)
        snapshot = _run(sim, 3600)[-1]
    assert snapshot.node_health is Health.HEALTHY
    assert snapshot.findings == () and snapshot.quarantines == ()
    links = snapshot.gpus[1].nvlinks
    assert (links[2].up, links[2].errors) == (None, {})
    assert all(link.up and link.errors for link in links if link.link != 2)


# -- NVLinks expected from the fabric and the links seen up, not the product name -------

H100_NODE = 'node: {gpus: 2, model: "NVIDIA H100 80GB HBM3", nvlinks: %d, hcas: 0}\nseed: %d\n'
A100_NODE = 'node: {gpus: 2, model: "NVIDIA A100-SXM4-80GB", nvlinks: 12, hcas: 0}\nseed: %d\n'


def _nvlink_missing(snapshot: Snapshot) -> list[tuple[str, object, object, object]]:
    return [
        (f.subject, f.evidence["expected"], f.evidence["up"], f.evidence["never_up"])
        for f in snapshot.findings
        if f.code == "nvlink_missing"
    ]


def _restarted_on(
    state: Path, first_node: str, node: str, config: Config | None = None
) -> Snapshot:
    """A minute of a daemon restarted on `node`, hours after a healthy run
    on `first_node`, on the same state database, with real NVLink expectations
    (`config`'s after the restart)."""
    with simulated_daemon(first_node + "faults: []\n", state, links_from_scenario=False) as sim:
        assert _nvlink_missing(sim.run_until(70)) == []
        restart = sim.clock.now() + 6 * 3600
    shutil.rmtree(state / "sysfs")
    with simulated_daemon(node, state, config, start=restart, links_from_scenario=False) as sim:
        return sim.run_until(70)


def test_an_h100_passed_through_to_a_vm_without_nvlinks_is_not_missing_any(
    tmp_path: Path,
) -> None:
    # The VM's GPUs keep their HGX product name; NVML reports no links and no fabric.
    with simulated_daemon(H100_NODE % (0, 1), tmp_path, links_from_scenario=False) as sim:
        snapshot = sim.run_until(420)
    assert {(g.name, g.fabric_state, g.nvlinks) for g in snapshot.gpus} == {
        ("NVIDIA H100 80GB HBM3", FABRIC_STATE_NOT_SUPPORTED, ())
    }
    assert _nvlink_missing(snapshot) == []
    assert snapshot.quarantines == ()


def test_an_h100_registered_with_the_fabric_whose_links_never_came_up_is_missing(
    tmp_path: Path,
) -> None:
    scenario = H100_NODE % (18, 1) + "faults: [{at: 0s, kind: nvlink_inactive, gpu: 1}]\n"
    with simulated_daemon(scenario, tmp_path, links_from_scenario=False) as sim:
        snapshot = sim.run_until(70)
    assert snapshot.gpus[1].fabric_state == FABRIC_STATE_COMPLETED
    assert _nvlink_missing(snapshot) == [("gpu:1", 18, 0, ", ".join(map(str, range(18))))]


def test_links_learned_before_a_restart_and_never_up_after_it_are_missing_by_name(
    tmp_path: Path,
) -> None:
    # An A100 reports no fabric state: only the links seen up say what it should have.
    inactive = "  - {at: 0s, kind: nvlink_inactive, gpu: 1, link: %d}\n"
    node = A100_NODE % 1 + "faults:\n" + inactive % 4 + inactive % 9
    assert _nvlink_missing(_restarted_on(tmp_path, A100_NODE % 1, node)) == [
        ("gpu:1", 12, 10, "4, 9")
    ]


def test_a_new_board_at_the_same_index_does_not_inherit_the_learned_links(
    tmp_path: Path,
) -> None:
    # Another seed: other boards (UUIDs) at the same indices, GPU 1's links never up.
    node = A100_NODE % 2 + "faults: [{at: 0s, kind: nvlink_inactive, gpu: 1}]\n"
    snapshot = _restarted_on(tmp_path, A100_NODE % 1, node)
    assert _nvlink_missing(snapshot) == []
    store = Store.open(str(tmp_path / "state"))
    learned = store.facts.get(nvlink.LINKS_SEEN_UP_FACT)
    store.close()
    # The first run's two boards and the new GPU 0; nothing for the new GPU 1.
    assert sorted(learned.values()) == [list(range(12))] * 3
    assert snapshot.gpus[0].uuid in learned and snapshot.gpus[1].uuid not in learned


def test_the_links_seen_up_are_written_once_by_uuid_not_every_poll(tmp_path: Path) -> None:
    with simulated_daemon(A100_NODE % 1 + "faults: []\n", tmp_path) as sim:
        snapshot = sim.run_until(120)
    database = tmp_path / "state" / "state.db"
    with closing(sqlite3.connect(database)) as db:
        [(written, data)] = db.execute(
            "SELECT time, data FROM facts WHERE key = ?", (nvlink.LINKS_SEEN_UP_FACT,)
        ).fetchall()
    assert written == sim.start
    assert json.loads(data) == {gpu.uuid: list(range(12)) for gpu in snapshot.gpus}


def test_expected_links_0_silences_the_links_learned_and_the_fabric(tmp_path: Path) -> None:
    node = H100_NODE % (18, 1) + "faults: [{at: 0s, kind: nvlink_inactive, gpu: 1}]\n"
    none = Config(checks=ChecksConfig(nvlink=NvlinkConfig(expected_links=0)))
    snapshot = _restarted_on(tmp_path, H100_NODE % (18, 1), node, none)
    assert snapshot.gpus[1].fabric_state == FABRIC_STATE_COMPLETED
    assert _nvlink_missing(snapshot) == []


# -- the record of the first healthy start ----------------------------------------------


def test_the_record_is_kept_by_the_state_database(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    store = Store.open(state)
    assert store.facts.get(gpu_lost.KNOWN_GPUS_FACT) is None
    store.facts.put(gpu_lost.KNOWN_GPUS_FACT, [{"uuid": "GPU-a", "pci_bus_id": "b"}], 1.0)
    store.close()
    reopened = Store.open(state)
    known = gpu_lost.decode_known(reopened.facts.get(gpu_lost.KNOWN_GPUS_FACT))
    reopened.close()
    assert known == (KnownGpu("GPU-a", "b"),)


def test_only_a_healthy_poll_with_no_fewer_gpus_is_recorded() -> None:
    eight = [gpu(i, pci_bus_id=f"bus{i}") for i in range(8)]
    known = gpu_lost.known_after((), eight)
    assert known is not None and len(known) == 8
    assert gpu_lost.known_after(known, eight) is None  # nothing new
    assert gpu_lost.known_after(known, eight[:7]) is None  # fewer: keep the expectation
    assert gpu_lost.known_after((), [*eight[:7], gpu(7, up=False)]) is None  # one lost
    replaced = [*eight[:7], gpu(7, uuid="GPU-rma")]
    assert gpu_lost.known_after(known, replaced) == (*known[:7], KnownGpu("GPU-rma", None))


def test_without_a_record_or_a_count_nothing_is_missing() -> None:
    history = record(History(max_age_seconds=600), 0.0, [gpu(0)])
    assert gpu_lost.run(history, 0.0, GpuLostConfig()).findings == ()
    assert gpu_lost.run(history, 0.0, GpuLostConfig(expected_gpus=0)).findings == ()
    [finding] = gpu_lost.run(history, 0.0, GpuLostConfig(expected_gpus=2)).findings
    assert finding.code == "gpu_missing" and finding.evidence["missing"] == "unknown"


# -- the scenario kinds ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("{at: 10s, kind: gpu_missing, gpu: 1}", "from boot"),
        ("{at: 10s, kind: nvlink_inactive, gpu: 1}", "from boot"),
        ("{at: 0s, kind: gpu_missing, gpu: 1, count: 2}", "either gpu"),
        ("{at: 0s, kind: gpu_missing, count: 9}", "count must be 1-8"),
        ("{at: 0s, kind: nvlink_inactive, gpu: 1, link: 4}", "link 4 out of range"),
        ("{at: 0s, kind: nvlink_inactive}", "missing field(s) gpu"),
    ],
)
def test_boot_time_kinds_reject_what_they_cannot_mean(fault: str, problem: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(problem)):
        parse(EIGHT_GPUS + f"faults: [{fault}]\n")
