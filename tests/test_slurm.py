"""Slurm: drain on quarantine and resume on release through a fake `scontrol`
that answers `show node` like the real one and records every call; only
gpuwatchd's own drains are resumed; failures are findings, retried; dry run
runs nothing; and `gpuwatchd slurm-healthcheck`."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from actions_support import FakeScontrol, fake_scontrol, wait_for
from click.testing import CliRunner

from gpuwatchd.actions.fleet import FleetSafety, FleetSafetyConfig
from gpuwatchd.actions.scheduler import SchedulerWorker
from gpuwatchd.actions.slurm import Slurm, SlurmConfig, parse_show_node
from gpuwatchd.cli import main
from gpuwatchd.clock import FakeClock
from gpuwatchd.model import Health, Quarantine
from gpuwatchd.policy import PolicyConfig, evaluate
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.store import Store

T0 = FakeClock().now()
NODE_ECC = Quarantine("node", "gpu_quarantine_ratio", "auto", T0, code="gpu_quarantine_ratio")
GPU_ECC = Quarantine("gpu:1", "ecc_uncorrectable", "auto", T0, hardware=True)
MANUAL = Quarantine("node", "bad PSU", "manual", T0, operator="alice")
IB = Quarantine("ib:mlx5_0/1", "ib_link_flapping", "auto", T0)
FLEET_ALLOWS = FleetSafety(FleetSafetyConfig(enabled=False))


def snapshot(*quarantines: Quarantine) -> Snapshot:
    health = {q.subject: Health.QUARANTINED for q in quarantines}
    return Snapshot(time=T0, quarantines=quarantines, health=health)


@pytest.fixture
def scontrol(tmp_path: Path) -> FakeScontrol:
    return fake_scontrol(tmp_path / "slurm")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(str(tmp_path / "state"))


def worker(
    scontrol: FakeScontrol,
    store: Store,
    fleet: FleetSafety = FLEET_ALLOWS,
    policy_dry_run: bool = False,
    **settings: object,
) -> SchedulerWorker:
    config = SlurmConfig(
        enabled=True,
        node_name="gpu-node-7",
        scontrol=str(scontrol.path),
        timeout=settings.pop("timeout", 5.0),  # type: ignore[arg-type]
        **settings,  # type: ignore[arg-type]
    )
    return SchedulerWorker(Slurm(config), fleet, store, FakeClock(), policy_dry_run)


def test_show_node_parses_state_flags_reason_with_spaces_and_null_comment() -> None:
    state = parse_show_node(
        "NodeName=n1 Arch=x86_64\n   State=MIXED+DRAIN ThreadsPerCore=2\n"
        "   Comment=(null)\n   Reason=gpuwatchd: gpu:1 ecc [root@2026-01-01T00:00:00]\n"
    )
    assert state.flags == ("MIXED", "DRAIN") and state.drained and state.drained_by_us
    assert state.comment == ""


def test_a_node_quarantine_drains_and_its_release_resumes(
    scontrol: FakeScontrol, store: Store
) -> None:
    slurm = worker(scontrol, store)
    slurm.update(snapshot(NODE_ECC))
    slurm.run_once(T0)
    assert scontrol.updates() == [
        [
            "update",
            "NodeName=gpu-node-7",
            "State=DRAIN",
            "Reason=gpuwatchd: node gpu_quarantine_ratio",
        ]
    ]
    assert scontrol.state["state"] == "IDLE+DRAIN" and slurm.status().drained
    slurm.update(snapshot())
    slurm.run_once(T0 + 10)
    assert scontrol.updates()[-1] == ["update", "NodeName=gpu-node-7", "State=RESUME"]
    assert scontrol.state["state"] == "IDLE" and not slurm.status().drained
    journal = [e.message for e in store.journal.entries() if e.kind == "action"]
    assert journal == [
        "slurm: drained gpu-node-7: gpuwatchd: node gpu_quarantine_ratio",
        "slurm: resumed gpu-node-7, drained by gpuwatchd "
        "(gpuwatchd: node gpu_quarantine_ratio [root@2026-01-01T00:00:00])",
    ]


def test_a_node_drained_by_someone_else_is_neither_drained_again_nor_resumed(
    tmp_path: Path, store: Store
) -> None:
    scontrol = fake_scontrol(tmp_path / "slurm", state="IDLE+DRAIN", reason="disk replacement")
    slurm = worker(scontrol, store)
    slurm.update(snapshot(NODE_ECC))
    slurm.run_once(T0)
    slurm.update(snapshot())
    slurm.run_once(T0 + 10)
    assert scontrol.updates() == []
    assert [call[:2] for call in scontrol.calls()] == [["show", "node"], ["show", "node"]]
    assert scontrol.state["state"] == "IDLE+DRAIN"


def test_a_gpu_quarantine_drains_the_node_by_default(scontrol: FakeScontrol, store: Store) -> None:
    slurm = worker(scontrol, store)
    slurm.update(snapshot(GPU_ECC))
    slurm.run_once(T0)
    assert scontrol.state["reason"] == "gpuwatchd: gpu:1 ecc_uncorrectable"


def test_a_gpu_quarantine_with_mark_only_comments_and_the_comment_goes_with_it(
    scontrol: FakeScontrol, store: Store
) -> None:
    slurm = worker(scontrol, store, gpu_quarantine="mark")
    slurm.update(snapshot(GPU_ECC, IB))
    slurm.run_once(T0)
    assert scontrol.state["state"] == "IDLE"
    comment = "gpuwatchd: gpu:1 ecc_uncorrectable; ib:mlx5_0/1 ib_link_flapping"
    assert scontrol.updates() == [["update", "NodeName=gpu-node-7", f"Comment={comment}"]]
    slurm.update(snapshot())
    slurm.run_once(T0 + 10)
    assert scontrol.updates()[-1] == ["update", "NodeName=gpu-node-7", "Comment="]
    assert scontrol.state["comment"] == ""


def test_someone_elses_comment_is_left_alone(tmp_path: Path, store: Store) -> None:
    scontrol = fake_scontrol(tmp_path / "slurm")
    scontrol.set(comment="reserved for team A")
    slurm = worker(scontrol, store, gpu_quarantine="mark")
    slurm.update(snapshot(GPU_ECC))
    slurm.run_once(T0)
    assert scontrol.updates() == [] and scontrol.state["comment"] == "reserved for team A"


def test_a_hanging_scontrol_is_a_finding_and_is_retried_until_it_works(
    scontrol: FakeScontrol, store: Store
) -> None:
    scontrol.set(hang=True)
    slurm = worker(scontrol, store, timeout=0.3, retry_interval=60.0)
    slurm.update(snapshot(NODE_ECC))
    due = slurm.run_once(T0)
    (finding,) = slurm.findings()
    assert finding.subject == "node" and finding.check == "actions"
    assert finding.code == "slurm_show_failed" and "timed out after 0.3s" in finding.message
    assert due == T0 + 60 and slurm.run_once(T0 + 30) == T0 + 60  # not before it is due

    scontrol.set(hang=False, fail=True)
    slurm.run_once(T0 + 60)
    assert "Unable to contact slurm controller" in slurm.findings()[0].message

    scontrol.set(fail=False)
    assert slurm.run_once(T0 + 120) is None
    assert slurm.findings() == () and scontrol.state["state"] == "IDLE+DRAIN"
    failures = [e for e in store.journal.entries() if e.kind == "action" and "failed" in e.message]
    assert len(failures) == 2  # the timeout and the controller error, each once


@pytest.mark.parametrize("policy_dry_run", [True, False])
def test_dry_run_logs_and_journals_what_would_run_and_runs_nothing(
    scontrol: FakeScontrol, store: Store, policy_dry_run: bool
) -> None:
    slurm = worker(scontrol, store, policy_dry_run=policy_dry_run, dry_run=not policy_dry_run)
    slurm.update(snapshot(NODE_ECC))
    slurm.run_once(T0)
    slurm.update(snapshot())
    slurm.run_once(T0 + 10)
    assert scontrol.calls() == []
    rehearsed = [e.message for e in store.journal.entries() if e.kind == "action"]
    assert rehearsed == [
        "slurm: dry run: would run: "
        f"{scontrol.path} update NodeName=gpu-node-7 State=DRAIN "
        "'Reason=gpuwatchd: node gpu_quarantine_ratio'",
        f"slurm: dry run: would run: {scontrol.path} update NodeName=gpu-node-7 State=RESUME "
        "(if gpuwatchd drained it)",
    ]
    assert all(e.dry_run for e in store.journal.entries() if e.kind == "action")


def test_fleet_safety_holds_an_automatic_drain_back_but_never_a_manual_one(
    scontrol: FakeScontrol, store: Store
) -> None:
    closed = FleetSafety(FleetSafetyConfig(prometheus_url=None, fail_open=False))
    slurm = worker(scontrol, store, fleet=closed)
    slurm.update(snapshot(NODE_ECC))
    slurm.run_once(T0)
    assert scontrol.updates() == []
    (finding,) = slurm.findings()
    assert finding.code == "fleet_drain_withheld" and "failing closed" in finding.message
    assert slurm.status().withheld is not None
    assert any("held back by fleet safety" in e.message for e in store.journal.entries())

    slurm.update(snapshot(MANUAL))
    slurm.run_once(T0 + 1)
    assert scontrol.state["reason"] == "gpuwatchd: node bad PSU"
    assert slurm.findings() == ()


def _state_dir_with(
    tmp_path: Path, *quarantines: tuple[str, str], polled: float | None = None
) -> Path:
    """A state directory with `quarantines`, last polled at `polled` (wall
    clock seconds; never when None)."""
    state = tmp_path / "state"
    store = Store.open(str(state))
    for subject, reason in quarantines:
        store.quarantine(subject, reason, "alice", T0)
    if polled is not None:
        result = evaluate([], store.load_state(), polled, PolicyConfig(), ("node",))
        store.save_poll(result, now=polled, wall=polled)
    store.close()
    return state


def test_slurm_healthcheck_fails_a_quarantined_node_from_the_state_database(
    tmp_path: Path,
) -> None:
    state = _state_dir_with(tmp_path, ("node", "bad PSU"))
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(f"daemon: {{listen: '127.0.0.1:1', state_dir: '{state}'}}\n")
    result = CliRunner().invoke(main, ["slurm-healthcheck", "--config", str(config)])
    assert result.exit_code == 1
    assert result.output == "gpuwatchd: node quarantined: node bad PSU\n"


def test_slurm_healthcheck_passes_a_healthy_node_and_one_it_knows_nothing_of(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(f"daemon: {{listen: '127.0.0.1:1', state_dir: '{tmp_path / 'none'}'}}\n")
    unknown = CliRunner().invoke(main, ["slurm-healthcheck", "--config", str(config)])
    assert unknown.exit_code == 0 and unknown.output.startswith("gpuwatchd: no verdict")
    state = _state_dir_with(tmp_path, polled=time.time())
    config.write_text(f"daemon: {{listen: '127.0.0.1:1', state_dir: '{state}'}}\n")
    healthy = CliRunner().invoke(main, ["slurm-healthcheck", "--config", str(config)])
    assert (healthy.exit_code, healthy.output) == (0, "gpuwatchd: node healthy\n")


def test_slurm_healthcheck_fails_a_database_no_daemon_ever_polled_unless_failing_open(
    tmp_path: Path,
) -> None:
    state = _state_dir_with(tmp_path)
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(f"daemon: {{listen: '127.0.0.1:1', state_dir: '{state}'}}\n")
    never = CliRunner().invoke(main, ["slurm-healthcheck", "--config", str(config)])
    assert never.exit_code == 1
    assert never.output == (
        "gpuwatchd: node unknown: the daemon is not running and last polled never "
        "(more than 3 poll intervals): nothing watches this node\n"
    )
    opened = CliRunner().invoke(main, ["slurm-healthcheck", "--fail-open", "--config", str(config)])
    assert opened.exit_code == 0 and "passing (--fail-open)" in opened.stderr


def test_slurm_healthcheck_reads_the_state_database_when_the_daemon_hangs(
    tmp_path: Path,
) -> None:
    state = _state_dir_with(tmp_path, ("node", "bad PSU"))
    # A listener that never accepts: the connection is made, no answer ever comes.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(1)
        port = hung.getsockname()[1]
        config = tmp_path / "gpuwatchd.yaml"
        config.write_text(f"daemon: {{listen: '127.0.0.1:{port}', state_dir: '{state}'}}\n")
        result = CliRunner().invoke(
            main, ["slurm-healthcheck", "--timeout", "200ms", "--config", str(config)]
        )
    assert result.exit_code == 1
    assert result.stdout == "gpuwatchd: node quarantined: node bad PSU\n"
    assert "the daemon did not answer" in result.stderr


def test_a_drain_with_our_tag_that_the_journal_does_not_explain_is_never_lifted(
    tmp_path: Path, store: Store
) -> None:
    # A daemon that lost its state: Slurm shows our drain of a hardware fault,
    # the fresh journal knows nothing of it, and nothing wants it any more.
    reason = "gpuwatchd: gpu:3 xid_hardware; node gpu_quarantine_ratio"
    scontrol = fake_scontrol(tmp_path / "slurm", state="IDLE+DRAIN", reason=reason)
    slurm = worker(scontrol, store)
    slurm.update(snapshot())
    slurm.run_once(T0)
    assert scontrol.updates() == []
    assert scontrol.state["state"] == "IDLE+DRAIN"
    (finding,) = slurm.findings()
    assert finding.code == "slurm_drain_unexplained" and "resume it by hand" in finding.message


def test_a_drain_the_journal_records_is_lifted_by_a_restarted_worker(
    scontrol: FakeScontrol, store: Store
) -> None:
    first = worker(scontrol, store)
    first.update(snapshot(NODE_ECC))
    first.run_once(T0)
    restarted = worker(scontrol, store)
    restarted.update(snapshot())
    restarted.run_once(T0 + 10)
    assert scontrol.updates()[-1] == ["update", "NodeName=gpu-node-7", "State=RESUME"]
    assert restarted.findings() == ()


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hung_scontrol_wrapper_is_killed_with_its_children(
    scontrol: FakeScontrol, store: Store
) -> None:
    scontrol.set(hang_in_child=True)
    slurm = worker(scontrol, store, timeout=0.5)
    slurm.update(snapshot(NODE_ECC))
    slurm.run_once(T0)
    assert "timed out after 0.5s" in slurm.findings()[0].message
    child = int(Path(f"{scontrol.state_path}.child").read_text())
    wait_for(lambda: not _running(child), "the wrapper's child to end")
