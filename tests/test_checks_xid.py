"""XID check and catalog: each XID judged by NVIDIA's catalog, every occurrence
counted, escalation to hardware inspection only for hardware XIDs that come
back after reboots within the window."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from gpu_history import T0, gpu, record

from gpuwatchd.checks import xid
from gpuwatchd.checks.xid import BootRecord, BootXid, XidConfig
from gpuwatchd.checks.xid_catalog import CATALOG, lookup
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, NvlinkXidDetail, Severity, XidEvent

CONFIG = XidConfig()
NOW = T0 + 100.0
DAY = 86400.0


def xids(
    *events: tuple[int, int],
    boots: BootRecord | None = None,
    uuid: str | None = None,
    config: XidConfig = CONFIG,
) -> list[Finding]:
    """(gpu, code) events a second apart before NOW, judged at NOW."""
    history = History(max_age_seconds=3600.0)
    stamped = [
        XidEvent(gpu=g, code=code, time=NOW - 50 + n, uuid=uuid)
        for n, (g, code) in enumerate(events)
    ]
    record(history, NOW - 60, [gpu(index) for index in range(8)])
    record(history, NOW, [gpu(index) for index in range(8)], stamped)
    return list(xid.run(history, NOW, config, boots).findings)


def seen_before(code: int, *ages: float, gpu_index: int = 3) -> BootRecord:
    """Earlier boots, one per age (seconds before NOW, oldest first), in each of
    which GPU `gpu_index` raised `code`; then the current boot."""
    earlier = [f"boot-{n}" for n in range(len(ages))]
    return BootRecord(
        boot_ids=(*earlier, "boot-now"),
        xids=tuple(
            BootXid(boot, gpu_index, f"GPU-{gpu_index:04d}", code, NOW - age)
            for boot, age in zip(earlier, ages, strict=True)
        ),
    )


def verdict(finding: Finding) -> tuple[str, Severity, Action, bool]:
    return (finding.code, finding.severity, finding.action, finding.definitive)


def by_code(findings: Sequence[Finding]) -> dict[str, Finding]:
    return {finding.code: finding for finding in findings}


def test_an_application_xid_is_recorded_but_does_not_condemn_the_gpu() -> None:
    [finding] = xids((4, 13))
    assert (finding.subject, finding.code) == ("gpu:4", "xid_application")
    assert finding.severity is Severity.OK
    assert finding.action is Action.RESTART_APP
    assert not finding.definitive


def test_a_gpu_fallen_off_the_bus_drains_at_once_for_the_reboot_nvidia_asks_for() -> None:
    [finding] = xids((2, 79))
    assert verdict(finding) == ("xid_hardware", Severity.CRITICAL, Action.REBOOT, False)
    assert finding.immediate
    assert finding.evidence["nvidia_immediate"] == "RESTART_BM"


def test_a_gpu_fallen_off_the_bus_again_after_two_reboots_is_condemned() -> None:
    [finding] = xids((3, 79), boots=seen_before(79, 2 * 3600.0, 3600.0))
    assert verdict(finding) == ("xid_hardware", Severity.CRITICAL, Action.INSPECT_HARDWARE, True)


def test_a_contained_memory_error_warns_and_only_the_application_restarts() -> None:
    [finding] = xids((0, 94))
    assert verdict(finding) == (
        "xid_hardware",
        Severity.WARN,
        Action.RESTART_APP,
        False,
    )


@pytest.mark.parametrize("code", [48, 95])
def test_a_double_bit_or_uncontained_memory_error_drains_for_a_reset_not_for_good(
    code: int,
) -> None:
    [finding] = xids((1, code))
    assert verdict(finding) == (
        "xid_hardware",
        Severity.CRITICAL,
        Action.RESET_GPU,
        False,
    )
    assert "row-remap failure" in finding.message


@pytest.mark.parametrize("code", [48, 94, 95])
def test_memory_error_xids_repeated_within_the_window_still_only_ask_for_a_reset(
    code: int,
) -> None:
    # NVIDIA's RMA criteria (row-remap failure, SRAM threshold) condemn, read
    # by the memory check; a repeated XID is not one of them.
    [finding] = xids((3, code), boots=seen_before(code, DAY, 3600.0))
    assert not finding.definitive
    assert finding.action is not Action.INSPECT_HARDWARE


def test_every_occurrence_counts_not_only_the_last() -> None:
    [finding] = xids((3, 13), (3, 13), (3, 13))
    assert finding.evidence["count"] == 3
    assert "x3" in finding.message


def test_hardware_application_and_informational_xids_of_one_gpu_are_judged_apart() -> None:
    found = by_code(xids((1, 48), (1, 45), (1, 63), (1, 13)))
    assert found["xid_hardware"].severity is Severity.CRITICAL
    assert found["xid_hardware"].evidence["xids"] == "48"
    assert found["xid_application"].evidence["xids"] == "13"
    assert found["xid_informational"].evidence["xids"] == "45,63"
    assert found["xid_application"].severity is Severity.OK
    assert found["xid_informational"].severity is Severity.OK


def test_the_most_severe_xid_of_a_gpu_decides_its_finding() -> None:
    [finding] = xids((6, 94), (6, 79))
    assert finding.severity is Severity.CRITICAL
    assert finding.evidence["xid"] == 79
    assert finding.action is Action.REBOOT


def test_an_unknown_xid_is_worth_a_warning() -> None:
    [finding] = xids((0, 999))
    assert (finding.code, finding.severity) == ("xid_unknown", Severity.WARN)
    assert not finding.definitive


def test_an_xid_older_than_the_window_is_forgotten() -> None:
    history = History(max_age_seconds=3600.0)
    record(history, NOW - 900, [gpu(0)], [XidEvent(0, 79, NOW - 900)])
    record(history, NOW, [gpu(0)])
    assert xid.run(history, NOW, CONFIG).findings == ()


def test_ignored_xids_are_not_reported() -> None:
    history = History(max_age_seconds=3600.0)
    record(history, NOW, [gpu(0)], [XidEvent(0, 13, NOW), XidEvent(0, 92, NOW)])
    assert xid.run(history, NOW, XidConfig(ignore=(13, 92))).findings == ()


def test_xid_157_twice_across_reboots_condemns_nothing() -> None:
    [finding] = xids((3, 157), boots=seen_before(157, 2 * 3600.0, 3600.0))
    assert verdict(finding) == (
        "xid_informational",
        Severity.OK,
        Action.NONE,
        False,
    )


@pytest.mark.parametrize("code", [43, 63, 92, 121, 137, 159, 160, 161])
def test_an_xid_nvidia_says_to_ignore_condemns_nothing_however_often_it_returns(
    code: int,
) -> None:
    [finding] = xids((3, code), boots=seen_before(code, 3 * 3600.0, 2 * 3600.0, 3600.0))
    assert verdict(finding) == (
        "xid_informational",
        Severity.OK,
        Action.NONE,
        False,
    )


@pytest.mark.parametrize("code", [119, 120])
def test_a_gsp_xid_asks_for_a_reset_and_points_at_software_not_hardware(code: int) -> None:
    [finding] = xids((5, code))
    assert verdict(finding) == (
        "xid_software",
        Severity.CRITICAL,
        Action.RESET_GPU,
        False,
    )
    assert finding.evidence["nvidia_investigatory"] == "INVESTIGATE_SW"


def test_xid_119_repeated_across_boots_a_week_apart_is_not_definitive() -> None:
    [finding] = xids((3, 119), boots=seen_before(119, 14 * DAY, 7 * DAY))
    assert not finding.definitive
    assert finding.action is Action.RESET_GPU


def test_xid_119_repeated_across_boots_within_a_day_is_still_not_definitive() -> None:
    # NVIDIA investigates 119 as software: repeats ask for a driver look, not an RMA.
    [finding] = xids((3, 119), boots=seen_before(119, 2 * 3600.0, 3600.0))
    assert not finding.definitive
    assert finding.action is Action.RESET_GPU


def test_xid_79_repeated_within_three_days_escalates_to_hardware_inspection() -> None:
    [finding] = xids((3, 79), boots=seen_before(79, 2 * DAY, DAY))
    assert finding.action is Action.INSPECT_HARDWARE
    assert finding.severity is Severity.CRITICAL
    assert finding.definitive
    assert finding.evidence["reboots"] == 2
    assert "came back after 2 reboots within 3d" in finding.message


def test_a_reset_cured_hardware_xid_back_after_two_reboots_escalates_and_quarantines() -> None:
    [finding] = xids((3, 62), boots=seen_before(62, 2 * 3600.0, 3600.0))
    assert verdict(finding) == (
        "xid_hardware",
        Severity.CRITICAL,
        Action.INSPECT_HARDWARE,
        True,
    )


def test_a_hardware_xid_seen_before_the_reboot_window_does_not_escalate() -> None:
    # Boots 5 and 4 days ago saw it: outside gpud's 3-day lookback, the XID
    # now is a new event, drained for a reset and released once quiet.
    [finding] = xids((3, 62), boots=seen_before(62, 5 * DAY, 4 * DAY))
    assert verdict(finding) == (
        "xid_hardware",
        Severity.CRITICAL,
        Action.RESET_GPU,
        False,
    )


def test_only_the_reboots_since_the_first_xid_within_the_window_count() -> None:
    # Three earlier boots saw it, but only the last one within 3 days: one reboot.
    [finding] = xids((3, 62), boots=seen_before(62, 6 * DAY, 5 * DAY, DAY))
    assert finding.action is Action.RESET_GPU


def test_the_reboot_window_is_configurable() -> None:
    week = XidConfig(reboot_window=7 * DAY)
    [finding] = xids((3, 62), boots=seen_before(62, 5 * DAY, 4 * DAY), config=week)
    assert finding.action is Action.INSPECT_HARDWARE


def test_a_hardware_xid_back_after_one_reboot_still_asks_for_a_reset() -> None:
    [finding] = xids((3, 62), boots=seen_before(62, 3600.0))
    assert finding.action is Action.RESET_GPU
    assert not finding.definitive


def test_escalation_follows_the_board_by_uuid_when_indices_shift() -> None:
    # Before the reboots the board was GPU 4; a missing GPU renumbered it to 3.
    boots = BootRecord(
        boot_ids=("boot-a", "boot-b", "boot-c"),
        xids=(BootXid("boot-a", 4, "GPU-0003", 79, NOW - DAY),),
    )
    [finding] = xids((3, 79), boots=boots)
    assert finding.action is Action.INSPECT_HARDWARE
    # The GPU now at index 4 is another board: its history is not GPU 3's.
    [other] = xids((4, 79), boots=boots)
    assert other.action is Action.REBOOT


def test_a_gpu_without_a_uuid_never_escalates_on_the_record_of_its_index() -> None:
    # The board that had index 2 in the earlier boot may not be this one.
    boots = BootRecord(
        boot_ids=("boot-a", "boot-b", "boot-c"),
        xids=(BootXid("boot-a", 2, "GPU-0002", 62, NOW - DAY),),
    )
    history = History(max_age_seconds=3600.0)
    record(history, NOW, [gpu(2, uuid=None)], [XidEvent(2, 62, NOW)])
    [finding] = xid.run(history, NOW, CONFIG, boots).findings
    assert finding.action is Action.RESET_GPU
    assert not finding.definitive


def test_an_application_xid_is_never_escalated() -> None:
    [finding] = xids((3, 13), boots=seen_before(13, 2 * 3600.0, 3600.0))
    assert finding.action is Action.RESTART_APP


def test_xid_109_asks_for_a_reset() -> None:
    [finding] = xids((2, 109))
    assert verdict(finding) == (
        "xid_hardware",
        Severity.CRITICAL,
        Action.RESET_GPU,
        False,
    )


def test_xid_74_drains_the_reporting_gpu_but_never_condemns_it_for_the_remote_end() -> None:
    [finding] = xids((3, 74), boots=seen_before(74, 2 * 3600.0, 3600.0))
    assert verdict(finding) == (
        "xid_hardware",
        Severity.CRITICAL,
        Action.RESET_GPU,
        False,
    )
    assert "remote end" in finding.message


def test_xid_154_warns_and_points_to_the_recovery_action_the_driver_announced() -> None:
    [finding] = xids((3, 154), boots=seen_before(154, 2 * 3600.0, 3600.0))
    assert verdict(finding) == ("xid_recovery_action", Severity.WARN, Action.NONE, False)
    assert "gpu_recovery_action" in finding.message


def judged(*events: XidEvent) -> list[Finding]:
    """Events as the kernel log's lines make them, judged at NOW."""
    history = History(max_age_seconds=3600.0)
    record(history, NOW, [gpu(index) for index in range(8)], events)
    return list(xid.run(history, NOW, CONFIG).findings)


def nvlink5(
    code: int, fatal: bool, link: int, intrinfo: int = 0x021425C6, status: int = 0
) -> XidEvent:
    """An NVLink5 XID of GPU 3 with its line's tail (gb200_149_fatal_link_01's by default)."""
    detail = NvlinkXidDetail("NETIR_LINK_EVT", fatal, link, intrinfo, status)
    return XidEvent(gpu=3, code=code, time=NOW - 10, uuid="GPU-0003", nvlink=detail)


def test_a_fatal_nvlink5_xid_is_critical_on_its_link_and_asks_for_a_reset() -> None:
    [finding] = judged(nvlink5(149, fatal=True, link=1))
    assert (finding.subject, *verdict(finding)) == (
        "nvlink:3/1",
        "xid_nvlink",
        Severity.CRITICAL,
        Action.RESET_GPU,
        False,
    )
    # A reset cures it: confirmed by policy like any reset XID, never at once.
    assert not finding.immediate
    assert finding.evidence["intrinfo"] == "0x021425c6" and finding.evidence["fatal"] == 1


def test_a_nonfatal_nvlink5_xid_warns_on_its_link_and_asks_for_nothing() -> None:
    [finding] = judged(nvlink5(145, fatal=False, link=3, intrinfo=0x040868E2, status=8))
    assert (finding.subject, *verdict(finding)) == (
        "nvlink:3/3",
        "xid_nvlink",
        Severity.WARN,
        Action.NONE,
        False,
    )


@pytest.mark.parametrize("reason", [0x26, 0x28])
def test_a_fatal_netir_link_down_whose_reason_the_decode_ignores_only_warns(reason: int) -> None:
    # NETIR_LINK_DOWN's V1 intrinfo pattern, the reason in bits 20-25.
    [finding] = judged(nvlink5(149, fatal=True, link=2, intrinfo=(reason << 20) | 0x1C6))
    assert (finding.subject, finding.severity) == ("nvlink:3/2", Severity.WARN)


def test_a_fatal_and_a_nonfatal_xid_on_one_link_are_one_critical_finding() -> None:
    [finding] = judged(nvlink5(149, fatal=True, link=1), nvlink5(145, fatal=False, link=1))
    assert finding.severity is Severity.CRITICAL
    assert (finding.evidence["count"], finding.evidence["fatal"]) == (2, 1)
    assert "Fatal x1" in finding.message and "Nonfatal x1" in finding.message


def test_an_nvlink5_xid_without_a_link_or_without_its_line_warns_on_the_gpu() -> None:
    no_link = nvlink5(149, fatal=True, link=-1, intrinfo=0x000FE406)
    nvml_alone = XidEvent(gpu=3, code=146, time=NOW - 5, uuid="GPU-0003")
    [finding] = judged(no_link, nvml_alone)
    assert (finding.subject, finding.code, finding.severity) == (
        "gpu:3",
        "xid_hardware",
        Severity.WARN,
    )


def test_an_xid_154_back_to_none_is_the_recovery_done_not_a_warning() -> None:
    done = XidEvent(gpu=3, code=154, time=NOW - 10, recovery_action=0)
    [finding] = judged(done)
    assert verdict(finding) == ("xid_recovery_action", Severity.OK, Action.NONE, False)
    assert "recovery is done" in finding.message
    reset = XidEvent(gpu=3, code=154, time=NOW - 5, recovery_action=1)
    [both] = judged(done, reset)
    assert both.severity is Severity.WARN and both.evidence["count"] == 2


def test_every_catalog_row_cites_nvidias_immediate_and_investigatory_action() -> None:
    for entry in CATALOG.values():
        assert entry.immediate and entry.investigatory, entry.code


def test_the_catalog_covers_every_xid_the_review_and_current_gpus_name() -> None:
    named = {8, 13, 31, 43, 45, 46, 48, 54, 62, 63, 64, 74, 79, 92, 94, 95, 109, 110, 119}
    current = {120, 121, 136, 137, 140, 143, *range(144, 162)}
    assert (named | current) - set(CATALOG) == set()


def test_no_row_nvidia_says_to_ignore_condemns_or_escalates() -> None:
    ignored = [entry for entry in CATALOG.values() if entry.immediate == "IGNORE"]
    assert {92, 121, 157} <= {entry.code for entry in ignored}
    for entry in ignored:
        assert entry.severity is Severity.OK and not entry.condemns, entry.code
        assert not entry.escalates and not entry.definitive, entry.code


def test_no_row_nvidia_investigates_as_software_or_ignores_escalates() -> None:
    for entry in CATALOG.values():
        if entry.investigatory.startswith(("INVESTIGATE_SW", "IGNORE", "CHECK_APP")):
            assert not entry.escalates, entry.code


def test_only_missing_auxiliary_power_condemns_at_once_and_only_off_the_bus_drains_at_once() -> (
    None
):
    assert {code for code, entry in CATALOG.items() if entry.definitive} == {54}
    assert {code for code, entry in CATALOG.items() if entry.drains} == {79}


def test_the_xids_that_escalate_are_reset_or_reboot_cured_hardware_faults() -> None:
    escalating = {code for code, entry in CATALOG.items() if entry.escalates}
    assert escalating == {46, 62, 64, 79, 109, 136, 140, 143, 158}


@pytest.mark.parametrize("code", [48, 74, 79, 95, 119, 120, 140])
def test_dcgm_fatal_xids_are_critical(code: int) -> None:
    assert CATALOG[code].severity is Severity.CRITICAL


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_xids_do_not_condemn_the_gpu(code: int) -> None:
    assert not CATALOG[code].condemns
    assert CATALOG[code].severity is Severity.OK


def test_an_unlisted_xid_is_looked_up_as_unknown_with_its_own_code() -> None:
    entry = lookup(4242)
    assert (entry.code, entry.name, entry.condemns) == (4242, "unknown XID", False)
