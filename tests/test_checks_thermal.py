"""Thermal check: throttle shares from the violation counters, HW slowdown on a
cool or a hot GPU, temperature headroom."""

from __future__ import annotations

import pytest
from gpu_history import gpu, last_time, record, timeline

from gpuwatchd.checks import CheckOutput, thermal
from gpuwatchd.checks.thermal import ThermalConfig
from gpuwatchd.history import History
from gpuwatchd.model import CLOCKS_EVENT_REASONS, Action, GpuSample, Severity

CONFIG = ThermalConfig()
POLLS = 31  # 300 s of 10 s polls: one full window
NOW = last_time(POLLS)
HW_SLOWDOWN = CLOCKS_EVENT_REASONS["hw_slowdown"]
POWER_BRAKE = CLOCKS_EVENT_REASONS["hw_power_brake_slowdown"]


def hot_gpu(**fields: object) -> GpuSample:
    values: dict[str, object] = {
        "temperature_gpu_celsius": 70.0,
        "temperature_memory_celsius": 75.0,
        "temperature_slowdown_celsius": 90.0,
        "clocks_event_reasons": 0,
    }
    values.update(fields)
    return gpu(0, **values)


def codes(output: CheckOutput) -> dict[str, Severity]:
    return {finding.code: finding.severity for finding in output.findings}


def ratio(output: CheckOutput, reason: str) -> float:
    return next(
        m.value
        for m in output.measurements
        if m.name == "gpu_throttle_ratio" and m.labels["reason"] == reason
    )


def test_sustained_thermal_throttling_warns_with_its_share_of_the_window() -> None:
    # Half of every 10 s poll in thermal violation.
    history = timeline(POLLS, lambda k, t: [hot_gpu(throttle_seconds={"thermal": 5.0 * k})])
    output = thermal.run(history, NOW, CONFIG)
    finding = next(f for f in output.findings if f.code == "thermal_throttling")
    assert finding.severity is Severity.WARN
    assert finding.subject == "gpu:0"
    assert finding.action is Action.INSPECT_HARDWARE
    assert ratio(output, "thermal") == pytest.approx(0.5)


def test_judged_every_poll_throttling_that_stopped_ages_out_as_from_a_fresh_history() -> None:
    # Thermal throttling, then the very same sample poll after poll (as a
    # source may hand back an unchanged one) with the power counter a float
    # that stands still too: each poll's output on the one history is the one
    # a history made afresh gives, until the throttling has left the window.
    config = ThermalConfig(window=60.0)
    stopped = hot_gpu(throttle_seconds={"thermal": 50.0, "power": 0.5})
    samples = [hot_gpu(throttle_seconds={"thermal": 5.0 * k, "power": 0.5}) for k in range(11)]
    samples += [stopped] * 12
    history = History(max_age_seconds=7200.0)
    each_poll, fresh = [], []
    for k, sample in enumerate(samples):
        time = last_time(k + 1)
        record(history, time, [sample])
        each_poll.append(thermal.run(history, time, config))
        afresh = timeline(k + 1, lambda n, t: [samples[n]])
        fresh.append(thermal.run(afresh, time, config))
    assert each_poll == fresh
    # Stopped at poll 10: 5 s of thermal violation fewer in the window a poll.
    shares = [ratio(each_poll[k], "thermal") for k in range(10, 17)]
    assert shares == pytest.approx([(16 - k) * 5.0 / 60.0 for k in range(10, 17)])
    assert "thermal_throttling" in codes(each_poll[14])
    assert not each_poll[-1].findings
    assert ratio(each_poll[-1], "thermal") == ratio(each_poll[-1], "power") == 0.0


def test_a_short_throttle_between_polls_is_counted_but_is_no_finding() -> None:
    # 3 s of throttling in the window: the counter saw it, the reason bits never would.
    history = timeline(
        POLLS, lambda k, t: [hot_gpu(throttle_seconds={"thermal": 0.0 if k < 20 else 3.0})]
    )
    output = thermal.run(history, NOW, CONFIG)
    assert "thermal_throttling" not in codes(output)
    assert ratio(output, "thermal") == pytest.approx(3.0 / 300.0)


def test_every_violation_reason_is_measured_per_gpu_with_its_uuid() -> None:
    history = timeline(
        POLLS, lambda k, t: [hot_gpu(throttle_seconds={"thermal": 0.0, "power": 2.0 * k})]
    )
    output = thermal.run(history, NOW, CONFIG)
    labels = {tuple(sorted(m.labels.items())) for m in output.measurements}
    assert (("gpu", "0"), ("reason", "power"), ("uuid", "GPU-0000")) in labels
    assert ratio(output, "power") == pytest.approx(0.2)
    assert ratio(output, "thermal") == 0.0
    # A reason NVML did not report has no measurement: absent is not zero.
    assert not any(m.labels["reason"] == "reliability" for m in output.measurements)


def test_a_driver_reload_that_resets_the_violation_counter_is_no_false_throttling() -> None:
    # 1000 s of violation before the reload; after it the counter restarts at 0.
    history = timeline(
        POLLS,
        lambda k, t: [hot_gpu(throttle_seconds={"thermal": 1000.0 if k < 15 else 0.5})],
    )
    output = thermal.run(history, NOW, CONFIG)
    assert "thermal_throttling" not in codes(output)
    assert ratio(output, "thermal") < 0.01


def test_hw_slowdown_on_a_cool_gpu_is_a_critical_board_fault() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [hot_gpu(temperature_gpu_celsius=45.0, clocks_event_reasons=HW_SLOWDOWN)],
    )
    finding = next(iter(thermal.run(history, NOW, CONFIG).findings))
    assert finding.code == "hw_slowdown_while_cool"
    assert finding.severity is Severity.CRITICAL
    assert finding.evidence["reasons"] == "hw_slowdown"


def test_power_brake_on_a_cool_gpu_is_critical_too() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [
            hot_gpu(temperature_gpu_celsius=40.0, clocks_event_reasons=POWER_BRAKE if k % 2 else 0)
        ],
    )
    assert codes(thermal.run(history, NOW, CONFIG)) == {"hw_slowdown_while_cool": Severity.CRITICAL}


def test_hw_slowdown_on_a_hot_gpu_is_a_warning() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [hot_gpu(temperature_gpu_celsius=84.0, clocks_event_reasons=HW_SLOWDOWN)],
    )
    assert codes(thermal.run(history, NOW, CONFIG)) == {"hw_slowdown": Severity.WARN}


def test_hw_slowdown_with_hot_hbm_is_not_called_a_board_fault() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [
            hot_gpu(
                temperature_gpu_celsius=45.0,
                temperature_memory_celsius=88.0,
                clocks_event_reasons=HW_SLOWDOWN,
            )
        ],
    )
    assert codes(thermal.run(history, NOW, CONFIG))["hw_slowdown"] is Severity.WARN


def test_hw_slowdown_without_a_known_slowdown_threshold_is_not_judged_cool() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [
            hot_gpu(
                temperature_gpu_celsius=30.0,
                temperature_slowdown_celsius=None,
                clocks_event_reasons=HW_SLOWDOWN,
            )
        ],
    )
    assert codes(thermal.run(history, NOW, CONFIG)) == {"hw_slowdown": Severity.WARN}


def test_a_rare_hw_slowdown_sample_is_below_the_share_that_counts() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [
            hot_gpu(temperature_gpu_celsius=45.0, clocks_event_reasons=HW_SLOWDOWN if k == 5 else 0)
        ],
    )
    assert thermal.run(history, NOW, CONFIG).findings == ()


def test_a_gpu_near_its_slowdown_temperature_warns() -> None:
    history = timeline(3, lambda k, t: [hot_gpu(temperature_gpu_celsius=86.0)])
    finding = next(iter(thermal.run(history, last_time(3), CONFIG).findings))
    assert finding.code == "gpu_temperature_high"
    assert finding.evidence["margin_celsius"] == 4.0


def test_hbm_near_its_maximum_warns() -> None:
    history = timeline(3, lambda k, t: [hot_gpu(temperature_memory_celsius=92.0)])
    assert codes(thermal.run(history, last_time(3), CONFIG)) == {
        "hbm_temperature_high": Severity.WARN
    }


def test_a_lost_gpu_has_no_thermal_findings() -> None:
    history = timeline(
        POLLS,
        lambda k, t: (
            [hot_gpu(temperature_gpu_celsius=45.0, clocks_event_reasons=HW_SLOWDOWN)]
            if k < POLLS - 1
            else [gpu(0, up=False)]
        ),
    )
    assert thermal.run(history, NOW, CONFIG) == CheckOutput()


def test_thresholds_out_of_range_are_rejected() -> None:
    with pytest.raises(ValueError, match="thermal_warn_ratio"):
        ThermalConfig(thermal_warn_ratio=0.0)


HW_THERMAL = CLOCKS_EVENT_REASONS["hw_thermal_slowdown"]


def test_hw_thermal_slowdown_bit_alone_is_judged() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [hot_gpu(temperature_gpu_celsius=45.0, clocks_event_reasons=HW_THERMAL)],
    )
    finding = next(iter(thermal.run(history, NOW, CONFIG).findings))
    assert finding.code == "hw_slowdown_while_cool"
    assert finding.evidence["reasons"] == "hw_thermal_slowdown"


def test_slowdown_counters_judge_what_the_bits_never_caught() -> None:
    # 4 s of power brake in every 10 s poll interval, no bit set at any poll.
    history = timeline(
        POLLS,
        lambda k, t: [
            hot_gpu(
                temperature_gpu_celsius=45.0,
                throttle_seconds={"hw_power_brake_slowdown": 4.0 * k, "hw_thermal_slowdown": 0.0},
            )
        ],
    )
    output = thermal.run(history, NOW, CONFIG)
    finding = next(iter(output.findings))
    assert finding.code == "hw_slowdown_while_cool"
    assert finding.evidence["window_ratio"] == pytest.approx(0.4)
    assert finding.evidence["sample_ratio"] == 0
    assert ratio(output, "hw_power_brake_slowdown") == pytest.approx(0.4)


def test_a_counted_slowdown_below_the_share_is_measured_but_no_finding() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [
            hot_gpu(
                temperature_gpu_celsius=45.0,
                throttle_seconds={"hw_power_brake_slowdown": 3.0 if k >= 10 else 0.0},
            )
        ],
    )
    output = thermal.run(history, NOW, CONFIG)
    assert output.findings == ()
    assert ratio(output, "hw_power_brake_slowdown") == pytest.approx(0.01)


def test_hbm_limit_follows_the_drivers_mem_max_threshold() -> None:
    at_82 = timeline(3, lambda k, t: [hot_gpu(temperature_memory_celsius=82.0)])
    assert thermal.run(at_82, last_time(3), CONFIG).findings == ()
    driver_85 = timeline(
        3,
        lambda k, t: [
            hot_gpu(temperature_memory_celsius=82.0, temperature_memory_max_celsius=85.0)
        ],
    )
    finding = next(iter(thermal.run(driver_85, last_time(3), CONFIG).findings))
    assert finding.code == "hbm_temperature_high"
    assert finding.evidence["margin_celsius"] == 3.0
    assert "85 C limit" in finding.message


def test_hot_hbm_by_the_drivers_limit_is_not_a_cool_gpu() -> None:
    history = timeline(
        POLLS,
        lambda k, t: [
            hot_gpu(
                temperature_gpu_celsius=45.0,
                temperature_memory_celsius=75.0,
                temperature_memory_max_celsius=85.0,
                clocks_event_reasons=HW_SLOWDOWN,
            )
        ],
    )
    assert codes(thermal.run(history, NOW, CONFIG))["hw_slowdown"] is Severity.WARN


def test_a_slowdown_in_a_daemons_first_minute_is_judged_against_the_whole_window() -> None:
    # 60 s of HW slowdown on a cool GPU as the daemon starts, judged at 120 s:
    # a fifth of the window, as a long-running daemon would count it, not
    # half of the two minutes seen (which read as a critical board fault).
    history = timeline(
        13,
        lambda k, t: [
            hot_gpu(temperature_gpu_celsius=45.0, clocks_event_reasons=HW_SLOWDOWN if k < 6 else 0)
        ],
    )
    output = thermal.run(history, last_time(13), CONFIG)
    assert output.findings == ()


def test_throttling_since_the_daemon_started_is_a_share_of_the_whole_window() -> None:
    # Throttled throughout the 60 s seen: 20 % of the window, not 100 %.
    history = timeline(7, lambda k, t: [hot_gpu(throttle_seconds={"thermal": 10.0 * k})])
    output = thermal.run(history, last_time(7), CONFIG)
    assert ratio(output, "thermal") == pytest.approx(0.2)
    assert codes(output) == {"thermal_throttling": Severity.WARN}


def test_hbm_at_its_limit_is_said_to_be_at_it() -> None:
    history = timeline(3, lambda k, t: [hot_gpu(temperature_memory_celsius=95.0)])
    finding = next(iter(thermal.run(history, last_time(3), CONFIG).findings))
    assert finding.message == "HBM at 95 C, at its 95 C limit"
