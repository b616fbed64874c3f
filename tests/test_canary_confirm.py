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
    target: str, outcome: Outcome = "mismatch", canary: str = "gemm_exact_fp16"
) -> CanaryResult:
    kind, index = target.split(":")
    kind_name, dtype = canary.rsplit("_", 1)
    return CanaryResult(
        canary=canary,
        kind=kind_name,  # type: ignore[arg-type]
        dtype=dtype,
        seed=7,
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
    state: ConfirmState, reruns: tuple[Rerun, ...], outcomes: dict[str, Outcome], now: float
) -> ConfirmState:
    """Play back the re-runs with the given outcome per target."""
    for rerun in reruns:
        state, more = observe_rerun(
            state, rerun, [result(rerun.target, outcomes[rerun.target])], now, CONFIG, GPUS
        )
        assert more == ()
    return state


def lead_on(target: str, now: float = T0) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    return observe(ConfirmState(), [result(target), result("gpu:0", "pass")], now, CONFIG, GPUS)


def test_a_mismatch_is_rerun_on_the_suspect_and_once_on_a_sibling() -> None:
    state, reruns = lead_on("gpu:3")
    assert [(r.target, r.suspect) for r in reruns] == [("gpu:3", "gpu:3"), ("gpu:4", "gpu:3")]
    assert reruns[0].spec == result("gpu:3").spec
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


def test_not_reproduced_is_watched_and_a_second_mismatch_confirms() -> None:
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
    state, reruns = observe(state, [result("gpu:3", canary="int_chain_u32")], T0 + 60, CONFIG, GPUS)
    assert reruns == ()
    [finding] = findings(state, T0 + 60)
    assert (finding.code, finding.severity) == ("sdc_confirmed", Severity.CRITICAL)
    assert finding.evidence["canary"] == "int_chain_u32"


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
    rerun = Rerun("gpu:0", result("gpu:0").spec, "gpu:0")
    after, more = observe_rerun(state, rerun, [result("gpu:0")], T0 + 301, CONFIG, GPUS)
    assert (after, more) == (state, ())


def test_a_single_gpu_node_confirms_on_the_suspect_alone() -> None:
    state, reruns = observe(ConfirmState(), [result("gpu:0")], T0, CONFIG, ("gpu:0",))
    assert [r.target for r in reruns] == ["gpu:0"]
    state, _ = observe_rerun(state, reruns[0], [result("gpu:0")], T0 + 1, CONFIG, ("gpu:0",))
    assert [f.code for f in findings(state, T0 + 1)] == ["sdc_confirmed"]


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
