"""Clocks, thermal thresholds and slowdown counters as real drivers report them,
read through the real nvidia-ml-py over the fake libnvidia-ml, and judged by
the thermal and clocks checks on what the source read."""

from __future__ import annotations

import logging

import pynvml
import pytest
from nvml_support import B200, H100, V100, SimulatedNode, simulated_node

from gpuwatchd.checks import clocks, thermal
from gpuwatchd.checks.clocks import ClocksConfig
from gpuwatchd.checks.thermal import ThermalConfig
from gpuwatchd.history import History
from gpuwatchd.model import CLOCKS_EVENT_REASONS, Severity
from gpuwatchd.sim.fake_nvml import R580_DRIVER_VERSION, FakeNvml
from gpuwatchd.sources.nvml import counter_ids

NVML_LOG = "gpuwatchd.sources.nvml"
R570 = "570.133.20"
R590 = "590.44.01"
POLL = 10.0


def record(node: SimulatedNode, until: float, history: History | None = None) -> History:
    """Poll every 10 s from the node's start until `until` seconds, into a History."""
    history = history or History(max_age_seconds=7200.0)
    seconds = 0.0
    while seconds <= until:
        history.record(node.poll_at(seconds))
        seconds += POLL
    return history


# -- locked clocks ------------------------------------------------------------------


def test_locked_clocks_read_as_the_driver_reports_them_no_reason_and_max_unchanged() -> None:
    with simulated_node("[{at: 0s, kind: clocks_locked, mhz: 1410}]") as node:
        for sample in node.poll_at(30).gpus or ():
            assert sample.sm_clock_hertz == 1410e6
            assert sample.sm_max_clock_hertz == 1980e6
            assert sample.clocks_event_reasons == 0
            assert sample.sm_application_clock_hertz == sample.sm_default_application_clock_hertz


def test_an_idle_gpu_reads_as_the_driver_reports_one_no_load_idle_clock_and_reason() -> None:
    with simulated_node("[{at: 0s, kind: gpu_idle, gpu: 1}]") as node:
        busy, idle = node.poll_at(30).gpus or ()
    assert (idle.utilization_gpu_ratio, idle.utilization_memory_ratio) == (0.0, 0.0)
    assert idle.sm_clock_hertz == 345e6 and idle.power_watts == 70.0
    assert idle.clocks_event_reasons == CLOCKS_EVENT_REASONS["gpu_idle"]
    assert busy.utilization_gpu_ratio is not None and busy.utilization_gpu_ratio >= 0.85
    assert busy.clocks_event_reasons == 0


def test_eight_busy_gpus_locked_at_1410_mhz_are_not_drifting() -> None:
    with simulated_node("[{at: 0s, kind: clocks_locked, mhz: 1410}]", gpus=8) as node:
        history = record(node, 16 * 60)
        output = clocks.run(history, node.clock.now(), ClocksConfig())
    assert output.findings == ()
    assert {m.value for m in output.measurements} == {1.0}


def test_one_gpu_drifting_below_its_locked_peers_is_still_drift() -> None:
    faults = "[{at: 0s, kind: clocks_locked, mhz: 1410}, {at: 0s, kind: clock_drift, gpu: 5}]"
    with simulated_node(faults, gpus=8) as node:
        history = record(node, 16 * 60)
        output = clocks.run(history, node.clock.now(), ClocksConfig())
    (finding,) = output.findings
    assert (finding.subject, finding.severity) == ("gpu:5", Severity.CRITICAL)
    assert finding.evidence["peer_median_hertz"] == 1410e6
    assert finding.evidence["peer_ratio"] == pytest.approx(0.7, abs=0.02)


def test_a_lock_on_one_gpu_only_is_judged_against_its_peers() -> None:
    with simulated_node("[{at: 0s, kind: clocks_locked, gpu: 2, mhz: 1410}]", gpus=8) as node:
        history = record(node, 5 * 60)
        output = clocks.run(history, node.clock.now(), ClocksConfig())
    assert [(f.subject, f.severity) for f in output.findings] == [("gpu:2", Severity.WARN)]


# -- slowdown counters, by driver branch -------------------------------------------------


def test_counter_ids_follow_the_driver_branch_not_the_binding() -> None:
    assert counter_ids(R570) == {}
    assert counter_ids("575.51.03")["hw_thermal_slowdown"] == 252
    assert counter_ids(R580_DRIVER_VERSION) == {
        "thermal": 251,
        "hw_thermal_slowdown": 252,
        "hw_power_brake_slowdown": 253,
    }
    assert counter_ids(R590)["hw_power_brake_slowdown"] == 271
    assert counter_ids(None) == counter_ids("garbage") == {}


@pytest.mark.parametrize(("driver", "counter_id"), [(R580_DRIVER_VERSION, 252), (R590, 270)])
def test_hw_thermal_counter_is_read_at_the_branch_id_never_the_power_smoothing_field(
    driver: str, counter_id: int
) -> None:
    # On B200 the other branch's id answers a power smoothing setting: reading
    # the binding's constant (270) on R580 would give a 0 or 1, not nanoseconds.
    throttle = "[{at: 10s, kind: thermal_throttle, gpu: 0}]"
    with simulated_node(throttle, model=B200, driver_version=driver) as node:
        sample = node.gpu_at(100)
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        state = node.hardware.state(0)
        (counter,) = pynvml.nvmlDeviceGetFieldValues(handle, [counter_id])
        other_id = 270 if counter_id == 252 else 252
        (other,) = pynvml.nvmlDeviceGetFieldValues(handle, [other_id])
    expected = state.violation_ns["hw_thermal_slowdown"]
    assert expected == 70e9
    assert counter.value.ullVal == expected
    assert other.value.uiVal in (0, 1)
    assert sample.throttle_seconds["hw_thermal_slowdown"] == pytest.approx(70)
    assert sample.throttle_seconds["hw_power_brake_slowdown"] == 0


def test_r570_driver_reads_no_counters_where_its_ids_are_power_smoothing() -> None:
    with simulated_node("[{at: 10s, kind: power_brake, gpu: 0}]", driver_version=R570) as node:
        sample = node.gpu_at(30)
    assert "hw_power_brake_slowdown" not in sample.throttle_seconds
    assert "hw_thermal_slowdown" not in sample.throttle_seconds
    assert sample.reason_active("hw_power_brake_slowdown")


def test_a_power_brake_pulse_shorter_than_a_poll_is_counted() -> None:
    pulse = "[{at: 12s, kind: power_brake, gpu: 0, for: 3s}]"
    with simulated_node(pulse, driver_version=R580_DRIVER_VERSION) as node:
        before, after = node.gpu_at(10), node.gpu_at(20)
    assert before.clocks_event_reasons == after.clocks_event_reasons == 0
    grown = (
        after.throttle_seconds["hw_power_brake_slowdown"]
        - before.throttle_seconds["hw_power_brake_slowdown"]
    )
    assert grown == pytest.approx(3)


def pulses(every: float, length: float, until: float) -> str:
    """Power brake pulses of `length` s every `every` s, each between two 10 s polls."""
    faults = [
        f"{{at: {start + 2:g}s, kind: power_brake, gpu: 0, for: {length:g}s}}"
        for start in range(0, int(until), int(every))
    ]
    return "[" + ", ".join(faults) + "]"


@pytest.mark.parametrize(("driver", "judged"), [(R580_DRIVER_VERSION, True), (R570, False)])
def test_power_brake_pulses_the_polls_never_see_are_judged_from_the_counters(
    driver: str, judged: bool
) -> None:
    with simulated_node(pulses(10, 4, 400), driver_version=driver) as node:
        history = record(node, 400)
        output = thermal.run(history, node.clock.now(), ThermalConfig())
    brake = [m for m in output.measurements if m.labels["reason"] == "hw_power_brake_slowdown"]
    if not judged:
        # Before R575 only the reason bits say it, and no poll caught one.
        assert output.findings == () and brake == []
        return
    (finding,) = output.findings
    assert (finding.subject, finding.code) == ("gpu:0", "hw_slowdown_while_cool")
    assert finding.evidence["sample_ratio"] == 0
    assert finding.evidence["window_ratio"] == pytest.approx(0.4, abs=0.01)
    assert finding.evidence["reasons"] == "hw_power_brake_slowdown"
    assert brake[0].value == pytest.approx(0.4, abs=0.01)


def test_violation_status_refused_on_r590_reads_sw_thermal_at_269_for_thermal() -> None:
    throttle = "[{at: 10s, kind: thermal_throttle, gpu: 0}]"
    with simulated_node(
        throttle,
        model=B200,
        driver_version=R590,
        before_start=lambda fake: fake.fail(
            pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetViolationStatus"
        ),
    ) as node:
        sample = node.gpu_at(100)
        state = node.hardware.state(0)
    assert sample.throttle_seconds["thermal"] == pytest.approx(state.violation_ns["thermal"] / 1e9)
    assert sample.throttle_seconds["thermal"] == pytest.approx(70)


# -- counter ids checked by behaviour -------------------------------------------------------
# The 12.9/13.0 headers put the counters at 251-253; NVML's change log has
# R580 renumbered as 13.1 is, with power smoothing settings at 251-253. The
# fake's `field_numbering` serves such an R580.


def misnumbered_r580(fake: FakeNvml) -> None:
    fake.field_numbering = 590


def test_a_counter_id_answering_a_setting_of_1_is_left_absent_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=NVML_LOG)
    brake = "[{at: 10s, kind: power_brake, gpu: 0}]"
    with simulated_node(
        brake, model=B200, driver_version=R580_DRIVER_VERSION, before_start=misnumbered_r580
    ) as node:
        history = record(node, 400)
        output = thermal.run(history, node.clock.now(), ThermalConfig())
    samples = [sample for _, sample in history.gpu(0)]
    # 253 answers IMM_RAMP_DOWN_ENABLED's 1: once is no proof, twice is.
    assert samples[0].throttle_seconds["hw_power_brake_slowdown"] == pytest.approx(1e-9)
    assert all("hw_power_brake_slowdown" not in s.throttle_seconds for s in samples[1:])
    # 252 answers PRIV_LVL's 0 with no thermal slowdown: as a counter would.
    assert all(s.throttle_seconds["hw_thermal_slowdown"] == 0 for s in samples)
    [line] = [r for r in caplog.records if "not a counter" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert "hw_power_brake_slowdown] on GPU 0-1" in line.getMessage()
    # The slowdown is judged from the reason bits, and nothing else is raised.
    (finding,) = output.findings
    assert (finding.subject, finding.code) == ("gpu:0", "hw_slowdown_while_cool")
    assert finding.evidence["sample_ratio"] == 1.0


@pytest.mark.parametrize("misnumbered", [False, True])
def test_a_counter_that_does_not_grow_while_its_reason_bit_is_set_is_left_absent(
    misnumbered: bool,
) -> None:
    throttle = "[{at: 10s, kind: thermal_throttle, gpu: 0}]"
    with simulated_node(
        throttle,
        model=B200,
        driver_version=R580_DRIVER_VERSION,
        before_start=misnumbered_r580 if misnumbered else None,
    ) as node:
        history = record(node, 120)
    samples = dict(history.gpu(0))
    start = history.gpu(0)[0][0]
    slowed = [samples[start + t] for t in (30, 40)]
    assert all(s.reason_active("hw_thermal_slowdown") for s in slowed)
    later = samples[start + 120].throttle_seconds
    if misnumbered:
        # PRIV_LVL's 0 stayed 0 over two polls of HW thermal slowdown.
        assert "hw_thermal_slowdown" in samples[start + 40].throttle_seconds
        assert "hw_thermal_slowdown" not in later
    else:
        assert later["hw_thermal_slowdown"] == pytest.approx(90)
    # The other GPU, never slowed, keeps its reading either way.
    assert history.gpu(1)[-1][1].throttle_seconds["hw_thermal_slowdown"] == 0


# -- temperature thresholds ---------------------------------------------------------------


@pytest.mark.parametrize(("model", "limit"), [(H100, 95), (V100, 85)])
def test_hbm_limit_is_the_drivers_mem_max_threshold(model: str, limit: float) -> None:
    with simulated_node(model=model) as node:
        sample = node.gpu_at(10)
    assert sample.temperature_memory_max_celsius == limit


def test_threshold_call_removed_falls_back_to_the_t_limit_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=NVML_LOG)
    with simulated_node(
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetTemperatureThreshold")
    ) as node:
        first, later = node.gpu_at(10), node.gpu_at(400)
    for sample in (first, later):
        assert sample.temperature_slowdown_celsius == 89
        assert sample.temperature_shutdown_celsius == 92
        assert sample.temperature_memory_max_celsius is None
    assert first.temperature_gpu_celsius != later.temperature_gpu_celsius
    refusals = [
        r.getMessage()
        for r in caplog.records
        if "temperature_slowdown_celsius on GPU 0" in r.getMessage()
        and "TLIMIT instead" in r.getMessage()
    ]
    assert len(refusals) == 1


def test_threshold_deprecated_on_a_gpu_without_t_limit_leaves_thresholds_absent() -> None:
    with simulated_node(
        model=V100,
        before_start=lambda fake: fake.fail(
            pynvml.NVML_ERROR_DEPRECATED, "nvmlDeviceGetTemperatureThreshold"
        ),
    ) as node:
        sample = node.gpu_at(10)
    assert sample.temperature_slowdown_celsius is None
    assert sample.temperature_shutdown_celsius is None
    assert sample.temperature_gpu_celsius is not None
