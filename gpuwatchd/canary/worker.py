"""The canary worker process: `python -m gpuwatchd.canary.worker`.

Reads a runner.BurstRequest as JSON on stdin and runs it, writing one JSON
line to stdout as each canary starts ({"event": "start", ...}) and one with
each result ({"event": "result", ...}). Every canary's host work (inputs,
and references the cache lacks) is done before the device is opened, so
the GPU's memory and a busy GPU's time are held for device work alone
(suite.py). Device errors become `error` results and end the burst (a CUDA
error leaves the context unusable); a hang or crash is the runner's to see.
With `--probe`, lists the GPUs the CUDA backend sees instead, one JSON
object a line.

The protocol has stdout to itself: anything else the process prints at
file-descriptor level (a library's banner, a driver's warning) goes to
stderr, which the runner keeps for error messages.

The worker dies with the process that started it: it asks the kernel for
SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG, Linux), and ends at
once if the parent died before it could ask. A daemon killed with SIGKILL
leaves no worker computing on a GPU for nobody.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from gpuwatchd.canary.backend import Backend, open_backend
from gpuwatchd.canary.inject import FaultyBackend
from gpuwatchd.canary.result import CanaryResult, TelemetrySource, failed, no_telemetry
from gpuwatchd.canary.runner import (
    PARENT_PID,
    BurstOutcome,
    BurstRequest,
    ProbedGpu,
    WorkerGroup,
    stamp,
)
from gpuwatchd.canary.spec import CanarySpec
from gpuwatchd.canary.suite import (
    Prepared,
    ReferenceCache,
    RunContext,
    prepare_canary,
    run_prepared,
)
from gpuwatchd.canary.wire import from_wire, to_wire
from gpuwatchd.clock import Clock

Emit = Callable[[dict[str, Any]], None]


def open_request_backend(request: BurstRequest) -> Backend:
    backend = open_backend(
        request.backend,
        # The runner narrows CUDA_VISIBLE_DEVICES to the burst's GPU.
        0 if request.backend == "cuda" else None,
        stand_in_sm_count=request.stand_in_sm_count,
        name=request.stand_in_model,
        uuid=request.uuid,
    )
    for fault in request.faults:
        backend = FaultyBackend(backend, fault, request.temperature_celsius, request.fault_draw)
    return backend


def execute(request: BurstRequest, emit: Emit) -> None:
    """Run the burst, reporting through `emit`. Pins the calling thread to
    each of `request.cpu_cores` in turn."""
    cache = ReferenceCache(request.reference_cache)
    affinity = os.sched_getaffinity(0)
    backend: Backend | None = None
    try:
        for core in request.cpu_cores or (None,):
            if core is not None:
                os.sched_setaffinity(0, {core})
            context = RunContext(
                cache,
                request.gpu,
                request.uuid,
                core,
                request.hbm_free_fraction,
                reference_cores=tuple(sorted(affinity)),
            )
            prepared = [_prepare(spec, context) for spec in request.specs]
            if backend is None:
                backend = _open(request, emit)
                if backend is None:
                    return
            if not _run_all(backend, prepared, context, request, emit):
                return
    finally:
        os.sched_setaffinity(0, affinity)


def _prepare(spec: CanarySpec, context: RunContext) -> Prepared | Exception:
    try:
        return prepare_canary(spec, context)
    except Exception as error:  # reported when its turn comes, as a device error would be
        return error


def _open(request: BurstRequest, emit: Emit) -> Backend | None:
    try:
        return open_request_backend(request)
    except Exception as error:  # no CuPy, no driver, no such GPU
        first = request.cpu_cores[0] if request.cpu_cores else None
        _report_error(request, request.specs[0], first, error, emit)
        return None


def _run_all(
    backend: Backend,
    prepared: list[Prepared | Exception],
    context: RunContext,
    request: BurstRequest,
    emit: Emit,
) -> bool:
    """Every prepared canary in turn; False when one failed (the burst ends)."""
    for spec, canary in zip(request.specs, prepared, strict=True):
        emit({"event": "start", "spec": to_wire(spec), "cpu_core": context.cpu_core})
        try:
            if isinstance(canary, Exception):
                raise canary
            result = run_prepared(backend, canary, context)
        except Exception as error:  # any device failure is this canary's error
            _report_error(request, spec, context.cpu_core, error, emit)
            return False
        emit({"event": "result", "result": to_wire(result)})
    return True


def _report_error(
    request: BurstRequest, spec: CanarySpec, core: int | None, error: Exception, emit: Emit
) -> None:
    message = f"{type(error).__name__}: {error}"
    result = failed(
        spec,
        "error",
        message,
        gpu=request.gpu,
        uuid=request.uuid,
        cpu_core=core,
        backend=request.backend,
    )
    emit({"event": "result", "result": to_wire(result)})


def run_in_process(
    request: BurstRequest,
    *,
    timeout: float,
    clock: Clock,
    telemetry: TelemetrySource = no_telemetry,
    group: WorkerGroup | None = None,
) -> BurstOutcome:
    """The burst in the calling process, without the runner's timeout or a
    worker group (which it accepts to stand in for run_burst): for tests and
    the benchmark, never for a real GPU."""
    started = clock.now()
    results: list[CanaryResult] = []

    def collect(message: dict[str, Any]) -> None:
        if message["event"] == "result":
            results.append(stamp(from_wire(CanaryResult, message["result"]), clock, telemetry))

    execute(request, collect)
    return BurstOutcome(request, tuple(results), started, clock.now())


def probe(emit: Emit) -> None:
    from gpuwatchd.canary.cuda import list_devices

    for index, name in list_devices():
        emit(to_wire(ProbedGpu(index, name)))


# linux/prctl.h
PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Have the kernel kill this process when its parent dies; False when the
    parent (named in the environment by the runner) is already gone."""
    libc = ctypes.util.find_library("c")
    if libc is not None:
        ctypes.CDLL(libc, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = os.environ.get(PARENT_PID)
    return parent is None or str(os.getppid()) == parent


def main(argv: list[str]) -> int:
    if not die_with_parent():
        return 3
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def emit(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    if argv == ["--probe"]:
        try:
            probe(emit)
        except Exception as error:  # no CuPy, no driver: say so in one line
            print(f"{type(error).__name__}: {error}", file=sys.stderr)
            return 2
        return 0
    request = from_wire(BurstRequest, json.loads(sys.stdin.read()))
    execute(request, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
