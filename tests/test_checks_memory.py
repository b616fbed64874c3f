"""Memory check: uncorrectable ECC, SBE storms, row remapping, page retirement,
and counters that restart at a driver reload or a GPU's return."""

from __future__ import annotations

import pytest
from gpu_history import gpu, last_time, record, timeline

from gpuwatchd.checks import memory
from gpuwatchd.checks.memory import MemoryConfig
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, GpuSample, Severity

CONFIG = MemoryConfig()
POLLS = 61  # one 600 s window of 10 s polls


def ecc(uncorrected: int = 0, corrected: int = 0, aggregate_uncorrected: int = 0) -> GpuSample:
    return gpu(
        1,
        ecc_errors={
            ("uncorrected", "volatile"): uncorrected,
            ("corrected", "volatile"): corrected,
            ("uncorrected", "aggregate"): aggregate_uncorrected,
        },
    )


def judged(*samples: GpuSample) -> list[Finding]:
    """One poll per sample, the last one judged."""
    history = timeline(len(samples), lambda k, t: [samples[k]])
    return list(memory.run(history, last_time(len(samples)), CONFIG).findings)


def only(findings: list[Finding]) -> Finding:
    [finding] = findings
    return finding


def test_an_uncorrectable_error_drains_the_gpu_for_a_reset_without_condemning_it() -> None:
    # NVIDIA's memory error management guide: A100 and later contain the
    # error and remap the row at the next reset; only the RMA criteria
    # (remap failure, SRAM threshold, no spare rows) condemn for good.
    finding = only(judged(ecc(uncorrected=0), ecc(uncorrected=0), ecc(uncorrected=1)))
    assert finding.subject == "gpu:1"
    assert finding.code == "ecc_uncorrectable"
    assert finding.severity is Severity.CRITICAL
    assert finding.immediate and not finding.definitive
    assert finding.action is Action.RESET_GPU


def pending_after(uncorrected: int, pending: bool) -> GpuSample:
    return gpu(
        1,
        ecc_errors={("uncorrected", "volatile"): uncorrected},
        row_remap_pending=pending,
        row_remap_failed=False,
    )


def test_an_uncorrectable_error_holds_its_finding_while_its_repair_is_pending() -> None:
    # Long after the window, the row is still waiting for the reset.
    samples = [pending_after(1, pending=True)] * POLLS * 2
    finding = only([f for f in judged(*samples) if f.code == "ecc_uncorrectable"])
    assert finding.evidence["errors"] == 0 and finding.evidence["errors_since_reset"] == 1


def test_a_gpu_back_from_its_reset_with_nothing_pending_has_no_ecc_finding() -> None:
    before = [pending_after(1, pending=True)] * 3
    after = [pending_after(0, pending=False)] * POLLS
    assert judged(*before, *after) == []


def test_an_aggregate_count_that_grows_is_an_uncorrectable_error_too() -> None:
    finding = only(judged(ecc(aggregate_uncorrected=4), ecc(aggregate_uncorrected=5)))
    assert finding.code == "ecc_uncorrectable"


def test_old_uncorrectable_errors_that_do_not_grow_are_no_new_finding() -> None:
    assert judged(ecc(uncorrected=2, aggregate_uncorrected=9), ecc(2, 0, 9), ecc(2, 0, 9)) == []


def test_a_driver_reload_that_zeroes_the_volatile_counters_is_no_false_finding() -> None:
    before = [ecc(uncorrected=3, corrected=500, aggregate_uncorrected=3)] * 3
    after = [ecc(uncorrected=0, corrected=0, aggregate_uncorrected=3)] * 3
    assert judged(*before, *after) == []


def test_a_gpu_returning_after_being_lost_with_fresh_counters_has_no_memory_finding() -> None:
    before = [ecc(uncorrected=1, corrected=40, aggregate_uncorrected=1)] * 2
    lost = [gpu(1, up=False)] * 3
    back = [ecc(uncorrected=0, corrected=0, aggregate_uncorrected=1)] * 2
    assert judged(*before, *lost, *back) == []


def test_an_sbe_storm_warns() -> None:
    history = timeline(POLLS, lambda k, t: [ecc(corrected=5 * k)])  # 30/min
    finding = only(list(memory.run(history, last_time(POLLS), CONFIG).findings))
    assert (finding.code, finding.severity) == ("ecc_sbe_storm", Severity.WARN)
    assert finding.evidence["rate_per_second"] == pytest.approx(0.5)


def test_judged_every_poll_errors_that_stopped_age_out_as_from_a_fresh_history() -> None:
    # An SBE storm, an uncorrectable error, then the very same sample poll
    # after poll (as a source may hand back an unchanged one): each poll's
    # findings on the one history are those of a history made afresh, until
    # the errors have left the window.
    config = MemoryConfig(window=120.0)
    stopped = ecc(uncorrected=1, corrected=1200)
    samples = [ecc(corrected=100 * k) for k in range(13)] + [stopped] * 15
    history = History(max_age_seconds=7200.0)
    each_poll, fresh = [], []
    for k, sample in enumerate(samples):
        time = last_time(k + 1)
        record(history, time, [sample])
        each_poll.append([f.code for f in memory.run(history, time, config).findings])
        afresh = timeline(k + 1, lambda n, t: [samples[n]])
        fresh.append([f.code for f in memory.run(afresh, time, config).findings])
    assert each_poll == fresh
    assert "ecc_sbe_storm" in each_poll[12] and "ecc_uncorrectable" in each_poll[13]
    assert each_poll[-1] == []


def test_a_few_corrected_errors_are_no_storm() -> None:
    history = timeline(POLLS, lambda k, t: [ecc(corrected=k // 20)])
    assert memory.run(history, last_time(POLLS), CONFIG).findings == ()


def test_a_pending_row_remap_warns_and_asks_for_a_reset() -> None:
    finding = only(judged(gpu(1, row_remap_pending=True, row_remap_failed=False)))
    assert (finding.code, finding.severity, finding.action) == (
        "row_remap_pending",
        Severity.WARN,
        Action.RESET_GPU,
    )


def test_a_row_remap_failure_is_critical_and_definitive() -> None:
    finding = only(judged(gpu(1, row_remap_pending=False, row_remap_failed=True)))
    assert (finding.code, finding.severity, finding.definitive, finding.action) == (
        "row_remap_failure",
        Severity.CRITICAL,
        True,
        Action.INSPECT_HARDWARE,
    )


def banks(none: int) -> dict[str, int]:
    return {"max": 2560 - none, "high": 0, "partial": 0, "low": 0, "none": none}


def test_a_bank_with_no_spare_rows_left_warns_and_condemns_nothing() -> None:
    # 512 uncorrectable remaps alone are no finding: the histogram says whether
    # a bank has run out, not the count. A bank that has is not NVIDIA's RMA
    # criterion (the failure flag, set by the next error there, is).
    assert judged(gpu(1, remapped_rows_uncorrectable=512, row_remapper_banks=banks(0))) == []
    finding = only(judged(gpu(1, row_remapper_banks=banks(1))))
    assert (finding.code, finding.severity, finding.definitive, finding.immediate) == (
        "row_remap_exhausted",
        Severity.WARN,
        False,
        False,
    )
    assert finding.evidence["banks_none"] == 1


def test_sram_errors_past_the_field_diag_threshold_condemn_the_gpu() -> None:
    assert judged(gpu(1, sram_threshold_exceeded=False)) == []
    finding = only(judged(gpu(1, sram_threshold_exceeded=True)))
    assert (finding.code, finding.severity, finding.definitive, finding.action) == (
        "sram_threshold_exceeded",
        Severity.CRITICAL,
        True,
        Action.INSPECT_HARDWARE,
    )


def test_pending_page_retirement_warns() -> None:
    finding = only(judged(gpu(1, retired_pages_pending=True)))
    assert (finding.code, finding.severity) == ("retired_pages_pending", Severity.WARN)


def test_retired_pages_at_dcgm_limit_are_critical_and_definitive() -> None:
    below = {"multiple_single_bit": 40, "double_bit": 22}
    assert judged(gpu(1, retired_pages=below)) == []
    finding = only(judged(gpu(1, retired_pages={"multiple_single_bit": 40, "double_bit": 23})))
    assert (finding.code, finding.severity, finding.definitive) == (
        "retired_pages_limit",
        Severity.CRITICAL,
        True,
    )
    assert finding.evidence["retired_pages"] == 63


def test_unsupported_memory_readings_are_no_finding() -> None:
    # Absent is not zero: a GPU without ECC, remapping or retirement says nothing.
    assert judged(gpu(1), gpu(1), gpu(1)) == []


def test_corrected_errors_in_a_daemons_first_poll_are_no_storm() -> None:
    # Two corrected errors between the daemon's first two polls: 12/min over
    # the 10 s seen, but 0.2/min over the window a long-running daemon judges.
    assert judged(ecc(corrected=0), ecc(corrected=2)) == []
