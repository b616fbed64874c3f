"""Turning canary mismatches into findings: a mismatch is a lead, not a verdict.

Pure functions of the state, the results and the time the caller passes in.

- Every mismatching canary of a burst goes into one lead on its target: the
  same inputs are re-run on the suspect and once on a sibling, the next
  target of its peer group that is itself above doubt (the caller's
  `Peers`: the GPUs of one model and SM count, which compute every canary
  alike, or the host's cores; a GPU of another model can disagree for
  reasons of its model's own). A full-mantissa GEMM whose digest differs
  from the one its peers agreed on is a lead like any other: GPUs of one
  model, SM count, driver and library compute it bit for bit alike
  (cuBLAS's reproducibility promise), so its re-runs are compared bit for
  bit again, and a suspect whose product differs again while the sibling's
  is the agreed one has computed wrong, in the lowest bit as in the
  highest. The re-runs are `gemm_bounded`: the same product, digested, and
  judged element by element against an fp64 reference and an error bound
  that holds for any summation order. The bound is the software-fault
  filter: a sibling whose product is outside it, or is not the agreed one
  either, shows the library, the configuration or the agreed digest wrong,
  not the suspect.
- Reproduced on the suspect and not on the sibling: confirmed. A critical,
  definitive `sdc_confirmed` finding, action inspect_hardware, so policy
  quarantines the GPU (a hardware fault, never auto-released).
- Each mismatch the sibling computed right on the same inputs is kept in the
  history of the board that showed it (the GPU's UUID, or the host core),
  persisted by the caller; two of them on different canaries or seeds
  within `history_window` confirm too, when they are two observations: from
  bursts at least one `interval` apart, or one of them reproduced. That is
  what catches an intermittent fault that no single re-run reproduces; the
  mismatches of one burst are one event (a host or worker transient can hit
  several canaries at once), however many canaries it hit.
- No sibling (a single-GPU node, a GPU alone of its model, or every peer
  under doubt): nothing can tell a GPU fault from a software or reference
  fault, so nothing confirms.
  The suspect is watched, and `sdc_suspected` asks for an offline diagnostic.
- Not reproduced: the suspect is watched for `watch_for`, with a burst every
  `watch_interval` and a warning `sdc_suspected`.
- Reproduced on the sibling too, or the same canary failing on more than
  `software_ratio` of its peer group within one interval: a software,
  driver or reference problem. A warning `canary_software_fault` on the
  node, nobody quarantined; mismatches of that canary are not leads while
  they keep coming (and for two intervals after the last). A full-mantissa
  GEMM that is a software fault has its agreed digest dropped
  (`rebaseline`): it is agreed afresh.

The host's CPU cores go through the same steps as `cpu:<core>` targets,
with the findings on the node (a core that computes wrong makes the whole
node unsafe to schedule on).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from types import MappingProxyType
from typing import Any, TypeVar

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.result import CanaryResult, Outcome
from gpuwatchd.canary.spec import CanarySpec
from gpuwatchd.model import Action, Finding, Severity

CHECK = "sdc"
# What the suspect of a lead without a sibling should get instead of a
# verdict: DCGM's level 3 diagnostic, recorded for `gpuwatchd report`.
OFFLINE_DIAGNOSTIC = "gpuwatchd canary --dcgm 3"

# Target -> its peer group: the targets that compute every canary alike and
# so can vouch for each other (canary/peers.py). A target missing from it
# has no peer.
Peers = Mapping[str, str]


def board_of(target: str, uuid: str | None) -> str | None:
    """What a mismatch belongs to: a GPU's UUID (its NVML index moves with a
    reboot or a replacement), a host core's target; None for a GPU whose
    UUID is unknown, whose mismatches never count toward a history."""
    return uuid if target.startswith("gpu:") else target


def rerun_spec(spec: CanarySpec) -> CanarySpec:
    """How a mismatch is re-run: the same inputs; a full-mantissa GEMM's
    digest mismatch digested again and against an fp64 reference and error
    bound too."""
    return replace(spec, kind="gemm_bounded") if spec.kind == "gemm_random" else spec


@dataclass(frozen=True)
class Rerun:
    """Run `specs` on `target` to settle the lead on `suspect`."""

    target: str
    specs: tuple[CanarySpec, ...]
    suspect: str


@dataclass(frozen=True)
class Mismatch:
    """One mismatch in a target's history (kept across restarts)."""

    time: float
    target: str
    canary: str
    seed: int
    # The sibling ran the same inputs and passed: the inputs, the reference
    # and the software are right, so the mismatch is the target's own.
    sibling_clear: bool
    reproduced: bool
    uuid: str | None = None
    # When the burst that showed it came in (its lead's start). Rows kept
    # before this was recorded have none: their `time` stands in.
    burst_time: float | None = None
    # The evidence a vendor's ticket cites (`gpuwatchd report`): the wrong
    # answer (the first wrong element's expected and actual bits, the SMs
    # and lanes of the threads that computed wrong), what the re-run on the
    # suspect and the sibling's run of the same inputs gave (None: none came
    # back), and which board the sibling is. Rows kept before these were
    # recorded have none.
    first_expected_bits: str | None = None
    first_actual_bits: str | None = None
    mismatch_units: tuple[int, ...] = ()
    mismatch_lanes: tuple[int, ...] = ()
    rerun: Outcome | None = None
    sibling: str | None = None
    sibling_uuid: str | None = None
    sibling_result: Outcome | None = None

    @property
    def burst(self) -> float:
        return self.time if self.burst_time is None else self.burst_time

    @property
    def board(self) -> str | None:
        return board_of(self.target, self.uuid)


@dataclass(frozen=True)
class Lead:
    suspect: str
    evidence: tuple[CanaryResult, ...]
    since: float
    sibling: str | None
    suspect_results: tuple[CanaryResult, ...] | None = None
    sibling_results: tuple[CanaryResult, ...] | None = None

    @property
    def settled(self) -> bool:
        return self.suspect_results is not None and (
            self.sibling is None or self.sibling_results is not None
        )


@dataclass(frozen=True)
class Watch:
    until: float
    evidence: CanaryResult
    # Reproduced with no sibling to compare with: only an offline
    # diagnostic can tell.
    offline: bool = False


@dataclass(frozen=True)
class SoftwareFault:
    until: float
    targets: tuple[str, ...]
    evidence: CanaryResult


V = TypeVar("V")


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class ConfirmState:
    leads: Mapping[str, Lead] = field(default_factory=_empty)
    watching: Mapping[str, Watch] = field(default_factory=_empty)
    # Target -> the mismatch that confirmed it.
    confirmed: Mapping[str, CanaryResult] = field(default_factory=_empty)
    # Canary name -> the software problem it shows.
    software: Mapping[str, SoftwareFault] = field(default_factory=_empty)
    # (time, target, canary) of the mismatches of the last interval.
    recent: tuple[tuple[float, str, str], ...] = ()
    # Every target's mismatches within the history window, oldest first.
    history: tuple[Mismatch, ...] = ()
    # Full-mantissa canaries whose agreed digest must be agreed afresh (the
    # caller drops it and clears this).
    rebaseline: frozenset[str] = frozenset()

    def watched(self, now: float) -> frozenset[str]:
        return frozenset(t for t, watch in self.watching.items() if watch.until > now)

    def settled_targets(self) -> frozenset[str]:
        """Targets that cannot serve as a sibling."""
        return frozenset({*self.leads, *self.watching, *self.confirmed})


def _put(mapping: Mapping[str, V], key: str, value: V) -> Mapping[str, V]:
    return MappingProxyType({**mapping, key: value})


def _drop(mapping: Mapping[str, V], *keys: str) -> Mapping[str, V]:
    return MappingProxyType({k: v for k, v in mapping.items() if k not in keys})


def _peers_of(target: str, targets: Peers) -> list[str]:
    """The targets of `target`'s peer group, itself included, in order; none
    when its group is unknown (it left the node, or went out of service)."""
    group = targets.get(target)
    return sorted(t for t, g in targets.items() if group is not None and g == group)


def _sibling(state: ConfirmState, suspect: str, targets: Peers) -> str | None:
    """The next target of the suspect's peer group after it, in order, that
    is itself above doubt."""
    peers = _peers_of(suspect, targets)
    if suspect not in peers:
        return None
    start = peers.index(suspect)
    doubtful = state.settled_targets()
    for offset in range(1, len(peers)):
        candidate = peers[(start + offset) % len(peers)]
        if candidate not in doubtful:
            return candidate
    return None


def _software_hold(config: CanaryConfig) -> float:
    return 2 * config.interval


def _expire(state: ConfirmState, now: float, config: CanaryConfig) -> ConfirmState:
    horizon = now - config.interval
    stale = [lead for lead in state.leads.values() if lead.since < horizon]
    for lead in stale:
        # The re-runs never came back (the GPU vanished, the burst hung, the
        # GPU never had time for them): settled with what did come back.
        state = _judge(
            state, replace(lead, suspect_results=lead.suspect_results or ()), now, config
        )
    return replace(
        state,
        watching=MappingProxyType({t: w for t, w in state.watching.items() if w.until > now}),
        software=MappingProxyType({c: s for c, s in state.software.items() if s.until > now}),
        recent=tuple(entry for entry in state.recent if entry[0] > horizon),
        history=tuple(m for m in state.history if m.time > now - config.history_window),
    )


def observe(
    state: ConfirmState,
    results: Sequence[CanaryResult],
    now: float,
    config: CanaryConfig,
    targets: Peers,
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    """Take a burst's results; return the new state and the re-runs to start.
    `targets` are the node's GPUs and host cores that can run canaries now,
    each with its peer group."""
    state = _expire(state, now, config)
    mismatches = [r for r in results if r.result == "mismatch"]
    state = replace(
        state, recent=state.recent + tuple((now, r.target, r.canary) for r in mismatches)
    )
    for result in mismatches:
        state = _node_wide(state, result, now, config, targets)
    reruns: list[Rerun] = []
    for target in sorted({r.target for r in mismatches}):
        mine = tuple(r for r in mismatches if r.target == target)
        state, new = _lead(state, mine, now, config, targets)
        reruns.extend(new)
    return state, tuple(reruns)


def _node_wide(
    state: ConfirmState,
    result: CanaryResult,
    now: float,
    config: CanaryConfig,
    targets: Peers,
) -> ConfirmState:
    peers = _peers_of(result.target, targets)
    failing = sorted({t for _, t, c in state.recent if c == result.canary and t in peers})
    if len(failing) < 2 or len(failing) <= config.software_ratio * len(peers):
        return state
    return _software(state, result, failing, now, config)


def _software(
    state: ConfirmState,
    evidence: CanaryResult,
    targets: Sequence[str],
    now: float,
    config: CanaryConfig,
) -> ConfirmState:
    known = state.software.get(evidence.canary)
    involved = tuple(sorted({*targets, *(known.targets if known else ())}))
    fault = SoftwareFault(
        now + _software_hold(config), involved, known.evidence if known else evidence
    )
    leads = {
        t: replace(lead, evidence=tuple(e for e in lead.evidence if e.canary != evidence.canary))
        for t, lead in state.leads.items()
    }
    rebaseline = state.rebaseline
    if evidence.kind == "gemm_random":
        rebaseline = rebaseline | {evidence.canary}
    return replace(
        state,
        software=_put(state.software, evidence.canary, fault),
        leads=MappingProxyType({t: lead for t, lead in leads.items() if lead.evidence}),
        rebaseline=rebaseline,
    )


def _lead(
    state: ConfirmState,
    results: tuple[CanaryResult, ...],
    now: float,
    config: CanaryConfig,
    targets: Peers,
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    target = results[0].target
    fresh: list[CanaryResult] = []
    for result in results:
        if result.canary in state.software:
            state = _software(state, result, (target,), now, config)
        else:
            fresh.append(result)
    if not fresh or target in state.confirmed or target in state.leads:
        return state, ()
    sibling = _sibling(state, target, targets)
    lead = Lead(target, tuple(fresh), now, sibling)
    specs = tuple(rerun_spec(r.spec) for r in fresh)
    reruns = tuple(Rerun(t, specs, target) for t in (target, sibling) if t is not None)
    return replace(state, leads=_put(state.leads, target, lead)), reruns


def observe_rerun(
    state: ConfirmState,
    rerun: Rerun,
    results: Sequence[CanaryResult],
    now: float,
    config: CanaryConfig,
    targets: Peers,
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    """Take the results of a re-run; settle its lead once both re-runs are in."""
    lead = state.leads.get(rerun.suspect)
    if lead is None or not {rerun_spec(e.spec) for e in lead.evidence} & set(rerun.specs):
        return state, ()
    if rerun.target == lead.suspect:
        lead = replace(lead, suspect_results=tuple(results))
    elif rerun.target == lead.sibling:
        lead = replace(lead, sibling_results=tuple(results))
    if not lead.settled:
        return replace(state, leads=_put(state.leads, lead.suspect, lead)), ()
    state = _judge(state, lead, now, config)
    return _sibling_leads(state, lead, now, config, targets)


def _outcome(results: tuple[CanaryResult, ...] | None, spec: CanarySpec) -> Outcome | None:
    if results is None:
        return None
    answer = next((r for r in results if r.canary == spec.name and r.seed == spec.seed), None)
    return answer.result if answer is not None else "error"


def _judge(state: ConfirmState, lead: Lead, now: float, config: CanaryConfig) -> ConfirmState:
    """Settle a lead: software faults, the history it adds, and the verdict."""
    state = replace(state, leads=_drop(state.leads, lead.suspect))
    entries: list[Mismatch] = []
    reproduced_clear: CanaryResult | None = None
    for evidence in lead.evidence:
        spec = rerun_spec(evidence.spec)
        mine, theirs = _outcome(lead.suspect_results, spec), _outcome(lead.sibling_results, spec)
        if mine == "mismatch" and theirs == "mismatch":
            assert lead.sibling is not None
            state = _software(state, evidence, (lead.suspect, lead.sibling), now, config)
            continue
        entry = Mismatch(
            now,
            lead.suspect,
            evidence.canary,
            evidence.seed,
            sibling_clear=theirs == "pass",
            reproduced=mine == "mismatch",
            uuid=evidence.uuid,
            burst_time=lead.since,
            first_expected_bits=evidence.first_expected_bits,
            first_actual_bits=evidence.first_actual_bits,
            mismatch_units=evidence.mismatch_units,
            mismatch_lanes=evidence.mismatch_lanes,
            rerun=mine,
            sibling=lead.sibling,
            sibling_uuid=next((r.uuid for r in lead.sibling_results or () if r.uuid), None),
            sibling_result=theirs,
        )
        entries.append(entry)
        if entry.reproduced and entry.sibling_clear:
            reproduced_clear = evidence
    if not entries:
        return state
    state = replace(state, history=state.history + tuple(entries))
    if reproduced_clear is not None:
        return _confirm(state, lead.suspect, reproduced_clear)
    if _history_confirms(state.history, entries[0].board, config.interval):
        return _confirm(state, lead.suspect, lead.evidence[-1])
    offline = lead.sibling is None and any(e.reproduced for e in entries)
    watch = Watch(now + config.watch_for, lead.evidence[0], offline)
    return replace(state, watching=_put(state.watching, lead.suspect, watch))


def _own(history: Sequence[Mismatch], board: str | None) -> list[Mismatch]:
    """The board's mismatches of its own: those a sibling computed right."""
    return [m for m in history if board is not None and m.board == board and m.sibling_clear]


def _history_confirms(history: Sequence[Mismatch], board: str | None, interval: float) -> bool:
    """Two mismatches of the board's own that are two observations of it."""
    own = _own(history, board)
    return any(_independent(a, b, interval) for a, b in combinations(own, 2))


def _independent(a: Mismatch, b: Mismatch, interval: float) -> bool:
    """Different inputs (canary or seed), and not one event: bursts at least
    `interval` apart, or one of them reproduced on its re-run. One burst's
    mismatches can all come from one transient of the host or the worker."""
    if (a.canary, a.seed) == (b.canary, b.seed):
        return False
    return a.reproduced or b.reproduced or abs(a.burst - b.burst) >= interval


def forget_gone(state: ConfirmState, uuids: Collection[str]) -> ConfirmState:
    """The state without the history of GPUs whose UUID is not among `uuids`
    (the node's GPUs now): a board that was replaced or moved away takes its
    mismatches with it, and the GPU enumerated in its place starts clean.
    The host cores' history stays."""
    kept = tuple(m for m in state.history if not m.target.startswith("gpu:") or m.uuid in uuids)
    return state if len(kept) == len(state.history) else replace(state, history=kept)


def _sibling_leads(
    state: ConfirmState, lead: Lead, now: float, config: CanaryConfig, targets: Peers
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    """The sibling went wrong where the suspect did not: a lead of its own."""
    if lead.sibling is None or not lead.sibling_results:
        return state, ()
    theirs = tuple(
        r
        for r in lead.sibling_results
        if r.result == "mismatch" and _outcome(lead.suspect_results, r.spec) == "pass"
    )
    if not theirs:
        return state, ()
    return _lead(state, theirs, now, config, targets)


def _confirm(state: ConfirmState, target: str, evidence: CanaryResult) -> ConfirmState:
    return replace(
        state,
        confirmed=_put(state.confirmed, target, evidence),
        watching=_drop(state.watching, target),
        leads=_drop(state.leads, target),
    )


def _subject(target: str) -> str:
    return target if target.startswith("gpu:") else "node"


def evidence_of(result: CanaryResult) -> dict[str, float | int | str]:
    evidence: dict[str, float | int | str] = {
        "canary": result.canary,
        "dtype": result.dtype,
        "seed": result.seed,
        "shape": "x".join(map(str, result.shape)),
        "mismatch_count": result.mismatch_count,
        "mismatched_bits": result.mismatched_bits,
    }
    optional: dict[str, float | int | str | None] = {
        "uuid": result.uuid,
        "cpu_core": result.cpu_core,
        "first_mismatch_index": result.first_mismatch_index,
        "first_expected_bits": result.first_expected_bits,
        "first_actual_bits": result.first_actual_bits,
        "sms": ",".join(map(str, result.mismatch_units)) or None,
        "lanes": ",".join(map(str, result.mismatch_lanes)) or None,
        "temperature_celsius": result.temperature_celsius,
        "detail": result.message,
    }
    evidence.update({k: v for k, v in optional.items() if v is not None})
    return evidence


def _confirmed_finding(target: str, result: CanaryResult, history: int) -> Finding:
    where = f"CPU core {result.cpu_core}" if result.cpu_core is not None else target
    return Finding(
        subject=_subject(target),
        check=CHECK,
        code="sdc_confirmed" if target.startswith("gpu:") else "sdc_cpu_core_confirmed",
        severity=Severity.CRITICAL,
        message=(
            f"{where} computes wrong results: {result.canary} (seed {result.seed}) "
            f"mismatched {result.mismatch_count} element(s); {history} mismatch(es) of its own "
            "on record, where a sibling computed the same inputs right"
        ),
        action=Action.INSPECT_HARDWARE,
        evidence={**evidence_of(result), "mismatches_on_record": history},
        definitive=True,
    )


def _suspected_finding(target: str, watch: Watch) -> Finding:
    result = watch.evidence
    if watch.offline:
        why = (
            "and again on a re-run, with no sibling GPU to tell a GPU fault from a software "
            f"or reference one; run an offline diagnostic ({OFFLINE_DIAGNOSTIC})"
        )
    else:
        why = "but not on a re-run; watched with more frequent canaries"
    evidence: dict[str, float | int | str] = {**evidence_of(result), "watch_until": watch.until}
    if watch.offline:
        evidence["offline_diagnostic"] = OFFLINE_DIAGNOSTIC
    return Finding(
        subject=_subject(target),
        check=CHECK,
        code="sdc_suspected",
        severity=Severity.WARN,
        message=f"{target} mismatched on {result.canary} (seed {result.seed}) {why}",
        evidence=evidence,
    )


def _software_finding(canary: str, fault: SoftwareFault) -> Finding:
    return Finding(
        subject="node",
        check=CHECK,
        code="canary_software_fault",
        severity=Severity.WARN,
        message=(
            f"{canary} mismatches on {len(fault.targets)} device(s) at once "
            f"({', '.join(fault.targets)}): a software, driver or reference problem, "
            "not a GPU fault; nothing is quarantined for it"
        ),
        evidence={**evidence_of(fault.evidence), "devices": ",".join(fault.targets)},
    )


def findings(state: ConfirmState, now: float) -> tuple[Finding, ...]:
    return tuple(_findings(state, now))


def _findings(state: ConfirmState, now: float) -> Iterator[Finding]:
    for target, result in sorted(state.confirmed.items()):
        history = len(_own(state.history, board_of(target, result.uuid)))
        yield _confirmed_finding(target, result, history)
    for target, watch in sorted(state.watching.items()):
        if watch.until > now and target not in state.confirmed:
            yield _suspected_finding(target, watch)
    for canary, fault in sorted(state.software.items()):
        if fault.until > now:
            yield _software_finding(canary, fault)
