"""NVSwitch fabric registration through the real nvidia-ml-py over the fake
libnvidia-ml, and the fabric check on what the source read."""

from __future__ import annotations

import metrics_support
import pynvml
from gpu_history import gpu, last_time, timeline
from nvml_support import A100, H100, simulated_node
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.checks import fabric
from gpuwatchd.checks.fabric import FabricConfig
from gpuwatchd.export.gpu import families
from gpuwatchd.model import Action, Severity
from gpuwatchd.snapshot import Snapshot

COMPLETED, NOT_STARTED, IN_PROGRESS, NOT_SUPPORTED = 3, 1, 2, 0


def test_hgx_h100_gpus_are_registered_with_the_fabric() -> None:
    with simulated_node(model=H100) as node:
        sample = node.gpu_at(10)
    assert (sample.fabric_state, sample.fabric_status) == (COMPLETED, pynvml.NVML_SUCCESS)


def test_a100_refuses_fabric_info_and_leaves_it_absent() -> None:
    with simulated_node(model=A100) as node:
        sample = node.gpu_at(10)
    assert (sample.fabric_state, sample.fabric_status) == (None, None)


def test_driver_without_the_versioned_call_reads_the_unversioned_one() -> None:
    with simulated_node(
        "[{kind: fabric_unregistered, gpu: 0, at: 0s, code: NOT_READY}]",
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetGpuFabricInfoV"),
    ) as node:
        sample = node.gpu_at(10)
    assert (sample.fabric_state, sample.fabric_status) == (
        COMPLETED,
        pynvml.NVML_ERROR_NOT_READY,
    )


def test_unregistered_fault_leaves_the_gpu_not_started_while_others_complete() -> None:
    with simulated_node("[{kind: fabric_unregistered, gpu: 1, at: 20s}]") as node:
        before = node.gpu_at(10, index=1)
        after = node.gpu_at(30, index=1)
        other = node.gpu_at(30, index=0)
    assert before.fabric_state == COMPLETED
    assert after.fabric_state == NOT_STARTED
    assert other.fabric_state == COMPLETED


def _check(polls: int, **fields: object) -> list[tuple[str, Severity]]:
    history = timeline(polls, lambda k, t: [gpu(0, **fields)])
    output = fabric.run(history, last_time(polls), FabricConfig())
    return [(f.code, f.severity) for f in output.findings]


def test_gpu_without_nvswitch_raises_nothing() -> None:
    assert _check(60, fabric_state=NOT_SUPPORTED, fabric_status=0) == []


def test_registration_pending_within_the_timeout_raises_nothing() -> None:
    # 29 polls 10 s apart: 280 s pending, under the 300 s timeout.
    assert _check(29, fabric_state=IN_PROGRESS, fabric_status=0) == []


def test_registration_pending_past_the_timeout_is_critical_not_definitive() -> None:
    history = timeline(31, lambda k, t: [gpu(0, fabric_state=NOT_STARTED, fabric_status=0)])
    (finding,) = fabric.run(history, last_time(31), FabricConfig()).findings
    assert (finding.code, finding.severity) == ("fabric_unregistered", Severity.CRITICAL)
    assert not finding.definitive and finding.action is Action.RESET_GPU
    assert finding.evidence["state"] == "not_started"


def test_registration_completed_with_an_error_is_critical_at_once() -> None:
    error = pynvml.NVML_ERROR_NOT_READY
    assert _check(1, fabric_state=COMPLETED, fabric_status=error) == [
        ("fabric_registration_failed", Severity.CRITICAL)
    ]


def test_a_gpu_that_completes_registration_clears_the_finding() -> None:
    def sample(k: int, time: float) -> list[object]:
        return [gpu(0, fabric_state=IN_PROGRESS if k < 40 else COMPLETED, fabric_status=0)]

    history = timeline(45, sample)  # type: ignore[arg-type]
    assert fabric.run(history, last_time(45), FabricConfig()).findings == ()


def test_exporter_shows_the_status_only_once_registration_completed() -> None:
    with simulated_node("[{kind: fabric_unregistered, gpu: 1, at: 0s}]") as node:
        reading = node.poll_at(10)
    assert reading.gpus is not None
    text = metrics_support.render(lambda: families(Snapshot(time=10.0, gpus=reading.gpus)))
    series = {
        (s.name, s.labels["gpu"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "fabric" in s.name
    }
    assert series == {
        ("gpuwatchd_gpu_fabric_state_id", "0"): COMPLETED,
        ("gpuwatchd_gpu_fabric_status", "0"): 0,
        ("gpuwatchd_gpu_fabric_state_id", "1"): NOT_STARTED,
    }
