"""What the daemon does about its decisions besides showing them: the events
it writes to the webhook outbox, and the threads that deliver them and keep
the schedulers in step.

The daemon calls `events(result)` inside each poll's store transaction (and
`manual_events` in a manual decision's), `publish(snapshot)` after each new
Snapshot, and reads `findings()` (the actions' failures) into the next poll
and `status()` into the Snapshot. Nothing here ever blocks the poll loop:
requests and commands run in the workers' threads.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from collections.abc import Sequence

from gpuwatchd.actions.events import decision_event, poll_events
from gpuwatchd.actions.fleet import FleetSafety
from gpuwatchd.actions.kubernetes import Kubernetes
from gpuwatchd.actions.scheduler import Backend, SchedulerWorker
from gpuwatchd.actions.slurm import Slurm
from gpuwatchd.actions.webhook import WebhookSender
from gpuwatchd.actions.worker import Worker
from gpuwatchd.clock import Clock
from gpuwatchd.config import ActionsConfig
from gpuwatchd.model import Decision, Finding
from gpuwatchd.policy import PolicyResult
from gpuwatchd.snapshot import SchedulerStatus, Snapshot, WebhookStatus
from gpuwatchd.store import EventsOf, OutboxCounts, OutboxEvent, Store, StoreError

log = logging.getLogger(__name__)

# Dead letters past their retention, and queues of webhooks no longer
# configured, are dropped at start and then this often.
PRUNE_EVERY_SECONDS = 3600.0
STOP_TIMEOUT_SECONDS = 5.0


class Actions:
    def __init__(
        self,
        config: ActionsConfig,
        store: Store,
        clock: Clock,
        *,
        policy_dry_run: bool,
        listen_port: int,
    ) -> None:
        self.config = config
        self.node = node_name(config)
        self._store = store
        self._stopping = threading.Event()
        external_url = config.external_url or f"http://{self.node}:{listen_port}"
        # Jitter only: no need for a seed or a secure source.
        rng = random.Random()
        self.senders = tuple(
            WebhookSender(webhook, store, clock, rng, external_url, self._stopping.is_set)
            for webhook in config.webhooks
        )
        fleet = FleetSafety(config.fleet_safety)
        backends: list[Backend] = []
        if config.slurm.enabled:
            backends.append(Slurm(config.slurm))
        if config.kubernetes.enabled:
            backends.append(Kubernetes(config.kubernetes, clock))
        self.schedulers = tuple(
            SchedulerWorker(backend, fleet, store, clock, policy_dry_run) for backend in backends
        )
        self._workers = [
            *(Worker(f"webhook-{s.config.name}", s.run_once, clock) for s in self.senders),
            *(Worker(w.backend.name, w.run_once, clock) for w in self.schedulers),
        ]
        self._pruned_at: float | None = None

    @property
    def webhook_names(self) -> tuple[str, ...]:
        return tuple(sender.config.name for sender in self.senders)

    def events(self, result: PolicyResult) -> tuple[OutboxEvent, ...]:
        """The webhook events of one poll, for its store transaction."""
        names = self.webhook_names
        if not names:
            return ()
        return tuple(
            OutboxEvent(e.time, e.to_json(), names) for e in poll_events(result, self.node)
        )

    def manual_events(self, operator: str) -> EventsOf:
        """The webhook events of an operator's decision, made in its transaction."""
        return manual_events(self.node, operator, self.webhook_names)

    def publish(self, snapshot: Snapshot) -> None:
        """A new Snapshot: schedulers follow it, senders look at their outbox."""
        for scheduler in self.schedulers:
            scheduler.update(snapshot)
        self._prune(snapshot.time)
        for worker in self._workers:
            worker.wake()

    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for scheduler in self.schedulers for f in scheduler.findings())

    def status(self) -> tuple[tuple[WebhookStatus, ...], tuple[SchedulerStatus, ...]]:
        try:
            counts = self._store.outbox.counts() if self.senders else {}
        except StoreError as error:
            log.error("%s", error)
            counts = {}
        webhooks = tuple(
            WebhookStatus(
                name=sender.config.name,
                delivered=sender.counts.delivered,
                retried=sender.counts.retry,
                dead_lettered=sender.counts.dead_letter,
                pending=counts.get(sender.config.name, OutboxCounts()).pending,
                dead_letters=counts.get(sender.config.name, OutboxCounts()).dead_letters,
                last_error=sender.last_error,
            )
            for sender in self.senders
        )
        return webhooks, tuple(scheduler.status() for scheduler in self.schedulers)

    def run_due(self, now: float) -> None:
        """One pass of every action, in the caller's thread (tests, fake clocks)."""
        for sender in self.senders:
            sender.run_once(now)
        for scheduler in self.schedulers:
            scheduler.run_once(now)

    def start(self) -> None:
        for worker in self._workers:
            worker.start()

    def stop(self) -> None:
        self._stopping.set()
        for worker in self._workers:
            worker.stop()
        for worker in self._workers:
            worker.join(STOP_TIMEOUT_SECONDS)

    def _prune(self, now: float) -> None:
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY_SECONDS:
            return
        self._pruned_at = now
        try:
            dropped = self._store.outbox.prune(
                self.webhook_names, now, self.config.dead_letter_retention
            )
        except StoreError as error:
            log.error("%s", error)
            return
        if dropped:
            log.warning("dropped %d undelivered events of webhooks no longer configured", dropped)


def node_name(config: ActionsConfig) -> str:
    """The node's name in webhook events."""
    return config.node_name or socket.gethostname()


def manual_events(node: str, operator: str, webhooks: Sequence[str]) -> EventsOf:
    """The events of a manual decision, for the daemon or the CLI on its own."""
    names = tuple(webhooks)

    def of(decision: Decision) -> tuple[OutboxEvent, ...]:
        if not names:
            return ()
        event = decision_event(decision, node, operator)
        return (OutboxEvent(event.time, event.to_json(), names),)

    return of
