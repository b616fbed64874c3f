"""Confirmation: a mismatch is a lead, not a verdict."""

from __future__ import annotations

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.confirm import ConfirmState, Rerun, findings, observe, observe_rerun
from gpuwatchd.canary.result import CanaryResult, Outcome
from gpuwatchd.model import Action, Severity

CONFIG = CanaryConfig(interval=600.0, watch_for=3600.0, software_ratio=0.5)
GPUS = tuple(f"gpu:{i}" for i in range(8))
T0 = 1_000_000.0


def result(
    target: str, outcome: Outcome = "mismatch", canary: str = "gemm_exact_fp16", seed: int = 7
) -> CanaryResult:
    kind, index = target.split(":")
    kind_name, dtype = canary.rsplit("_", 1)
    return CanaryResult(
        canary=canary,
        kind=kind_name,  # type: ignore[arg-type]
        dtype=dtype,
        seed=seed,
        shape=(128, 128, 128),
        result=outcome,
        duration_seconds=0.01,
        gpu=int(index) if kind == "gpu" else None,
        cpu_core=int(index) if kind == "cpu" else None,
        mismatch_count=1 if outcome == "mismatch" else 0,
        first_mismatch_index=15 if outcome == "mismatch" else None,
        bit_histogram=(1, 0, 1) if outcome == "mismatch" else (),
    )


def answer(
    state: ConfirmState,
    reruns: tuple[Rerun, ...],
    outcomes: dict[str, Outcome],
    now: float,
    targets: tuple[str, ...] = GPUS,
) -> ConfirmState:
    """Play back the re-runs with the given outcome per target, for every
    canary each re-run asks for."""
    for rerun in reruns:
        results = [
            result(rerun.target, outcomes[rerun.target], spec.name, spec.seed)
            for spec in rerun.specs
        ]
        state, more = observe_rerun(state, rerun, results, now, CONFIG, targets)
        assert more == ()
    return state


def lead_on(target: str, now: float = T0) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    return observe(ConfirmState(), [result(target), result("gpu:0", "pass")], now, CONFIG, GPUS)


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
    # The second mismatch is a lead too: its sibling must compute the same
    # inputs right before it counts.
    state, reruns = observe(state, [result("gpu:3", canary="int_chain_u32")], T0 + 60, CONFIG, GPUS)
    assert [r.target for r in reruns] == ["gpu:3", "gpu:4"]
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 65)
    [finding] = findings(state, T0 + 65)
    assert (finding.code, finding.severity) == ("sdc_confirmed", Severity.CRITICAL)
    assert finding.evidence["canary"] == "int_chain_u32"
    assert finding.evidence["mismatches_on_record"] == 2


def test_the_same_canary_and_seed_twice_does_not_confirm() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    state, reruns = observe(state, [result("gpu:3")], T0 + 60, CONFIG, GPUS)
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 65)
    assert [f.code for f in findings(state, T0 + 65)] == ["sdc_suspected"]


def test_every_mismatching_canary_of_a_burst_counts() -> None:
    burst = [result("gpu:3"), result("gpu:3", canary="fma_chain_fp32"), result("gpu:0", "pass")]
    state, reruns = observe(ConfirmState(), burst, T0, CONFIG, GPUS)
    assert [len(r.specs) for r in reruns] == [2, 2]
    # Neither re-run reproduces, but the sibling computed both right: two
    # mismatches of the GPU's own, on two canaries.
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["sdc_confirmed"]


def test_the_history_outlives_the_watch_and_the_daemon() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    # Ten days on (the watch long over, the daemon restarted with the
    # history it persisted), another canary goes wrong.
    later = T0 + 10 * 86400
    restarted = ConfirmState(history=state.history)
    restarted, reruns = observe(
        restarted, [result("gpu:3", canary="int_chain_u32", seed=8)], later, CONFIG, GPUS
    )
    restarted = answer(restarted, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, later + 5)
    assert [f.code for f in findings(restarted, later + 5)] == ["sdc_confirmed"]


def test_a_mismatch_older_than_the_history_window_is_forgotten() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    later = T0 + CONFIG.history_window + 10
    state, reruns = observe(state, [result("gpu:3", seed=8)], later, CONFIG, GPUS)
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, later + 5)
    assert [f.code for f in findings(state, later + 5)] == ["sdc_suspected"]


def test_a_watch_that_sees_nothing_ends() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    later = T0 + 5 + CONFIG.watch_for + 1
    state, _ = observe(state, [result("gpu:3", "pass")], later, CONFIG, GPUS)
    assert findings(state, later) == ()
    state, reruns = observe(state, [result("gpu:3")], later + 1, CONFIG, GPUS)
    assert reruns  # a fresh lead, not a confirmation


def test_a_rerun_that_hangs_counts_as_not_reproduced() -> None:
    state, reruns = lead_on("gpu:3")
    state = answer(state, reruns, {"gpu:3": "timeout", "gpu:4": "pass"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["sdc_suspected"]


def test_a_lead_whose_reruns_never_return_expires_into_a_watch() -> None:
    state, _ = lead_on("gpu:3")
    later = T0 + CONFIG.interval + 1
    state, _ = observe(state, [], later, CONFIG, GPUS)
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
    state, reruns = observe(state, [result("gpu:5")], T0 + 30, CONFIG, GPUS)
    assert reruns == ()
    assert [f.code for f in findings(state, T0 + 30)] == ["canary_software_fault"]


def test_the_same_canary_failing_on_most_gpus_quarantines_nothing() -> None:
    failing = [result(gpu) for gpu in GPUS[:5]]
    passing = [result(gpu, "pass") for gpu in GPUS[5:]]
    state, reruns = observe(ConfirmState(), failing + passing, T0, CONFIG, GPUS)
    assert state.leads == {} and reruns == ()
    [finding] = findings(state, T0 + 5)
    assert finding.code == "canary_software_fault" and finding.severity == Severity.WARN
    assert finding.evidence["devices"] == ",".join(GPUS[:5])
    assert not any(f.severity == Severity.CRITICAL for f in findings(state, T0 + 5))


def test_mismatches_spread_over_an_interval_still_count_as_node_wide() -> None:
    state = ConfirmState()
    for step, gpu in enumerate(GPUS[:5]):
        state, _ = observe(state, [result(gpu)], T0 + 60 * step, CONFIG, GPUS)
    assert [f.code for f in findings(state, T0 + 300)] == ["canary_software_fault"]
    # The leads opened before it showed as node-wide are dropped, and their
    # re-runs, when they come back, settle nothing.
    assert state.leads == {}
    rerun = Rerun("gpu:0", (result("gpu:0").spec,), "gpu:0")
    after, more = observe_rerun(state, rerun, [result("gpu:0")], T0 + 301, CONFIG, GPUS)
    assert (after, more) == (state, ())


def test_a_single_gpu_node_never_confirms_and_asks_for_an_offline_diagnostic() -> None:
    alone = ("gpu:0",)
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
        assert finding.evidence["offline_diagnostic"] == "dcgmi diag -r 3"
        assert "offline diagnostic" in finding.message


def test_no_confirmation_when_every_peer_is_under_doubt() -> None:
    pair = ("gpu:0", "gpu:1")
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
        ConfirmState(), [result("gpu:3", canary="gemm_random_fp32", seed=1)], T0, CONFIG, GPUS
    )
    assert {spec.kind for r in reruns for spec in r.specs} == {"gemm_bounded"}
    state = answer(state, reruns, {"gpu:3": "mismatch", "gpu:4": "pass"}, T0 + 5)
    assert [f.code for f in findings(state, T0 + 5)] == ["sdc_confirmed"]


def test_a_digest_mismatch_within_the_bound_blames_no_gpu_and_rebaselines() -> None:
    # The GPU's result is right to within what any summation order allows:
    # the digest changed with the configuration (SM count, workspace,
    # library), not with the GPU.
    state, reruns = observe(
        ConfirmState(), [result("gpu:3", canary="gemm_random_fp32", seed=1)], T0, CONFIG, GPUS
    )
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    assert findings(state, T0 + 5) == ()
    assert state.history == () and state.rebaseline == {"gemm_random_fp32"}


def test_a_digest_mismatch_whose_bounded_rerun_fails_to_run_is_no_evidence() -> None:
    state, reruns = observe(
        ConfirmState(), [result("gpu:3", canary="gemm_random_fp32", seed=1)], T0, CONFIG, GPUS
    )
    state = answer(state, reruns, {"gpu:3": "error", "gpu:4": "pass"}, T0 + 5)
    assert findings(state, T0 + 5) == () and state.history == ()


def test_a_full_mantissa_software_fault_rebaselines_its_digest() -> None:
    failing = [result(gpu, canary="gemm_random_bf16", seed=1) for gpu in GPUS[:5]]
    state, _ = observe(ConfirmState(), failing, T0, CONFIG, GPUS)
    assert [f.code for f in findings(state, T0)] == ["canary_software_fault"]
    assert state.rebaseline == {"gemm_random_bf16"}


def test_the_sibling_is_never_a_gpu_under_suspicion() -> None:
    state, _ = lead_on("gpu:4")
    state, reruns = observe(state, [result("gpu:3")], T0 + 1, CONFIG, GPUS)
    assert [r.target for r in reruns] == ["gpu:3", "gpu:5"]


def test_a_sibling_that_fails_alone_gets_a_lead_of_its_own() -> None:
    state, reruns = lead_on("gpu:3")
    suspect, sibling = reruns
    state, _ = observe_rerun(state, suspect, [result("gpu:3", "pass")], T0 + 5, CONFIG, GPUS)
    state, more = observe_rerun(state, sibling, [result("gpu:4")], T0 + 6, CONFIG, GPUS)
    assert [(r.target, r.suspect) for r in more] == [("gpu:4", "gpu:4"), ("gpu:5", "gpu:4")]
    assert state.watched(T0 + 6) == {"gpu:3"}


def test_a_bad_cpu_core_is_a_node_finding() -> None:
    cores = ("cpu:0", "cpu:1", "cpu:2")
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
