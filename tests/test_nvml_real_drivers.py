"""The NVML source against what real drivers answer (issue: real drivers).

Each test drives the fake libnvidia-ml under the real nvidia-ml-py; the
source and checks are the production code. docs/nvml-fidelity.md names the
source of each fake behaviour used here.
"""

from __future__ import annotations

import logging

import pynvml
import pytest
from nvml_support import A100, V100, simulated_node

from gpuwatchd.checks import gpu_lost, recovery
from gpuwatchd.checks.gpu_lost import GpuLostConfig
from gpuwatchd.history import History
from gpuwatchd.model import Action, GpuSample, Reading, Severity
from gpuwatchd.sources import NvmlSourceConfig
from gpuwatchd.sources.nvml import REASK_REFUSED_S, NvmlSource

NVML_LOG = "gpuwatchd.sources.nvml"
R550 = "550.54.15"
R560 = "560.35.03"
R565 = "565.57.01"


def judged(reading: Reading) -> list[tuple[str, str, Severity, Action, bool]]:
    history = History(max_age_seconds=3600.0)
    history.record(reading)
    return [
        (f.subject, f.code, f.severity, f.action, f.immediate)
        for f in recovery.run(history).findings
    ]


# -- the binding ------------------------------------------------------------------


def test_a_function_the_binding_lacks_is_absent_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # An older nvidia-ml-py has no wrapper for the call: no AttributeError.
    monkeypatch.delattr(pynvml, "nvmlDeviceGetRowRemapperHistogram")
    caplog.set_level(logging.INFO, NVML_LOG)
    with simulated_node() as node:
        first, second = node.gpu_at(10), node.gpu_at(20)
    assert first.up and second.up
    assert first.row_remapper_banks == {} and first.temperature_gpu_celsius is not None
    said = [r for r in caplog.records if "nvmlDeviceGetRowRemapperHistogram" in r.getMessage()]
    [line] = said  # once for both GPUs, not once per poll
    assert "Function Not Found" in line.getMessage() and "GPU 0-1" in line.getMessage()


def test_a_field_the_binding_lacks_is_absent_and_the_rest_of_the_batch_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    with simulated_node() as node:
        sample = node.gpu_at(10)
    assert sample.recovery_action is None
    assert sample.temperature_memory_celsius is not None


# -- the driver's own verdicts ----------------------------------------------------


def test_reset_required_from_every_call_is_a_finding_not_an_absent_gpu() -> None:
    with simulated_node("[{at: 5s, kind: reset_required, gpu: 1}]") as node:
        before = node.poll_at(1)
        reading = node.poll_at(10)
    assert reading.gpus is not None and before.gpus is not None
    sample = reading.gpus[1]
    assert sample.up and sample.reset_required
    assert sample.temperature_gpu_celsius is None and not before.gpus[1].reset_required
    assert judged(reading) == [
        ("gpu:1", "gpu_reset_required", Severity.CRITICAL, Action.RESET_GPU, True)
    ]


def test_reset_required_from_one_call_is_enough() -> None:
    fault = "[{at: 5s, kind: nvml_error, gpu: 0, call: nvmlDeviceGetRemappedRows, code: 16}]"
    with simulated_node(fault) as node:
        sample = node.gpu_at(10)
    assert sample.reset_required and sample.temperature_gpu_celsius is not None


def test_reset_required_in_a_field_value_is_enough() -> None:
    fault = "[{at: 5s, kind: nvml_error, gpu: 0, call: NVML_FI_DEV_MEMORY_TEMP, code: 16}]"
    with simulated_node(fault) as node:
        sample = node.gpu_at(10)
    assert sample.reset_required and sample.temperature_memory_celsius is None


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("gpu_reset", Action.RESET_GPU),
        ("drain_and_reset", Action.RESET_GPU),
        ("node_reboot", Action.REBOOT),
        ("drain_p2p", Action.DRAIN_P2P),
    ],
)
def test_the_drivers_recovery_action_is_read_each_poll_and_judged(
    action: str, expected: Action
) -> None:
    with simulated_node(f"[{{at: 5s, kind: recovery_action, gpu: 0, action: {action}}}]") as node:
        calm = node.poll_at(1)
        reading = node.poll_at(10)
    assert calm.gpus is not None and calm.gpus[0].recovery_action == 0
    assert judged(calm) == []
    assert judged(reading) == [("gpu:0", "gpu_recovery_action", Severity.CRITICAL, expected, True)]


def test_a_recovery_action_survives_a_daemon_restart_because_it_is_read() -> None:
    with simulated_node("[{at: 5s, kind: recovery_action, gpu: 0, action: gpu_reset}]") as node:
        node.poll_at(10)
        node.source.close()
        restarted = NvmlSource(node.clock, NvmlSourceConfig(kernel_log=None), xid_thread=False)
        try:
            reading = restarted.poll(node.clock.now())
        finally:
            restarted.close()
    assert reading.gpus is not None and reading.gpus[0].recovery_action == 1


def test_a_driver_without_the_recovery_action_field_gives_no_value_and_no_finding() -> None:
    with simulated_node(
        "[{at: 5s, kind: recovery_action, gpu: 0, action: gpu_reset}]", driver_version=R550
    ) as node:
        reading = node.poll_at(10)
    assert reading.gpus is not None and reading.gpus[0].recovery_action is None
    assert judged(reading) == []


@pytest.mark.parametrize(
    ("action", "code", "expected"),
    [
        (
            "gpu_reset",
            1,
            [("gpu:0", "gpu_recovery_action", Severity.CRITICAL, Action.RESET_GPU, True)],
        ),
        (
            "drain_and_reset",
            4,
            [("gpu:0", "gpu_recovery_action", Severity.CRITICAL, Action.RESET_GPU, True)],
        ),
        # R560 has no field for a reboot or a P2P drain: only its reset verdicts speak.
        ("node_reboot", 0, []),
    ],
)
def test_r560_reads_its_reset_and_drain_and_reset_status_as_the_recovery_action(
    action: str, code: int, expected: list[tuple[str, str, Severity, Action, bool]]
) -> None:
    fault = f"[{{at: 5s, kind: recovery_action, gpu: 0, action: {action}}}]"
    with simulated_node(fault, driver_version=R560) as node:
        calm = node.poll_at(1)
        reading = node.poll_at(10)
    assert calm.gpus is not None and calm.gpus[0].recovery_action == 0
    assert reading.gpus is not None and reading.gpus[0].recovery_action == code
    assert judged(reading) == expected


def test_r565_reads_the_recovery_action_field_nvml_added_in_it() -> None:
    fault = "[{at: 5s, kind: recovery_action, gpu: 0, action: drain_p2p}]"
    with simulated_node(fault, driver_version=R565) as node:
        reading = node.poll_at(10)
    assert reading.gpus is not None and reading.gpus[0].recovery_action == 3


def test_a_field_past_the_drivers_range_is_refused_once_and_never_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, NVML_LOG)
    fault = "[{at: 5s, kind: recovery_action, gpu: 0, action: gpu_reset}]"
    with simulated_node(fault, driver_version=R550) as node:
        first = node.gpu_at(10)
        # Were field 230 asked again, this library would now answer it.
        node.fake.driver_version = "570.172.08"
        later = node.gpu_at(20 + REASK_REFUSED_S)
    assert first.recovery_action is None and later.recovery_action is None
    [line] = [r for r in caplog.records if "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert "Invalid Argument" in line.getMessage() and "past the 199" in line.getMessage()


def test_invalid_argument_for_a_field_the_driver_defines_is_asked_again() -> None:
    with simulated_node() as node:
        node.fake.fail_field(pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_ERROR_INVALID_ARGUMENT)
        refused = node.gpu_at(10)
        node.fake.clear_failures()
        back = node.gpu_at(20)
    assert refused.temperature_memory_celsius is None
    assert back.temperature_memory_celsius is not None


# -- memory: NVIDIA's RMA criteria are read ---------------------------------------


def test_a100_reports_its_remapper_histogram_and_sram_status() -> None:
    with simulated_node(model=A100) as node:
        sample = node.gpu_at(10)
    assert sample.row_remapper_banks == {"max": 640, "high": 0, "partial": 0, "low": 0, "none": 0}
    assert sample.sram_threshold_exceeded is False


def test_a_failed_remap_shows_a_bank_with_no_spare_rows() -> None:
    with simulated_node("[{at: 5s, kind: row_remap_failure, gpu: 0}]") as node:
        sample = node.gpu_at(10)
    assert sample.row_remap_failed and sample.row_remapper_banks["none"] == 1


def test_volta_has_neither_histogram_nor_sram_status() -> None:
    with simulated_node(model=V100) as node:
        sample = node.gpu_at(10)
    assert sample.row_remapper_banks == {} and sample.sram_threshold_exceeded is None
    assert sample.retired_pages is not None


# -- "not supported" is not forever -----------------------------------------------


def test_a_value_refused_while_mig_is_on_comes_back_when_it_is_off() -> None:
    # Row remapping is NotSupported "if MIG is enabled" (nvml.h).
    fault = (
        "[{at: 0s, kind: nvml_error, gpu: 0, call: nvmlDeviceGetRemappedRows,"
        " code: not_supported, for: 5m}]"
    )
    with simulated_node(fault) as node:
        refused = node.gpu_at(10)
        still_unasked = node.gpu_at(10 + REASK_REFUSED_S - 10)
        back = node.gpu_at(10 + REASK_REFUSED_S + 10)
    assert refused.row_remap_pending is None and still_unasked.row_remap_pending is None
    assert back.row_remap_pending is False


def test_a_function_the_driver_lacks_is_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    with simulated_node(
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetSramEccErrorStatus")
    ) as node:
        node.gpu_at(10)
        node.fake.restore_function("nvmlDeviceGetSramEccErrorStatus")
        later = node.gpu_at(10 + 2 * REASK_REFUSED_S)
    assert later.sram_threshold_exceeded is None


# -- XIDs while a GPU is lost -----------------------------------------------------


def test_a_lost_gpu_does_not_silence_the_other_gpus_xids() -> None:
    faults = """[{at: 10s, kind: gpu_lost, gpu: 1},
      {at: 30s, kind: xid, gpu: 0, code: 31},
      {at: 50s, kind: xid, gpu: 0, code: 13}]"""
    with simulated_node(faults) as node:
        node.poll_at(20)
        node.poll_at(40)
        reading = node.poll_at(60)
    assert reading.gpus is not None
    assert reading.gpus[0].xid_counts == {31: 1, 13: 1}
    assert reading.gpus[1].xid_counts == {79: 1}


def test_a_gpu_back_from_being_lost_reports_its_xids_again() -> None:
    faults = """[{at: 10s, kind: gpu_lost, gpu: 1, for: 20s},
      {at: 50s, kind: xid, gpu: 1, code: 31}]"""
    with simulated_node(faults) as node:
        node.poll_at(20)
        node.poll_at(40)  # answers again: registered for events again
        reading = node.poll_at(60)
    assert reading.gpus is not None and reading.gpus[1].up
    assert reading.gpus[1].xid_counts == {79: 1, 31: 1}


# -- the fake's field-value batch as nvml.h specifies it ----------------------------


def test_a_lost_gpus_field_batch_answers_success_with_an_error_in_every_field() -> None:
    with simulated_node("[{at: 5s, kind: gpu_lost, gpu: 0}]") as node:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        node.hardware.advance(node.clock.now() + 10)
        values = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert values[0].nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST


# -- a GPU that cannot be watched is not "healthy" ----------------------------------


def lost_check(reading: Reading) -> list[tuple[str, str, Severity]]:
    history = History(max_age_seconds=3600.0)
    history.record(reading)
    output = gpu_lost.run(history, reading.time, GpuLostConfig())
    return [(f.subject, f.code, f.severity) for f in output.findings]


def test_a_gpu_answering_timeout_to_every_call_is_unresponsive_not_healthy() -> None:
    with simulated_node() as node:
        node.fake.fail(pynvml.NVML_ERROR_TIMEOUT, gpu=1)
        reading = node.poll_at(10)
        node.fake.clear_failures()
        back = node.poll_at(20)
    assert reading.gpus is not None and reading.gpus[1].up and not reading.gpus[1].responsive
    assert lost_check(reading) == [("gpu:1", "gpu_unresponsive", Severity.CRITICAL)]
    assert lost_check(back) == []


def test_a_broken_xid_event_wait_is_seen(caplog: pytest.LogCaptureFixture) -> None:
    with simulated_node() as node:
        healthy = node.poll_at(10)
        node.fake.fail(pynvml.NVML_ERROR_UNKNOWN, "nvmlEventSetWait_v2")
        broken = node.poll_at(20)
        node.fake.clear_failures()
        node.poll_at(30)  # registers again after the failed wait
        again = node.poll_at(40)
    assert healthy.gpus is not None and healthy.gpus[0].xid_events_received is True
    assert broken.gpus is not None and broken.gpus[0].xid_events_received is False
    assert ("gpu:0", "xid_events_not_received", Severity.WARN) in lost_check(broken)
    assert again.gpus is not None and again.gpus[0].xid_events_received is True


def test_a_recovery_action_newer_than_this_daemon_warns_and_drains_nothing() -> None:
    sample = GpuSample(index=0, up=True, recovery_action=99)
    reading = Reading(source="nvml", time=0.0, gpus=(sample,))
    assert judged(reading) == [("gpu:0", "gpu_recovery_action", Severity.WARN, Action.NONE, False)]
