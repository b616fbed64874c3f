"""The state database as the daemon and the CLI use it: one connection, a
room per concern, and the writes that span them.

A poll is written in one transaction (`save_poll`): its quarantines and
policy state, journal, XIDs, the webhook events of its decisions and the
readings' last samples, so that no decision is ever on record without its
events or the other way round. An operator's quarantine or release is one
transaction too. Everything else belongs to one concern and is reached
through it: `journal`, `outbox`, `boots`, `facts`, `canary`, `dcgm`, `samples`.

A database that cannot be used raises StoreError; the daemon can go on
monitoring with `Store.in_memory()` (`persistent` is False) and export that
it cannot persist. The policy state carries the store's revision, and
`save_poll` refuses (`StateConflict`) to overwrite a manual change made since
it was read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpuwatchd.model import Board, Decision, Quarantine, Reading
from gpuwatchd.policy import (
    D,
    ManualResult,
    PolicyResult,
    PolicyState,
    quarantine_manually,
    release_manually,
)
from gpuwatchd.store import policy_state
from gpuwatchd.store.boots import Boots, record_xids
from gpuwatchd.store.canary import CanaryMismatches
from gpuwatchd.store.database import LOCK_WAIT_SECONDS, Database
from gpuwatchd.store.dcgm import DcgmRuns
from gpuwatchd.store.facts import Facts
from gpuwatchd.store.journal import (
    Journal,
    journal_decision,
    journal_manual_health,
    journal_poll,
)
from gpuwatchd.store.outbox import Outbox, OutboxEvent, enqueue
from gpuwatchd.store.samples import LastSamples, SampleTexts, record_samples

# The events of a manual decision, made once the store has decided it.
EventsOf = Callable[[Decision], Sequence[OutboxEvent]]


class StateConflict(RuntimeError):
    """The state changed in the database (a manual quarantine or release) since
    it was read: load it again and evaluate again."""


@dataclass(frozen=True)
class UnsavedPoll:
    """What a poll wanted written beside the state when the database could
    not take it: kept by the daemon and written with a later poll."""

    result: PolicyResult
    now: float
    boot_id: str | None
    readings: tuple[Reading, ...]  # those with XID events
    events: tuple[OutboxEvent, ...]

    @property
    def empty(self) -> bool:
        r = self.result
        return not (
            r.raised or r.cleared or r.changes or r.decisions or self.events or self.readings
        )


class Store:
    """The state database. Open with `Store.open(state_dir)`; one instance may
    be shared by threads (calls are serialised)."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self.journal = Journal(database)
        self.outbox = Outbox(database)
        self.boots = Boots(database)
        self.facts = Facts(database)
        self.canary = CanaryMismatches(database)
        self.dcgm = DcgmRuns(database)
        self.samples = LastSamples(database)
        # What the last poll wrote, by the objects it was made of.
        self._subjects_text = policy_state.SubjectsText()
        self._sample_texts = SampleTexts()

    @classmethod
    def open(
        cls, state_dir: str, *, exclusive: bool = False, wait: float = LOCK_WAIT_SECONDS
    ) -> Store:
        """The database in `state_dir`, made when missing. `exclusive` (the
        daemon's): held, with no -shm file, until closed. `wait`: how long to
        wait for another process's lock (StoreError.held after that)."""
        return cls(Database.open(state_dir, exclusive=exclusive, wait=wait))

    @classmethod
    def in_memory(cls) -> Store:
        """A store that forgets at exit: for a daemon whose database is unusable,
        so that policy goes on working while `persistent` says it is not kept."""
        return cls(Database.in_memory())

    @property
    def path(self) -> str:
        return self._database.path

    @property
    def persistent(self) -> bool:
        return self._database.persistent

    def reopen_if_replaced(self) -> bool:
        """When the database file was removed or replaced since it was opened,
        start a new one at its path and return True: the caller writes its
        state into it (`restore`). Raises StoreError when that cannot be done."""
        return self._database.reopen_if_replaced()

    def close(self) -> None:
        self._database.close()

    def load_state(self) -> PolicyState:
        with self._database.reading() as db:
            return policy_state.load(db)

    def quarantines(self) -> tuple[Quarantine, ...]:
        with self._database.reading() as db:
            return policy_state.quarantines(db)

    def last_poll(self) -> float | None:
        """When the daemon last wrote a poll (wall-clock seconds), if ever."""
        with self._database.reading() as db:
            return policy_state.last_poll(db)

    def save_poll(
        self,
        result: PolicyResult,
        *,
        now: float,
        boot_id: str | None = None,
        readings: Iterable[Reading] = (),
        events: Sequence[OutboxEvent] = (),
        earlier: Sequence[UnsavedPoll] = (),
        wall: float | None = None,
    ) -> PolicyState:
        """Write one poll in one transaction: its quarantines, policy state,
        journal, XIDs (under `boot_id`), the readings' samples and the webhook
        events it raised, after the journal, XIDs and events of the `earlier`
        polls that could not be written, and `wall`, the wall clock's time of
        the poll (`last_poll`). Raises StateConflict, writing nothing, when
        the state changed since it was read."""
        readings = tuple(readings)
        with self._database.writing() as db:
            revision = policy_state.revision(db)
            if revision != result.state.revision:
                raise StateConflict(
                    f"state revision {revision} in the database, {result.state.revision} evaluated"
                )
            changed = policy_state.write(db, result.state, self._subjects_text)
            for poll in (*earlier, UnsavedPoll(result, now, boot_id, readings, tuple(events))):
                journal_poll(db, poll.result, poll.now)
                if poll.boot_id is not None:
                    record_xids(db, poll.boot_id, poll.readings, poll.now)
                enqueue(db, poll.events)
            record_samples(db, readings, self._sample_texts)
            if wall is not None:
                policy_state.set_last_poll(db, wall)
            if changed:
                revision += 1
                policy_state.set_revision(db, revision)
        return PolicyState(result.state.subjects, result.state.quarantines, revision)

    def restore(self, state: PolicyState) -> PolicyState:
        """Write a state kept in memory into a database that lost it (one
        made anew by `reopen_if_replaced`); the state with its new revision."""
        with self._database.writing() as db:
            policy_state.write(db, state)
            revision = policy_state.revision(db) + 1
            policy_state.set_revision(db, revision)
        return PolicyState(state.subjects, state.quarantines, revision)

    def quarantine(
        self,
        subject: str,
        reason: str,
        operator: str,
        now: float,
        events: EventsOf | None = None,
        board: Board | None = None,
    ) -> Decision | None:
        """Quarantine a subject by hand (the CLI, with or without the daemon);
        `events` gives the webhook events of the decision, written with it;
        `board`: the GPU the subject is, or is on, now. None when it is
        already quarantined (nothing is changed)."""
        return self._manual(
            lambda state: quarantine_manually(state, subject, reason, operator, now, board),
            operator,
            events,
        )

    def release(
        self,
        subject: str,
        operator: str,
        now: float,
        reason: str = "",
        events: EventsOf | None = None,
    ) -> Decision | None:
        """Release a subject by hand; None when it was not quarantined."""
        return self._manual(
            lambda state: release_manually(state, subject, operator, now, reason),
            operator,
            events,
        )

    def _manual(
        self,
        change: Callable[[PolicyState], ManualResult[D]],
        operator: str,
        events: EventsOf | None,
    ) -> D:
        with self._database.writing() as db:
            prior = policy_state.load(db)
            result = change(prior)
            if result.decision is not None:
                policy_state.write(db, result.state)
                policy_state.set_revision(db, policy_state.revision(db) + 1)
                journal_decision(db, result.decision, operator)
                journal_manual_health(db, prior, result.state, result.decision, operator)
                if events is not None:
                    enqueue(db, events(result.decision))
            return result.decision
