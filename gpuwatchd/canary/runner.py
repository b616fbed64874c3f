"""Running a burst out of the daemon's process, with a hard timeout.

A burst runs in a fresh `python -m gpuwatchd.canary.worker` process: the
request goes in as JSON on stdin, the worker answers with one JSON line as
each canary starts and one with each result. A canary that hangs is killed
with its whole process group at the timeout (`timeout`); a worker that
crashes, or a device call that fails, ends the burst with an `error` for the
canary in flight. Either way the caller gets an outcome and keeps going:
nothing of the device's state (a CUDA context left broken, a hung kernel)
survives into the daemon. An XID on the GPU during the burst fails it too
(`fail_on_xids`).

Each result is stamped with the caller's clock and the GPU's telemetry as
the result arrives.

Workers never outlive their caller: a caller that stops ends every burst at
once (`WorkerGroup.stop`: each worker's process group killed, so a burst
hung in a kernel does not hold a daemon's exit for its timeout), and a
worker dies with the process that started it, even by SIGKILL (it asks the
kernel for SIGKILL when its parent dies: PR_SET_PDEATHSIG, worker.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import IO

from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.result import (
    CanaryResult,
    Outcome,
    TelemetrySource,
    failed,
    no_telemetry,
)
from gpuwatchd.canary.spec import BackendKind, CanarySpec
from gpuwatchd.canary.wire import WireError, from_wire, to_wire
from gpuwatchd.clock import Clock
from gpuwatchd.model import XidEvent

WORKER_MODULE = "gpuwatchd.canary.worker"
# The worker's environment is pinned: of the daemon's it inherits only what
# finds Python, the libraries and the driver, never what changes what CUDA,
# cuBLAS or CuPy compute (NVIDIA_TF32_OVERRIDE, CUBLAS_WORKSPACE_CONFIG,
# CUDA_VISIBLE_DEVICES, CUPY_TF32 ...), which would change a digest or
# quietly turn a canary into another.
INHERITED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "LANG", "TZ")
WORKER_ENVIRONMENT: Mapping[str, str] = {
    # One BLAS thread keeps pinning meaningful (a pinned worker computes on
    # its core alone) and results independent of thread count.
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # CUDA's device order is NVML's (and nvidia-smi's) only in PCI order.
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    # Never an MPS client: with no control daemon's pipe in this directory,
    # CUDA runs without MPS, so the worker is never queued behind another
    # user's MPS server until its timeout (modes.py skips GPUs MPS serves).
    "CUDA_MPS_PIPE_DIRECTORY": "/nonexistent/gpuwatchd-no-mps",
}
STDERR_TAIL_LINES = 20
# The worker is told its parent's pid: if the parent is gone by the time the
# worker has asked for its death signal, the worker ends at once.
PARENT_PID = "GPUWATCHD_CANARY_PARENT"


@dataclass(frozen=True)
class BurstRequest:
    """What one worker runs: `specs` on one GPU (the CUDA backend, or the
    CPU backend standing in for it), or on each of the host's `cpu_cores`
    in turn (the CPU backend)."""

    backend: BackendKind
    specs: tuple[CanarySpec, ...]
    gpu: int | None = None  # NVML index
    uuid: str | None = None
    cpu_cores: tuple[int, ...] = ()
    # The CPU backend standing in for a GPU of a simulated node.
    stand_in_model: str | None = None
    stand_in_sm_count: int | None = None
    faults: tuple[FaultSpec, ...] = ()
    # The GPU's temperature as the burst starts, and which burst this is:
    # what simulated intermittent faults are drawn from.
    temperature_celsius: float | None = None
    fault_draw: int = 0
    reference_cache: str | None = None
    hbm_free_fraction: float = 0.05
    # Where CuPy keeps its compiled kernels (CUPY_CACHE_DIR): under the state
    # directory, the only place the systemd unit lets the daemon write;
    # None keeps them in the worker's memory (CUPY_CACHE_IN_MEMORY).
    kernel_cache: str | None = None
    # Where the driver keeps the kernels it compiles from PTX (CUDA_CACHE_PATH;
    # its default, ~/.nv/ComputeCache, is read-only under the unit), when
    # NVRTC is older than the GPU; None: the driver's default.
    jit_cache: str | None = None

    def __post_init__(self) -> None:
        if not self.specs:
            raise ValueError("a burst needs at least one canary")
        if self.cpu_cores and (self.backend != "cpu" or self.gpu is not None):
            raise ValueError("the host's cores are checked by the cpu backend, without a GPU")


@dataclass(frozen=True)
class BurstOutcome:
    request: BurstRequest
    results: tuple[CanaryResult, ...]
    started: float  # the caller's clock
    finished: float

    @property
    def device_seconds(self) -> float:
        """What the canaries took of the device (the duty budget counts this):
        the device time of each canary's calls, copies included, and the
        whole duration of one that did not finish (timed out, crashed)."""
        return sum(
            result.duration_seconds if result.device_seconds is None else result.device_seconds
            for result in self.results
        )

    @property
    def device_memory_bytes(self) -> int | None:
        """The most device memory a canary of the burst held (each gives its
        memory back as it ends); None where the backend cannot tell."""
        held = [r.device_memory_bytes for r in self.results if r.device_memory_bytes is not None]
        return max(held) if held else None


def pinned_environment(kernel_cache: str | None, jit_cache: str | None = None) -> dict[str, str]:
    """The worker's environment, the same whatever the daemon's."""
    environment = {name: os.environ[name] for name in INHERITED if name in os.environ}
    environment.update(WORKER_ENVIRONMENT)
    if kernel_cache:
        environment["CUPY_CACHE_DIR"] = kernel_cache
    else:
        environment["CUPY_CACHE_IN_MEMORY"] = "1"
    if jit_cache:
        environment["CUDA_CACHE_PATH"] = jit_cache
    return environment


def worker_environment(request: BurstRequest) -> dict[str, str]:
    environment = pinned_environment(request.kernel_cache, request.jit_cache)
    if request.backend == "cuda":
        # NVML's UUID names the very GPU NVML's index does; without one, the
        # index in PCI order (CUDA_DEVICE_ORDER).
        device = request.uuid or (str(request.gpu) if request.gpu is not None else None)
        if device is not None:
            environment["CUDA_VISIBLE_DEVICES"] = device
    return environment


class WorkerGroup:
    """The worker processes one caller's bursts run in, so that the caller
    can end them all at once when it stops (`stop`); a worker started after
    that is killed as it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: set[_Worker] = set()
        self._stopped = False

    def add(self, worker: _Worker) -> None:
        with self._lock:
            stopped = self._stopped
            if not stopped:
                self._workers.add(worker)
        if stopped:
            worker.kill()

    def discard(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.discard(worker)

    def stop(self) -> None:
        """Kill every worker running now, and every one started from now on."""
        with self._lock:
            self._stopped = True
            workers = list(self._workers)
        for worker in workers:
            worker.kill()


class _Worker:
    """One worker process and the threads that read its output."""

    def __init__(self, arguments: list[str], environment: Mapping[str, str], stdin: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**environment, PARENT_PID: str(os.getpid())},
            text=True,
            # Its own process group: a timeout kills the worker and anything
            # it started, and a Ctrl-C on the CLI reaches the CLI alone.
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        assert self.process.stdout is not None and self.process.stderr is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True).start()
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(stdin)
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # the worker died at once; its exit status tells why

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            self.stderr.append(line.rstrip())

    def next_line(self, deadline: float) -> str | None:
        """The next line, None at the end of output; TimeoutError past the deadline."""
        try:
            return self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def exit_status(self, deadline: float) -> int:
        try:
            return self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError from None

    def why_it_ended(self, status: int) -> str:
        if status < 0:
            how = f"was killed by {signal.Signals(-status).name}"
        else:
            how = f"exited with status {status}"
        tail = " | ".join(line for line in self.stderr if line)[-1000:]
        return f"worker {how}" + (f": {tail}" if tail else "")


def stamp(result: CanaryResult, clock: Clock, telemetry: TelemetrySource) -> CanaryResult:
    """The result as received now: the caller's time, the GPU's telemetry."""
    reading = telemetry(result.gpu) if result.gpu is not None and result.cpu_core is None else None
    return replace(
        result,
        time=clock.now(),
        temperature_celsius=reading.temperature_celsius if reading else None,
        sm_clock_hertz=reading.sm_clock_hertz if reading else None,
        memory_clock_hertz=reading.memory_clock_hertz if reading else None,
    )


@dataclass(frozen=True)
class _Progress:
    """The canary in flight (or, before the first starts, the first one)."""

    spec: CanarySpec
    cpu_core: int | None
    since: float


def run_burst(
    request: BurstRequest,
    *,
    timeout: float,
    clock: Clock,
    telemetry: TelemetrySource = no_telemetry,
    on_result: Callable[[CanaryResult], None] | None = None,
    group: WorkerGroup | None = None,
) -> BurstOutcome:
    """Run one burst in a worker process; returns when the worker is done,
    dead or killed at `timeout` seconds (real time), or when `group` stops."""
    started = clock.now()
    deadline = time.monotonic() + timeout
    first_core = request.cpu_cores[0] if request.cpu_cores else None
    progress: _Progress | None = _Progress(request.specs[0], first_core, time.monotonic())
    results: list[CanaryResult] = []

    def deliver(result: CanaryResult) -> None:
        results.append(stamp(result, clock, telemetry))
        if on_result is not None:
            on_result(results[-1])

    def fail(outcome: Outcome, message: str) -> None:
        if progress is not None:
            deliver(
                failed(
                    progress.spec,
                    outcome,
                    message,
                    gpu=request.gpu,
                    uuid=request.uuid,
                    cpu_core=progress.cpu_core,
                    backend=request.backend,
                    duration_seconds=time.monotonic() - progress.since,
                )
            )

    worker = _Worker([], worker_environment(request), json.dumps(to_wire(request)))
    if group is not None:
        group.add(worker)
    try:
        while (line := worker.next_line(deadline)) is not None:
            event = _parse(line)
            if isinstance(event, _Progress):
                progress = event
            elif event is not None:
                deliver(event)
                progress = None
        status = worker.exit_status(deadline)
        if status != 0:
            fail("error", worker.why_it_ended(status))
    except TimeoutError:
        worker.kill()
        fail("timeout", f"no result within {timeout:g}s; the worker was killed")
    finally:
        worker.kill()
        if group is not None:
            group.discard(worker)
    return BurstOutcome(request, tuple(results), started, clock.now())


def _parse(line: str) -> _Progress | CanaryResult | None:
    """A protocol line: a canary starting, or its result; None for anything
    else (a stray line is not worth failing a burst)."""
    try:
        message = json.loads(line)
        if message.get("event") == "start":
            spec = from_wire(CanarySpec, message["spec"])
            return _Progress(spec, message.get("cpu_core"), time.monotonic())
        if message.get("event") == "result":
            return from_wire(CanaryResult, message["result"])
    except (ValueError, KeyError, AttributeError, WireError):
        pass
    return None


def fail_on_xids(outcome: BurstOutcome, events: Iterable[XidEvent]) -> BurstOutcome:
    """An XID on the burst's GPU between its start and now fails the whole
    burst: every result becomes an `error` (its evidence kept), since a GPU
    raising XIDs computes nothing worth judging, and the XID check owns the
    verdict."""
    gpu = outcome.request.gpu
    xids = sorted(
        {event.code for event in events if event.gpu == gpu and event.time >= outcome.started}
    )
    if gpu is None or not xids:
        return outcome
    message = f"XID {', '.join(map(str, xids))} during the burst"
    results = tuple(replace(result, result="error", message=message) for result in outcome.results)
    return replace(outcome, results=results)


@dataclass(frozen=True)
class ProbedGpu:
    index: int  # CUDA's ordinal, in PCI bus order
    name: str


def probe_cuda(timeout: float) -> tuple[ProbedGpu, ...]:
    """The GPUs the CUDA backend can use, asked of a worker so that CUDA is
    never initialised in the caller's process. Raises RuntimeError when
    CuPy, the driver or a GPU is missing."""
    deadline = time.monotonic() + timeout
    worker = _Worker(["--probe"], pinned_environment(None), "")
    gpus: list[ProbedGpu] = []
    try:
        while (line := worker.next_line(deadline)) is not None:
            try:
                gpus.append(from_wire(ProbedGpu, json.loads(line)))
            except (ValueError, WireError):
                continue
        status = worker.exit_status(deadline)
    except TimeoutError:
        raise RuntimeError(f"probing CUDA took longer than {timeout:g}s") from None
    finally:
        worker.kill()
    if status != 0:
        raise RuntimeError(f"no CUDA backend: {worker.why_it_ended(status)}")
    return tuple(gpus)


def choose_gpu_backend(
    setting: str, simulated: bool, probe_timeout: float
) -> tuple[BackendKind | None, str]:
    """Which backend checks the GPUs, and why. A simulated node's GPUs are
    stood in for by the CPU backend; a real GPU only by CUDA, never by the
    CPU (so `cpu` checks the host's cores alone), and `auto` takes CUDA when
    a worker finds CuPy and a GPU."""
    if simulated:
        return "cpu", "the CPU backend stands in for the simulated GPUs"
    if setting == "cuda":
        return "cuda", "the cuda backend was asked for"
    if setting == "cpu":
        return None, "the cpu backend checks the host's cores only"
    try:
        gpus = probe_cuda(probe_timeout)
    except RuntimeError as error:
        return None, str(error)
    if not gpus:
        return None, "CUDA sees no GPU"
    return "cuda", f"CUDA sees {len(gpus)} GPU(s)"
