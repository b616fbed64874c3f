"""Confirmation: a mismatch is a lead, not a verdict."""

from __future__ import annotations

from confirm_support import CONFIG, GPUS, H100, NODE, T0, answer, lead_on, result

from gpuwatchd.canary.confirm import ConfirmState, Mismatch, Rerun, findings, observe, observe_rerun
from gpuwatchd.canary.result import Outcome
from gpuwatchd.model import Action, Severity


def test_a_mismatch_is_rerun_on_the_suspect_and_once_on_a_sibling() -> None:
    state, reruns = lead_on("gpu:3")
    assert [(r.target, r.suspect) for r in reruns] == [("gpu:3", "gpu:3"), ("gpu:4", "gpu:3")]
    assert reruns[0].specs == (result("gpu:3").spec,)
    assert findings(state, T0) == ()  # a lead is not a verdict


def test_reproduced_on_the_suspect_only_is_confirmed_and_quarantines() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "mismatch", "gpu:4": "pass"}, T0 + 5)
    [finding] = findings(state, T0 + 5)
    assert (finding.subject, finding.check, finding.code) == ("gpu:3", "sdc", "sdc_confirmed")
    assert finding.severity == Severity.CRITICAL and finding.definitive
    assert finding.action == Action.INSPECT_HARDWARE
    assert finding.evidence["canary"] == "gemm_exact_fp16"
    assert finding.evidence["first_mismatch_index"] == 15
    assert findings(state, T0 + 10 * 86400) == (finding,)  # never released by time


def test_not_reproduced_is_watched_and_a_second_mismatch_elsewhere_confirms() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    [finding] = findings(state, T0 + 5)
    assert (finding.subject, finding.code, finding.severity) == (
        "gpu:3",
        "sdc_suspected",
        Severity.WARN,
    )
    assert not finding.definitive
    assert state.watched(T0 + 60) == {"gpu:3"}
    # The second mismatch, a burst an interval later, is a lead too: its
    # sibling must compute the same inputs right before it counts.
    later = T0 + CONFIG.interval
    state, reruns = lead_on("gpu:3", later, state, canary="int_chain_u32")
    assert [r.target for r in reruns] == ["gpu:3", "gpu:4"]
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, later + 5)
    [finding] = findings(state, later + 5)
    assert (finding.code, finding.severity) == ("sdc_confirmed", Severity.CRITICAL)
    assert finding.evidence["canary"] == "int_chain_u32"
    assert finding.evidence["mismatches_on_record"] == 2


def test_an_intermittent_fault_is_confirmed_by_bursts_an_interval_apart() -> None:
    # A watched GPU bursts every minute; mismatches a minute apart, each
    # cleared by its sibling, are not yet two observations of the GPU; one
    # an interval after the first is.
    state = ConfirmState()
    bursts = [
        (T0, "gemm_exact_fp16", "sdc_suspected"),
        (T0 + 60, "int_chain_u32", "sdc_suspected"),
        (T0 + CONFIG.interval, "fma_chain_fp32", "sdc_confirmed"),
    ]
    for now, canary, code in bursts:
        state, reruns = lead_on("gpu:3", now, state, canary)
        state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, now + 5)
        assert [f.code for f in findings(state, now + 5)] == [code]
    [finding] = findings(state, T0 + CONFIG.interval + 5)
    assert finding.evidence["mismatches_on_record"] == 3


def test_the_same_canary_and_seed_twice_does_not_confirm() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    state, reruns = observe(state, [result("gpu:3")], T0 + 60, CONFIG, NODE)
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 65)
    assert [f.code for f in findings(state, T0 + 65)] == ["sdc_suspected"]


def test_the_mismatches_of_one_burst_are_one_observation() -> None:
    burst = [result("gpu:3"), result("gpu:3", canary="fma_chain_fp32"), result("gpu:0", "pass")]
    state, reruns = observe(ConfirmState(), burst, T0, CONFIG, NODE)
    assert [len(r.specs) for r in reruns] == [2, 2]
    # Neither re-run reproduces, the sibling computed both right: two
    # mismatches of the GPU's own, but one event (a transient of the host
    # or the worker can spoil several canaries of one burst).
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["sdc_suspected"]
    assert len(state.history) == 2
    # Both are kept: a mismatch of a burst an interval on is a second observation.
    later = T0 + CONFIG.interval
    state, reruns = lead_on("gpu:3", later, state, canary="int_chain_u32")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, later + 5)
    [finding] = findings(state, later + 5)
    assert finding.code == "sdc_confirmed" and finding.evidence["mismatches_on_record"] == 3


def test_a_reproduced_mismatch_on_record_needs_no_interval_to_a_second_one() -> None:
    # A row from the state database whose re-run reproduced (its GPU was
    # confirmed and quarantined before a restart) and a mismatch a minute
    # later: two observations, the reproduction being one of its own.
    kept = Mismatch(T0, "gpu:3", "int_chain_u32", 8, True, reproduced=True, uuid="GPU-3")
    state, reruns = lead_on("gpu:3", T0 + 60, ConfirmState(history=(kept,)))
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 65)
    assert [f.code for f in findings(state, T0 + 65)] == ["sdc_confirmed"]


def test_the_history_outlives_the_watch_and_the_daemon() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    # Ten days on (the watch long over, the daemon restarted with the
    # history it persisted), another canary goes wrong.
    later = T0 + 10 * 86400
    restarted = ConfirmState(history=state.history)
    restarted, reruns = observe(
        restarted, [result("gpu:3", canary="int_chain_u32", seed=8)], later, CONFIG, NODE
    )
    restarted = answer(restarted, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, later + 5)
    assert [f.code for f in findings(restarted, later + 5)] == ["sdc_confirmed"]


def test_a_mismatch_older_than_the_history_window_is_forgotten() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    later = T0 + CONFIG.history_window + 10
    state, reruns = observe(state, [result("gpu:3", seed=8)], later, CONFIG, NODE)
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, later + 5)
    assert [f.code for f in findings(state, later + 5)] == ["sdc_suspected"]


def test_a_watch_that_sees_nothing_ends() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    later = T0 + 5 + CONFIG.watch_for + 1
    state, _ = observe(state, [result("gpu:3", "pass")], later, CONFIG, NODE)
    assert findings(state, later) == ()
    state, reruns = observe(state, [result("gpu:3")], later + 1, CONFIG, NODE)
    assert reruns  # a fresh lead, not a confirmation


def test_a_rerun_that_hangs_counts_as_not_reproduced() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "timeout", "gpu:4": "pass"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["sdc_suspected"]


def test_a_lead_whose_reruns_never_return_expires_into_a_watch() -> None:
    state, _ = lead_on("gpu:3")
    later = T0 + CONFIG.interval + 1
    state, _ = observe(state, [], later, CONFIG, NODE)
    assert state.leads == {} and state.watched(later) == {"gpu:3"}


def test_reproduced_on_the_sibling_too_is_a_software_problem() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "mismatch", "gpu:4": "mismatch"}, T0 + 5)
    [finding] = findings(state, T0 + 5)
    assert (finding.subject, finding.code, finding.severity) == (
        "node",
        "canary_software_fault",
        Severity.WARN,
    )
    assert not finding.definitive and finding.action == Action.NONE
    # While it lasts, that canary's mismatches are not leads.
    state, reruns = observe(state, [result("gpu:5")], T0 + 30, CONFIG, NODE)
    assert reruns == ()
    assert [f.code for f in findings(state, T0 + 30)] == ["canary_software_fault"]


def test_the_same_canary_failing_on_most_gpus_quarantines_nothing() -> None:
    failing = [result(gpu) for gpu in GPUS[:5]]
    passing = [result(gpu, "pass") for gpu in GPUS[5:]]
    state, reruns = observe(ConfirmState(), failing + passing, T0, CONFIG, NODE)
    assert state.leads == {} and reruns == ()
    [finding] = findings(state, T0 + 5)
    assert finding.code == "canary_software_fault" and finding.severity == Severity.WARN
    assert finding.evidence["devices"] == ",".join(GPUS[:5])
    assert not any(f.severity == Severity.CRITICAL for f in findings(state, T0 + 5))


def test_mismatches_spread_over_an_interval_still_count_as_node_wide() -> None:
    state = ConfirmState()
    for step, gpu in enumerate(GPUS[:5]):
        state, _ = observe(state, [result(gpu)], T0 + 60 * step, CONFIG, NODE)
    assert [f.code for f in findings(state, T0 + 300)] == ["canary_software_fault"]
    # The leads opened before it showed as node-wide are dropped, and their
    # re-runs, when they come back, settle nothing.
    assert state.leads == {}
    rerun = Rerun("gpu:0", (result("gpu:0").spec,), "gpu:0")
    after, more = observe_rerun(state, rerun, [result("gpu:0")], T0 + 301, CONFIG, NODE)
    assert (after, more) == (state, ())


def test_a_single_gpu_node_never_confirms_and_asks_for_an_offline_diagnostic() -> None:
    alone = {"gpu:0": H100}
    state = ConfirmState()
    # Reproduced every time, on seed after seed: a GPU fault, or a software
    # or reference fault that hits every GPU of its kind; with no sibling
    # nothing tells them apart.
    for step, seed in enumerate((7, 8, 9)):
        now = T0 + 60 * step
        state, reruns = observe(state, [result("gpu:0", seed=seed)], now, CONFIG, alone)
        assert [r.target for r in reruns] == ["gpu:0"]
        state = answer(state, reruns, {"gpu:0": "mismatch"}, now + 1, alone)
        [finding] = findings(state, now + 1)
        assert (finding.code, finding.definitive) == ("sdc_suspected", False)
        assert finding.evidence["offline_diagnostic"] == "gpuwatchd canary --dcgm 3"
        assert "offline diagnostic" in finding.message


def test_no_confirmation_when_every_peer_is_under_doubt() -> None:
    pair = {"gpu:0": H100, "gpu:1": H100}
    state, reruns = observe(ConfirmState(), [result("gpu:0")], T0, CONFIG, pair)
    state = answer(state, reruns, {"gpu:0": "pass", "gpu:1": "pass"}, T0 + 1, pair)
    assert state.watched(T0 + 1) == {"gpu:0"}
    # gpu:1 goes wrong (on another canary: the same one on both GPUs would
    # be node-wide) while gpu:0, its only peer, is watched.
    state, reruns = observe(state, [result("gpu:1", canary="int_chain_u32")], T0 + 2, CONFIG, pair)
    assert [r.target for r in reruns] == ["gpu:1"]
    state = answer(state, reruns, {"gpu:1": "mismatch"}, T0 + 3, pair)
    assert "sdc_confirmed" not in [f.code for f in findings(state, T0 + 3)]


def test_a_digest_mismatch_is_rerun_against_an_fp64_bound() -> None:
    state, reruns = observe(
        ConfirmState(), [result("gpu:3", canary="gemm_random_fp32", seed=1)], T0, CONFIG, NODE
    )
    assert {spec.kind for r in reruns for spec in r.specs} == {"gemm_bounded"}
    state = answer(state, reruns, {"gpu:3": "mismatch", "gpu:4": "pass"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["sdc_confirmed"]


def test_a_digest_mismatch_that_does_not_reproduce_is_watched_and_on_record() -> None:
    # The re-run's product is the agreed one again: an intermittent fault
    # (or a transient), kept for the history rule like any mismatch.
    state, reruns = observe(
        ConfirmState(), [result("gpu:3", canary="gemm_random_fp32", seed=1)], T0, CONFIG, NODE
    )
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["sdc_suspected"]
    [entry] = state.history
    assert (entry.canary, entry.sibling_clear, entry.reproduced) == (
        "gemm_random_fp32",
        True,
        False,
    )
    assert state.rebaseline == frozenset()


def test_a_digest_mismatch_the_siblings_rerun_shares_is_a_software_fault() -> None:
    # The sibling's product is not the agreed one either (or is outside the
    # fp64 bound): the agreed digest or the library is wrong, not the GPU.
    state, reruns = observe(
        ConfirmState(), [result("gpu:3", canary="gemm_random_fp32", seed=1)], T0, CONFIG, NODE
    )
    state = answer(state, reruns, {"gpu:3": "mismatch", "gpu:4": "mismatch"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["canary_software_fault"]
    assert state.history == () and state.rebaseline == {"gemm_random_fp32"}


def test_a_digest_mismatch_whose_rerun_fails_to_run_is_on_record_like_any() -> None:
    state, reruns = observe(
        ConfirmState(), [result("gpu:3", canary="gemm_random_fp32", seed=1)], T0, CONFIG, NODE
    )
    state = answer(state, reruns, {"gpu:3": "error", "gpu:4": "pass"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["sdc_suspected"]
    assert [(m.reproduced, m.sibling_clear) for m in state.history] == [(False, True)]


def test_a_full_mantissa_software_fault_rebaselines_its_digest() -> None:
    failing = [result(gpu, canary="gemm_random_bf16", seed=1) for gpu in GPUS[:5]]
    state, _ = observe(ConfirmState(), failing, T0, CONFIG, NODE)
    assert [f.code for f in findings(state, T0)] == ["canary_software_fault"]
    assert state.rebaseline == {"gemm_random_bf16"}


def test_the_sibling_is_never_a_gpu_under_suspicion() -> None:
    state, _ = lead_on("gpu:4")
    state, reruns = observe(state, [result("gpu:3")], T0 + 1, CONFIG, NODE)
    assert [r.target for r in reruns] == ["gpu:3", "gpu:5"]


def test_a_sibling_that_fails_alone_gets_a_lead_of_its_own() -> None:
    state, reruns = lead_on("gpu:3")
    suspect, sibling = reruns
    state, _ = observe_rerun(state, suspect, [result("gpu:3", "pass")], T0 + 5, CONFIG, NODE)
    state, more = observe_rerun(state, sibling, [result("gpu:4")], T0 + 6, CONFIG, NODE)
    assert [(r.target, r.suspect) for r in more] == [("gpu:4", "gpu:4"), ("gpu:5", "gpu:4")]
    assert state.watched(T0 + 6) == {"gpu:3"}


def test_a_bad_cpu_core_is_a_node_finding() -> None:
    cores = dict.fromkeys(("cpu:0", "cpu:1", "cpu:2"), "host cores")
    state, reruns = observe(
        ConfirmState(), [result("cpu:1", canary="int_chain_u32")], T0, CONFIG, cores
    )
    assert [r.target for r in reruns] == ["cpu:1", "cpu:2"]
    for rerun in reruns:
        outcome: Outcome = "mismatch" if rerun.target == "cpu:1" else "pass"
        mine = result(rerun.target, outcome, "int_chain_u32")
        state, _ = observe_rerun(state, rerun, [mine], T0 + 1, CONFIG, cores)
    [finding] = findings(state, T0 + 1)
    assert (finding.subject, finding.code) == ("node", "sdc_cpu_core_confirmed")
    assert finding.evidence["cpu_core"] == 1 and finding.definitive
