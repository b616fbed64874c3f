"""The NVML source, read through the real nvidia-ml-py over the fake libnvidia-ml."""

from __future__ import annotations

import logging
import threading
import time

import pynvml
import pytest
from nvml_support import A100, B200, H100, V100, SimulatedNode, simulated_node

from gpuwatchd.clock import FakeClock
from gpuwatchd.model import CLOCKS_EVENT_REASONS, THROTTLE_REASONS, GpuSample
from gpuwatchd.sim.fake_nvml import DEFAULT_DRIVER_VERSION, R580_DRIVER_VERSION, FakeNvml
from gpuwatchd.sources import NvmlSourceConfig, SourceUnavailable
from gpuwatchd.sources.nvml import NvmlSource

NVML_LOG = "gpuwatchd.sources.nvml"


def messages(caplog: pytest.LogCaptureFixture, *words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if all(w in r.getMessage() for w in words)]


def assert_matches_hardware(node: SimulatedNode, sample: GpuSample) -> None:
    """Every scalar the source read equals what the simulated GPU reports."""
    simulated = node.hardware.gpus[sample.index]
    spec, state = simulated.spec, node.hardware.state(sample.index)
    assert sample.up is True
    assert (sample.name, sample.uuid, sample.pci_bus_id) == (
        spec.name,
        simulated.uuid,
        simulated.pci_bus_id,
    )
    assert sample.temperature_gpu_celsius == state.temperature_celsius
    assert sample.temperature_memory_celsius == state.memory_temperature_celsius
    assert sample.temperature_slowdown_celsius == spec.slowdown_celsius
    assert sample.temperature_shutdown_celsius == spec.shutdown_celsius
    assert sample.temperature_memory_max_celsius == spec.memory_max_operating_celsius
    assert sample.sm_clock_hertz == state.sm_clock_mhz * 1e6
    assert sample.memory_clock_hertz == state.memory_clock_mhz * 1e6
    assert sample.sm_max_clock_hertz == spec.sm_max_mhz * 1e6
    assert sample.memory_max_clock_hertz == spec.memory_mhz * 1e6
    assert sample.sm_application_clock_hertz == spec.sm_default_application_mhz * 1e6
    assert sample.sm_default_application_clock_hertz == spec.sm_default_application_mhz * 1e6
    assert sample.memory_application_clock_hertz == spec.memory_mhz * 1e6
    assert sample.clocks_event_reasons == state.clocks_event_reasons
    # The HW slowdown counters are read only on drivers that have them (R575 on).
    assert set(THROTTLE_REASONS[:6]) <= set(sample.throttle_seconds)
    assert sample.throttle_seconds == pytest.approx(
        {reason: state.violation_ns[reason] / 1e9 for reason in sample.throttle_seconds}
    )
    assert sample.power_watts == pytest.approx(state.power_milliwatts / 1000)
    assert sample.power_limit_watts == spec.power_limit_watts
    assert sample.utilization_gpu_ratio == state.utilization_gpu_percent / 100
    assert sample.utilization_memory_ratio == state.utilization_memory_percent / 100
    assert sample.ecc_errors == state.ecc_errors


# -- every value, per generation ------------------------------------------------


def test_h100_every_value_read_through_nvidia_ml_py() -> None:
    with simulated_node(model=H100) as node:
        reading = node.poll_at(600)
        assert reading.source == "nvml"
        assert reading.driver_version == DEFAULT_DRIVER_VERSION
        assert reading.gpus is not None and len(reading.gpus) == 2
        sample = reading.gpus[0]
        assert_matches_hardware(node, sample)
        assert 500 <= sample.power_watts <= 690
        assert sample.throttle_seconds["power"] > 0
        assert (sample.remapped_rows_correctable, sample.remapped_rows_uncorrectable) == (0, 0)
        assert (sample.row_remap_pending, sample.row_remap_failed) == (False, False)
        # Hopper repairs memory by row remapping: no retired pages to read.
        assert sample.retired_pages == {} and sample.retired_pages_pending is None
        assert [link.link for link in sample.nvlinks] == list(range(18))
        assert all(link.up for link in sample.nvlinks)
        links = node.hardware.state(0).links
        for link in sample.nvlinks:
            expected = {k: links[link.link].counters[k] for k in ("crc_flit", "replay", "recovery")}
            assert link.errors == expected  # no data CRC or data ECC counter on Hopper


def test_a100_reads_nvlink_counters_through_error_counter_without_scoped_fields() -> None:
    with simulated_node(
        "[{at: 0s, kind: nvlink_crc_storm, gpu: 0, link: 11, rate: 100/s}]", model=A100
    ) as node:
        sample = node.gpu_at(60)
        assert_matches_hardware(node, sample)
        assert sample.sm_default_application_clock_hertz == 1140e6
        assert len(sample.nvlinks) == 12
        link = sample.nvlinks[11]
        dl_counters = {"crc_flit", "crc_data", "replay", "recovery", "ecc_data"}
        counters = node.hardware.state(0).links[11].counters
        assert link.errors == {kind: counters[kind] for kind in dl_counters}
        assert link.errors["crc_flit"] >= 6000 and link.errors["crc_data"] >= 1500
        # The A100's driver does not answer the scoped per-link fields.
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        field_id = (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 11)
        (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])
        assert value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_b200_reads_nvlink5_counts_under_their_own_names() -> None:
    with simulated_node(
        "[{at: 0s, kind: nvlink_crc_storm, gpu: 1, link: 17, rate: 10/s}]",
        model=B200,
        driver_version=R580_DRIVER_VERSION,
    ) as node:
        sample = node.gpu_at(100, 1)
        assert_matches_hardware(node, sample)
        assert sample.power_limit_watts == 1000
        assert len(sample.nvlinks) == 18
        counters = node.hardware.state(1).links[17].counters
        nvlink5 = ("effective_errors", "recovery", "recovery_failed", "malformed_packets")
        assert sample.nvlinks[17].errors == {
            kind: counters[kind] for kind in (*nvlink5, "link_integrity")
        }
        # Post-FEC errors are not NVLink 4's flit CRC errors: no crc_flit on NVLink5.
        assert sample.nvlinks[17].errors["effective_errors"] >= 1000
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkErrorCounter(pynvml.nvmlDeviceGetHandleByIndex(1), 0, 0)


def test_v100_reports_retired_pages_instead_of_remapped_rows() -> None:
    with simulated_node("[{at: 10s, kind: ecc_uncorrectable, gpu: 0}]", model=V100) as node:
        before = node.gpu_at(5)
        assert before.retired_pages == {"multiple_single_bit": 0, "double_bit": 0}
        assert before.retired_pages_pending is False
        assert before.remapped_rows_correctable is None and before.row_remap_pending is None
        after = node.gpu_at(20)
        assert after.retired_pages == {"multiple_single_bit": 0, "double_bit": 1}
        assert after.retired_pages_pending is True
        assert after.ecc_errors["uncorrected", "volatile"] == 1
        assert after.xid_counts == {48: 1}
        assert len(after.nvlinks) == 6
        assert "ecc_data" not in after.nvlinks[0].errors  # NVLink 2 has no data ECC


# -- values the GPU or driver does not provide ------------------------------------


def test_memory_temperature_not_supported_is_absent_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=NVML_LOG)
    with simulated_node() as node:
        node.fake.fail_field(pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=0)
        first, second = node.gpu_at(10), node.gpu_at(20)
        assert first.temperature_memory_celsius is None is second.temperature_memory_celsius
        assert first.temperature_gpu_celsius is not None
        assert node.gpu_at(30, 1).temperature_memory_celsius is not None
    logged = messages(caplog, "GPU 0", "temperature_memory_celsius", "Not Supported")
    assert len(logged) == 1


def test_function_missing_from_old_driver_is_absent_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=NVML_LOG)
    with simulated_node(
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetCurrentClocksEventReasons")
    ) as node:
        samples = [node.gpu_at(t) for t in (10, 20, 30)]
        assert all(sample.clocks_event_reasons is None for sample in samples)
        assert all(sample.reason_active("sw_power_cap") is None for sample in samples)
        assert samples[-1].sm_clock_hertz is not None
    # One line for every GPU that lacks it, not one a GPU.
    [logged] = messages(caplog, "clocks_event_reasons", "Function Not Found")
    assert "clocks_event_reasons on GPU 0-1 (" in logged


def test_driver_without_temperature_v_falls_back_to_the_older_call() -> None:
    with simulated_node(
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetTemperatureV")
    ) as node:
        sample = node.gpu_at(10)
        assert sample.temperature_gpu_celsius == node.hardware.state(0).temperature_celsius


def test_not_supported_on_one_gpu_leaves_the_others_alone() -> None:
    with simulated_node() as node:
        node.fake.fail(pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetPowerUsage", gpu=1)
        reading = node.poll_at(10)
        assert reading.gpus is not None
        assert reading.gpus[0].power_watts is not None
        assert reading.gpus[1].power_watts is None
        assert reading.gpus[1].power_limit_watts == 700


def test_not_supported_value_is_not_asked_again() -> None:
    with simulated_node() as node:
        node.fake.fail(pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetEnforcedPowerLimit")
        assert node.gpu_at(10).power_limit_watts is None
        node.fake.clear_failures()
        assert node.gpu_at(20).power_limit_watts is None


def test_no_permission_value_is_absent_and_asked_again() -> None:
    with simulated_node() as node:
        node.fake.fail(pynvml.NVML_ERROR_NO_PERMISSION, "nvmlDeviceGetRemappedRows")
        sample = node.gpu_at(10)
        assert sample.remapped_rows_correctable is None and sample.row_remap_pending is None
        node.fake.clear_failures()
        assert node.gpu_at(20).row_remap_pending is False


def test_ecc_disabled_leaves_ecc_counts_absent_not_zero() -> None:
    with simulated_node() as node:
        node.fake.fail(pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetTotalEccErrors")
        assert node.gpu_at(10).ecc_errors == {}


def test_nvlink_field_refused_per_field_leaves_that_type_absent() -> None:
    with simulated_node(model=B200) as node:
        node.fake.fail_field(
            pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS,
            pynvml.NVML_ERROR_NOT_SUPPORTED,
        )
        sample = node.gpu_at(10)
        kinds = {"effective_errors", "recovery", "recovery_failed", "link_integrity"}
        assert all(set(link.errors) == kinds for link in sample.nvlinks)


def test_gpu_without_nvlinks_reports_none() -> None:
    with simulated_node(
        before_start=lambda fake: fake.fail(
            pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetNvLinkState"
        )
    ) as node:
        sample = node.gpu_at(10)
        assert sample.nvlinks == ()
        assert sample.temperature_gpu_celsius is not None


# -- violation time: the perf-policy fields, the call where a driver refuses them ---------


def test_violation_time_comes_from_the_fields_without_the_deprecated_call() -> None:
    # R580 still answers the call (nvml.h 13.0: DEPRECATED(13.0) is a no-op,
    # removal is for CUDA 14.0); a driver that refuses it is made here, and
    # the batch's perf-policy fields give the same time without it.
    with simulated_node(
        "[{at: 10s, kind: power_cap, gpu: 0}]",
        driver_version=R580_DRIVER_VERSION,
        before_start=lambda fake: fake.fail(
            pynvml.NVML_ERROR_DEPRECATED, "nvmlDeviceGetViolationStatus"
        ),
    ) as node:
        with pytest.raises(pynvml.NVMLError_Deprecated):
            pynvml.nvmlDeviceGetViolationStatus(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
        asked = node.fake.calls["nvmlDeviceGetViolationStatus"]
        first = node.gpu_at(20)
        second = node.gpu_at(50)
        assert set(first.throttle_seconds) == set(THROTTLE_REASONS)
        assert second.throttle_seconds["power"] - first.throttle_seconds["power"] >= 30
        state = node.hardware.state(0)
        assert second.throttle_seconds["power"] == pytest.approx(state.violation_ns["power"] / 1e9)
        assert node.fake.calls["nvmlDeviceGetViolationStatus"] == asked


def test_perf_policy_fields_refused_read_the_violation_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=NVML_LOG)

    def refusing_the_fields(fake: FakeNvml) -> None:
        fake.fail_field(pynvml.NVML_FI_DEV_PERF_POLICY_POWER, pynvml.NVML_ERROR_NOT_SUPPORTED)

    with simulated_node(
        "[{at: 10s, kind: power_cap, gpu: 0}]", before_start=refusing_the_fields
    ) as node:
        first = node.gpu_at(20)
        second = node.gpu_at(50)
        state = node.hardware.state(0)
    assert second.throttle_seconds["power"] - first.throttle_seconds["power"] >= 30
    assert second.throttle_seconds["power"] == pytest.approx(state.violation_ns["power"] / 1e9)
    refusals = messages(caplog, "GPU 0", "throttle_seconds[power]", "NVML_FI_DEV_PERF_POLICY_POWER")
    assert len(refusals) == 1


# -- lost GPUs ------------------------------------------------------------------------


def test_gpu_lost_mid_run_others_keep_reporting() -> None:
    with simulated_node("[{at: 30s, kind: gpu_lost, gpu: 1, for: 60s}]", gpus=3) as node:
        healthy = node.poll_at(10).gpus
        assert healthy is not None and all(gpu.up for gpu in healthy)
        lost = node.poll_at(40)
        assert lost.gpus is not None
        down = lost.gpus[1]
        assert down.up is False
        assert (down.uuid, down.name) == (healthy[1].uuid, healthy[1].name)
        assert down.temperature_gpu_celsius is None and down.nvlinks == ()
        assert down.xid_counts == {79: 1}
        assert [event.code for event in lost.xid_events] == [79]
        for index in (0, 2):
            assert lost.gpus[index].up and lost.gpus[index].temperature_gpu_celsius is not None
        back = node.gpu_at(100, 1)
        assert back.up is True and back.temperature_gpu_celsius is not None
        assert back.xid_counts == {79: 1}


def test_gpu_answering_unknown_error_on_every_call_is_unanswered_not_lost() -> None:
    # Only GPU_IS_LOST, or XID 79 on the GPU, says a GPU fell off the bus
    # (nvml.h); UNKNOWN is "any unexpected error".
    with simulated_node() as node:
        node.fake.fail(pynvml.NVML_ERROR_UNKNOWN, gpu=0)
        reading = node.poll_at(10)
        assert reading.gpus is not None
        unanswered = reading.gpus[0]
        assert (unanswered.up, unanswered.responsive) == (True, False)
        assert unanswered.uuid is not None
        assert unanswered.unanswered == "Unknown Error from every call"
        assert reading.gpus[1].responsive is True
        node.fake.clear_failures()
        back = node.gpu_at(20)
        assert (back.up, back.responsive, back.unanswered) == (True, True, None)
        assert len(back.nvlinks) == 18  # links probed while it failed are probed again


def test_gpu_answering_unknown_error_after_xid_79_is_lost() -> None:
    with simulated_node("[{at: 5s, kind: xid, gpu: 0, code: 79}]") as node:
        node.fake.fail(pynvml.NVML_ERROR_UNKNOWN, gpu=0)
        lost = node.gpu_at(10)
        assert lost.up is False and lost.xid_counts == {79: 1}


def test_a_handle_that_fails_with_anything_but_gpu_is_lost_is_asked_again() -> None:
    def refuse_handle(fake: FakeNvml) -> None:
        fake.fail(pynvml.NVML_ERROR_IRQ_ISSUE, "nvmlDeviceGetHandleByIndex_v2", args=(0,))

    with simulated_node(before_start=refuse_handle) as node:
        first = node.gpu_at(10)
        assert (first.up, first.responsive, first.uuid) == (True, False, None)
        assert first.unanswered == "nvmlDeviceGetHandleByIndex: Interrupt Request Issue"
        assert first.no_permission is False
        node.fake.clear_failures()
        back = node.gpu_at(20)
        assert back.responsive and back.uuid is not None
        # Registered for XIDs once it has a handle.
        assert node.gpu_at(30).xid_events_received is True


def test_a_handle_refused_with_no_permission_is_said_so() -> None:
    def refuse_handle(fake: FakeNvml) -> None:
        fake.fail(pynvml.NVML_ERROR_NO_PERMISSION, "nvmlDeviceGetHandleByIndex_v2", args=(1,))

    with simulated_node(before_start=refuse_handle) as node:
        refused = node.gpu_at(10, index=1)
        assert (refused.up, refused.responsive, refused.no_permission) == (True, False, True)


def test_unknown_error_on_one_call_leaves_only_that_value_absent() -> None:
    with simulated_node() as node:
        node.fake.fail(pynvml.NVML_ERROR_UNKNOWN, "nvmlDeviceGetUtilizationRates", gpu=0)
        sample = node.gpu_at(10)
        assert sample.up is True
        assert sample.utilization_gpu_ratio is None
        assert sample.power_watts is not None


def test_gpu_lost_at_start_is_down_until_it_answers() -> None:
    with simulated_node("[{at: 0s, kind: gpu_lost, gpu: 0, for: 30s}]") as node:
        down = node.gpu_at(10)
        assert down.up is False and down.uuid is None
        up = node.gpu_at(40)
        assert up.up is True and up.uuid == node.hardware.gpus[0].uuid


# -- XIDs -------------------------------------------------------------------------------


def test_xid_events_counted_per_code_including_repeats() -> None:
    faults = """[
      {at: 5s, kind: xid, gpu: 0, code: 13},
      {at: 6s, kind: xid, gpu: 0, code: 13},
      {at: 7s, kind: xid, gpu: 0, code: 31},
      {at: 8s, kind: xid, gpu: 1, code: 43},
      {at: 25s, kind: xid, gpu: 0, code: 13}]"""
    with simulated_node(faults) as node:
        first = node.poll_at(10)
        assert [(e.gpu, e.code) for e in first.xid_events] == [(0, 13), (0, 13), (0, 31), (1, 43)]
        assert first.gpus is not None
        assert first.gpus[0].xid_counts == {13: 2, 31: 1}
        assert first.gpus[1].xid_counts == {43: 1}
        quiet = node.poll_at(20)
        assert quiet.xid_events == ()
        assert quiet.gpus is not None and quiet.gpus[0].xid_counts == {13: 2, 31: 1}
        assert node.gpu_at(30).xid_counts == {13: 3, 31: 1}


def test_xid_event_carries_gpu_uuid_and_receipt_time() -> None:
    with simulated_node("[{at: 5s, kind: xid, gpu: 1, code: 79}]") as node:
        reading = node.poll_at(10)
        (event,) = reading.xid_events
        assert event.gpu == 1 and event.code == 79
        assert event.uuid == node.hardware.gpus[1].uuid
        assert event.time == node.clock.now()


def test_xid_thread_delivers_events_from_the_event_set() -> None:
    with simulated_node("[{at: 5s, kind: xid, gpu: 0, code: 94}]", xid_thread=True) as node:
        node.poll_at(1)
        node.clock.advance(9)
        node.hardware.advance(node.clock.now())  # wakes the thread's wait
        events = []
        deadline = time.monotonic() + 5
        while not events and time.monotonic() < deadline:
            events = list(node.source.poll(node.clock.now()).xid_events)
            threading.Event().wait(0.005)
        assert [(e.gpu, e.code) for e in events] == [(0, 94)]
        assert node.gpu_at(20).xid_counts == {94: 1}


def test_xid_wait_failure_registers_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=NVML_LOG)
    faults = "[{at: 5s, kind: xid, gpu: 0, code: 31}, {at: 25s, kind: xid, gpu: 0, code: 13}]"
    with simulated_node(faults) as node:
        node.fake.remove_function("nvmlEventSetWait_v2")
        assert node.poll_at(10).xid_events == ()
        node.fake.restore_function("nvmlEventSetWait_v2")
        # Nothing before registration is replayed; the next XID is counted.
        node.poll_at(20)
        assert [e.code for e in node.poll_at(30).xid_events] == [13]
    assert messages(caplog, "XID event wait failed", "registering again")


def test_gpu_without_xid_events_is_not_registered() -> None:
    faults = "[{at: 5s, kind: xid, gpu: 0, code: 31}, {at: 5s, kind: xid, gpu: 1, code: 31}]"
    with simulated_node(
        faults,
        before_start=lambda fake: fake.fail(
            pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetSupportedEventTypes", gpu=1
        ),
    ) as node:
        assert [(e.gpu, e.code) for e in node.poll_at(10).xid_events] == [(0, 31)]


def test_xid_events_off_in_config_counts_none() -> None:
    config = NvmlSourceConfig(xid_events=False, kernel_log=None)
    with simulated_node("[{at: 5s, kind: xid, gpu: 0, code: 31}]", config=config) as node:
        reading = node.poll_at(10)
        assert reading.xid_events == ()
        assert reading.gpus is not None and reading.gpus[0].xid_counts == {}


# -- NVML missing ------------------------------------------------------------------------


def test_nvml_missing_raises_source_unavailable_with_a_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_library(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    with pytest.raises(SourceUnavailable) as raised:
        NvmlSource(FakeClock(), NvmlSourceConfig())
    message = str(raised.value)
    assert "NVML could not be loaded" in message
    assert "--simulate" in message and "--source" in message


# -- scenario kinds, as a user sees them -----------------------------------------------


def test_thermal_throttle_shows_heat_reasons_and_thermal_time() -> None:
    with simulated_node("[{at: 10s, kind: thermal_throttle, gpu: 0, for: 120s}]") as node:
        reading = node.poll_at(40)
        assert reading.gpus is not None
        hot, peer = reading.gpus
        assert hot.temperature_gpu_celsius >= hot.temperature_slowdown_celsius
        assert hot.temperature_memory_celsius > hot.temperature_gpu_celsius
        assert hot.reason_active("hw_thermal_slowdown") and hot.reason_active("sw_thermal_slowdown")
        assert hot.reason_active("hw_slowdown")
        assert hot.sm_clock_hertz < 0.6 * peer.sm_clock_hertz
        assert not peer.reason_active("hw_thermal_slowdown")
        later = node.gpu_at(60)
        assert later.throttle_seconds["thermal"] - hot.throttle_seconds["thermal"] == pytest.approx(
            20
        )
        cooled = node.gpu_at(200)
        assert cooled.clocks_event_reasons == 0
        assert cooled.temperature_gpu_celsius < 75
        assert cooled.throttle_seconds["thermal"] == pytest.approx(100)


def test_power_cap_shows_sw_power_cap_at_the_limit() -> None:
    with simulated_node("[{at: 10s, kind: power_cap, gpu: 1}]") as node:
        first = node.poll_at(20)
        assert first.gpus is not None
        peer, capped = first.gpus
        assert capped.reason_active("sw_power_cap") and not peer.reason_active("sw_power_cap")
        assert capped.power_watts == pytest.approx(capped.power_limit_watts, abs=2)
        assert capped.sm_clock_hertz < peer.sm_clock_hertz
        later = node.gpu_at(30, 1)
        assert later.throttle_seconds["power"] - capped.throttle_seconds["power"] == pytest.approx(
            10, abs=0.1
        )


@pytest.mark.parametrize(("ratio", "expected"), [("", 0.7), (", ratio: 0.5", 0.5)])
def test_clock_drift_slows_a_busy_gpu_without_a_throttle_reason(
    ratio: str, expected: float
) -> None:
    with simulated_node(f"[{{at: 10s, kind: clock_drift, gpu: 0{ratio}}}]") as node:
        reading = node.poll_at(30)
        assert reading.gpus is not None
        drifting, peer = reading.gpus
        assert drifting.clocks_event_reasons == 0
        assert drifting.utilization_gpu_ratio >= 0.85
        assert drifting.sm_clock_hertz / peer.sm_clock_hertz == pytest.approx(expected, abs=0.02)


def test_nvlink_crc_storm_grows_crc_and_replay_on_one_link() -> None:
    with simulated_node(
        "[{at: 45s, kind: nvlink_crc_storm, gpu: 1, link: 7, rate: 2000/s}]"
    ) as node:
        before = node.gpu_at(60, 1)
        after = node.gpu_at(70, 1)
        grown = {
            k: after.nvlinks[7].errors[k] - before.nvlinks[7].errors[k]
            for k in ("crc_flit", "replay")
        }
        assert grown["crc_flit"] == pytest.approx(20000, abs=2)
        assert grown["replay"] == pytest.approx(20000, abs=2)
        others = [link.link for link in after.nvlinks if link.errors["crc_flit"] > 100]
        assert others == [7]


def test_nvlink_down_reports_the_link_inactive() -> None:
    with simulated_node("[{at: 10s, kind: nvlink_down, gpu: 0, link: 3, for: 30s}]") as node:
        down = node.gpu_at(20)
        assert [link.link for link in down.nvlinks if not link.up] == [3]
        assert all(link.up for link in node.gpu_at(50).nvlinks)


def test_ecc_sbe_storm_grows_corrected_counts() -> None:
    with simulated_node("[{at: 10s, kind: ecc_sbe_storm, gpu: 0, rate: 50/s}]") as node:
        before, after = node.gpu_at(20), node.gpu_at(30)
        for scope in ("volatile", "aggregate"):
            grown = after.ecc_errors["corrected", scope] - before.ecc_errors["corrected", scope]
            assert grown == pytest.approx(500, abs=2)
        assert after.ecc_errors["uncorrected", "volatile"] == 0


@pytest.mark.parametrize(("code", "xid"), [("", 48), (", code: 94", 94)])
def test_ecc_uncorrectable_counts_one_error_an_xid_and_a_pending_remap(code: str, xid: int) -> None:
    with simulated_node(f"[{{at: 10s, kind: ecc_uncorrectable, gpu: 0{code}}}]") as node:
        before = node.gpu_at(5)
        after = node.gpu_at(15)
        for scope in ("volatile", "aggregate"):
            assert (
                after.ecc_errors["uncorrected", scope]
                == before.ecc_errors["uncorrected", scope] + 1
            )
        assert after.xid_counts == {xid: 1}
        assert after.row_remap_pending is True
        assert after.remapped_rows_uncorrectable == before.remapped_rows_uncorrectable + 1
        assert node.gpu_at(25).xid_counts == {xid: 1}


def test_row_remap_pending_is_reported() -> None:
    with simulated_node("[{at: 10s, kind: row_remap_pending, gpu: 1, for: 60s}]") as node:
        pending = node.gpu_at(20, 1)
        assert pending.row_remap_pending is True and pending.remapped_rows_correctable == 1
        assert pending.xid_counts == {63: 1}
        assert node.gpu_at(80, 1).row_remap_pending is False


def test_row_remap_failure_is_reported() -> None:
    with simulated_node("[{at: 10s, kind: row_remap_failure, gpu: 0}]") as node:
        assert node.gpu_at(5).row_remap_failed is False
        failed = node.gpu_at(20)
        assert failed.row_remap_failed is True and failed.xid_counts == {64: 1}


def test_xid_fault_is_counted_once() -> None:
    with simulated_node("[{at: 120s, kind: xid, gpu: 1, code: 13}]") as node:
        assert node.gpu_at(100, 1).xid_counts == {}
        assert node.gpu_at(130, 1).xid_counts == {13: 1}
        assert node.gpu_at(200, 1).xid_counts == {13: 1}


def test_background_node_stays_in_realistic_ranges() -> None:
    with simulated_node(gpus=8) as node:
        for seconds in range(0, 3600, 300):
            reading = node.poll_at(seconds)
            assert reading.gpus is not None
            for gpu in reading.gpus:
                assert 55 <= gpu.temperature_gpu_celsius <= 72
                assert gpu.temperature_memory_celsius > gpu.temperature_gpu_celsius
                assert 0.85 <= gpu.utilization_gpu_ratio <= 1.0
                assert 500 <= gpu.power_watts <= 690
                assert 1950e6 <= gpu.sm_clock_hertz <= 1980e6
                assert gpu.clocks_event_reasons & CLOCKS_EVENT_REASONS["hw_slowdown"] == 0


def test_values_the_gpus_do_not_give_are_one_line_at_start_not_one_a_gpu(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=NVML_LOG)
    with simulated_node() as node:
        node.gpu_at(10)
        node.gpu_at(20)
    refusals = [r for r in caplog.records if "not read" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.INFO
    # The simulated H100 answers retired pages Not Supported, as Hopper does.
    assert "retired_pages_pending on GPU 0-1 (" in refusals[0].getMessage()
