"""Clock-drift check: a busy GPU slower than its busy peers, or than its maximum,
with no clocks-event reason that explains it."""

from __future__ import annotations

import pytest
from gpu_history import POLL, gpu, last_time, timeline

from gpuwatchd.checks import clocks
from gpuwatchd.checks.clocks import ClocksConfig
from gpuwatchd.history import History
from gpuwatchd.model import CLOCKS_EVENT_REASONS, Action, GpuSample, Severity

CONFIG = ClocksConfig()
MAX_HZ = 1980e6
SW_POWER_CAP = CLOCKS_EVENT_REASONS["sw_power_cap"]


def busy(index: int, clock_hz: float, **fields: object) -> GpuSample:
    values: dict[str, object] = {
        "sm_clock_hertz": clock_hz,
        "sm_max_clock_hertz": MAX_HZ,
        "utilization_gpu_ratio": 1.0,
        "clocks_event_reasons": 0,
    }
    values.update(fields)
    return gpu(index, **values)


def node(
    slow_clock_hz: float,
    polls: int,
    slow_from: int = 0,
    step: float = POLL,
    **slow_fields: object,
) -> tuple[History, float]:
    """Eight busy GPUs near 1950 MHz, polled every `step`; GPU 5 runs at
    `slow_clock_hz` from poll `slow_from` on."""

    def gpus_at(k: int, time: float) -> list[GpuSample]:
        gpus = [busy(i, 1950e6 - 5e6 * i) for i in range(8)]
        if k >= slow_from:
            gpus[5] = busy(5, slow_clock_hz, **slow_fields)
        return gpus

    history = History(max_age_seconds=3600.0)
    return timeline(polls, gpus_at, step=step, history=history), last_time(polls, step=step)


def test_a_busy_gpu_slower_than_its_peers_for_no_reason_warns_with_its_drift_ratio() -> None:
    history, now = node(1400e6, polls=7)
    output = clocks.run(history, now, CONFIG)
    assert [(f.subject, f.code, f.severity) for f in output.findings] == [
        ("gpu:5", "clock_drift", Severity.WARN)
    ]
    drift = {m.labels["gpu"]: m.value for m in output.measurements}
    # Busy clocks 1400, 1915 ... 1950 MHz: the median is between 1930 and 1935.
    assert drift["5"] == pytest.approx(1400 / 1932.5)
    assert drift["0"] == pytest.approx(1950 / 1932.5)
    assert all(m.name == "gpu_clock_drift_ratio" for m in output.measurements)


def test_drift_in_every_window_of_a_quarter_hour_is_critical() -> None:
    history, now = node(1400e6, polls=6 * 15 + 1)
    finding = next(iter(clocks.run(history, now, CONFIG).findings))
    assert finding.severity is Severity.CRITICAL
    assert finding.action is Action.INSPECT_HARDWARE


def test_drift_for_a_quarter_hour_at_a_100ms_poll_is_critical_as_at_10s() -> None:
    # 9000 polls: more than History's 4096 samples, which must still span the
    # quarter hour (review F8: the window was cut to 6.8 minutes, a warning).
    history, now = node(1400e6, polls=10 * 60 * 15 + 1, step=0.1)
    assert len(history.gpu(5)) <= history.max_samples
    finding = next(iter(clocks.run(history, now, CONFIG).findings))
    assert finding.severity is Severity.CRITICAL


def test_drift_that_began_a_few_minutes_ago_is_still_a_warning() -> None:
    history, now = node(1400e6, polls=6 * 15 + 1, slow_from=6 * 12)
    assert next(iter(clocks.run(history, now, CONFIG).findings)).severity is Severity.WARN


def test_a_power_capped_gpu_is_slow_for_a_reason_and_is_no_finding() -> None:
    history, now = node(1400e6, polls=7, clocks_event_reasons=SW_POWER_CAP)
    assert clocks.run(history, now, CONFIG).findings == ()


def test_an_idle_gpu_at_low_clocks_is_no_finding() -> None:
    history, now = node(300e6, polls=7, utilization_gpu_ratio=0.05)
    assert clocks.run(history, now, CONFIG).findings == ()


def test_unknown_reasons_cannot_rule_out_an_explanation() -> None:
    history, now = node(1400e6, polls=7, clocks_event_reasons=None)
    assert clocks.run(history, now, CONFIG).findings == ()


def test_a_small_spread_between_gpus_is_normal() -> None:
    history, now = node(1800e6, polls=7)
    assert clocks.run(history, now, CONFIG).findings == ()


def test_with_too_few_busy_peers_only_the_maximum_clock_is_compared() -> None:
    def pair(k: int, time: float) -> list[GpuSample]:
        return [busy(0, 1950e6), busy(1, 1700e6), gpu(2, utilization_gpu_ratio=0.0)]

    history = timeline(7, pair)
    output = clocks.run(history, last_time(7), CONFIG)
    # 1700 MHz is 86% of the 1980 MHz maximum: within the 20% allowed.
    assert output.findings == ()
    assert output.measurements == ()

    def slow_pair(k: int, time: float) -> list[GpuSample]:
        return [busy(0, 1950e6), busy(1, 1200e6)]

    history = timeline(7, slow_pair)
    finding = next(iter(clocks.run(history, last_time(7), CONFIG).findings))
    assert finding.subject == "gpu:1"
    assert finding.evidence["allowed_ratio"] == pytest.approx(1200 / 1980, abs=1e-4)
    assert "peer_ratio" not in finding.evidence


def test_an_unknown_explaining_reason_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown reason"):
        ClocksConfig(explaining_reasons=("gpu_idle", "coffee_break"))


def alone(clock_hz: float, **fields: object) -> History:
    """A node with one busy GPU: no peers to compare with."""
    return timeline(7, lambda k, t: [busy(0, clock_hz, **fields)])


def test_application_clocks_an_operator_set_are_the_clock_it_may_run_at() -> None:
    applied = {"sm_application_clock_hertz": 1275e6, "sm_default_application_clock_hertz": MAX_HZ}
    assert clocks.run(alone(1275e6, **applied), last_time(7), CONFIG).findings == ()
    finding = next(iter(clocks.run(alone(900e6, **applied), last_time(7), CONFIG).findings))
    assert finding.evidence["allowed_clock_hertz"] == 1275e6
    assert "application clock target" in finding.message


def test_default_application_clocks_leave_the_maximum_as_the_allowed_clock() -> None:
    # A100: default application clock 1095 MHz, boosting to its 1410 MHz maximum.
    default = {
        "sm_max_clock_hertz": 1410e6,
        "sm_application_clock_hertz": 1095e6,
        "sm_default_application_clock_hertz": 1095e6,
    }
    finding = next(iter(clocks.run(alone(1050e6, **default), last_time(7), CONFIG).findings))
    assert finding.evidence["allowed_clock_hertz"] == 1410e6
    assert "of its maximum" in finding.message


def test_a_gpu_alone_below_its_maximum_for_no_reason_still_drifts() -> None:
    # NVML reports no lock: with no peer to agree with, a lone GPU is judged.
    assert clocks.run(alone(1410e6), last_time(7), CONFIG).findings != ()


def test_two_gpus_held_at_one_clock_agree_and_are_not_drifting() -> None:
    history = timeline(7, lambda k, t: [busy(0, 1410e6), busy(1, 1395e6)])
    assert clocks.run(history, last_time(7), CONFIG).findings == ()


def test_a_whole_node_held_below_its_maximum_raises_nothing_for_a_quarter_hour() -> None:
    history = timeline(6 * 15 + 1, lambda k, t: [busy(i, 1410e6) for i in range(8)])
    output = clocks.run(history, last_time(6 * 15 + 1), CONFIG)
    assert output.findings == ()
    assert {m.value for m in output.measurements} == {1.0}


A100_MAX_HZ = 1410e6
IDLE = CLOCKS_EVENT_REASONS["gpu_idle"]
QUARTER_HOUR = 6 * 15 + 1


def test_gpus_are_held_to_peers_of_their_own_model() -> None:
    # Four H100s near their 1980 MHz, four A100s at their 1410 MHz maximum:
    # against the node's median (1675 MHz) every A100 would look slow.
    def mixed(k: int, time: float) -> list[GpuSample]:
        h100s = [busy(i, 1950e6, name="NVIDIA H100 80GB HBM3") for i in range(4)]
        a100s = [
            busy(i, 1410e6, name="NVIDIA A100-SXM4-80GB", sm_max_clock_hertz=A100_MAX_HZ)
            for i in range(4, 8)
        ]
        return h100s + a100s

    output = clocks.run(timeline(7, mixed), last_time(7), CONFIG)
    assert output.findings == ()
    assert {m.value for m in output.measurements} == {1.0}


def lone_gpu(clock_hz: float, peers_busy_polls: int, polls: int) -> tuple[History, float]:
    """GPU 0 busy throughout, from poll `peers_busy_polls` on at `clock_hz`;
    GPUs 1-7 busy at a 1410 MHz lock for the first `peers_busy_polls` polls, idle after."""

    def gpus_at(k: int, time: float) -> list[GpuSample]:
        if k < peers_busy_polls:
            return [busy(i, 1410e6) for i in range(8)]
        idle = [
            gpu(i, sm_clock_hertz=345e6, utilization_gpu_ratio=0.0, clocks_event_reasons=IDLE)
            for i in range(1, 8)
        ]
        return [busy(0, clock_hz), *idle]

    history = History(max_age_seconds=3600.0)
    return timeline(polls, gpus_at, history=history), last_time(polls)


def test_a_lone_busy_gpu_with_no_peer_busy_in_the_history_never_goes_critical() -> None:
    history, now = lone_gpu(1410e6, peers_busy_polls=0, polls=QUARTER_HOUR)
    (finding,) = clocks.run(history, now, CONFIG).findings
    assert (finding.subject, finding.severity) == ("gpu:0", Severity.WARN)
    assert finding.evidence["second_reference"] == "none"
    assert "no second reference" in finding.message


def test_a_lone_busy_gpu_at_its_peers_last_busy_clock_is_not_drifting() -> None:
    history, now = lone_gpu(1410e6, peers_busy_polls=30, polls=30 + QUARTER_HOUR)
    assert clocks.run(history, now, CONFIG).findings == ()


def test_a_lone_busy_gpu_well_below_its_peers_last_busy_clock_is_critical() -> None:
    history, now = lone_gpu(990e6, peers_busy_polls=30, polls=30 + QUARTER_HOUR)
    (finding,) = clocks.run(history, now, CONFIG).findings
    assert finding.severity is Severity.CRITICAL
    assert finding.evidence["peers_last_busy_hertz"] == 1410e6
    assert "70% of its peers' last busy clocks" in finding.message


def test_peers_busy_before_the_history_began_are_no_reference() -> None:
    # Busy for the first 5 minutes, idle for the 65 after: the hour kept holds
    # none of their busy samples.
    history, now = lone_gpu(1410e6, peers_busy_polls=30, polls=6 * 70)
    (finding,) = clocks.run(history, now, CONFIG).findings
    assert finding.severity is Severity.WARN
    assert finding.evidence["second_reference"] == "none"
