"""The poll loop: read every source, judge, decide, persist, publish.

One thread runs `step()` every poll interval: sources → History → checks →
policy → store (with the webhook events of the decisions, in the same
transaction) → a new immutable Snapshot that replaces the old one in a single
assignment, so the HTTP server's threads always read a whole poll → the
actions (webhook senders, schedulers), which act in threads of their own.

An operator's quarantine or release through the control API takes effect at
once: `quarantine()` and `release()` write it, judge the last poll's findings
again on top of it and publish a new Snapshot before they return.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from gpuwatchd.actions.dispatch import Actions
from gpuwatchd.actions.scheduler import DRAIN_NOTE
from gpuwatchd.canary.agent import CanaryAgent, CanaryView
from gpuwatchd.checks import CheckOutput, gpu_lost, nvlink
from gpuwatchd.checks.infiniband import learned_ports
from gpuwatchd.checks.registry import CheckInputs, ChecksRun, run_all
from gpuwatchd.clock import Clock
from gpuwatchd.config import Config, parse_listen
from gpuwatchd.dcgm import DcgmRun, record_run
from gpuwatchd.evidence import board_evidence
from gpuwatchd.exporter import MetricsPage
from gpuwatchd.history import History
from gpuwatchd.identity import Roster, absent_finding, placed, reconcile, stamp
from gpuwatchd.model import Decision, Finding, GpuSample, Quarantine, Reading, Severity
from gpuwatchd.notify import Notifier
from gpuwatchd.policy import NODE, PolicyResult, PolicyState, evaluate, observed_subjects
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.sources import Source
from gpuwatchd.store import (
    JournalEntry,
    StateConflict,
    Store,
    StoreError,
    UnsavedPoll,
    read_boot_id,
)

log = logging.getLogger(__name__)

# A finding's log level, so that journald's priority says its severity: an
# [ok] finding (an XID that condemns nothing) is news, a critical one an error
# (`journalctl -p err` and syslog-based alerting see it; warning went unseen).
FINDING_LOG_LEVELS = {
    Severity.OK: logging.INFO,
    Severity.WARN: logging.WARNING,
    Severity.CRITICAL: logging.ERROR,
}

# The state database fact that holds the InfiniBand ports seen ACTIVE (Store.fact).
EXPECTED_PORTS = "infiniband_ports_seen_active"
# A difference between the wall clock and the daemon's reckoning that is a
# step, not the drift of a poll's few instructions.
WALL_STEP_SECONDS = 1.0
# Polls with something to journal kept while the database cannot be written:
# about a day of a fault raised and cleared every poll at the default interval.
MAX_UNSAVED_POLLS = 10_000
STORE_CHECK = "store"
REFUSED_NOTES_PER_MINUTE = 10
JOURNAL_PRUNE_EVERY = 3600.0


def _gathered(readings: tuple[Reading, ...], now: float, polls: int) -> Snapshot:
    """The merged readings of one poll, before judgement."""
    gpus = tuple(gpu for reading in readings for gpu in reading.gpus or ())
    devices = tuple(device for reading in readings for device in reading.infiniband_devices or ())
    ports = tuple(port for reading in readings for port in reading.ports or ())
    functions = tuple(f for reading in readings for f in reading.pcie_functions or ())
    driver = next((r.driver_version for r in readings if r.driver_version), None)
    return Snapshot(
        time=now,
        gpus=tuple(sorted(gpus, key=lambda gpu: gpu.index)),
        infiniband_devices=tuple(sorted(devices, key=lambda device: device.device)),
        ports=tuple(sorted(ports, key=lambda port: (port.device, port.port))),
        pcie_functions=tuple(sorted(functions, key=lambda function: function.address)),
        driver_version=driver,
        source_up={reading.source: reading.error is None for reading in readings},
        source_errors={r.source: r.error for r in readings if r.error is not None},
        polls=polls,
    )


def open_store(state_dir: str, now: float) -> tuple[Store, str | None]:
    """The state database, and what was lost on the way when it was damaged
    (it is moved aside and a new one started), or an in-memory one when it
    cannot be used: the daemon keeps monitoring and exports
    gpuwatchd_state_persisted 0. Opened exclusive (no -shm file for a
    SIGBUS to come from: gpuwatchd.store). Raises StoreError when another
    process holds it (another daemon on this state directory): two daemons
    deciding for one node, one of them forgetting, is worse than none
    starting; and when its schema is newer than this gpuwatchd's (a
    rollback): run without it, every quarantine in it would be released
    unseen, where a daemon that does not start is seen at once
    (GpuwatchdDown, a stale slurm-healthcheck)."""
    try:
        return Store.open(state_dir, exclusive=True), None
    except StoreError as error:
        if error.held or error.newer:
            raise
        if not error.damaged:
            log.error("%s; decisions will not survive a restart", error)
            return Store.in_memory(), None
        aside = f"{error.path}.damaged-{int(now)}"
        try:
            for suffix in ("-wal", "-shm", ""):
                if os.path.exists(error.path + suffix):
                    os.rename(error.path + suffix, aside + suffix)
            store = Store.open(state_dir, exclusive=True)
        except (OSError, StoreError) as again:
            log.error(
                "%s; cannot move it aside: %s; decisions will not survive a restart", error, again
            )
            return Store.in_memory(), None
        lost = (
            f"the state database was damaged ({error.problem.split(';')[0]}) and was moved "
            f"aside to {aside}: its quarantines, journal and queued webhook events are lost; "
            "check this node's scheduler drains by hand"
        )
        log.critical("%s", lost)
        return store, lost


def _boot_id(path: str | None) -> str:
    """This boot's id (XID escalation counts reboots by it), or "unknown"."""
    try:
        return read_boot_id(path) if path else read_boot_id()
    except (OSError, ValueError) as error:
        log.warning("cannot read the boot id: %s; reboots will not be counted", error)
        return "unknown"


class Daemon:
    def __init__(
        self,
        config: Config,
        sources: Sequence[Source],
        clock: Clock,
        before_poll: Callable[[float], None] | None = None,
        boot_id_path: str | None = None,
        canary: CanaryAgent | None = None,
    ) -> None:
        self.config = config
        self.sources = list(sources)
        self.canary = canary
        self.clock = clock
        self.before_poll = before_poll
        self.history = History(max_age_seconds=config.daemon.history)
        self.stop_event = threading.Event()
        self._polls = 0
        now = clock.now()
        self.store, lost = open_store(config.daemon.state_dir, now)
        self._persisted = self.store.persistent
        if canary is not None:
            canary.keep_history(self.store.canary)
        # Polls whose journal rows and webhook events the database could not take yet.
        self._unsaved: list[UnsavedPoll] = []
        self._store_findings: tuple[Finding, ...] = ()
        if lost is not None:
            self._store_findings = (
                Finding(
                    subject=NODE,
                    check=STORE_CHECK,
                    code="state_lost",
                    severity=Severity.WARN,
                    message=lost,
                    evidence={"path": self.store.path},
                ),
            )
            self._write(lambda: self.store.journal.note("state_lost", NODE, lost, now))
        self.boot_id = _boot_id(boot_id_path)
        self._write(lambda: self.store.boots.add(self.boot_id, now))
        # The last samples of the previous run make the first rates right. Its
        # GPUs' wait for the first poll that says which board is at which
        # index now (`_place_boards`).
        self._restored: list[Reading] = []
        for reading in self.store.samples.readings(now, max_age=config.daemon.history):
            self.history.record(replace(reading, gpus=None))
            if reading.gpus:
                self._restored.append(reading)
        self.state: PolicyState = self.store.load_state()
        # The boards NVML enumerated at the last poll that read them.
        self._roster = Roster()
        # Whether every source was down at the last poll (policy's `blind`).
        self._blind = False
        self._known_gpus = self._load_known_gpus()
        # Read at start only: a port forgotten in the database (removed on
        # purpose) is forgotten by the daemon when it restarts.
        self._expected_ports = self._load_expected_ports()
        self._learned_links = self._load_learned_links()
        self._source_errors: dict[str, str] = {}
        self.actions = Actions(
            config.actions,
            self.store,
            clock,
            policy_dry_run=config.policy.dry_run,
            listen_port=parse_listen(config.daemon.listen)[1],
        )
        # Serialises judging between the poll loop and the API's manual changes.
        self._judging = threading.Lock()
        self._checked = CheckOutput(findings=(), measurements=())
        self._check_errors: dict[str, str] = {}
        # The wall clock's lead over the daemon's reckoning (clock.py), last seen.
        self._wall_offset = clock.wall() - now
        webhooks, schedulers = self.actions.status()
        self._snapshot = Snapshot(
            time=now,
            quarantines=self.state.quarantines,
            webhooks=webhooks,
            schedulers=schedulers,
            export=config.export,
        )
        self.metrics = MetricsPage(lambda: self._snapshot)
        # The whole page uncached, for whoever renders it with prometheus_client.
        self.registry: CollectorRegistry = self.metrics.registry
        self._refused_total = Counter(
            "gpuwatchd_api_refused_requests",
            "Control API writes refused (no or a wrong token), journaled or not.",
            registry=self.metrics.live,
        )
        self._refused_lock = threading.Lock()
        self._refused_window = -math.inf
        self._refused_notes = 0
        self._refused_left_out = 0
        self._pruned = -math.inf

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def _write(self, write: Callable[[], object]) -> None:
        try:
            write()
        except StoreError as error:
            log.error("%s", error)
            self._persisted = False

    def _keep_unsaved(self, error: StoreError, poll: UnsavedPoll) -> None:
        """Keep what `poll` could not write, for the next poll to write."""
        if self._persisted:
            log.error("%s; decisions are kept in memory and written when it can be", error)
        self._persisted = False
        readings = tuple(r for r in poll.readings if r.xid_events)
        poll = replace(poll, readings=readings)
        if poll.empty:
            return
        self._unsaved.append(poll)
        if len(self._unsaved) > MAX_UNSAVED_POLLS:
            dropped = self._unsaved.pop(0)
            log.error(
                "%d polls wait for the state database: the journal and webhook events of "
                "the oldest (%s) are dropped",
                MAX_UNSAVED_POLLS,
                dropped.now,
            )

    def _reopen_if_replaced(self) -> None:
        """A database file removed under the running daemon is made anew from
        what it holds in memory. Holds `_judging`."""
        try:
            if not self.store.reopen_if_replaced():
                return
            log.error(
                "state database %s was removed or replaced while the daemon ran: a new one is "
                "written from memory (the journal and queued webhook events in the old one "
                "are lost)",
                self.store.path,
            )
            self.state = self.store.restore(self.state)
        except StoreError as error:
            log.error("%s", error)

    def _poll_source(self, source: Source, now: float) -> Reading:
        try:
            return source.poll(now)
        except Exception as error:  # a source bug must not stop the others
            log.exception("source %s failed", source.name)
            return Reading(source=source.name, time=now, error=f"{type(error).__name__}: {error}")

    def _load_known_gpus(self) -> tuple[gpu_lost.KnownGpu, ...]:
        try:
            return gpu_lost.decode_known(self.store.facts.get(gpu_lost.KNOWN_GPUS_FACT))
        except StoreError as error:
            log.error("%s; the GPUs of the first healthy start are learned again", error)
            return ()

    def _load_expected_ports(self) -> frozenset[str]:
        try:
            ports = self.store.facts.get(EXPECTED_PORTS)
        except StoreError as error:
            log.error("%s; the InfiniBand ports to expect are learned again", error)
            return frozenset()
        return (
            frozenset(p for p in ports if isinstance(p, str))
            if isinstance(ports, list)
            else frozenset()
        )

    def _learn_gpus(self, readings: tuple[Reading, ...], now: float) -> None:
        """Record the GPUs of a healthy poll: the expectation when none is
        configured, and the names of the missing GPUs either way."""
        gpus = [gpu for r in readings if r.error is None for gpu in r.gpus or ()]
        learned = gpu_lost.known_after(self._known_gpus, gpus)
        if learned is None:
            return
        log.info("expecting %d GPU(s) from now on, as this healthy poll read", len(learned))
        self._known_gpus = learned
        data = [asdict(gpu) for gpu in learned]
        self._write(lambda: self.store.facts.put(gpu_lost.KNOWN_GPUS_FACT, data, now))

    def _place_boards(self, readings: tuple[Reading, ...]) -> None:
        """When this poll's GPUs are not those of the last (the first poll, or
        NVML enumerating anew), put what the database holds of each board
        where the board is now: the restored samples into History, before
        this poll's, and the quarantines and health states (identity.py).
        Holds `_judging`, which guards the state."""
        gpus = [gpu for reading in readings if reading.error is None for gpu in reading.gpus or ()]
        roster = Roster.of(gpus)
        if not roster.boards or roster == self._roster:
            return
        self._roster = roster
        for reading in self._restored:
            mine = tuple(p for gpu in reading.gpus or () if (p := placed(gpu, roster)))
            if mine:
                self.history.record(replace(reading, gpus=mine))
        self._restored.clear()
        before = self.state
        self.state = reconcile(self.state, roster)
        for held in set(self.state.quarantines) - set(before.quarantines):
            log.warning(
                "board %s: its quarantine (%s) is now under %s",
                held.uuid,
                held.reason,
                held.subject,
                extra={"subject": held.subject},
            )

    def _decide(self, readings: tuple[Reading, ...], now: float) -> Snapshot:
        boots = self.store.boots.record()
        self._learn_gpus(readings, now)
        inputs = CheckInputs(
            self.history,
            now,
            boots,
            self._known_gpus,
            self._expected_ports,
            learned_links=self._learned_links,
            canaries=self.canary is not None,
        )
        run = run_all(inputs, self.config.checks)
        checked = self._carry_failed_checks(run)
        gathered = replace(_gathered(readings, now, self._polls), check_errors=run.failed)
        canary = self._poll_canary(now, gathered.gpus)
        if canary is not None:
            checked = replace(checked, findings=(*checked.findings, *canary.findings))
            gathered = replace(gathered, canary=canary.stats)
        with self._judging:
            self._checked = checked
            result = self._judge(now, readings, self.boot_id)
            return self._publish(gathered, result)

    def _carry_failed_checks(self, run: ChecksRun) -> CheckOutput:
        """This poll's output, with the last findings of each check that failed
        now: a check's bug neither raises nor clears what it last found."""
        for name, error in run.failed.items():
            if self._check_errors.get(name) != error:
                log.error("check %s failed: %s; its last findings stand", name, error)
        for name in self._check_errors.keys() - run.failed.keys():
            log.warning("check %s works again", name)
        self._check_errors = dict(run.failed)
        if not run.failed:
            return run.output
        kept = tuple(f for f in self._checked.findings if f.check in run.failed)
        return replace(run.output, findings=(*run.output.findings, *kept))

    def _poll_canary(self, now: float, gpus: Sequence[GpuSample]) -> CanaryView | None:
        """Start due canary bursts on this poll's GPUs and collect finished
        ones (never blocks)."""
        if self.canary is None:
            return None
        # Every XID since the oldest burst that may still be running began.
        horizon = self.config.canary.timeout + self.config.daemon.poll_interval
        return self.canary.poll(
            gpus,
            self.history.xid_events(since=now - horizon),
            quarantined={q.subject for q in self.state.quarantines if not q.dry_run},
        )

    def _judge(
        self, now: float, readings: tuple[Reading, ...] = (), boot_id: str | None = None
    ) -> PolicyResult:
        """Policy over the last checks' findings and the actions' own, saved
        with the poll's readings and webhook events. Holds `_judging`."""
        findings = (*self._checked.findings, *self.actions.findings(), *self._store_findings)
        subjects = observed_subjects(self.history)
        self._reopen_if_replaced()
        for _ in range(3):
            absent = absent_finding(self.state.quarantines)
            judged = (*findings, absent) if absent is not None else findings
            result = evaluate(judged, self.state, now, self.config.policy, subjects, self._blind)
            result = stamp(result, self._roster)
            events = self.actions.events(result)
            try:
                self.state = self.store.save_poll(
                    result,
                    now=now,
                    boot_id=boot_id,
                    readings=readings,
                    events=events,
                    earlier=self._unsaved,
                    wall=self.clock.wall(),
                )
            except StateConflict:
                # An operator quarantined or released something since we read
                # the state: judge again on top of their change.
                self.state = self.store.load_state()
            except StoreError as error:
                self._keep_unsaved(error, UnsavedPoll(result, now, boot_id, readings, events))
                self.state = result.state
                break
            else:
                if self._unsaved:
                    log.warning(
                        "state database writable again: %d polls written", len(self._unsaved)
                    )
                self._unsaved.clear()
                self._persisted = self.store.persistent
                break
        self._log_changes(result)
        return result

    def _publish(self, base: Snapshot, result: PolicyResult) -> Snapshot:
        """`base` with `result` and the actions' status: the new Snapshot."""
        webhooks, schedulers = self.actions.status()
        snapshot = replace(
            base,
            findings=result.findings,
            measurements=self._checked.measurements,
            health=result.health,
            health_since=result.health_since,
            node_health=result.node_health,
            quarantines=result.quarantines,
            state_persisted=self._persisted,
            webhooks=webhooks,
            schedulers=schedulers,
            export=self.config.export,
        )
        self._snapshot = snapshot
        self.actions.publish(snapshot)
        return snapshot

    # --- the control API (gpuwatchd.server.Control) ------------------------------

    def now(self) -> float:
        return self.clock.now()

    def quarantine(
        self, subject: str, reason: str, operator: str
    ) -> tuple[Decision | None, Quarantine]:
        """An operator's quarantine, in effect (and on /metrics) when this
        returns: its decision (None when the subject was already quarantined)
        and the quarantine that stands, read before another client's release
        can come between (review adversarial-2, row 219)."""
        with self._judging:
            now = self.clock.now()
            self._reopen_if_replaced()
            events = self.actions.manual_events(operator)
            board = self._roster.board_of(subject)
            decision = self.store.quarantine(subject, reason, operator, now, events, board)
            if decision is not None:
                _log_decision(decision, operator)
                self._rejudge(now)
            held = next(q for q in self.store.quarantines() if q.subject == subject)
        return decision, held

    def release(self, subject: str, reason: str, operator: str) -> Decision | None:
        """An operator's release; None when the subject was not quarantined."""
        with self._judging:
            now = self.clock.now()
            self._reopen_if_replaced()
            events = self.actions.manual_events(operator)
            decision = self.store.release(subject, operator, now, reason, events)
            if decision is not None:
                _log_decision(decision, operator)
                self._rejudge(now)
        return decision

    def quarantines(self) -> tuple[Quarantine, ...]:
        return self.store.quarantines()

    def journal(
        self, since: float | None, subject: str | None, limit: int, until: float | None = None
    ) -> tuple[JournalEntry, ...]:
        return self.store.journal.entries(since=since, subject=subject, limit=limit, until=until)

    def evidence(self, board: str) -> dict[str, Any]:
        return board_evidence(self.store, board)

    def record_dcgm(self, run: DcgmRun) -> int:
        """A DCGM run `canary --dcgm` made while the daemon holds the
        database; the daemon itself never runs one (it takes the GPU)."""
        return record_run(self.store, run)

    def refused(self, message: str) -> None:
        """A refused write: counted on /metrics, and logged and journaled up to
        REFUSED_NOTES_PER_MINUTE a minute, so that whoever reaches the
        listener can neither flood the log nor grow the database."""
        self._refused_total.inc()
        now = self.clock.now()
        with self._refused_lock:
            if now - self._refused_window >= 60.0:
                left_out, self._refused_left_out = self._refused_left_out, 0
                self._refused_window, self._refused_notes = now, 0
                if left_out:
                    message = (
                        f"{message} ({left_out} more refused in the minute before, not logged)"
                    )
            if self._refused_notes >= REFUSED_NOTES_PER_MINUTE:
                self._refused_left_out += 1
                return
            self._refused_notes += 1
        log.warning("%s", message)
        self._write(lambda: self.store.journal.note("api_refused", NODE, message, now))

    def _rejudge(self, now: float) -> None:
        """Judge the last poll's findings again on top of a manual change, so
        that what follows from it (the node's GPU share) follows at once too."""
        self.state = self.store.load_state()
        self._publish(self._snapshot, self._judge(now))

    @staticmethod
    def _log_changes(result: PolicyResult) -> None:
        for finding in result.raised:
            log.log(
                FINDING_LOG_LEVELS[finding.severity],
                "%s: %s %s: %s",
                finding.subject,
                finding.severity.label,
                finding.code,
                finding.message,
                extra={"subject": finding.subject},
            )
        for decision in result.decisions:
            _log_decision(decision)

    def step(self) -> Snapshot:
        """One poll of every source; returns the Snapshot it published."""
        started = time.perf_counter()
        now = self.clock.now()
        self._watch_wall_clock(now)
        if self.before_poll is not None:
            self.before_poll(now)
        readings = tuple(self._poll_source(source, now) for source in self.sources)
        # Every source down: nothing this poll says the node is well.
        self._blind = bool(readings) and all(r.error is not None for r in readings)
        with self._judging:
            self._place_boards(readings)
        for reading in readings:
            self._log_source_error(reading)
            self.history.record(reading)
        self._learn_ports(readings, now)
        self._learn_links(readings, now)
        self._polls += 1
        snapshot = self._decide(readings, now)
        self._prune_journal(now)
        self.metrics.poll_duration.observe(time.perf_counter() - started)
        return snapshot

    def _log_source_error(self, reading: Reading) -> None:
        """A source's error when it starts or changes, and its recovery: a
        lasting one (a node without InfiniBand) is in source_up, not every poll."""
        previous = self._source_errors.get(reading.source)
        if reading.error == previous:
            return
        if reading.error is not None:
            log.warning("source %s: %s", reading.source, reading.error)
            self._source_errors[reading.source] = reading.error
        else:
            log.info("source %s: working again", reading.source)
            del self._source_errors[reading.source]

    def _learn_ports(self, readings: Sequence[Reading], now: float) -> None:
        """Remember the InfiniBand ports seen ACTIVE, so that one gone after a
        restart or a reboot is missed (checks.infiniband.expect_ports_seen_active)."""
        if not self.config.checks.infiniband.expect_ports_seen_active:
            return
        new = learned_ports(readings) - self._expected_ports
        if new:
            log.info("expecting InfiniBand port(s) from now on: %s", ", ".join(sorted(new)))
            self._expected_ports |= new
            ports = sorted(self._expected_ports)
            self._write(lambda: self.store.facts.put(EXPECTED_PORTS, ports, now))

    def _load_learned_links(self) -> dict[str, frozenset[int]]:
        try:
            return nvlink.decode_learned(self.store.facts.get(nvlink.LINKS_SEEN_UP_FACT))
        except StoreError as error:
            log.error("%s; the NVLinks to expect are learned again", error)
            return {}

    def _learn_links(self, readings: Sequence[Reading], now: float) -> None:
        """Remember the NVLinks seen up on each board, by UUID, so that one not
        up after a restart or a reboot is missed (checks.nvlink). Written only
        when a poll shows a link up that was not known."""
        grown = nvlink.links_after(self._learned_links, readings)
        if not grown:
            return
        for uuid, links in sorted(grown.items()):
            numbers = ", ".join(map(str, sorted(links)))
            log.info("expecting NVLink(s) %s of %s from now on", numbers, uuid)
        self._learned_links = {**self._learned_links, **grown}
        data = nvlink.encode_learned(self._learned_links)
        self._write(lambda: self.store.facts.put(nvlink.LINKS_SEEN_UP_FACT, data, now))

    def _prune_journal(self, now: float) -> None:
        if now - self._pruned < JOURNAL_PRUNE_EVERY:
            return
        self._pruned = now
        before = now - self.config.daemon.journal_retention
        try:
            pruned = self.store.journal.prune(before, keep_kinds=(DRAIN_NOTE,))
        except StoreError as error:
            log.error("%s", error)
            return
        if pruned:
            log.info("deleted %d journal entries older than the retention", pruned)

    def _watch_wall_clock(self, now: float) -> None:
        """Say when the wall clock steps: windows, rates and confirmation keep
        the daemon's monotonic reckoning, and so do its timestamps until it
        restarts."""
        offset = self.clock.wall() - now
        if abs(offset - self._wall_offset) > WALL_STEP_SECONDS:
            log.warning(
                "the wall clock stepped by %+.1fs; polling, windows and confirmation go on "
                "unchanged, and timestamps stay %+.1fs from the wall clock until restart",
                offset - self._wall_offset,
                -offset,
            )
            self._wall_offset = offset

    def run(self, notifier: Notifier | None = None) -> None:
        """Poll until `stop()`; each poll starts one interval after the last one started.

        systemd's watchdog is fed from this loop only, after a poll that
        completed and while waiting for the next, so a poll that hangs (a
        sysfs read that never returns, say) stops the pings and systemd
        restarts the daemon. NVML reads do not hang it: the source gives up a
        GPU's read at its deadline and reports that GPU unreadable.
        """
        notifier = notifier or Notifier({})
        interval = self.config.daemon.poll_interval
        self.actions.start()
        ping_every = (notifier.watchdog_seconds or math.inf) / 2
        while not self.stop_event.is_set():
            started = self.clock.now()
            snapshot = self.step()
            self.metrics.prerender()
            if snapshot.polls == 1:
                notifier.ready(f"polling every {interval:g}s")
            notifier.watchdog()
            while not self.stop_event.is_set():
                remaining = interval - (self.clock.now() - started)
                if remaining <= 0:
                    break
                if self.clock.wait(self.stop_event, min(remaining, ping_every)):
                    break
                notifier.watchdog()
        notifier.stopping()

    def stop(self) -> None:
        self.stop_event.set()

    def close(self) -> None:
        self.actions.stop()
        if self.canary is not None:
            self.canary.close()
        for source in self.sources:
            try:
                source.close()
            except Exception:
                log.exception("closing source %s failed", source.name)
        self.store.close()


def _log_decision(decision: Decision, operator: str | None = None) -> None:
    """One line a decision, automatic or an operator's (`by` whom)."""
    log.warning(
        "%s: %s%s (%s%s): %s",
        decision.subject,
        decision.kind,
        " [dry run]" if decision.dry_run else "",
        decision.source,
        f", by {operator}" if operator else "",
        decision.reason,
        extra={"subject": decision.subject},
    )
