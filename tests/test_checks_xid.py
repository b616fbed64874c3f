"""XID check and catalog: application against hardware XIDs, every occurrence
counted, escalation to hardware inspection after reboots that did not help."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from gpu_history import T0, gpu, record

from gpuwatchd.checks import xid
from gpuwatchd.checks.xid import BootRecord, BootXid, XidConfig
from gpuwatchd.checks.xid_catalog import CATALOG, lookup
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, Severity, XidEvent

CONFIG = XidConfig()
NOW = T0 + 100.0


def xids(
    *events: tuple[int, int], boots: BootRecord | None = None, uuid: str | None = None
) -> list[Finding]:
    """(gpu, code) events a second apart before NOW, judged at NOW."""
    history = History(max_age_seconds=3600.0)
    stamped = [
        XidEvent(gpu=g, code=code, time=NOW - 50 + n, uuid=uuid)
        for n, (g, code) in enumerate(events)
    ]
    record(history, NOW - 60, [gpu(index) for index in range(8)])
    record(history, NOW, [gpu(index) for index in range(8)], stamped)
    return list(xid.run(history, NOW, CONFIG, boots).findings)


def by_code(findings: Sequence[Finding]) -> dict[str, Finding]:
    return {finding.code: finding for finding in findings}


def test_an_application_xid_is_recorded_but_does_not_condemn_the_gpu() -> None:
    [finding] = xids((4, 13))
    assert (finding.subject, finding.code) == ("gpu:4", "xid_application")
    assert finding.severity is Severity.OK
    assert finding.action is Action.RESTART_APP
    assert not finding.definitive


def test_a_gpu_fallen_off_the_bus_is_critical_definitive_and_asks_for_a_reboot() -> None:
    [finding] = xids((2, 79))
    assert (finding.code, finding.severity, finding.definitive, finding.action) == (
        "xid_hardware",
        Severity.CRITICAL,
        True,
        Action.REBOOT,
    )


def test_a_contained_ecc_error_is_a_warning() -> None:
    [finding] = xids((0, 94))
    assert (finding.code, finding.severity, finding.definitive) == (
        "xid_hardware",
        Severity.WARN,
        False,
    )


def test_every_occurrence_counts_not_only_the_last() -> None:
    [finding] = xids((3, 13), (3, 13), (3, 13))
    assert finding.evidence["count"] == 3
    assert "x3" in finding.message


def test_hardware_and_application_xids_of_one_gpu_are_judged_apart() -> None:
    found = by_code(xids((1, 48), (1, 45), (1, 63), (1, 13)))
    assert found["xid_hardware"].severity is Severity.CRITICAL
    assert found["xid_hardware"].evidence["xids"] == "48"
    assert found["xid_application"].evidence["xids"] == "13,45,63"
    assert found["xid_application"].severity is Severity.OK


def test_the_most_severe_xid_of_a_gpu_decides_its_finding() -> None:
    [finding] = xids((6, 94), (6, 79))
    assert finding.severity is Severity.CRITICAL
    assert finding.evidence["xid"] == 79
    assert finding.action is Action.REBOOT


def test_an_unknown_xid_is_worth_a_warning() -> None:
    [finding] = xids((0, 999))
    assert (finding.code, finding.severity) == ("xid_unknown", Severity.WARN)


def test_an_xid_older_than_the_window_is_forgotten() -> None:
    history = History(max_age_seconds=3600.0)
    record(history, NOW - 900, [gpu(0)], [XidEvent(0, 79, NOW - 900)])
    record(history, NOW, [gpu(0)])
    assert xid.run(history, NOW, CONFIG).findings == ()


def test_ignored_xids_are_not_reported() -> None:
    history = History(max_age_seconds=3600.0)
    record(history, NOW, [gpu(0)], [XidEvent(0, 13, NOW), XidEvent(0, 92, NOW)])
    assert xid.run(history, NOW, XidConfig(ignore=(13, 92))).findings == ()


def test_a_hardware_xid_back_after_two_reboots_asks_for_hardware_inspection() -> None:
    boots = BootRecord(
        boot_ids=("boot-a", "boot-b", "boot-c"),
        xids=(BootXid("boot-a", 3, "GPU-0003", 48), BootXid("boot-b", 3, "GPU-0003", 48)),
    )
    [finding] = xids((3, 48), boots=boots)
    assert finding.action is Action.INSPECT_HARDWARE
    assert finding.severity is Severity.CRITICAL
    assert finding.definitive
    assert finding.evidence["reboots"] == 2
    assert "came back after 2 reboots" in finding.message


def test_a_hardware_xid_back_after_one_reboot_still_asks_for_a_reset() -> None:
    boots = BootRecord(boot_ids=("boot-b", "boot-c"), xids=(BootXid("boot-b", 3, "GPU-0003", 48),))
    [finding] = xids((3, 48), boots=boots)
    assert finding.action is Action.RESET_GPU


def test_escalation_follows_the_board_by_uuid_when_indices_shift() -> None:
    # Before the reboots the board was GPU 4; a missing GPU renumbered it to 3.
    boots = BootRecord(
        boot_ids=("boot-a", "boot-b", "boot-c"),
        xids=(BootXid("boot-a", 4, "GPU-0003", 79),),
    )
    [finding] = xids((3, 79), boots=boots)
    assert finding.action is Action.INSPECT_HARDWARE
    # The GPU now at index 4 is another board: its history is not GPU 3's.
    [other] = xids((4, 79), boots=boots)
    assert other.action is Action.REBOOT


def test_without_uuids_escalation_matches_by_index() -> None:
    boots = BootRecord(
        boot_ids=("boot-a", "boot-b", "boot-c"), xids=(BootXid("boot-a", 2, None, 95),)
    )
    history = History(max_age_seconds=3600.0)
    record(history, NOW, [gpu(2, uuid=None)], [XidEvent(2, 95, NOW)])
    [finding] = xid.run(history, NOW, CONFIG, boots).findings
    assert finding.action is Action.INSPECT_HARDWARE


def test_an_application_xid_is_never_escalated() -> None:
    boots = BootRecord(
        boot_ids=("boot-a", "boot-b", "boot-c"), xids=(BootXid("boot-a", 0, "GPU-0000", 13),)
    )
    [finding] = xids((0, 13), boots=boots)
    assert finding.action is Action.RESTART_APP


@pytest.mark.parametrize("code", [48, 74, 79, 95, 119, 120, 140])
def test_dcgm_fatal_xids_are_critical_definitive_hardware_faults(code: int) -> None:
    entry = CATALOG[code]
    assert (entry.severity, entry.condemns, entry.definitive) == (Severity.CRITICAL, True, True)


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_xids_do_not_condemn_the_gpu(code: int) -> None:
    assert not CATALOG[code].condemns
    assert CATALOG[code].severity is Severity.OK


def test_an_unlisted_xid_is_looked_up_as_unknown_with_its_own_code() -> None:
    entry = lookup(4242)
    assert (entry.code, entry.name, entry.condemns) == (4242, "unknown XID", False)
