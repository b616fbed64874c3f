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
from gpuwatchd.model import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_STARTED,
    FABRIC_STATE_NOT_SUPPORTED,
    Finding,
    GpuSample,
    LinkSample,
    Reading,
    Severity,
)

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


def test_judged_every_poll_a_burst_that_reset_ages_out_as_from_a_fresh_history() -> None:
    # The very same links poll after poll (as the NVML source hands back
    # unchanged ones), a CRC burst on link 1, a driver reload back to those
    # same links: each poll's findings on the one history are those of a
    # history made afresh, until the burst has left every window.
    still = tuple(link(5, n, crc_data=0) for n in range(4))
    burst = tuple(link(5, n, crc_data=50_000 if n == 1 else 0) for n in range(4))

    def gpus_at(k: int, time: float) -> list[GpuSample]:
        return [gpu(5, nvlinks=burst if k in (5, 6) else still)]

    polls = 30
    history = History(max_age_seconds=7200.0)
    each_poll, fresh = [], []
    for k in range(polls):
        time = last_time(k + 1)
        history.record(Reading(source="nvml", time=time, gpus=tuple(gpus_at(k, time))))
        each_poll.append(list(nvlink.run(history, time, CONFIG).findings))
        fresh.append(findings(timeline(k + 1, gpus_at), k + 1))
    assert each_poll == fresh
    assert [(f.subject, f.code) for f in each_poll[5]] == [("nvlink:5/1", "nvlink_crc_errors")]
    assert each_poll[-1] == []


# -- replays -------------------------------------------------------------------------------


def test_a_replay_every_minute_for_three_minutes_is_a_replay_storm() -> None:
    history = links_of(lambda k, n: link(5, n, replay=k // 6 if n == 3 else 0))
    assert [(f.code, f.severity) for f in findings(history)] == [
        ("nvlink_replay_storm", Severity.CRITICAL)
    ]


# -- expected links -------------------------------------------------------------------------


def model_links(
    model: str | None,
    up: Callable[[int, int], bool | None],
    count: int = 18,
    fabric: Callable[[int], int | None] = lambda k: FABRIC_STATE_COMPLETED,
    uuid: str = "GPU-0005",
) -> History:
    """GPU 5 of `model` reporting `count` links; poll k, link n is up(k, n),
    and the fabric state is fabric(k) (registered, unless told otherwise)."""

    def gpus_at(k: int, time: float) -> list[GpuSample]:
        links = tuple(link(5, n, up=up(k, n)) for n in range(count))
        return [gpu(5, name=model, uuid=uuid, fabric_state=fabric(k), nvlinks=links)]

    return timeline(POLLS, gpus_at)


def missing(
    history: History,
    learned: nvlink.LearnedLinks = nvlink.NONE_LEARNED,
    config: NvlinkConfig = CONFIG,
) -> list[Finding]:
    output = nvlink.run(history, last_time(POLLS), config, learned)
    return [f for f in output.findings if f.code == "nvlink_missing"]


ALL_18 = frozenset(range(18))


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
        registered = FABRIC_STATE_COMPLETED
        return [gpu(5, name="NVIDIA H100 80GB HBM3", fabric_state=registered, nvlinks=links)]

    assert findings(timeline(POLLS, gpus_at)) == []


def test_links_of_unknown_state_are_not_missing() -> None:
    assert findings(model_links("NVIDIA H100 80GB HBM3", lambda k, n: None)) == []


def test_a_link_down_after_being_up_is_nvlink_down_only() -> None:
    history = model_links("NVIDIA H100 80GB HBM3", lambda k, n: not (n == 4 and k > 12))
    assert [(f.subject, f.code) for f in findings(history)] == [("nvlink:5/4", "nvlink_down")]


def test_a_model_not_listed_has_no_link_expectation() -> None:
    assert findings(model_links("NVIDIA H100 PCIe", lambda k, n: False)) == []


def test_configured_expected_links_override_the_model() -> None:
    history = model_links("NVIDIA H100 PCIe", lambda k, n: n < 2, count=4)
    config = NvlinkConfig(expected_links=4)
    [finding] = nvlink.run(history, last_time(POLLS), config).findings
    assert finding.code == "nvlink_missing" and finding.evidence["never_up"] == "2, 3"
    assert nvlink.run(history, last_time(POLLS), NvlinkConfig(expected_links=0)).findings == ()


@pytest.mark.parametrize("fabric_state", [FABRIC_STATE_NOT_SUPPORTED, None])
def test_an_h100_passed_through_to_a_vm_with_no_links_ever_up_expects_none(
    fabric_state: int | None,
) -> None:
    # Its product name is an HGX board's, but the VM is outside the NVSwitch fabric.
    vm = model_links("NVIDIA H100 80GB HBM3", lambda k, n: False, fabric=lambda k: fabric_state)
    assert findings(vm) == []


def test_an_h100_registered_with_the_fabric_whose_links_never_came_up_is_missing() -> None:
    [finding] = missing(model_links("NVIDIA H100 80GB HBM3", lambda k, n: False))
    assert finding.evidence == {"expected": 18, "up": 0, "never_up": ", ".join(map(str, range(18)))}
    assert "registered with the NVSwitch fabric" in finding.message


def test_one_poll_with_the_fabric_state_unread_keeps_the_models_expectation() -> None:
    def fabric(k: int) -> int | None:
        return None if k == POLLS - 1 else FABRIC_STATE_COMPLETED

    assert missing(model_links("NVIDIA H100 80GB HBM3", lambda k, n: n != 4, fabric=fabric))


def test_links_learned_up_before_a_restart_and_never_up_since_are_missing_by_name() -> None:
    # Not registered (the fabric manager did not start after the reboot):
    # only what was seen up on this board says what it should have.
    history = model_links(
        "NVIDIA H100 80GB HBM3",
        lambda k, n: n not in (6, 13),
        fabric=lambda k: FABRIC_STATE_NOT_STARTED,
    )
    [finding] = missing(history, {"GPU-0005": ALL_18})
    assert finding.subject == "gpu:5"
    assert finding.evidence == {"expected": 18, "up": 16, "never_up": "6, 13"}
    assert "seen up on this board before" in finding.message


def test_links_learned_on_another_board_at_the_same_index_are_not_expected() -> None:
    history = model_links(None, lambda k, n: False, uuid="GPU-new-board")
    assert missing(history, {"GPU-0005": ALL_18}) == []


def test_more_links_learned_than_the_model_has_are_all_expected() -> None:
    history = model_links("NVIDIA H100 PCIe", lambda k, n: n != 2, count=4)
    [finding] = missing(history, {"GPU-0005": frozenset(range(4))})
    assert finding.evidence == {"expected": 4, "up": 3, "never_up": "2"}


def test_expected_links_0_silences_the_fabric_and_the_learned_links() -> None:
    history = model_links("NVIDIA H100 80GB HBM3", lambda k, n: False)
    assert missing(history, {"GPU-0005": ALL_18}, NvlinkConfig(expected_links=0)) == []


def test_a_link_learned_up_and_up_now_is_not_missing() -> None:
    history = model_links(None, lambda k, n: True, fabric=lambda k: None)
    assert missing(history, {"GPU-0005": ALL_18}) == []


# -- learning the links seen up -----------------------------------------------------------


def reading(*gpus: GpuSample) -> Reading:
    return Reading(source="nvml", time=0.0, gpus=gpus)


def board(uuid: str, up: set[int], count: int = 4) -> GpuSample:
    return gpu(0, uuid=uuid, nvlinks=tuple(link(0, n, up=n in up) for n in range(count)))


def test_links_seen_up_are_learned_per_board_and_nothing_when_already_known() -> None:
    grown = nvlink.links_after({}, [reading(board("GPU-a", {0, 1}), board("GPU-b", set()))])
    assert grown == {"GPU-a": frozenset({0, 1})}
    assert nvlink.links_after(grown, [reading(board("GPU-a", {1}))]) == {}
    later = nvlink.links_after(grown, [reading(board("GPU-a", {2}))])
    assert later == {"GPU-a": frozenset({0, 1, 2})}


def test_the_learned_links_are_recorded_as_sorted_numbers_by_uuid_and_read_back() -> None:
    learned = {"GPU-a": frozenset({3, 0, 1})}
    assert nvlink.encode_learned(learned) == {"GPU-a": [0, 1, 3]}
    assert nvlink.decode_learned(nvlink.encode_learned(learned)) == learned
    assert nvlink.decode_learned({"GPU-a": [0, "x"], "GPU-b": 3}) == {"GPU-a": frozenset({0})}
    assert nvlink.decode_learned(None) == {}
