"""Boards, not slots: every decision follows the GPU that earned it.

Each test runs the daemon over the simulated node, boot after boot on one
state directory: a scenario run again with the same seed is the next boot of
the same node (the boards keep their UUIDs), and `gpu_missing` renumbers the
GPUs after the one it takes out, as NVML does.
"""

from __future__ import annotations

from pathlib import Path

from daemon_support import SimulatedDaemon, simulated_daemon

from gpuwatchd.actions.client import Offline
from gpuwatchd.actions.manual import resolve_subject
from gpuwatchd.config import Config
from gpuwatchd.model import Health, Quarantine
from gpuwatchd.policy import PolicyConfig
from gpuwatchd.snapshot import Snapshot

NODE = "node: {gpus: 8, nvlinks: 2, hcas: 0}\nseed: 7\n"
HOUR = 3600.0
DAY = 86400.0


def boot(
    tmp_path: Path, faults: str, start: float, config: Config | None = None
) -> SimulatedDaemon:
    """The node booted at `start` (seconds on the daemon's clock) with `faults`."""
    return simulated_daemon(f"{NODE}faults: {faults}\n", tmp_path, config, start=start)


def uuids(sim: SimulatedDaemon) -> list[str]:
    """The boards of the node, by slot (gpu_missing's included)."""
    return [gpu.uuid for gpu in sim.node.gpus.gpus]


def held(snapshot: Snapshot) -> dict[str, Quarantine]:
    return {q.subject: q for q in snapshot.quarantines}


def test_a_lost_board_keeps_its_quarantine_and_no_renumbered_board_inherits_it(
    tmp_path: Path,
) -> None:
    with boot(tmp_path, "[{at: 10s, kind: gpu_lost, gpu: 3}]", start=1000.0) as sim:
        boards = uuids(sim)
        first = held(sim.run_until(60))
        assert first["gpu:3"].uuid == boards[3]
    # The reboot: GPU 3 does not come back; the GPUs after it move down one.
    with boot(tmp_path, "[{at: 0s, kind: gpu_missing, gpu: 3}]", start=2000.0) as sim:
        snapshot = sim.run_until(60)
    quarantines = held(snapshot)
    gone = quarantines[f"gpu:{boards[3]}"]
    assert (gone.uuid, gone.last_index, gone.code) == (boards[3], 3, "gpu_lost")
    # No board but the lost one is quarantined; the board now at index 3 is GPU 4's.
    assert {s for s in quarantines if s.startswith("gpu:")} == {f"gpu:{boards[3]}"}
    now_at_3 = next(gpu for gpu in snapshot.gpus if gpu.index == 3)
    assert now_at_3.uuid == boards[4]
    assert all(snapshot.health[f"gpu:{index}"] is Health.HEALTHY for index in range(7))
    [absent] = [f for f in snapshot.findings if f.code == "quarantined_gpu_absent"]
    assert absent.subject == "node" and boards[3] in absent.message
    assert "last gpu:3, bus 00000000:5D:00.0" in absent.message


def test_restored_samples_are_given_to_their_own_board_only(tmp_path: Path) -> None:
    with boot(tmp_path, "[]", start=1000.0) as sim:
        boards = uuids(sim)
        sim.run_until(60)
    with boot(tmp_path, "[{at: 0s, kind: gpu_missing, gpu: 3}]", start=2000.0) as sim:
        sim.daemon.step()
        history = sim.daemon.history
        # Each index holds one board's samples, the earlier run's among them.
        for index, slot in enumerate((0, 1, 2, 4, 5, 6, 7)):
            track = history.gpu_track(index)
            assert {sample.uuid for sample in track.samples} == {boards[slot]}
            assert track.times[0] < 2000.0


def test_a_new_board_in_a_condemned_slot_is_healthy(tmp_path: Path) -> None:
    with boot(tmp_path, "[{at: 10s, kind: row_remap_failure, gpu: 2}]", start=1000.0) as sim:
        boards = uuids(sim)
        assert held(sim.run_until(30))["gpu:2"].hardware
    # The board was sent back; another one sits in slot 2.
    with boot(tmp_path, "[{at: 0s, kind: gpu_replaced, gpu: 2}]", start=DAY) as sim:
        replacement = uuids(sim)[2]
        first = sim.daemon.step()
        assert "quarantined_gpu_absent" in {f.code for f in first.findings}
        assert first.health["node"] is Health.DEGRADED
        snapshot = sim.run_until(60)
    assert replacement != boards[2]
    assert snapshot.health["gpu:2"] is Health.HEALTHY
    quarantines = held(snapshot)
    assert "gpu:2" not in quarantines
    assert quarantines[f"gpu:{boards[2]}"].hardware
    # An absent board is no GPU of the node's share: the node serves again.
    assert "node" not in quarantines
    assert snapshot.health["node"] is Health.DEGRADED


def test_the_reboot_that_cures_a_lost_gpu_releases_it_once_quiet(tmp_path: Path) -> None:
    with boot(tmp_path, "[{at: 10s, kind: gpu_lost, gpu: 3}]", start=1000.0) as sim:
        quarantines = held(sim.run_until(60))
    assert not quarantines["gpu:3"].hardware and not quarantines["node"].hardware
    with boot(tmp_path, "[]", start=2000.0) as sim:
        assert {"gpu:3", "node"} <= held(sim.run_until(60)).keys()
        # Quiet for policy.release_after (an hour) since it was last lost; the
        # node an hour after its GPU share is back (as after any GPU's drain).
        assert held(sim.run_until(HOUR)).keys() == {"node"}
        released = sim.run_until(2 * HOUR + 120)
    assert released.quarantines == ()
    assert released.node_health is Health.HEALTHY


def test_a_board_that_falls_off_the_bus_again_after_two_reboots_is_condemned(
    tmp_path: Path,
) -> None:
    lost = "[{at: 10s, kind: gpu_lost, gpu: 5}]"
    # Released between the boots only by the operator; what counts is the boots.
    quick = Config(policy=PolicyConfig(release_after=600.0))
    with boot(tmp_path, lost, start=1000.0, config=quick) as sim:
        board = uuids(sim)[5]
        assert not held(sim.run_until(60))["gpu:5"].hardware
    with boot(tmp_path, "[]", start=2000.0, config=quick) as sim:
        sim.run_until(60)
    # The third boot renumbers it (GPU 2 is missing): the record follows the board.
    again = "[{at: 0s, kind: gpu_missing, gpu: 2}, {at: 10s, kind: gpu_lost, gpu: 5}]"
    with boot(tmp_path, again, start=3000.0, config=quick) as sim:
        quarantine = held(sim.run_until(60))["gpu:4"]
    assert quarantine.uuid == board
    assert quarantine.hardware and quarantine.code == "gpu_lost"


def test_a_board_lost_in_one_boot_and_absent_from_the_next_is_not_escalated_elsewhere(
    tmp_path: Path,
) -> None:
    with boot(tmp_path, "[{at: 10s, kind: gpu_lost, gpu: 3}]", start=1000.0) as sim:
        sim.run_until(60)
    with boot(tmp_path, "[{at: 0s, kind: gpu_missing, gpu: 3}]", start=2000.0) as sim:
        sim.run_until(60)
    # The board now at index 3 (GPU 4's) falls off the bus for the first time.
    lost_again = "[{at: 0s, kind: gpu_missing, gpu: 3}, {at: 10s, kind: gpu_lost, gpu: 4}]"
    with boot(tmp_path, lost_again, start=3000.0) as sim:
        quarantine = held(sim.run_until(60))["gpu:3"]
    assert not quarantine.hardware


def test_an_operators_quarantine_names_the_board_in_the_state_and_the_journal(
    tmp_path: Path,
) -> None:
    with boot(tmp_path, "[]", start=1000.0) as sim:
        boards = uuids(sim)
        sim.run_until(20)
        decision, _ = sim.daemon.quarantine("gpu:3", "fans at 100%", "alice")
        assert decision is not None and decision.uuid == boards[3]
        quarantine = {q.subject: q for q in sim.daemon.quarantines()}["gpu:3"]
        assert (quarantine.uuid, quarantine.last_index) == (boards[3], 3)
        [entry] = [e for e in sim.daemon.journal(None, "gpu:3", 100) if e.kind == "quarantine"]
        assert entry.data == {"uuid": boards[3]}
    # With the daemon down the CLI resolves gpu:<index> by the boards it last saw.
    config = sim.daemon.config
    with Offline(config, config.daemon.state_dir) as offline:
        subject = offline.subject("gpu:5")
        offline.quarantine(subject, "reseat", "bob")
        by_subject = {q.subject: q for q in offline.quarantines()}
    assert by_subject["gpu:5"].uuid == boards[5]


def test_an_absent_boards_quarantine_is_released_by_its_uuid(tmp_path: Path) -> None:
    with boot(tmp_path, "[{at: 10s, kind: gpu_lost, gpu: 3}]", start=1000.0) as sim:
        board = uuids(sim)[3]
        sim.run_until(30)
    with boot(tmp_path, "[{at: 0s, kind: gpu_missing, gpu: 3}]", start=2000.0) as sim:
        snapshot = sim.run_until(30)
        subject = resolve_subject(f"gpu:{board.lower()}", snapshot.gpus, snapshot.quarantines)
        assert subject == f"gpu:{board}"
        assert sim.daemon.release(subject, "sent back to the vendor", "alice") is not None
        after = sim.run_until(60)
    assert subject not in held(after)
    assert "quarantined_gpu_absent" not in {f.code for f in after.findings}
