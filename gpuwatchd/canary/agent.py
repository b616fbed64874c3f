"""The daemon's side of the canaries.

Call `CanaryAgent.poll(gpus, xid_events)` once per daemon poll with the
latest GPU samples and the recent XID events. It collects the bursts that
finished since (failing those an XID hit, judging full-mantissa GEMMs across
GPUs, counting everything into the stats, feeding mismatches to the
confirmation), starts the confirmation re-runs and the bursts that are due,
and returns the findings and the stats to export. It never blocks on a
burst: bursts run in worker processes, waited on by a thread pool.

Before a burst or re-run starts on a GPU, the GPU's modes are read through
NVML (modes.py): a GPU whose compute mode, MIG or MPS state or free memory
rules a burst out gets none, and /metrics says why. Each GPU's mismatch
history is kept in the state database (`keep_history`), by UUID: a poll that
no longer enumerates a UUID forgets its history. Siblings and the software
quorum are chosen among the GPUs of one model and SM count (peers.py).

Holds the only mutable canary state of the daemon; every decision in it is
made by the pure functions of schedule.py, crosscheck.py and confirm.py, and
what each burst runs by bursts.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import pynvml

from gpuwatchd.canary import schedule
from gpuwatchd.canary.bursts import IN_MEMORY, BurstMaker, StandIn, WorkerCaches, no_faults
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.confirm import (
    ConfirmState,
    Mismatch,
    Peers,
    Rerun,
    findings,
    forget_gone,
    observe,
    observe_rerun,
)
from gpuwatchd.canary.crosscheck import crosscheck, read_book, write_book
from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.modes import GpuModes, ModeReader, skip_reason
from gpuwatchd.canary.peers import peer_groups
from gpuwatchd.canary.result import CanaryResult, Telemetry, TelemetrySource, failed
from gpuwatchd.canary.runner import (
    BurstOutcome,
    BurstRequest,
    WorkerGroup,
    fail_on_xids,
    run_burst,
)
from gpuwatchd.canary.spec import BackendKind, CanarySpec
from gpuwatchd.canary.stats import CanaryStats
from gpuwatchd.canary.wire import WireError, from_wire
from gpuwatchd.clock import Clock
from gpuwatchd.model import Finding, GpuSample, XidEvent

log = logging.getLogger(__name__)

# Bursts that may run at once: one per GPU and one for the host's cores.
MAX_CONCURRENT_BURSTS = 65


class BurstRunner(Protocol):
    def __call__(
        self,
        request: BurstRequest,
        *,
        timeout: float,
        clock: Clock,
        telemetry: TelemetrySource,
        group: WorkerGroup | None,
    ) -> BurstOutcome: ...


class MismatchLog(Protocol):
    """Where the GPUs' mismatch history persists (the state database)."""

    def since(self, since: float) -> list[dict[str, Any]]: ...

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None: ...


@dataclass(frozen=True)
class CanaryView:
    findings: tuple[Finding, ...]
    stats: CanaryStats


@dataclass(frozen=True)
class _Job:
    future: Future[BurstOutcome]
    rerun: Rerun | None


def _index(target: str) -> int:
    """The GPU index of `gpu:<index>` (or of its schedule key)."""
    return int(target.split(":")[1])


def idle(sample: GpuSample, config: CanaryConfig) -> bool:
    """Idle by NVML's utilisation; unknown utilisation is busy."""
    ratio = sample.utilization_gpu_ratio
    return ratio is not None and ratio <= config.idle_utilization


class CanaryAgent:
    def __init__(
        self,
        config: CanaryConfig,
        clock: Clock,
        *,
        gpu_backend: BackendKind | None,
        host_cores: Collection[int] = (),
        stand_ins: Sequence[StandIn] = (),
        faults: Callable[[int], tuple[FaultSpec, ...]] = no_faults,
        digest_path: str | None = None,
        runner: BurstRunner = run_burst,
        executor: Executor | None = None,
        modes: ModeReader | None = None,
        caches: WorkerCaches = IN_MEMORY,
    ) -> None:
        """`gpu_backend` checks the GPUs (None: no GPU canaries, see
        runner.choose_gpu_backend); `host_cores` are checked in turn when
        config.host_cores is on; `stand_ins` (a simulated GPU stands in as
        the one of its NVML name, the first where NVML names none of them)
        and `faults` serve simulation;
        `digest_path` keeps the agreed full-mantissa digests across restarts;
        `runner` and `executor` are where bursts run (a worker process each,
        waited on by a thread pool); `modes` reads a GPU's modes before each
        burst (None: not read, for tests without NVML); `caches` is where
        a GPU burst's worker keeps compiled kernels (bursts.WorkerCaches)."""
        self._config = config
        self._clock = clock
        self._gpu_backend = gpu_backend
        self._cores = tuple(sorted(host_cores)) if config.host_cores else ()
        self._bursts_for = BurstMaker(config, gpu_backend, self._cores, stand_ins, faults, caches)
        self._digest_path = Path(digest_path) if digest_path else None
        self._runner = runner
        self._modes = modes
        self._unchecked: dict[int, tuple[str, float]] = {}
        # GPU index -> its compute capability, as last read with its modes.
        self._capabilities: dict[int, tuple[int, int]] = {}
        # GPU UUID -> its SM count, as its backend last reported it.
        self._sm_counts: dict[str, int] = {}
        # The targets and capabilities the plan was last made for.
        self._planned_for: tuple[object, ...] | None = None
        self._log: MismatchLog | None = None
        self._executor = executor or ThreadPoolExecutor(
            MAX_CONCURRENT_BURSTS, thread_name_prefix="canary"
        )
        # The bursts' worker processes, ended at once by `close`.
        self._workers = WorkerGroup()
        # Swapped whole by poll, read by the burst threads' telemetry.
        self._samples: Mapping[int, GpuSample] = MappingProxyType({})
        self._jobs: dict[str, _Job] = {}
        self._reruns: list[Rerun] = []
        self._bursts: dict[str, int] = {}
        self._draws = 0  # bursts started, re-runs included
        self._out_of_service: frozenset[str] = frozenset()
        self._schedule = schedule.ScheduleState()
        self._confirm = ConfirmState()
        self._book = read_book(self._digest_path)
        self._stats = CanaryStats()

    def poll(
        self,
        gpus: Sequence[GpuSample],
        xid_events: Sequence[XidEvent] = (),
        quarantined: Collection[str] = (),
    ) -> CanaryView:
        """`gpus`: the latest sample of every GPU; `xid_events`: the XIDs
        since at least the oldest running burst began; `quarantined`: the
        subjects out of service, which run no canaries (nor do GPUs this
        agent confirmed)."""
        now = self._clock.now()
        self._samples = MappingProxyType({gpu.index: gpu for gpu in gpus if gpu.read})
        self._forget_gone(gpus)
        self._out_of_service = frozenset(quarantined) | frozenset(self._confirm.confirmed)
        if not self._config.enabled:
            return CanaryView((), self._stats)
        self._plan()
        self._collect(now, xid_events)
        self._start_reruns(now)
        self._start_due(now)
        if self._gpu_backend is None:
            # A node with GPUs and no working GPU backend: no silent pass.
            for gpu in self._samples:
                self._mark(gpu, "no_backend", now)
        self._unchecked = {g: u for g, u in self._unchecked.items() if g in self._samples}
        watches = {
            target: watch
            for target, watch in self._confirm.watching.items()
            if watch.until > now and target not in self._confirm.confirmed
        }
        self._stats = replace(
            self._stats,
            unchecked=MappingProxyType(dict(self._unchecked)),
            suspects=self._confirm.leads,
            watches=MappingProxyType(watches),
        )
        return CanaryView(findings(self._confirm, now), self._stats)

    def keep_history(self, store: MismatchLog) -> None:
        """Keep the GPUs' mismatch history in `store` from now on, starting
        from what it holds within the history window."""
        self._log = store
        since = self._clock.now() - self._config.history_window
        try:
            rows = store.since(since)
        except Exception as error:  # an unreadable database: start afresh, say so
            log.warning("cannot read the canary mismatch history: %s", error)
            return
        history: list[Mismatch] = []
        for row in rows:
            try:
                history.append(from_wire(Mismatch, row))
            except WireError as error:
                log.warning("ignoring a canary mismatch record: %s", error)
        self._confirm = replace(self._confirm, history=tuple(history))

    def _forget_gone(self, gpus: Sequence[GpuSample]) -> None:
        """Forget the history of GPUs no longer on the node. A poll that
        enumerates no GPU, or one whose UUID it cannot read (an NVML
        failure), says nothing about which boards left."""
        uuids = [gpu.uuid for gpu in gpus]
        if uuids and None not in uuids:
            self._confirm = forget_gone(self._confirm, {u for u in uuids if u is not None})

    def _mark(self, gpu: int, reason: str, now: float) -> None:
        known = self._unchecked.get(gpu)
        if known is None or known[0] != reason:
            self._unchecked[gpu] = (reason, now)

    def close(self) -> None:
        """Start nothing more and end the running bursts now: their workers
        are killed, so no burst hung on a GPU holds the daemon's exit."""
        self._workers.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _telemetry(self, gpu: int) -> Telemetry:
        sample = self._samples.get(gpu)
        if sample is None:
            return Telemetry()
        return Telemetry(
            temperature_celsius=sample.temperature_gpu_celsius,
            sm_clock_hertz=sample.sm_clock_hertz,
            memory_clock_hertz=sample.memory_clock_hertz,
        )

    def _targets(self) -> tuple[str, ...]:
        gpus = [f"gpu:{i}" for i in sorted(self._samples)] if self._gpu_backend else []
        cores = [f"cpu:{core}" for core in self._cores]
        return tuple(t for t in gpus + cores if t not in self._out_of_service)

    def _peers(self) -> Peers:
        return peer_groups(self._targets(), self._samples, self._sm_counts)

    def _learn_sm_counts(self, results: Sequence[CanaryResult]) -> None:
        for result in results:
            if result.uuid is not None and result.sm_count is not None:
                self._sm_counts[result.uuid] = result.sm_count

    def _idle(self, key: str) -> bool:
        if key == schedule.HOST:
            return True
        sample = self._samples.get(int(key.split(":")[1]))
        return sample is not None and idle(sample, self._config)

    def _collect(self, now: float, xid_events: Sequence[XidEvent]) -> None:
        quorum = 2 if len(self._samples) > 1 else 1
        for key, job in list(self._jobs.items()):
            if not job.future.done():
                continue
            del self._jobs[key]
            outcome = fail_on_xids(job.future.result(), xid_events)
            book, results = crosscheck(self._book, outcome.results, quorum)
            if book.reference != self._book.reference:
                write_book(self._digest_path, book)
            self._book = book
            self._stats = self._stats.add(results)
            self._learn_sm_counts(results)
            targets = self._peers()
            for result in results:
                if result.result != "pass":
                    log.warning(
                        "canary %s on %s: %s %s",
                        result.canary,
                        result.target,
                        result.result,
                        result.message or "",
                    )
            before = self._confirm
            if job.rerun is None:
                self._confirm, reruns = observe(self._confirm, results, now, self._config, targets)
            else:
                self._confirm, reruns = observe_rerun(
                    self._confirm, job.rerun, results, now, self._config, targets
                )
            self._reruns.extend(reruns)
            self._record(before.history)
            if self._confirm.rebaseline:
                self._book = self._book.forget(self._confirm.rebaseline)
                write_book(self._digest_path, self._book)
                self._confirm = replace(self._confirm, rebaseline=frozenset())
            self._schedule = schedule.finished(
                self._config, self._schedule, key, now, outcome.device_seconds
            )

    def _record(self, before: Sequence[Mismatch]) -> None:
        known = set(before)
        new = [asdict(m) for m in self._confirm.history if m not in known]
        if not new or self._log is None:
            return
        try:
            self._log.append(new)
        except Exception as error:  # the database is down: the history stays in memory
            log.warning("cannot keep the canary mismatch history: %s", error)

    def _may_start(self, key: str, now: float, idle: bool) -> bool:
        """Whether the GPU's modes let a burst or re-run start now; marks
        the reason on /metrics when not."""
        if key == schedule.HOST or self._modes is None:
            return True
        gpu = int(key.split(":")[1])
        modes: GpuModes | None
        try:
            modes = self._modes(gpu)
        except pynvml.NVMLError as error:
            log.warning("cannot read the modes of GPU %d: %s", gpu, error)
            modes = None
        if modes is not None and modes.compute_capability is not None:
            self._capabilities[gpu] = modes.compute_capability
        reason = skip_reason(modes, idle, self._config)
        if reason is None:
            self._unchecked.pop(gpu, None)
            return True
        self._mark(gpu, reason, now)
        return False

    def _start_reruns(self, now: float) -> None:
        waiting: list[Rerun] = []
        targets = set(self._targets())
        for rerun in self._reruns:
            key = schedule.schedule_key(rerun.target)
            if rerun.target not in targets:
                continue  # gone from the node: its lead expires unsettled
            idle = self._idle(key)
            entry = self._schedule.of(key)
            # A re-run is a burst like any other: `when: idle` and the duty
            # budget hold; one that never gets its turn expires with its lead.
            if entry.running or not schedule.may_use(self._config, entry, now, idle):
                waiting.append(rerun)
                continue
            if not self._may_start(key, now, idle):
                waiting.append(rerun)
                continue
            self._schedule = schedule.rerun_started(self._schedule, key, now, idle)
            self._submit(key, self._request(rerun.target, rerun.specs), rerun)
        self._reruns = [r for r in waiting if r.suspect in self._confirm.leads]

    def _start_due(self, now: float) -> None:
        keys = {t for t in self._targets() if t.startswith("gpu:")}
        if self._cores:
            keys.add(schedule.HOST)
        idle = {key: self._idle(key) for key in keys}
        watching = self._confirm.watched(now)
        for key in schedule.due(self._config, self._schedule, now, idle, watching):
            if not self._may_start(key, now, idle[key]):
                continue
            count = self._bursts.get(key, 0)
            self._bursts[key] = count + 1
            seed = self._config.seed + count % self._config.seed_rotation
            self._schedule = schedule.started(self._schedule, key, now, idle[key])
            self._submit(key, self._request(key, self._suite(key, seed, now)), None)

    def _plan(self) -> None:
        """Export every planned (target, canary) pair, anew only when the
        targets or what the GPUs' capabilities allow have changed."""
        key = (self._targets(), tuple(sorted(self._capabilities.items())))
        if key != self._planned_for:
            self._planned_for = key
            self._stats = self._stats.plan(self._planned())

    def _planned(self) -> Iterator[tuple[str, str]]:
        """Every (target, canary) the regular bursts will run."""
        for target in self._targets():
            key = schedule.schedule_key(target)
            for spec in self._suite(key, self._config.seed, 0.0):
                yield target, spec.name

    def _suite(self, key: str, seed: int, now: float) -> tuple[CanarySpec, ...]:
        capability = None if key == schedule.HOST else self._capabilities.get(_index(key))
        return self._bursts_for.suite(key, seed, now, capability)

    def _request(self, target: str, specs: tuple[CanarySpec, ...]) -> BurstRequest:
        sample = self._samples.get(_index(target)) if target.startswith("gpu:") else None
        return self._bursts_for.request(target, specs, sample, self._draws)

    def _submit(self, key: str, request: BurstRequest, rerun: Rerun | None) -> None:
        self._draws += 1
        future = self._executor.submit(self._run, request)
        self._jobs[key] = _Job(future, rerun)

    def _run(self, request: BurstRequest) -> BurstOutcome:
        started = self._clock.now()
        try:
            return self._runner(
                request,
                timeout=self._config.timeout,
                clock=self._clock,
                telemetry=self._telemetry,
                group=self._workers,
            )
        except Exception as error:  # cannot start a worker: the burst failed
            log.exception("canary burst could not run")
            first = request.specs[0]
            core = request.cpu_cores[0] if request.cpu_cores else None
            result = failed(
                first,
                "error",
                f"the burst could not run: {error}",
                gpu=request.gpu,
                uuid=request.uuid,
                cpu_core=core,
                backend=request.backend,
            )
            return BurstOutcome(request, (result,), started, self._clock.now())
