"""GPU-lost check: a GPU off the bus, the node it takes with it, and its return."""

from __future__ import annotations

from gpu_history import gpu, last_time, timeline

from gpuwatchd.checks import gpu_lost
from gpuwatchd.checks.gpu_lost import GpuLostConfig
from gpuwatchd.history import History
from gpuwatchd.model import Action, GpuSample, Severity

CONFIG = GpuLostConfig()


def node_losing(gpu_index: int, lost_polls: range, polls: int = 6) -> tuple[History, float]:
    def gpus_at(k: int, time: float) -> list[GpuSample]:
        return [gpu(i, up=not (i == gpu_index and k in lost_polls)) for i in range(4)]

    return timeline(polls, gpus_at), last_time(polls)


def test_a_lost_gpu_is_critical_and_definitive_and_so_is_its_node() -> None:
    history, now = node_losing(2, range(4, 6))
    findings = gpu_lost.run(history, now, CONFIG).findings
    assert [(f.subject, f.code, f.severity, f.definitive, f.action) for f in findings] == [
        ("gpu:2", "gpu_lost", Severity.CRITICAL, True, Action.REBOOT),
        ("node", "gpu_lost", Severity.CRITICAL, True, Action.REBOOT),
    ]
    assert findings[0].evidence == {"uuid": "GPU-0002"}
    assert findings[1].evidence == {"gpus": "2"}


def test_a_gpu_that_answers_again_has_no_finding() -> None:
    history, now = node_losing(2, range(2, 4))
    assert gpu_lost.run(history, now, CONFIG).findings == ()


def test_the_node_finding_can_be_turned_off() -> None:
    history, now = node_losing(1, range(5, 6))
    findings = gpu_lost.run(history, now, GpuLostConfig(node_finding=False)).findings
    assert [f.subject for f in findings] == ["gpu:1"]
