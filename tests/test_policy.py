"""Policy: confirmation before quarantine, hysteresis on recovery, manual
overrides, hardware quarantines, the node's share, dry run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import pairwise

import pytest
from gpu_history import POLL, T0, gpu, link, record

from gpuwatchd.history import History
from gpuwatchd.model import Finding, Health, Severity
from gpuwatchd.policy import (
    PolicyConfig,
    PolicyResult,
    PolicyState,
    decode_subjects,
    encode_subjects,
    evaluate,
    gpu_of,
    observed_subjects,
    quarantine_manually,
    release_manually,
    validate_subject,
)
from gpuwatchd.settings import SettingsError, load

CONFIG = PolicyConfig()
GPUS = tuple(f"gpu:{i}" for i in range(8))
SUBJECTS = ("node", *GPUS, "nvlink:5/7")


def storm(severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding(
        subject="nvlink:5/7",
        check="nvlink",
        code="nvlink_crc_storm",
        severity=severity,
        message="NVLink crc errors at 2000/s",
    )


def remap_failure(subject: str = "gpu:3") -> Finding:
    return Finding(
        subject=subject,
        check="memory",
        code="row_remap_failure",
        severity=Severity.CRITICAL,
        message="row remapping failed",
        definitive=True,
    )


def throttling(subject: str = "gpu:1") -> Finding:
    return Finding(
        subject=subject,
        check="thermal",
        code="thermal_throttling",
        severity=Severity.WARN,
        message="thermally throttled",
    )


def run(
    polls: Iterable[Sequence[Finding]],
    config: PolicyConfig = CONFIG,
    state: PolicyState | None = None,
    start: float = T0,
) -> list[PolicyResult]:
    """One evaluation per poll, POLL seconds apart, each from the last one's state."""
    results: list[PolicyResult] = []
    current = state or PolicyState()
    for k, findings in enumerate(polls):
        result = evaluate(findings, current, start + k * POLL, config, SUBJECTS)
        results.append(result)
        current = result.state
    return results


def decisions_on(subject: str, results: Iterable[PolicyResult]) -> list[tuple[float, str]]:
    """(seconds since T0, kind) of every decision on `subject`."""
    return [(d.time - T0, d.kind) for r in results for d in r.decisions if d.subject == subject]


def test_a_single_short_burst_makes_the_link_unhealthy_but_quarantines_nothing() -> None:
    results = run([[storm()], [storm()], [], [], []])
    assert results[0].health["nvlink:5/7"] is Health.UNHEALTHY
    assert [d for r in results for d in r.decisions] == []
    assert results[-1].state.quarantines == ()
    assert results[-1].health["nvlink:5/7"] is Health.DEGRADED  # recovering


def test_a_critical_finding_that_lasts_the_confirmation_time_quarantines() -> None:
    # 300 s of a storm at 10 s polls: the 31st poll is the first at 300 s.
    results = run([[storm()]] * 32)
    assert decisions_on("nvlink:5/7", results) == [(300.0, "quarantine")]
    assert results[29].health["nvlink:5/7"] is Health.UNHEALTHY
    quarantine = results[-1].state.quarantine("nvlink:5/7")
    assert quarantine is not None
    assert (quarantine.source, quarantine.hardware, quarantine.reason) == (
        "auto",
        False,
        "nvlink_crc_storm",
    )
    assert results[-1].health["nvlink:5/7"] is Health.QUARANTINED


def test_a_gap_in_the_critical_run_restarts_the_confirmation() -> None:
    results = run([[storm()]] * 20 + [[]] + [[storm()]] * 20)
    assert [d for r in results for d in r.decisions] == []


def test_a_definitive_hardware_fault_quarantines_at_once() -> None:
    [result] = run([[remap_failure()]])
    [decision] = [d for d in result.decisions if d.subject == "gpu:3"]
    assert (decision.kind, decision.source, decision.code, decision.dry_run) == (
        "quarantine",
        "auto",
        "row_remap_failure",
        False,
    )
    quarantine = result.state.quarantine("gpu:3")
    assert quarantine is not None and quarantine.hardware
    assert result.health["gpu:3"] is Health.QUARANTINED


def test_a_hardware_quarantine_is_never_released_automatically() -> None:
    eager = PolicyConfig(recover_after=60.0, release_after=60.0)
    results = run([[remap_failure("gpu:3")]] + [[]] * 3, config=eager)
    later = evaluate([], results[-1].state, T0 + 30 * 86400, eager)
    assert later.state.quarantine("gpu:3") is not None
    assert [d.kind for d in later.decisions] == []


def test_an_automatic_quarantine_is_released_after_the_quiet_period() -> None:
    config = PolicyConfig(confirm_for=20.0, recover_after=60.0, release_after=120.0)
    results = run([[storm()]] * 3 + [[]] * 14, config=config)
    assert decisions_on("nvlink:5/7", results) == [(20.0, "quarantine"), (140.0, "release")]
    # The node followed its GPU's link out of service and back.
    assert decisions_on("node", results) == [(20.0, "quarantine"), (140.0, "release")]
    assert results[-1].health["nvlink:5/7"] is Health.HEALTHY


def test_without_release_after_automatic_quarantines_stay() -> None:
    config = PolicyConfig(confirm_for=20.0, release_after=None)
    results = run([[storm()]] * 3 + [[]] * 400, config=config)
    assert decisions_on("nvlink:5/7", results) == [(20.0, "quarantine")]


def test_a_warning_degrades_only_once_it_has_held() -> None:
    results = run([[throttling()]] * 5)
    assert [r.health["gpu:1"] for r in results] == [Health.HEALTHY] * 3 + [Health.DEGRADED] * 2


def test_a_degraded_gpu_recovers_only_after_a_longer_quiet_period() -> None:
    results = run([[throttling()]] * 4 + [[]] * 31)
    quiet = [r.health["gpu:1"] for r in results[4:]]
    # Degraded from 30 s; the last warning at 30 s; healthy at 30 + 300 s.
    assert quiet[:29] == [Health.DEGRADED] * 29
    assert quiet[29:] == [Health.HEALTHY, Health.HEALTHY]
    assert results[-1].health_since["gpu:1"] == T0 + 330.0


def test_a_flapping_warning_keeps_the_gpu_degraded() -> None:
    flapping = ([[throttling()]] * 4 + [[]] * 20) * 3
    results = run(flapping)
    assert all(r.health["gpu:1"] is Health.DEGRADED for r in results[3:])


def test_a_manual_quarantine_is_never_released_by_policy() -> None:
    manual = quarantine_manually(PolicyState(), "gpu:6", "fan noise", "alice", T0)
    results = run([[]] * 3, state=manual.state, start=T0 + 10)
    later = evaluate([], results[-1].state, T0 + 90 * 86400, CONFIG, SUBJECTS)
    quarantine = later.state.quarantine("gpu:6")
    assert quarantine is not None
    assert (quarantine.source, quarantine.operator) == ("manual", "alice")
    assert later.health["gpu:6"] is Health.QUARANTINED


def test_quarantining_a_hardware_quarantined_gpu_by_hand_keeps_the_original() -> None:
    [first] = run([[remap_failure("gpu:3")]])
    original = first.state.quarantine("gpu:3")
    manual = quarantine_manually(first.state, "gpu:3", "RMA ticket 4711", "bob", T0 + 5)
    assert manual.decision is None
    assert manual.state == first.state
    assert original is not None and (original.source, original.hardware) == ("auto", True)
    # Policy neither replaces nor releases it, findings or not.
    results = run([[remap_failure("gpu:3")], []], state=manual.state, start=T0 + 10)
    assert all(d.subject != "gpu:3" for r in results for d in r.decisions)
    assert results[-1].state.quarantine("gpu:3") == original


def test_a_manual_quarantine_replaces_a_dry_runs() -> None:
    [first] = run([[remap_failure("gpu:3")]], config=replace(CONFIG, dry_run=True))
    held = first.state.quarantine("gpu:3")
    assert held is not None and held.dry_run
    manual = quarantine_manually(first.state, "gpu:3", "RMA ticket 4711", "bob", T0 + 5)
    assert manual.decision is not None
    quarantine = manual.state.quarantine("gpu:3")
    assert quarantine is not None
    assert (quarantine.source, quarantine.dry_run, quarantine.reason) == (
        "manual",
        False,
        "RMA ticket 4711",
    )


def test_a_manual_release_stands_while_the_finding_that_caused_it_lasts() -> None:
    [first] = run([[remap_failure("gpu:3")]])
    released = release_manually(first.state, "gpu:3", "carol", T0 + 5)
    assert released.decision is not None and released.decision.source == "manual"
    results = run([[remap_failure("gpu:3")]] * 3, state=released.state, start=T0 + 10)
    assert results[-1].state.quarantine("gpu:3") is None
    assert results[-1].health["gpu:3"] is Health.UNHEALTHY
    # Once it clears and comes back, it is a new fault.
    again = run([[], [remap_failure("gpu:3")]], state=results[-1].state, start=T0 + 60)
    assert again[-1].state.quarantine("gpu:3") is not None


def test_releasing_a_subject_that_is_not_quarantined_decides_nothing() -> None:
    result = release_manually(PolicyState(), "gpu:0", "dave", T0)
    assert result.decision is None
    assert result.state == PolicyState()


def test_the_node_is_quarantined_when_its_share_of_quarantined_gpus_is_reached() -> None:
    [result] = run([[remap_failure("gpu:3")]])
    node = result.state.quarantine("node")
    assert node is not None
    assert (node.code, node.hardware) == ("gpu_quarantine_ratio", False)
    assert result.node_health is Health.QUARANTINED
    # Releasing the GPU brings the node back at the next poll.
    released = release_manually(result.state, "gpu:3", "erin", T0 + 5)
    [after] = run([[]], state=released.state, start=T0 + 10)
    assert after.state.quarantine("node") is None
    assert [(d.kind, d.subject, d.source) for d in after.decisions] == [("release", "node", "auto")]


def test_a_higher_share_leaves_the_node_in_service_with_one_gpu_out() -> None:
    [result] = run([[remap_failure("gpu:3")]], config=PolicyConfig(node_quarantine_ratio=0.5))
    assert result.state.quarantine("node") is None
    assert result.node_health is Health.DEGRADED


def test_a_quarantined_link_counts_for_its_gpu_in_the_node_share() -> None:
    results = run([[storm()]] * 31, config=PolicyConfig(node_quarantine_ratio=0.1))
    assert results[-1].state.quarantine("node") is not None
    assert gpu_of("nvlink:5/7") == 5


def test_a_node_level_hardware_fault_quarantines_the_node_at_once() -> None:
    lost = Finding("node", "gpu_lost", "gpu_lost", Severity.CRITICAL, "GPU 2 lost", definitive=True)
    [result] = run([[lost]], config=PolicyConfig(node_quarantine_ratio=1.0))
    node = result.state.quarantine("node")
    assert node is not None and node.hardware


def test_a_gpu_returning_after_being_lost_stays_quarantined_until_released() -> None:
    lost_gpu = Finding("gpu:2", "gpu_lost", "gpu_lost", Severity.CRITICAL, "lost", definitive=True)
    lost_node = Finding("node", "gpu_lost", "gpu_lost", Severity.CRITICAL, "lost", definitive=True)
    results = run([[lost_gpu, lost_node]] * 2 + [[]] * 400)
    final = results[-1]
    assert {q.subject for q in final.state.quarantines} == {"gpu:2", "node"}
    assert final.health["gpu:2"] is Health.QUARANTINED
    assert [c.code for c in results[2].cleared] == ["gpu_lost", "gpu_lost"]


def test_a_dry_run_decides_and_records_but_quarantines_nothing_for_real() -> None:
    config = PolicyConfig(dry_run=True)
    results = run([[remap_failure("gpu:3")]] * 3, config=config)
    decisions = [d for r in results for d in r.decisions]
    assert [(d.kind, d.subject, d.dry_run) for d in decisions] == [
        ("quarantine", "gpu:3", True),
        ("quarantine", "node", True),
    ]
    assert all(q.dry_run for q in results[-1].state.quarantines)
    assert results[-1].health["gpu:3"] is Health.UNHEALTHY
    assert results[-1].node_health is Health.UNHEALTHY


def test_a_dry_run_leaves_real_quarantines_alone() -> None:
    manual = quarantine_manually(PolicyState(), "gpu:6", "maintenance", "alice", T0)
    [auto] = run([[remap_failure("gpu:3")]], state=manual.state, start=T0 + 1)
    kept = run([[]], config=PolicyConfig(dry_run=True), state=auto.state, start=T0 + 9e5)[-1]
    assert {q.subject for q in kept.state.quarantines} == {"gpu:3", "gpu:6", "node"}
    assert not any(q.dry_run for q in kept.state.quarantines)
    assert kept.decisions == ()


def test_turning_dry_run_off_decides_afresh_and_for_real() -> None:
    [dry] = run([[remap_failure("gpu:3")]], config=PolicyConfig(dry_run=True))
    [live] = run([[remap_failure("gpu:3")]], state=dry.state, start=T0 + 10)
    assert [(d.subject, d.dry_run) for d in live.decisions] == [("gpu:3", False), ("node", False)]
    assert not any(q.dry_run for q in live.state.quarantines)


def test_findings_raised_and_cleared_and_health_changes_are_reported_once() -> None:
    results = run([[throttling()]] * 4 + [[]])
    assert [f.code for f in results[0].raised] == ["thermal_throttling"]
    assert results[1].raised == ()
    assert [(c.subject, c.code) for c in results[4].cleared] == [("gpu:1", "thermal_throttling")]
    changes = [(c.subject, c.before, c.after) for r in results for c in r.changes]
    assert ("gpu:1", Health.HEALTHY, Health.DEGRADED) in changes
    assert ("node", Health.HEALTHY, Health.DEGRADED) in changes
    # Subjects first seen healthy are no news.
    assert all(before is not None for _, before, _ in changes)


def test_the_tracking_state_survives_a_json_round_trip() -> None:
    [result] = run([[remap_failure("gpu:3"), throttling()]])
    released = release_manually(result.state, "gpu:3", "frank", T0 + 1).state
    assert decode_subjects(encode_subjects(released.subjects)) == released.subjects


def test_subjects_observed_in_history_include_links_and_the_node() -> None:
    history = record(History(600.0), T0, [gpu(0, nvlinks=(link(0, 0), link(0, 1))), gpu(1)])
    assert observed_subjects(history) == ("node", "gpu:0", "nvlink:0/0", "nvlink:0/1", "gpu:1")


@pytest.mark.parametrize("subject", ["node", "gpu:3", "nvlink:5/17", "ib:mlx5_0/1"])
def test_valid_subjects_are_accepted(subject: str) -> None:
    assert validate_subject(subject) == subject


@pytest.mark.parametrize("subject", ["gpu3", "GPU:1", "nvlink:5", "", "ib:mlx5_0"])
def test_invalid_subjects_are_rejected(subject: str) -> None:
    with pytest.raises(ValueError, match="not a subject"):
        validate_subject(subject)


def test_recovery_must_be_slower_than_degrading() -> None:
    with pytest.raises(ValueError, match="hysteresis"):
        PolicyConfig(warn_for=300.0, recover_after=300.0)


def test_policy_settings_load_from_yaml_with_durations_and_null() -> None:
    config = load(PolicyConfig, "confirm_for: 10m\nrelease_after: null\ndry_run: true\n")
    assert (config.confirm_for, config.release_after, config.dry_run) == (600.0, None, True)
    with pytest.raises(SettingsError, match="node_quarantine_ratio"):
        load(PolicyConfig, "node_quarantine_ratio: 0\n")


def test_resting_subjects_keep_their_states_in_order_while_one_among_them_recovers() -> None:
    results = run([[throttling("gpu:1")]] * 4 + [[]] * 31)
    for before, after in pairwise(results):
        names = [s.subject for s in after.state.subjects]
        assert names == sorted(SUBJECTS)
        # A healthy, quiet subject is carried over as it was, not judged anew.
        for name in ("gpu:0", "gpu:2", "gpu:7", "nvlink:5/7"):
            assert after.state.subject(name) is before.state.subject(name)
    # The one poll at which gpu:1 (and with it the node) is healthy again.
    [recovered] = [r for r in results if r.changes and r.changes[0].after is Health.HEALTHY]
    assert [(c.subject, c.before, c.after) for c in recovered.changes] == [
        ("gpu:1", Health.DEGRADED, Health.HEALTHY),
        ("node", Health.DEGRADED, Health.HEALTHY),
    ]
    assert recovered.changes[0].time == T0 + 330.0


def test_a_resting_subject_no_longer_observed_leaves_the_state() -> None:
    [first] = run([[]])
    gone = evaluate([], first.state, T0 + POLL, CONFIG, [s for s in SUBJECTS if s != "gpu:7"])
    assert first.state.subject("gpu:7") is not None
    assert gone.state.subject("gpu:7") is None and "gpu:7" not in gone.health
    assert gone.changes == ()
