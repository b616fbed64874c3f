"""NVLink check: storms over consecutive windows, single bursts, replays and
recoveries, links that went down, counter resets, NVLink5's effective errors
and BER, and links short of the expected count."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from gpu_history import gpu, last_time, link, timeline

from gpuwatchd.checks import nvlink
from gpuwatchd.checks.nvlink import NvlinkConfig
from gpuwatchd.history import History
from gpuwatchd.model import Finding, GpuSample, LinkSample, Severity

CONFIG = NvlinkConfig()
POLLS = 19  # three full 60 s windows of 10 s polls


def links_of(
    make: Callable[[int, int], LinkSample], polls: int = POLLS, gpu_index: int = 5
) -> History:
    """GPU `gpu_index` with links 0-3; poll k reads make(k, link number)."""

    def gpus_at(k: int, time: float) -> list[GpuSample]:
        return [gpu(gpu_index, nvlinks=tuple(make(k, number) for number in range(4)))]

    return timeline(polls, gpus_at)


def findings(history: History, polls: int = POLLS) -> list[Finding]:
    return list(nvlink.run(history, last_time(polls), CONFIG).findings)


def test_a_crc_storm_over_three_windows_is_critical_on_its_link() -> None:
    # 2000 CRC flit errors a second on link 2, every poll.
    history = links_of(lambda k, n: link(5, n, crc_flit=20_000 * k if n == 2 else 0))
    [finding] = findings(history)
    assert finding.subject == "nvlink:5/2"
    assert finding.code == "nvlink_crc_storm"
    assert finding.severity is Severity.CRITICAL
    assert finding.evidence["rate_per_second"] == pytest.approx(2000.0)
    assert not finding.definitive


def test_a_single_crc_burst_is_a_warning_not_a_storm() -> None:
    # 50 000 errors between two polls of the last window, nothing before.
    history = links_of(lambda k, n: link(5, n, crc_data=50_000 if (n == 1 and k >= 17) else 0))
    [finding] = findings(history)
    assert (finding.subject, finding.code, finding.severity) == (
        "nvlink:5/1",
        "nvlink_crc_errors",
        Severity.WARN,
    )


def test_crc_errors_at_a_low_rate_are_normal() -> None:
    history = links_of(lambda k, n: link(5, n, crc_flit=100 * k))
    assert findings(history) == []


def test_a_storm_that_stopped_in_the_last_window_is_no_longer_critical() -> None:
    history = links_of(lambda k, n: link(5, n, crc_flit=20_000 * min(k, 12) if n == 0 else 0))
    assert findings(history) == []


def test_a_single_replay_warns() -> None:
    history = links_of(lambda k, n: link(5, n, replay=1 if (n == 3 and k >= 15) else 0))
    [finding] = findings(history)
    assert (finding.subject, finding.code, finding.severity) == (
        "nvlink:5/3",
        "nvlink_replay_errors",
        Severity.WARN,
    )


def test_a_recovery_event_warns() -> None:
    history = links_of(lambda k, n: link(5, n, recovery=1 if (n == 0 and k == POLLS - 1) else 0))
    assert [(f.code, f.severity) for f in findings(history)] == [
        ("nvlink_recovery_errors", Severity.WARN)
    ]


def test_recoveries_every_window_are_a_recovery_storm() -> None:
    history = links_of(lambda k, n: link(5, n, recovery=k // 3 if n == 0 else 0))
    assert [(f.code, f.severity) for f in findings(history)] == [
        ("nvlink_recovery_storm", Severity.CRITICAL)
    ]


def test_a_link_that_goes_down_after_being_up_is_critical() -> None:
    history = links_of(lambda k, n: link(5, n, up=not (n == 1 and k == POLLS - 1)))
    [finding] = findings(history)
    assert (finding.subject, finding.code, finding.severity) == (
        "nvlink:5/1",
        "nvlink_down",
        Severity.CRITICAL,
    )


def test_a_link_that_was_never_up_is_not_a_link_down() -> None:
    history = links_of(lambda k, n: link(5, n, up=n != 3))
    assert findings(history) == []


def test_a_link_of_unknown_state_is_not_a_link_down() -> None:
    history = links_of(lambda k, n: link(5, n, up=None if k == POLLS - 1 else True))
    assert findings(history) == []


def test_a_driver_reload_that_resets_the_counters_is_no_false_storm() -> None:
    # Huge counts before the reload, a few after: the drop is a reset, not errors.
    history = links_of(lambda k, n: link(5, n, crc_flit=10_000_000 if k < 10 else k - 10, replay=0))
    assert findings(history) == []


def test_a_lost_gpu_has_no_link_findings() -> None:
    def gpus_at(k: int, time: float) -> list[GpuSample]:
        if k == POLLS - 1:
            return [gpu(5, up=False)]
        return [gpu(5, nvlinks=(link(5, 0, crc_flit=20_000 * k),))]

    assert findings(timeline(POLLS, gpus_at)) == []


def test_a_config_with_an_unknown_family_is_rejected() -> None:
    with pytest.raises(ValueError, match="warn_on_any"):
        NvlinkConfig(warn_on_any=("crc", "gossip"))


# -- NVLink5 (Blackwell) -------------------------------------------------------------


def test_b200_effective_errors_one_a_second_for_three_minutes_are_critical() -> None:
    history = links_of(lambda k, n: link(5, n, effective_errors=10 * k if n == 2 else 0))
    [finding] = findings(history)
    assert (finding.subject, finding.code, finding.severity) == (
        "nvlink:5/2",
        "nvlink_effective_storm",
        Severity.CRITICAL,
    )
    assert not finding.definitive


def test_a_single_effective_error_warns() -> None:
    history = links_of(lambda k, n: link(5, n, effective_errors=int(n == 1 and k == POLLS - 1)))
    assert [(f.subject, f.code, f.severity) for f in findings(history)] == [
        ("nvlink:5/1", "nvlink_effective_errors", Severity.WARN)
    ]


def test_effective_errors_are_not_judged_with_the_crc_tolerance() -> None:
    # 50/s is far under CRC's 100/s, and a fault for NVLink5 (review 2.6, DCGM).
    history = links_of(lambda k, n: link(5, n, effective_errors=500 * k if n == 0 else 0))
    assert [f.code for f in findings(history)] == ["nvlink_effective_storm"]


def test_recovery_failures_and_malformed_packets_warn() -> None:
    last = POLLS - 1
    history = links_of(
        lambda k, n: link(
            5,
            n,
            recovery_failed=int(n == 0 and k == last),
            malformed_packets=int(n == 1 and k == last),
        )
    )
    assert sorted((f.subject, f.code) for f in findings(history)) == [
        ("nvlink:5/0", "nvlink_recovery_errors"),
        ("nvlink:5/1", "nvlink_packet_errors"),
    ]


@pytest.mark.parametrize(("ber", "critical"), [(0.0, False), (1e-12, False), (2e-12, True)])
def test_effective_ber_over_dcgm_limit_is_critical(ber: float, critical: bool) -> None:
    def make(k: int, n: int) -> LinkSample:
        return LinkSample(5, n, True, {"effective_errors": 0}, {"effective": ber if n == 0 else 0})

    codes = [(f.subject, f.code, f.severity) for f in findings(links_of(make))]
    assert codes == (
        [("nvlink:5/0", "nvlink_effective_ber", Severity.CRITICAL)] if critical else []
    )


# -- replays -------------------------------------------------------------------------------


def test_a_replay_every_minute_for_three_minutes_is_a_replay_storm() -> None:
    history = links_of(lambda k, n: link(5, n, replay=k // 6 if n == 3 else 0))
    assert [(f.code, f.severity) for f in findings(history)] == [
        ("nvlink_replay_storm", Severity.CRITICAL)
    ]


# -- expected links -------------------------------------------------------------------------


def model_links(
    model: str | None, up: Callable[[int, int], bool | None], count: int = 18
) -> History:
    """GPU 5 of `model` reporting `count` links; poll k, link n is up(k, n)."""

    def gpus_at(k: int, time: float) -> list[GpuSample]:
        links = tuple(link(5, n, up=up(k, n)) for n in range(count))
        return [gpu(5, name=model, nvlinks=links)]

    return timeline(POLLS, gpus_at)


def test_a_b200_whose_links_never_came_up_is_critical_on_the_gpu() -> None:
    [finding] = findings(model_links("NVIDIA B200", lambda k, n: False))
    assert (finding.subject, finding.code, finding.severity) == (
        "gpu:5",
        "nvlink_missing",
        Severity.CRITICAL,
    )
    assert not finding.definitive
    assert finding.evidence["up"] == 0 and finding.evidence["expected"] == 18
    assert "0 of 18" in finding.message


def test_one_link_never_up_is_named() -> None:
    [finding] = findings(model_links("NVIDIA H100 80GB HBM3", lambda k, n: n != 11))
    assert finding.code == "nvlink_missing"
    assert finding.evidence["never_up"] == "11"


def test_an_h100_reporting_only_12_links_is_short_of_its_18() -> None:
    [finding] = findings(model_links("NVIDIA H100 80GB HBM3", lambda k, n: True, count=12))
    assert finding.code == "nvlink_missing" and finding.evidence["up"] == 12


def test_links_unread_in_one_poll_are_not_missing() -> None:
    def gpus_at(k: int, time: float) -> list[GpuSample]:
        links = () if k == POLLS - 1 else tuple(link(5, n) for n in range(18))
        return [gpu(5, name="NVIDIA H100 80GB HBM3", nvlinks=links)]

    assert findings(timeline(POLLS, gpus_at)) == []


def test_links_of_unknown_state_are_not_missing() -> None:
    assert findings(model_links("NVIDIA H100 80GB HBM3", lambda k, n: None)) == []


def test_a_link_down_after_being_up_is_nvlink_down_only() -> None:
    history = model_links("NVIDIA A100-SXM4-80GB", lambda k, n: not (n == 4 and k > 12), count=12)
    assert [(f.subject, f.code) for f in findings(history)] == [("nvlink:5/4", "nvlink_down")]


def test_a_model_not_listed_has_no_link_expectation() -> None:
    assert findings(model_links("NVIDIA H100 PCIe", lambda k, n: False)) == []


def test_configured_expected_links_override_the_model() -> None:
    history = model_links("NVIDIA H100 PCIe", lambda k, n: n < 2, count=4)
    config = NvlinkConfig(expected_links=4)
    [finding] = nvlink.run(history, last_time(POLLS), config).findings
    assert finding.code == "nvlink_missing" and finding.evidence["never_up"] == "2, 3"
    assert nvlink.run(history, last_time(POLLS), NvlinkConfig(expected_links=0)).findings == ()
