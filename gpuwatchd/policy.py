"""Policy: from one poll's findings and the prior state to health and decisions. Pure.

Reads findings (from the checks) and a `PolicyState` (from the store); returns
a `PolicyResult`: the health of every subject and of the node, the quarantine
and release decisions, the findings raised and cleared, and the next state.

- A definitive critical finding (a hardware fault) quarantines its subject at
  once, as a hardware quarantine that is never released automatically.
- An immediate critical finding (a state the driver reports, such as "reset
  required") quarantines at once too, but as an ordinary quarantine: released
  once the state has cleared and stayed quiet for `release_after`.
- Any other critical finding makes its subject unhealthy and quarantines it
  only once it has held for `confirm_for`, like a Prometheus alert's `for:`,
  so one burst does not drain a node.
- A warning makes a subject degraded once it has held for `warn_for`; a
  subject goes back to healthy only after `recover_after` without findings.
- The node is quarantined for a node-level fault, or when the share of its
  GPUs in quarantine reaches `node_quarantine_ratio`.
- A manual quarantine is released only manually, and a manual release stands:
  the findings active at that moment no longer quarantine the subject until
  they clear.
- In a dry run every decision is made and recorded with `dry_run=True`, and
  only the dry-run bookkeeping changes; real quarantines are left as they are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from gpuwatchd.history import History
from gpuwatchd.model import Board, Decision, Finding, Health, Quarantine, Severity, port_subject
from gpuwatchd.settings import Seconds
from gpuwatchd.units import format_duration

AUTO = "auto"
MANUAL = "manual"
QUARANTINE = "quarantine"
RELEASE = "release"
NODE = "node"
# The code of a node quarantine that comes from its GPUs' quarantines.
NODE_SHARE_CODE = "gpu_quarantine_ratio"

# A GPU's board by its UUID (NVML's `GPU-<hex groups>`): how the subject of a
# board that is no longer on the node is named (identity.py), so that it never
# takes the index another board now has.
BOARD = r"GPU-[0-9A-Fa-f-]{1,64}"
# A port's device name is escaped (model.port_subject): `ib:mlx5%20x/1`.
PORT = r"ib:(?:[A-Za-z0-9_.-]|%[0-9A-F]{2})+/\d+"
SUBJECT_PATTERN = re.compile(rf"^(node|gpu:(\d+|{BOARD})|nvlink:(\d+|{BOARD})/\d+|{PORT})$")
_GPU_OF = re.compile(r"^(?:gpu:(\d+)|nvlink:(\d+)/\d+)$")
_ABSENT = re.compile(rf"^(?:gpu:{BOARD}|nvlink:{BOARD}/\d+)$")

FindingKey = tuple[str, str]  # (check, code): one finding per subject and key


@dataclass(frozen=True)
class PolicyConfig:
    # Decide and record everything, act on nothing: decisions carry dry_run,
    # no real quarantine is made or released automatically.
    dry_run: bool = False
    # A warning must hold this long before its subject is degraded, so a
    # single odd poll does not flap the state.
    warn_for: Seconds = 30.0
    # Quiet time (no warning or critical finding) before a degraded or
    # unhealthy subject is healthy again. Longer than warn_for: the way out is
    # slower than the way in, which is what keeps a flapping subject degraded.
    recover_after: Seconds = 300.0
    # A critical finding that is not definitive quarantines only after holding
    # this long (Prometheus alerting rules commonly use `for: 5m`).
    confirm_for: Seconds = 300.0
    # Quiet time after which an automatic, non-hardware quarantine is released;
    # null keeps them until an operator releases them (as gpud's sticky states).
    release_after: Seconds | None = 3600.0
    # Quarantine the node when this share of its GPUs is quarantined. NHC and
    # the Azure HPC health checks take a node offline for any failing GPU, and
    # a training job needs all GPUs of its nodes: 0.125 is one GPU of eight.
    node_quarantine_ratio: float = 0.125

    def __post_init__(self) -> None:
        if self.recover_after <= self.warn_for:
            raise ValueError("recover_after must be longer than warn_for (hysteresis)")
        if self.release_after is not None and self.release_after < self.recover_after:
            raise ValueError("release_after must be at least recover_after")
        if not 0 < self.node_quarantine_ratio <= 1:
            raise ValueError("node_quarantine_ratio must be more than 0 and at most 1")


@dataclass(frozen=True)
class SubjectState:
    """What policy remembers of one subject between polls."""

    subject: str
    health: Health = Health.HEALTHY
    since: float = 0.0  # when it entered `health`
    bad_since: float | None = None  # start of the unbroken run of warn/critical findings
    critical_since: float | None = None  # start of the unbroken run of critical ones
    last_bad: float | None = None  # last poll with a warn/critical finding
    findings: tuple[tuple[str, str, Severity], ...] = ()  # (check, code, severity) last poll
    acknowledged: tuple[FindingKey, ...] = ()  # active at a manual release
    uuid: str | None = None  # the board of a GPU or NVLink subject (identity.py)


@dataclass(frozen=True)
class PolicyState:
    """Everything policy carries from one poll to the next; the store persists it.
    `revision` is the store's, so that a write made meanwhile is not overwritten."""

    subjects: tuple[SubjectState, ...] = ()
    quarantines: tuple[Quarantine, ...] = ()
    revision: int = 0

    def subject(self, name: str) -> SubjectState | None:
        return self._subjects.get(name)

    def quarantine(self, subject: str) -> Quarantine | None:
        return next((q for q in self.quarantines if q.subject == subject), None)

    @cached_property
    def _subjects(self) -> Mapping[str, SubjectState]:
        return MappingProxyType({state.subject: state for state in self.subjects})


@dataclass(frozen=True)
class ClearedFinding:
    subject: str
    check: str
    code: str
    time: float


@dataclass(frozen=True)
class HealthChange:
    subject: str
    before: Health | None  # None: first seen
    after: Health
    time: float


@dataclass(frozen=True)
class PolicyResult:
    state: PolicyState
    health: Mapping[str, Health]
    health_since: Mapping[str, float]
    node_health: Health
    # The findings judged, policy's own among them (the node's GPU share).
    findings: tuple[Finding, ...] = ()
    decisions: tuple[Decision, ...] = ()
    raised: tuple[Finding, ...] = ()  # new, or changed severity
    cleared: tuple[ClearedFinding, ...] = ()
    changes: tuple[HealthChange, ...] = ()

    @property
    def quarantines(self) -> tuple[Quarantine, ...]:
        return self.state.quarantines


# The decision of a manual operation: always one for a quarantine, None for
# the release of a subject that was not quarantined.
D = TypeVar("D", bound=Decision | None)


@dataclass(frozen=True)
class ManualResult(Generic[D]):
    state: PolicyState
    decision: D


def validate_subject(subject: str) -> str:
    if not SUBJECT_PATTERN.match(subject):
        raise ValueError(
            f"not a subject: {subject!r} "
            "(node, gpu:<index>, gpu:<UUID>, nvlink:<gpu>/<link> or ib:<device>/<port>)"
        )
    return subject


def absent(subject: str) -> bool:
    """Whether the subject is that of a board no longer on the node (`gpu:<UUID>`)."""
    return _ABSENT.match(subject) is not None


# A node's subjects are the same poll after poll: each is matched once.
@lru_cache(maxsize=4096)
def gpu_of(subject: str) -> int | None:
    """The GPU index a `gpu:` or `nvlink:` subject belongs to (None for a
    board no longer on the node)."""
    match = _GPU_OF.match(subject)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def observed_subjects(history: History) -> tuple[str, ...]:
    """Every subject the latest samples in History speak for, and the node."""
    subjects = [NODE]
    for index in history.gpu_indices():
        subjects.append(f"gpu:{index}")
        latest = history.latest_gpu(index)
        links = latest.nvlinks if latest is not None else ()
        subjects.extend(f"nvlink:{link.gpu}/{link.link}" for link in links)
    subjects.extend(port_subject(device, port) for device, port in history.port_keys())
    return tuple(subjects)


def evaluate(
    findings: Iterable[Finding],
    prior: PolicyState,
    now: float,
    config: PolicyConfig,
    subjects: Iterable[str] = (),
    blind: bool = False,
) -> PolicyResult:
    """One poll's verdict. `subjects` are those observed this poll (see
    `observed_subjects`); they get a health even without findings, and the
    GPUs among them are the node's GPUs for `node_quarantine_ratio`. `blind`:
    every source of the poll is down, so a node that nothing condemns is
    `unknown`, not healthy."""
    found = _group(findings)
    # Dry-run quarantines recorded what a dry run would do; in a live run
    # policy decides afresh.
    quarantines = {q.subject: q for q in prior.quarantines if config.dry_run or not q.dry_run}
    observed = set(subjects)
    names = (
        observed
        | found.keys()
        | quarantines.keys()
        | {s.subject for s in prior.subjects if s.health is not Health.HEALTHY}
    )
    # Most subjects, most polls: healthy, quiet and without a quarantine. Their
    # state stays as it is whatever the time, so they need no judging. (A
    # healthy subject is among the names only as an observed one.)
    resting = [
        state
        for state in prior.subjects
        if _resting(state)
        and state.subject in observed
        and state.subject != NODE
        and state.subject not in found
        and state.subject not in quarantines
    ]
    rested = {state.subject for state in resting}
    tracked = {
        name: _track(prior.subject(name), name, found.get(name, {}), now)
        for name in sorted(names - rested)
        if name != NODE
    }
    decisions: list[Decision] = []
    for name, state in tracked.items():
        wanted = _wanted(found.get(name, {}), state, now, config)
        # A board no longer on the node gives no evidence that it is well.
        releasable = not absent(name) and _quiet(state, now, config)
        _apply(name, wanted, releasable, quarantines, decisions, now, config)
    node = _judge_node(prior, names, found, quarantines, decisions, now, config)
    states, node_health = _settle_all(
        prior, tracked, node, found, quarantines, observed, now, config, blind
    )
    judged = sorted(states, key=_subject_name)
    new_state = PolicyState(
        subjects=tuple(sorted([*judged, *resting], key=_subject_name)),
        quarantines=tuple(quarantines[name] for name in sorted(quarantines)),
        revision=prior.revision,
    )
    return PolicyResult(
        state=new_state,
        health=MappingProxyType({state.subject: state.health for state in new_state.subjects}),
        health_since=MappingProxyType({s.subject: s.since for s in new_state.subjects}),
        node_health=node_health,
        findings=tuple(f for mine in found.values() for _, f in sorted(mine.items())),
        decisions=tuple(decisions),
        raised=_raised(prior, found),
        cleared=_cleared(prior, found, now),
        # A resting subject's state is the prior's own: its health did not change.
        changes=_changes(prior, judged, now),
    )


def _judge_node(
    prior: PolicyState,
    names: Iterable[str],
    found: dict[str, dict[FindingKey, Finding]],
    quarantines: dict[str, Quarantine],
    decisions: list[Decision],
    now: float,
    config: PolicyConfig,
) -> SubjectState:
    """The node's own findings, with policy's GPU-share finding added: judged
    after the GPUs, so that their quarantines of this poll count."""
    share = _share_finding(names, quarantines, config)
    if share is not None:
        found.setdefault(NODE, {})[(share.check, share.code)] = share
    node = _track(prior.subject(NODE), NODE, found.get(NODE, {}), now)
    held = quarantines.get(NODE)
    if held is not None and held.code == NODE_SHARE_CODE:
        releasable = share is None
    else:
        releasable = _quiet(node, now, config)
    wanted = _wanted(found.get(NODE, {}), node, now, config)
    _apply(NODE, wanted, releasable, quarantines, decisions, now, config)
    return node


def _settle_all(
    prior: PolicyState,
    tracked: Mapping[str, SubjectState],
    node: SubjectState,
    found: Mapping[str, Mapping[FindingKey, Finding]],
    quarantines: Mapping[str, Quarantine],
    observed: set[str],
    now: float,
    config: PolicyConfig,
    blind: bool,
) -> tuple[list[SubjectState], Health]:
    """Every subject's health after this poll's decisions, and the node's roll-up
    (unknown when `blind` and it is no worse). A healthy subject no longer
    observed, with nothing to remember, is dropped."""
    states: list[SubjectState] = []
    for name, state in tracked.items():
        new = _settle(prior.subject(name), state, found.get(name, {}), quarantines, now, config)
        if name in observed or new.health is not Health.HEALTHY or new.findings or new.acknowledged:
            states.append(new)
    own = _settle(prior.subject(NODE), node, found.get(NODE, {}), quarantines, now, config)
    node_health = _roll_up(own.health, (state.health for state in states))
    if blind and node_health in (Health.HEALTHY, Health.DEGRADED):
        node_health = Health.UNKNOWN
    states.append(_with_health(prior.subject(NODE), own, node_health, now))
    return states, node_health


def quarantine_manually(
    prior: PolicyState,
    subject: str,
    reason: str,
    operator: str,
    now: float,
    board: Board | None = None,
) -> ManualResult[Decision | None]:
    """An operator's quarantine; only a manual release ends it. None when the
    subject is already quarantined: the quarantine in force keeps its source,
    reason and start, which say why and since when the part is out. A dry
    run's quarantine is replaced, since it holds nothing out. `board`: the
    GPU the subject is (or belongs to) now."""
    validate_subject(subject)
    held = prior.quarantine(subject)
    if held is not None and not held.dry_run:
        return ManualResult(prior, None)
    quarantine = Quarantine(
        subject=subject,
        reason=reason,
        source=MANUAL,
        since=now,
        hardware=False,
        operator=operator,
        code=held.code if held is not None else None,
        **on_board(board or _board_of(held)),
    )
    state = prior.subject(subject) or SubjectState(subject=subject, since=now)
    new_state = replace(
        prior,
        quarantines=_replace_quarantine(prior.quarantines, subject, quarantine),
        subjects=_replace_subject(
            prior.subjects, _with_health(state, state, Health.QUARANTINED, now)
        ),
    )
    decision = Decision(
        QUARANTINE, subject, reason, MANUAL, now, code=quarantine.code, uuid=quarantine.uuid
    )
    return ManualResult(new_state, decision)


def release_manually(
    prior: PolicyState, subject: str, operator: str, now: float, reason: str = ""
) -> ManualResult[Decision | None]:
    """An operator's release, of any quarantine (hardware ones included: the
    operator has repaired or replaced the part). The findings active now are
    acknowledged: they no longer quarantine the subject until they clear."""
    validate_subject(subject)
    held = prior.quarantine(subject)
    if held is None:
        return ManualResult(prior, None)
    state = prior.subject(subject) or SubjectState(subject=subject, since=now)
    acknowledged = tuple((check, code) for check, code, _ in state.findings)
    released = replace(state, acknowledged=acknowledged, critical_since=None)
    after = Health.UNHEALTHY if _worst_of(state.findings) is Severity.CRITICAL else Health.DEGRADED
    new_state = replace(
        prior,
        quarantines=_replace_quarantine(prior.quarantines, subject, None),
        subjects=_replace_subject(prior.subjects, _with_health(state, released, after, now)),
    )
    text = reason or f"released by {operator}"
    decision = Decision(RELEASE, subject, text, MANUAL, now, code=held.code, uuid=held.uuid)
    return ManualResult(new_state, decision)


def encode_subjects(subjects: Sequence[SubjectState]) -> str:
    """The tracking part of a PolicyState as JSON (the store keeps quarantines in a table)."""
    return json.dumps(
        [
            {
                "subject": s.subject,
                "health": s.health.label,
                "since": s.since,
                "bad_since": s.bad_since,
                "critical_since": s.critical_since,
                "last_bad": s.last_bad,
                "findings": [[check, code, severity.label] for check, code, severity in s.findings],
                "acknowledged": [list(key) for key in s.acknowledged],
                "uuid": s.uuid,
            }
            for s in subjects
        ],
        sort_keys=True,
    )


def decode_subjects(text: str) -> tuple[SubjectState, ...]:
    raw: list[dict[str, Any]] = json.loads(text)
    return tuple(
        SubjectState(
            subject=item["subject"],
            health=Health[item["health"].upper()],
            since=item["since"],
            bad_since=item["bad_since"],
            critical_since=item["critical_since"],
            last_bad=item["last_bad"],
            findings=tuple(
                (check, code, Severity[severity.upper()])
                for check, code, severity in item["findings"]
            ),
            acknowledged=tuple((check, code) for check, code in item["acknowledged"]),
            uuid=item.get("uuid"),
        )
        for item in raw
    )


def _group(findings: Iterable[Finding]) -> dict[str, dict[FindingKey, Finding]]:
    """Findings by subject and key; of two with one key, the more severe stands."""
    grouped: dict[str, dict[FindingKey, Finding]] = {}
    for finding in findings:
        key = (finding.check, finding.code)
        mine = grouped.setdefault(finding.subject, {})
        if key not in mine or finding.severity > mine[key].severity:
            mine[key] = finding
    return grouped


def _worst(found: Mapping[FindingKey, Finding]) -> Severity:
    if not found:
        return Severity.OK
    return max((f.severity for f in found.values()), default=Severity.OK)


def _worst_of(findings: Iterable[tuple[str, str, Severity]]) -> Severity:
    return max((severity for _, _, severity in findings), default=Severity.OK)


def _track(
    prev: SubjectState | None, name: str, found: Mapping[FindingKey, Finding], now: float
) -> SubjectState:
    """The streaks and findings of this poll; health is settled later."""
    before = prev or SubjectState(subject=name, since=now)
    if not found and _settled_quiet(before):
        # Quiet, and quiet last poll: the state is the same (most subjects, most polls).
        return before
    # An acknowledgement lasts as long as its finding.
    acknowledged = tuple(key for key in before.acknowledged if key in found)
    bad = _worst(found) > Severity.OK
    critical = any(
        f.severity is Severity.CRITICAL and key not in acknowledged for key, f in found.items()
    )
    return replace(
        before,
        bad_since=(before.bad_since if before.bad_since is not None else now) if bad else None,
        critical_since=(
            (before.critical_since if before.critical_since is not None else now)
            if critical
            else None
        ),
        last_bad=now if bad else before.last_bad,
        findings=tuple((check, code, f.severity) for (check, code), f in sorted(found.items())),
        acknowledged=acknowledged,
    )


def _settled_quiet(state: SubjectState) -> bool:
    """Whether the subject's last poll was quiet and ended every streak."""
    return not (state.bad_since or state.critical_since or state.findings or state.acknowledged)


def _resting(state: SubjectState) -> bool:
    """Whether a poll without findings, for a subject without a quarantine,
    leaves `state` as it is (`_track` and `_settle` at any time): healthy,
    and nothing to end or recover from."""
    return state.health is Health.HEALTHY and _settled_quiet(state)


def _wanted(
    found: Mapping[FindingKey, Finding], state: SubjectState, now: float, config: PolicyConfig
) -> Finding | None:
    """The finding that calls for a quarantine now: a definitive one at once,
    another critical one once its run has lasted `confirm_for`."""
    critical = [
        f
        for key, f in sorted(found.items())
        if f.severity is Severity.CRITICAL and key not in state.acknowledged
    ]
    definitive = [f for f in critical if f.definitive]
    if definitive:
        return definitive[0]
    # The driver's own "reset required" and the like need no confirming
    # either, nor does the node's share of quarantined GPUs (each of those
    # quarantines was decided already).
    immediate = [f for f in critical if f.immediate]
    if immediate:
        return immediate[0]
    confirmed = (
        state.critical_since is not None and now - state.critical_since >= config.confirm_for
    )
    return critical[0] if critical and confirmed else None


def _quiet(state: SubjectState, now: float, config: PolicyConfig) -> bool:
    if config.release_after is None:
        return False
    return state.last_bad is None or now - state.last_bad >= config.release_after


def _apply(
    subject: str,
    wanted: Finding | None,
    releasable: bool,
    quarantines: dict[str, Quarantine],
    decisions: list[Decision],
    now: float,
    config: PolicyConfig,
) -> None:
    held = quarantines.get(subject)
    # Manual wins over auto, and a dry run never touches a real quarantine.
    if held is not None and (held.source == MANUAL or (config.dry_run and not held.dry_run)):
        return
    if wanted is not None:
        if held is not None and (held.hardware or not wanted.definitive):
            return
        quarantine = Quarantine(
            subject=subject,
            reason=wanted.code,
            source=AUTO,
            since=held.since if held is not None else now,
            hardware=wanted.definitive,
            code=wanted.code,
            dry_run=config.dry_run,
            **on_board(_board_of(held)),
        )
        quarantines[subject] = quarantine
        decisions.append(
            Decision(
                QUARANTINE,
                subject,
                wanted.message,
                AUTO,
                now,
                config.dry_run,
                wanted.code,
                quarantine.uuid,
            )
        )
    elif held is not None and not held.hardware and releasable:
        del quarantines[subject]
        quiet = format_duration(config.release_after or 0.0)
        reason = (
            "its GPUs are back in service" if held.code == NODE_SHARE_CODE else f"quiet for {quiet}"
        )
        decisions.append(
            Decision(RELEASE, subject, reason, AUTO, now, config.dry_run, held.code, held.uuid)
        )


def on_board(board: Board | None) -> dict[str, Any]:
    """A quarantine's fields that name its board (none without one)."""
    if board is None:
        return {}
    return {"uuid": board.uuid, "last_index": board.index, "pci_bus_id": board.pci_bus_id}


def _board_of(held: Quarantine | None) -> Board | None:
    if held is None or held.uuid is None or held.last_index is None:
        return None
    return Board(held.uuid, held.last_index, held.pci_bus_id)


def _share_finding(
    names: Iterable[str], quarantines: Mapping[str, Quarantine], config: PolicyConfig
) -> Finding | None:
    """A node-level finding when enough of the node's GPUs (or their links) are quarantined."""
    gpus = {gpu for name in names if (gpu := gpu_of(name)) is not None}
    held = {gpu for name in quarantines if (gpu := gpu_of(name)) is not None}
    if not gpus or len(held) / len(gpus) < config.node_quarantine_ratio:
        return None
    return Finding(
        subject=NODE,
        check="policy",
        code=NODE_SHARE_CODE,
        severity=Severity.CRITICAL,
        message=f"{len(held)} of {len(gpus)} GPUs quarantined",
        evidence={"quarantined_gpus": len(held), "gpus": len(gpus)},
        immediate=True,
    )


def _settle(
    prev: SubjectState | None,
    state: SubjectState,
    found: Mapping[FindingKey, Finding],
    quarantines: Mapping[str, Quarantine],
    now: float,
    config: PolicyConfig,
) -> SubjectState:
    held = quarantines.get(state.subject)
    before = prev.health if prev is not None else Health.HEALTHY
    worst = _worst(found)
    if held is not None and not held.dry_run:
        health = Health.QUARANTINED
    elif worst is Severity.CRITICAL:
        health = Health.UNHEALTHY
    elif worst is Severity.WARN:
        lasted = state.bad_since is not None and now - state.bad_since >= config.warn_for
        health = Health.DEGRADED if lasted or before is not Health.HEALTHY else Health.HEALTHY
    elif (
        before is not Health.HEALTHY
        and state.last_bad is not None
        and now - state.last_bad < config.recover_after
    ):
        health = Health.DEGRADED  # recovering: quiet, but not for long enough yet
    else:
        health = Health.HEALTHY
    return _with_health(prev, state, health, now)


def _with_health(
    prev: SubjectState | None, state: SubjectState, health: Health, now: float
) -> SubjectState:
    since = prev.since if prev is not None and prev.health is health else now
    if state.health is health and state.since == since:
        return state
    return replace(state, health=health, since=since)


def _roll_up(node: Health, others: Iterable[Health]) -> Health:
    """The node is quarantined or unhealthy by its own findings; any subject
    that is not healthy leaves it degraded (serving, with less)."""
    if node in (Health.QUARANTINED, Health.UNHEALTHY):
        return node
    if node is Health.DEGRADED or any(h is not Health.HEALTHY for h in others):
        return Health.DEGRADED
    return Health.HEALTHY


def _raised(
    prior: PolicyState, found: Mapping[str, Mapping[FindingKey, Finding]]
) -> tuple[Finding, ...]:
    raised: list[Finding] = []
    for subject, mine in sorted(found.items()):
        prev = prior.subject(subject)
        before = {(c, k): s for c, k, s in prev.findings} if prev is not None else {}
        raised.extend(f for key, f in sorted(mine.items()) if before.get(key) is not f.severity)
    return tuple(raised)


def _cleared(
    prior: PolicyState, found: Mapping[str, Mapping[FindingKey, Finding]], now: float
) -> tuple[ClearedFinding, ...]:
    return tuple(
        ClearedFinding(state.subject, check, code, now)
        for state in prior.subjects
        for check, code, _ in state.findings
        if (check, code) not in found.get(state.subject, {})
    )


def _changes(
    prior: PolicyState, states: Iterable[SubjectState], now: float
) -> tuple[HealthChange, ...]:
    changes = []
    for state in states:
        prev = prior.subject(state.subject)
        before = prev.health if prev is not None else None
        # A subject first seen healthy is no news; anything else is.
        if before is not state.health and not (before is None and state.health is Health.HEALTHY):
            changes.append(HealthChange(state.subject, before, state.health, now))
    return tuple(changes)


_subject_name = attrgetter("subject")


def _replace_quarantine(
    quarantines: Sequence[Quarantine], subject: str, new: Quarantine | None
) -> tuple[Quarantine, ...]:
    kept = [q for q in quarantines if q.subject != subject]
    if new is not None:
        kept.append(new)
    return tuple(sorted(kept, key=_subject_name))


def _replace_subject(
    subjects: Sequence[SubjectState], new: SubjectState
) -> tuple[SubjectState, ...]:
    kept = [s for s in subjects if s.subject != new.subject]
    return tuple(sorted([*kept, new], key=_subject_name))
