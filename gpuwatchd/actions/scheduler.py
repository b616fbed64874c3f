"""Taking the node out of its scheduler and putting it back: what is wanted,
and the worker that makes a scheduler (Slurm, Kubernetes) match it.

Level-triggered: from each published Snapshot the worker derives what the
scheduler should hold (`Want`: a drain, marks, conditions) and, when that
changed or a failed attempt is due again, has the scheduler's backend make it
so. A backend reads the scheduler's state first and only undoes what gpuwatchd
did itself. A failure is a finding (`actions/<code>`, a warning on the node)
until an attempt works; a drain that fleet safety holds back is one too.
Dry run (the policy's or the action's) logs and journals what would run and
runs nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from gpuwatchd.actions.fleet import FleetSafety, Verdict
from gpuwatchd.clock import Clock
from gpuwatchd.model import Finding, Health, Quarantine, Severity
from gpuwatchd.policy import AUTO, NODE, gpu_of
from gpuwatchd.settings import Seconds
from gpuwatchd.snapshot import SchedulerStatus, Snapshot
from gpuwatchd.store import Store, StoreError

log = logging.getLogger(__name__)

CHECK = "actions"
WITHHELD_CODE = "fleet_drain_withheld"
# The journal kind of a drain made, which alone allows lifting it (Journaled).
DRAIN_NOTE = "drain"
# Schedulers keep reasons short; Slurm shows them in `sinfo -R`.
MAX_REASON_CHARS = 200


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings every scheduler action has; each adds its own."""

    # Off by default: taking nodes out of a scheduler is opted into.
    enabled: bool = False
    # Log and journal what would run, run nothing (policy.dry_run does too).
    dry_run: bool = False
    # The node's name in the scheduler; null: derived from the hostname.
    node_name: str | None = None
    # A quarantined GPU (or NVLink): drain the whole node, or only mark it.
    gpu_quarantine: Literal["drain", "mark"] = "drain"
    # Every scheduler request gives up after this long.
    timeout: Seconds = 30.0
    # A failed attempt (or a drain fleet safety held back) is retried this often.
    retry_interval: Seconds = 60.0


class ActionFailed(RuntimeError):
    """A scheduler request that did not work; `code` names the finding."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Unwell:
    subject: str
    health: Health
    reason: str


@dataclass(frozen=True)
class Want:
    """What the scheduler should hold for this node."""

    drain: tuple[Quarantine, ...] = ()  # the quarantines that take the node out
    marked: tuple[Quarantine, ...] = ()  # quarantined parts that only mark it
    unwell: tuple[Unwell, ...] = ()  # unhealthy and quarantined subjects (conditions)

    @property
    def automatic(self) -> bool:
        """Only automatic quarantines want the drain: fleet safety applies."""
        return all(q.source == AUTO for q in self.drain)

    @property
    def drain_reason(self) -> str:
        return _summary(self.drain)

    @property
    def mark_text(self) -> str | None:
        return _summary(self.marked) if self.marked else None


NOTHING = Want()


def _summary(quarantines: tuple[Quarantine, ...]) -> str:
    parts = "; ".join(f"{q.subject} {q.reason}" for q in quarantines)
    return f"gpuwatchd: {parts}"[:MAX_REASON_CHARS]


def want_of(snapshot: Snapshot, gpu_quarantine: str, conditions: bool) -> Want:
    """A node quarantine drains; a GPU's or NVLink's drains or marks as
    configured; an InfiniBand port's marks (policy quarantines the node when
    its ports matter to it). Dry-run quarantines want nothing."""
    live = tuple(q for q in snapshot.quarantines if not q.dry_run)

    def drains(q: Quarantine) -> bool:
        return q.subject == NODE or (gpu_quarantine == "drain" and gpu_of(q.subject) is not None)

    unwell: tuple[Unwell, ...] = ()
    if conditions:
        unwell = tuple(
            Unwell(subject, health, _why(snapshot, subject))
            for subject, health in sorted(snapshot.health.items())
            if health in (Health.UNHEALTHY, Health.QUARANTINED, Health.UNKNOWN)
        )
    return Want(
        drain=tuple(q for q in live if drains(q)),
        marked=tuple(q for q in live if not drains(q)),
        unwell=unwell,
    )


def _why(snapshot: Snapshot, subject: str) -> str:
    held = next((q for q in snapshot.quarantines if q.subject == subject), None)
    if held is not None and not held.dry_run:
        return f"quarantined ({held.source}): {held.reason}"
    worst = max(
        (f for f in snapshot.findings if f.subject == subject),
        key=lambda f: f.severity,
        default=None,
    )
    return worst.message if worst is not None else "unhealthy"


@dataclass(frozen=True)
class Outcome:
    drained: bool  # gpuwatchd's drain is in place
    withheld: str | None = None  # fleet safety held a wanted drain back
    drained_for: str | None = None  # the reason of a drain made by this attempt


Gate = Callable[[], Verdict]
# Whether this daemon's journal records draining the node for the reason the
# scheduler shows: a drain carrying our tag is lifted only then, so a daemon
# that lost its state (a damaged database moved aside) never lifts it.
Journaled = Callable[[str], bool]


class Backend(Protocol):
    name: str
    node: str

    @property
    def config(self) -> SchedulerConfig: ...

    def want(self, snapshot: Snapshot) -> Want: ...

    def plan(self, before: Want, after: Want) -> list[str]:
        """What going from `before` to `after` would run, for a dry run."""
        ...

    def apply(self, want: Want, gate: Gate, journaled: Journaled, done: list[str]) -> Outcome:
        """Make the scheduler hold `want`; append each change made to `done`.
        Asks `gate` before a drain only when the want is automatic. Raises
        ActionFailed."""
        ...


class SchedulerWorker:
    """Keeps one scheduler in step with the latest Snapshot; see the module."""

    def __init__(
        self,
        backend: Backend,
        fleet: FleetSafety,
        store: Store,
        clock: Clock,
        policy_dry_run: bool,
    ) -> None:
        self.backend = backend
        self._fleet = fleet
        self._store = store
        self._clock = clock
        self.dry_run = policy_dry_run or backend.config.dry_run
        self._lock = threading.Lock()
        self._want: Want | None = None
        self._tried: Want | None = None  # the want of the last attempt
        self._retry_at: float | None = None
        self._failure: ActionFailed | None = None
        self._withheld: str | None = None
        self._drained = False

    def update(self, snapshot: Snapshot) -> None:
        want = self.backend.want(snapshot)
        with self._lock:
            self._want = want

    def run_once(self, now: float) -> float | None:
        with self._lock:
            want = self._want
        if want is None:
            return None
        due = self._retry_at is not None and now >= self._retry_at
        if want == self._tried and not due:
            return self._retry_at
        before, self._tried = self._tried or NOTHING, want
        if self.dry_run:
            self._rehearse(before, want, now)
        else:
            self._apply(want, now)
        return self._retry_at

    def findings(self) -> tuple[Finding, ...]:
        """Failures and a withheld drain, as findings on the node."""
        found = []
        if self._failure is not None:
            found.append(self._finding(self._failure.code, str(self._failure)))
        if self._withheld is not None:
            message = f"{self.backend.name} drain held back by fleet safety: {self._withheld}"
            found.append(self._finding(WITHHELD_CODE, message))
        return tuple(found)

    def status(self) -> SchedulerStatus:
        return SchedulerStatus(
            name=self.backend.name,
            node=self.backend.node,
            dry_run=self.dry_run,
            drained=self._drained,
            withheld=self._withheld,
            error=str(self._failure) if self._failure is not None else None,
        )

    def _finding(self, code: str, message: str) -> Finding:
        return Finding(
            subject=NODE,
            check=CHECK,
            code=code,
            severity=Severity.WARN,
            message=message,
            evidence={"scheduler": self.backend.name, "node": self.backend.node},
        )

    def _rehearse(self, before: Want, want: Want, now: float) -> None:
        for line in self.backend.plan(before, want):
            log.warning("%s dry run: would %s", self.backend.name, line)
            self._journal(now, f"dry run: would {line}", dry_run=True)

    def _apply(self, want: Want, now: float) -> None:
        done: list[str] = []
        try:
            outcome = self.backend.apply(want, self._ask_fleet, self._journaled, done)
        except ActionFailed as failure:
            log.error("%s: %s (retrying in %gs)", self.backend.name, failure, self._interval)
            if self._failure is None or str(self._failure) != str(failure):
                self._journal(now, f"failed: {failure}", code=failure.code)
            self._failure = failure
            self._retry_at = now + self._interval
        else:
            if outcome.withheld != self._withheld and outcome.withheld is not None:
                self._journal(now, f"drain held back by fleet safety: {outcome.withheld}")
            if outcome.drained_for is not None:
                self._note_drain(now, outcome.drained_for)
            self._failure = None
            self._withheld = outcome.withheld
            self._drained = outcome.drained
            self._retry_at = now + self._interval if outcome.withheld is not None else None
        finally:
            for change in done:
                log.warning("%s: %s", self.backend.name, change)
                self._journal(now, change)

    def _drain_note(self, reason: str) -> str:
        return f"{self.backend.name} drained {self.backend.node}: {reason}"

    def _note_drain(self, now: float, reason: str) -> None:
        try:
            self._store.journal.note(DRAIN_NOTE, NODE, self._drain_note(reason), now)
        except StoreError as error:
            log.error("%s", error)

    def _journaled(self, shown: str) -> bool:
        """Whether the journal records our drain with the reason the scheduler
        shows (which may add to it, as Slurm's " [user@time]" does)."""
        prefix = self._drain_note("")
        try:
            notes = self._store.journal.notes(DRAIN_NOTE, prefix)
        except StoreError as error:
            log.error("%s", error)
            return False
        return any(shown.startswith(note.removeprefix(prefix)) for note in notes)

    def _ask_fleet(self) -> Verdict:
        verdict = self._fleet.check()
        log.info("%s: fleet safety: %s", self.backend.name, verdict.reason)
        return verdict

    @property
    def _interval(self) -> float:
        return self.backend.config.retry_interval

    def _journal(
        self, now: float, message: str, code: str | None = None, dry_run: bool = False
    ) -> None:
        data = {"scheduler": self.backend.name, "node": self.backend.node}
        if code is not None:
            data["code"] = code
        try:
            self._store.journal.note(
                "action", NODE, f"{self.backend.name}: {message}", now, dry_run=dry_run, data=data
            )
        except StoreError as error:
            log.error("%s", error)
