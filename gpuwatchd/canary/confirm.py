"""Turning canary mismatches into findings: a mismatch is a lead, not a verdict.

Pure functions of the state, the results and the time the caller passes in.

- A mismatch opens a lead: the same inputs are re-run on the suspect and
  once on a sibling (the next GPU of the node that is itself above doubt).
- Reproduced on the suspect only: confirmed. A critical, definitive
  `sdc_confirmed` finding, action inspect_hardware, so policy quarantines
  the GPU (a hardware fault, never auto-released). It stays for the life of
  this state.
- Not reproduced (or the re-run failed to finish): the suspect is watched
  for `watch_for`, with a burst every `watch_interval` and a warning
  `sdc_suspected`; a second mismatch while watched confirms.
- Reproduced on the sibling too, or the same canary failing on more than
  `software_ratio` of the node's GPUs within one interval: a software,
  driver or reference problem. A warning `canary_software_fault` on the
  node, nobody quarantined; mismatches of that canary are not leads while
  they keep coming (and for two intervals after the last).

The host's CPU cores go through the same steps as `cpu:<core>` targets,
with the findings on the node (a core that computes wrong makes the whole
node unsafe to schedule on).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeVar

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.result import CanaryResult, Outcome
from gpuwatchd.canary.spec import CanarySpec
from gpuwatchd.model import Action, Finding, Severity

CHECK = "sdc"


@dataclass(frozen=True)
class Rerun:
    """Run `spec` on `target` to settle the lead on `suspect`."""

    target: str
    spec: CanarySpec
    suspect: str


@dataclass(frozen=True)
class Lead:
    suspect: str
    evidence: CanaryResult
    since: float
    sibling: str | None
    suspect_outcome: Outcome | None = None
    sibling_outcome: Outcome | None = None
    sibling_result: CanaryResult | None = None

    @property
    def settled(self) -> bool:
        return self.suspect_outcome is not None and (
            self.sibling is None or self.sibling_outcome is not None
        )


@dataclass(frozen=True)
class Watch:
    until: float
    evidence: CanaryResult


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

    def watched(self, now: float) -> frozenset[str]:
        return frozenset(t for t, watch in self.watching.items() if watch.until > now)

    def settled_targets(self) -> frozenset[str]:
        """Targets that cannot serve as a sibling."""
        return frozenset({*self.leads, *self.watching, *self.confirmed})


def _put(mapping: Mapping[str, V], key: str, value: V) -> Mapping[str, V]:
    return MappingProxyType({**mapping, key: value})


def _drop(mapping: Mapping[str, V], *keys: str) -> Mapping[str, V]:
    return MappingProxyType({k: v for k, v in mapping.items() if k not in keys})


def _sibling(state: ConfirmState, suspect: str, targets: Sequence[str]) -> str | None:
    """The next target of the suspect's kind after it, in order, that is
    itself above doubt."""
    kind = suspect.split(":")[0]
    peers = sorted(t for t in targets if t.split(":")[0] == kind)
    if suspect not in peers:
        peers = sorted([*peers, suspect])
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
    stale = [t for t, lead in state.leads.items() if lead.since < horizon]
    for target in stale:
        # The re-runs never came back (the GPU vanished, the burst hung):
        # as good as not reproduced.
        state = _not_reproduced(state, state.leads[target], now, config)
    return replace(
        state,
        watching=MappingProxyType({t: w for t, w in state.watching.items() if w.until > now}),
        software=MappingProxyType({c: s for c, s in state.software.items() if s.until > now}),
        recent=tuple(entry for entry in state.recent if entry[0] > horizon),
    )


def observe(
    state: ConfirmState,
    results: Sequence[CanaryResult],
    now: float,
    config: CanaryConfig,
    targets: Sequence[str],
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    """Take a burst's results; return the new state and the re-runs to start.
    `targets` are the node's GPUs and host cores that can run canaries now."""
    state = _expire(state, now, config)
    mismatches = [r for r in results if r.result == "mismatch"]
    state = replace(
        state, recent=state.recent + tuple((now, r.target, r.canary) for r in mismatches)
    )
    for result in mismatches:
        state = _node_wide(state, result, now, config, targets)
    reruns: list[Rerun] = []
    for result in mismatches:
        state, new = _lead(state, result, now, config, targets)
        reruns.extend(new)
    return state, tuple(reruns)


def _node_wide(
    state: ConfirmState,
    result: CanaryResult,
    now: float,
    config: CanaryConfig,
    targets: Sequence[str],
) -> ConfirmState:
    kind = result.target.split(":")[0]
    peers = [t for t in targets if t.split(":")[0] == kind]
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
    leads = [t for t, lead in state.leads.items() if lead.evidence.canary == evidence.canary]
    return replace(
        state,
        software=_put(state.software, evidence.canary, fault),
        leads=_drop(state.leads, *leads),
    )


def _lead(
    state: ConfirmState,
    result: CanaryResult,
    now: float,
    config: CanaryConfig,
    targets: Sequence[str],
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    target = result.target
    held = state.software.get(result.canary)
    if held is not None:
        return _software(state, result, (target,), now, config), ()
    if target in state.confirmed or target in state.leads:
        return state, ()
    if target in state.watched(now):
        return _confirm(state, target, result), ()
    sibling = _sibling(state, target, targets)
    lead = Lead(target, result, now, sibling)
    reruns = tuple(Rerun(t, result.spec, target) for t in (target, sibling) if t is not None)
    return replace(state, leads=_put(state.leads, target, lead)), reruns


def observe_rerun(
    state: ConfirmState,
    rerun: Rerun,
    results: Sequence[CanaryResult],
    now: float,
    config: CanaryConfig,
    targets: Sequence[str],
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    """Take the results of a re-run; settle its lead once both re-runs are in."""
    lead = state.leads.get(rerun.suspect)
    if lead is None or lead.evidence.spec.name != rerun.spec.name:
        return state, ()
    answer = next((r for r in results if r.canary == rerun.spec.name), None)
    outcome: Outcome = answer.result if answer is not None else "error"
    if rerun.target == lead.suspect:
        lead = replace(lead, suspect_outcome=outcome)
    else:
        lead = replace(lead, sibling_outcome=outcome, sibling_result=answer)
    if not lead.settled:
        return replace(state, leads=_put(state.leads, lead.suspect, lead)), ()
    return _settle(state, lead, now, config, targets)


def _settle(
    state: ConfirmState, lead: Lead, now: float, config: CanaryConfig, targets: Sequence[str]
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    state = replace(state, leads=_drop(state.leads, lead.suspect))
    sibling_mismatch = lead.sibling_outcome == "mismatch"
    if lead.suspect_outcome == "mismatch" and sibling_mismatch:
        assert lead.sibling is not None
        return _software(state, lead.evidence, (lead.suspect, lead.sibling), now, config), ()
    if lead.suspect_outcome == "mismatch":
        return _confirm(state, lead.suspect, lead.evidence), ()
    state = _not_reproduced(state, lead, now, config)
    if sibling_mismatch and lead.sibling_result is not None:
        # The sibling went wrong where the suspect did not: a lead of its own.
        return _lead(state, lead.sibling_result, now, config, targets)
    return state, ()


def _not_reproduced(
    state: ConfirmState, lead: Lead, now: float, config: CanaryConfig
) -> ConfirmState:
    watch = Watch(now + config.watch_for, lead.evidence)
    return replace(
        state,
        leads=_drop(state.leads, lead.suspect),
        watching=_put(state.watching, lead.suspect, watch),
    )


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


def _confirmed_finding(target: str, result: CanaryResult) -> Finding:
    where = f"CPU core {result.cpu_core}" if result.cpu_core is not None else target
    return Finding(
        subject=_subject(target),
        check=CHECK,
        code="sdc_confirmed" if target.startswith("gpu:") else "sdc_cpu_core_confirmed",
        severity=Severity.CRITICAL,
        message=(
            f"{where} computes wrong results: {result.canary} (seed {result.seed}) "
            f"mismatched {result.mismatch_count} element(s) and did so again"
        ),
        action=Action.INSPECT_HARDWARE,
        evidence=evidence_of(result),
        definitive=True,
    )


def _suspected_finding(target: str, watch: Watch) -> Finding:
    result = watch.evidence
    return Finding(
        subject=_subject(target),
        check=CHECK,
        code="sdc_suspected",
        severity=Severity.WARN,
        message=(
            f"{target} mismatched once on {result.canary} (seed {result.seed}) but not on a "
            "re-run; watched with more frequent canaries"
        ),
        evidence={**evidence_of(result), "watch_until": watch.until},
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
        yield _confirmed_finding(target, result)
    for target, watch in sorted(state.watching.items()):
        if watch.until > now and target not in state.confirmed:
            yield _suspected_finding(target, watch)
    for canary, fault in sorted(state.software.items()):
        if fault.until > now:
            yield _software_finding(canary, fault)
