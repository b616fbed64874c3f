"""GPU-lost check: a GPU off the bus, the node it takes with it, and its return."""

from __future__ import annotations

from gpu_history import T0, gpu, last_time, timeline

from gpuwatchd.checks import gpu_lost
from gpuwatchd.checks.gpu_lost import GpuLostConfig
from gpuwatchd.checks.xid import FALLEN_OFF_BUS, BootRecord, BootXid, XidConfig
from gpuwatchd.history import History
from gpuwatchd.model import Action, GpuSample, Reading, Severity

CONFIG = GpuLostConfig()


def node_losing(gpu_index: int, lost_polls: range, polls: int = 6) -> tuple[History, float]:
    def gpus_at(k: int, time: float) -> list[GpuSample]:
        return [gpu(i, up=not (i == gpu_index and k in lost_polls)) for i in range(4)]

    return timeline(polls, gpus_at), last_time(polls)


def test_a_lost_gpu_drains_at_once_and_so_does_its_node_for_the_reboot() -> None:
    history, now = node_losing(2, range(4, 6))
    findings = gpu_lost.run(history, now, CONFIG).findings
    verdicts = [
        (f.subject, f.code, f.severity, f.immediate, f.definitive, f.action) for f in findings
    ]
    assert verdicts == [
        ("gpu:2", "gpu_lost", Severity.CRITICAL, True, False, Action.REBOOT),
        ("node", "gpu_lost", Severity.CRITICAL, True, False, Action.REBOOT),
    ]
    assert findings[0].evidence == {"uuid": "GPU-0002"}
    assert findings[1].evidence == {"gpus": "2"}


def boots_losing(uuid: str, *boots_ago: int) -> BootRecord:
    """Four boots (the current one last); in each `boots_ago` back the board
    `uuid` fell off the bus (XID 79, as the store records a lost GPU too)."""
    ids = ("boot-a", "boot-b", "boot-c", "boot-now")
    xids = tuple(BootXid(ids[-1 - ago], 2, uuid, FALLEN_OFF_BUS, T0) for ago in boots_ago)
    return BootRecord(boot_ids=ids, xids=xids)


def test_a_board_lost_again_after_two_reboots_is_condemned() -> None:
    history, now = node_losing(2, range(4, 6))
    boots = boots_losing("GPU-0002", 2)
    finding = gpu_lost.run(history, now, CONFIG, boots=boots).findings[0]
    assert (finding.subject, finding.definitive, finding.action) == (
        "gpu:2",
        True,
        Action.INSPECT_HARDWARE,
    )
    assert finding.evidence["reboots"] == 2


def test_a_board_lost_once_before_one_reboot_is_only_drained() -> None:
    history, now = node_losing(2, range(4, 6))
    finding = gpu_lost.run(history, now, CONFIG, boots=boots_losing("GPU-0002", 1)).findings[0]
    assert (finding.immediate, finding.definitive) == (True, False)


def test_another_board_lost_at_that_index_earlier_does_not_count() -> None:
    history, now = node_losing(2, range(4, 6))
    finding = gpu_lost.run(history, now, CONFIG, boots=boots_losing("GPU-OTHER", 2)).findings[0]
    assert not finding.definitive


def test_a_lost_board_older_than_the_reboot_window_does_not_count() -> None:
    history, now = node_losing(2, range(4, 6))
    boots = boots_losing("GPU-0002", 2)
    short = XidConfig(reboot_window=60.0)
    finding = gpu_lost.run(history, now + 120, CONFIG, boots=boots, xid=short).findings[0]
    assert not finding.definitive


def test_a_gpu_without_a_handle_or_any_answer_is_unresponsive_not_lost() -> None:
    history = History(max_age_seconds=3600.0)
    unanswered = "nvmlDeviceGetHandleByIndex: Unknown Error"
    history.record(
        Reading("nvml", 10.0, gpus=(gpu(0), gpu(1, responsive=False, unanswered=unanswered)))
    )
    [finding] = gpu_lost.run(history, 10.0, CONFIG).findings
    assert (finding.subject, finding.code, finding.immediate, finding.definitive) == (
        "gpu:1",
        "gpu_unresponsive",
        False,
        False,
    )
    assert unanswered in finding.message


def test_no_permission_is_a_configuration_warning_on_the_node_naming_the_devices() -> None:
    history = History(max_age_seconds=3600.0)
    refused = gpu(3, responsive=False, unanswered="No Permission", no_permission=True)
    history.record(Reading("nvml", 10.0, gpus=(gpu(0), refused)))
    [finding] = gpu_lost.run(history, 10.0, CONFIG).findings
    assert (finding.subject, finding.code, finding.severity) == (
        "node",
        "nvml_no_permission",
        Severity.WARN,
    )
    assert "/dev/nvidia3" in finding.message and "DeviceAllow" in finding.message


def test_a_gpu_that_answers_again_has_no_finding() -> None:
    history, now = node_losing(2, range(2, 4))
    assert gpu_lost.run(history, now, CONFIG).findings == ()


def test_the_node_finding_can_be_turned_off() -> None:
    history, now = node_losing(1, range(5, 6))
    findings = gpu_lost.run(history, now, GpuLostConfig(node_finding=False)).findings
    assert [f.subject for f in findings] == ["gpu:1"]
