"""The events gpuwatchd tells its webhooks about, made from policy's results.

Each event is a change of one alert: an alert is identified by its kind and
subject (`quarantine:gpu:1`), and an event either says it is on with a
severity or (severity None) that it ended. Three kinds:

- `quarantine`: a subject entered quarantine (critical); ends at its release.
- `unhealthy`: a GPU, link or port became unhealthy (warning); ends when it
  is healthy or degraded again (entering quarantine does not end it).
- `node_health`: the node's health changed: degraded is a warning, unhealthy
  and quarantined are critical; ends when the node is healthy.

Dry-run decisions make no event: actions act only on real decisions. Events
are plain data, stored as JSON in the outbox (`to_json`), so what a webhook
is sent after a restart is exactly what was decided before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from gpuwatchd.faults import fault_code
from gpuwatchd.model import Action, Decision, Finding, Health
from gpuwatchd.policy import NODE, QUARANTINE, RELEASE, HealthChange, PolicyResult

WARNING = "warning"
CRITICAL = "critical"
SEVERITIES = (WARNING, CRITICAL)  # in rising order

# The alert kinds.
QUARANTINED = "quarantine"
UNHEALTHY = "unhealthy"
NODE_HEALTH = "node_health"

# What an operator should do, in words, for each suggested action.
ACTION_TEXT: Mapping[Action, str] = {
    Action.NONE: "watch it; no action needed yet",
    Action.RESTART_APP: "restart the application on this GPU",
    Action.RESET_GPU: "drain the node and reset the GPU (nvidia-smi -r)",
    Action.REBOOT: "drain and reboot the node",
    Action.INSPECT_HARDWARE: "drain the node and have the hardware inspected or replaced",
}


@dataclass(frozen=True)
class Event:
    alert: str  # quarantine, unhealthy or node_health
    subject: str
    severity: str | None  # warning or critical; None: the alert ended
    kind: str  # quarantine, release or health_changed: what happened
    time: float
    node: str
    summary: str  # one line for people
    reason: str = ""
    code: str | None = None
    check: str | None = None
    source: str | None = None  # auto or manual, for decisions
    operator: str | None = None
    health_before: str | None = None
    health_after: str | None = None
    evidence: Mapping[str, float | int | str] = field(default_factory=dict)
    action: str = ""  # the suggested action, in words

    @property
    def identity(self) -> str:
        """The alert this event belongs to: its firing and its end share it."""
        return f"{self.alert}:{self.subject}"

    @property
    def firing(self) -> bool:
        return self.severity is not None

    @property
    def fault_code(self) -> str | None:
        # Derived at each render, so an event queued before the catalog has it too.
        return fault_code(self.code)

    def to_json(self) -> dict[str, Any]:
        return {
            "alert": self.alert,
            "subject": self.subject,
            "severity": self.severity,
            "kind": self.kind,
            "time": self.time,
            "node": self.node,
            "summary": self.summary,
            "reason": self.reason,
            "code": self.code,
            "fault_code": self.fault_code,
            "check": self.check,
            "source": self.source,
            "operator": self.operator,
            "health_before": self.health_before,
            "health_after": self.health_after,
            "evidence": dict(self.evidence),
            "action": self.action,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        """An event as to_json wrote it; what is derived (fault_code) is derived again."""
        stored = {name: data[name] for name in (f.name for f in fields(cls)) if name in data}
        return cls(**{**stored, "evidence": dict(data.get("evidence") or {})})


def poll_events(result: PolicyResult, node: str) -> tuple[Event, ...]:
    """The events of one poll: its real decisions, then its health changes."""
    by_code = {(f.subject, f.code): f for f in result.findings}
    worst: dict[str, Finding] = {}
    for finding in result.findings:
        held = worst.get(finding.subject)
        if held is None or finding.severity > held.severity:
            worst[finding.subject] = finding
    decisions = (
        decision_event(d, node, finding=by_code.get((d.subject, d.code or "")))
        for d in result.decisions
        if not d.dry_run
    )
    return (*decisions, *_health_events(result.changes, node, worst))


def decision_event(
    decision: Decision, node: str, operator: str | None = None, finding: Finding | None = None
) -> Event:
    """The event of a quarantine (firing) or a release (its end)."""
    quarantine = decision.kind == QUARANTINE
    who = f"{decision.source}{', ' + operator if operator else ''}"
    verb = "quarantined" if quarantine else "released"
    action = ACTION_TEXT[finding.action] if finding is not None else ""
    if quarantine and decision.source != "auto":
        action = "keep it out of service until an operator releases it"
    return Event(
        alert=QUARANTINED,
        subject=decision.subject,
        severity=CRITICAL if quarantine else None,
        kind=QUARANTINE if quarantine else RELEASE,
        time=decision.time,
        node=node,
        summary=f"{decision.subject} on {node} {verb} ({who}): {decision.reason}",
        reason=decision.reason,
        code=decision.code,
        check=finding.check if finding is not None else None,
        source=decision.source,
        operator=operator,
        evidence=dict(finding.evidence) if finding is not None else {},
        action=action,
    )


def _health_events(
    changes: Iterable[HealthChange], node: str, worst: Mapping[str, Finding]
) -> Iterator[Event]:
    for change in changes:
        if change.subject == NODE:
            alert, severity = NODE_HEALTH, _node_severity(change.after)
        elif change.after is not Health.QUARANTINED:
            alert, severity = UNHEALTHY, WARNING if change.after is Health.UNHEALTHY else None
        else:
            # Entering quarantine leaves `unhealthy` as it was: the quarantine
            # alert says the rest.
            continue
        # An alert that ends is told without the findings that remain.
        finding = worst.get(change.subject) if severity is not None else None
        yield _health_event(change, node, alert, severity, finding)


def _node_severity(health: Health) -> str | None:
    if health is Health.HEALTHY:
        return None
    return WARNING if health is Health.DEGRADED else CRITICAL


def _health_event(
    change: HealthChange, node: str, alert: str, severity: str | None, finding: Finding | None
) -> Event:
    before = change.before.label if change.before is not None else "new"
    because = f": {finding.message}" if finding is not None else ""
    return Event(
        alert=alert,
        subject=change.subject,
        severity=severity,
        kind="health_changed",
        time=change.time,
        node=node,
        summary=f"{change.subject} on {node} is {change.after.label} (was {before}){because}",
        reason=finding.message if finding is not None else f"{before} -> {change.after.label}",
        code=finding.code if finding is not None else None,
        check=finding.check if finding is not None else None,
        health_before=before,
        health_after=change.after.label,
        evidence=dict(finding.evidence) if finding is not None else {},
        action=ACTION_TEXT[finding.action] if finding is not None else "",
    )


def severity_at_least(severity: str, minimum: str) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(minimum)
