"""NVSwitch fabric registration through the real nvidia-ml-py over the fake
libnvidia-ml, and the fabric check on what the source read."""

from __future__ import annotations

import metrics_support
import pynvml
import pytest
from gpu_history import gpu, last_time, timeline
from nvml_support import A100, B200, H100, simulated_node
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.checks import fabric
from gpuwatchd.checks.fabric import FabricConfig
from gpuwatchd.export.gpu import families
from gpuwatchd.history import History
from gpuwatchd.model import Action, Reading, Severity
from gpuwatchd.snapshot import Snapshot

COMPLETED, NOT_STARTED, IN_PROGRESS, NOT_SUPPORTED = 3, 1, 2, 0
R560, R570, R580 = "560.35.03", "570.172.08", "580.82.07"
# A healthy registered GPU's health mask, by hand from nvml.h's macros: each
# 2-bit field at FALSE (2) from bit 0 (degraded bandwidth; from R570 route
# recovery at 2, route unhealthy at 4, access timeout recovery at 6), and from
# R580 the 4-bit configuration at bit 8 reading NONE (1).
HEALTHY_R560 = 0x2
HEALTHY_R570 = 0x2 | 0x2 << 2 | 0x2 << 4 | 0x2 << 6
HEALTHY_R580 = HEALTHY_R570 | 0x1 << 8


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
        ("gpuwatchd_gpu_fabric_health_mask", "0"): HEALTHY_R570,
        ("gpuwatchd_gpu_fabric_state_id", "1"): NOT_STARTED,
        ("gpuwatchd_gpu_fabric_health_mask", "1"): HEALTHY_R570,
    }


# -- the fabric's health mask --------------------------------------------------------


def _judged(reading: Reading) -> list[tuple[str, str, Severity, bool, bool]]:
    history = History(max_age_seconds=3600.0)
    history.record(reading)
    output = fabric.run(history, reading.time, FabricConfig())
    return [(f.subject, f.code, f.severity, f.definitive, f.immediate) for f in output.findings]


@pytest.mark.parametrize(
    ("driver", "healthy"), [(R560, HEALTHY_R560), (R570, HEALTHY_R570), (R580, HEALTHY_R580)]
)
def test_a_healthy_fabric_reads_every_field_of_its_branch_false_and_raises_nothing(
    driver: str, healthy: int
) -> None:
    # Read as bits, a healthy mask has bits set everywhere: only the fields
    # decoded as nvml.h packs them say it is healthy.
    with simulated_node(driver_version=driver) as node:
        reading = node.poll_at(10)
    assert reading.gpus is not None
    assert [gpu.fabric_health_mask for gpu in reading.gpus] == [healthy, healthy]
    assert _judged(reading) == []


def test_route_unhealthy_is_critical_never_definitive_nor_immediate() -> None:
    with simulated_node("[{at: 5s, kind: fabric_health, gpu: 1, mask: 0x10}]") as node:
        reading = node.poll_at(10)
    assert reading.gpus is not None
    # Route unhealthy's field (bits 4-5) reads TRUE (1), the others FALSE.
    assert reading.gpus[1].fabric_health_mask == HEALTHY_R570 & ~(0x3 << 4) | 0x1 << 4
    assert _judged(reading) == [("gpu:1", "fabric_unhealthy", Severity.CRITICAL, False, False)]


@pytest.mark.parametrize("mask", [0x1, 0x4, 0x40])
def test_degraded_bandwidth_or_a_recovery_in_progress_warns(mask: int) -> None:
    with simulated_node(f"[{{at: 5s, kind: fabric_health, gpu: 0, mask: {mask:#x}}}]") as node:
        reading = node.poll_at(10)
    assert _judged(reading) == [("gpu:0", "fabric_degraded", Severity.WARN, False, False)]


def test_an_incorrect_configuration_is_critical_and_named_on_r580() -> None:
    fault = "[{at: 5s, kind: fabric_health, gpu: 0, mask: 0x500}]"
    with simulated_node(fault, model=B200, driver_version=R580) as node:
        reading = node.poll_at(10)
    history = History(max_age_seconds=3600.0)
    history.record(reading)
    (finding,) = fabric.run(history, reading.time, FabricConfig()).findings
    assert (finding.code, finding.severity, finding.definitive) == (
        "fabric_unhealthy",
        Severity.CRITICAL,
        False,
    )
    assert finding.evidence["conditions"] == "incorrect_configuration (insufficient_nvlinks)"


def test_a_branch_without_a_condition_does_not_report_it() -> None:
    # R560's mask has degraded bandwidth only (nvml.h 12.6); route unhealthy
    # arrives with R570.
    fault = "[{at: 5s, kind: fabric_health, gpu: 0, mask: 0x10}]"
    with simulated_node(fault, driver_version=R560) as node:
        reading = node.poll_at(10)
    assert reading.gpus is not None and reading.gpus[0].fabric_health_mask == HEALTHY_R560
    assert _judged(reading) == []


def test_two_conditions_in_neighbouring_fields_are_both_read() -> None:
    # Degraded bandwidth (bit 0) with route unhealthy (bit 4): the 0x11 width
    # of the 12.4-12.6 headers (and nvidia-ml-py 12.570.86) would read them
    # into one another; the 12.8 header's 0x3 keeps them apart.
    with simulated_node("[{at: 5s, kind: fabric_health, gpu: 0, mask: 0x11}]") as node:
        reading = node.poll_at(10)
    assert [(code, severity) for _, code, severity, _, _ in _judged(reading)] == [
        ("fabric_unhealthy", Severity.CRITICAL),
        ("fabric_degraded", Severity.WARN),
    ]


def test_the_unversioned_call_has_no_mask_and_none_is_judged() -> None:
    with simulated_node(
        "[{at: 5s, kind: fabric_health, gpu: 0, mask: 0x10}]",
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetGpuFabricInfoV"),
    ) as node:
        reading = node.poll_at(10)
    assert reading.gpus is not None and reading.gpus[0].fabric_health_mask is None
    assert _judged(reading) == []
