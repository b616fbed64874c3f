"""How long one canary burst takes on the CPU backend, what share of a
GPU's time the default schedule gives the canaries, and the host-side work
of a CUDA-sized burst.

Runs the suite the CPU backend runs for a (simulated) GPU: in this process,
to time the canaries themselves, and in a worker process as the daemon runs
it, to time the whole burst with the process start. Then one burst on the
host's cores. The duty cycle is burst time over the default interval.

`--cuda-host` times what the host does for each canary of the CUDA-sized
suite (default_suite("cuda")) around the GPU's work, which needs no GPU:
making the inputs, the reference (cold: computed; warm: cached by default),
and hashing an output of the canary's size. Device time, wall time with a
CUDA context and GPU memory need a GPU: scripts/sdc-gpu-check.py.

    .venv/bin/python bench/bench_canary.py [--repeat N] [--cuda-host]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from gpuwatchd.canary.chains import (
    FMA_FORMATS,
    fma_chain_inputs,
    fma_chain_reference,
    int_chain_inputs,
    int_chain_reference,
)
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.convert import convert_inputs, convert_reference
from gpuwatchd.canary.formats import FORMATS
from gpuwatchd.canary.gemm import exact_gemm, exact_reference, random_gemm
from gpuwatchd.canary.mma import mma_case, mma_reference
from gpuwatchd.canary.runner import BurstRequest, run_burst
from gpuwatchd.canary.sfu import outside as sfu_outside
from gpuwatchd.canary.sfu import sfu_inputs, sfu_reference
from gpuwatchd.canary.spec import CanarySpec, default_suite, host_suite
from gpuwatchd.canary.suite import digest
from gpuwatchd.canary.worker import run_in_process
from gpuwatchd.clock import SystemClock

T = TypeVar("T")


def timed(run: Callable[[], object], repeat: int) -> list[float]:
    durations = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        durations.append(time.perf_counter() - start)
    return durations


def cuda_host_work() -> None:
    """Host seconds per canary of the CUDA-sized suite (one run each)."""
    config = CanaryConfig()
    # An H100's compute capability: every canary, the tensor-core tiles too.
    suite = default_suite("cuda", config.seed, config.seed, config.hbm_bytes, (9, 0))
    print("CUDA-sized suite, host work per canary (s): inputs, reference cold, output digest")
    totals = [0.0, 0.0, 0.0]
    for spec in suite:
        inputs, reference, output = host_steps(spec)
        row = [_time(inputs), _time(reference) if reference else 0.0, _time(output)]
        totals = [t + r for t, r in zip(totals, row, strict=True)]
        print(f"  {spec.name:<28} {row[0]:7.3f} {row[1]:7.3f} {row[2]:7.3f}")
    print(f"  {'total':<28} {totals[0]:7.3f} {totals[1]:7.3f} {totals[2]:7.3f}")
    print(
        f"  per burst with cached references: {totals[0] + totals[2]:.2f} s host, "
        f"first burst of a seed {sum(totals):.2f} s"
    )


def _time(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


Steps = tuple[Callable[[], object], Callable[[], object] | None, Callable[[], object]]


def _known_answer(make: Callable[[], T], reference: Callable[[T], object], output: object) -> Steps:
    """Making the inputs, computing their reference, hashing an output of
    the output's size."""
    made = make()
    return make, (lambda: reference(made)), (lambda: digest(np.asarray(output)))


def host_steps(spec: CanarySpec) -> Steps:
    """(inputs, reference or None, digest of an output) of one canary."""
    threads = spec.shape[0]
    if spec.kind in ("gemm_exact", "gemm_random"):
        fmt = FORMATS[spec.dtype]
        m, k, n = spec.shape
        size = np.zeros((m, n), dtype=fmt.output_dtype)
        if spec.kind == "gemm_random":
            return (lambda: random_gemm(fmt, (m, k, n), spec.seed)), None, lambda: digest(size)
        return _known_answer(
            lambda: exact_gemm(fmt, (m, k, n), spec.seed),
            lambda inputs: exact_reference(fmt, inputs),
            size,
        )
    if spec.kind == "int_chain":
        steps = spec.shape[1]
        return _known_answer(
            lambda: int_chain_inputs(threads, steps, spec.seed),
            int_chain_reference,
            np.zeros(threads, dtype=np.uint32),
        )
    if spec.kind == "fma_chain":
        fmt_chain, steps = FMA_FORMATS[spec.dtype], spec.shape[1]
        return _known_answer(
            lambda: fma_chain_inputs(fmt_chain, threads, steps, spec.seed),
            fma_chain_reference,
            np.zeros(threads, dtype=np.float64),
        )
    if spec.kind == "convert":
        return _known_answer(
            lambda: convert_inputs(threads, spec.seed),
            convert_reference,
            np.zeros((threads, 4), dtype=np.uint32),
        )
    if spec.kind == "sfu":
        results = np.zeros((threads, 6), dtype=np.float32)
        # Judged against bounds: the exact values are computed every burst.
        return _known_answer(
            lambda: sfu_inputs(threads, spec.seed),
            lambda inputs: sfu_outside(results, sfu_reference(inputs), inputs),
            results,
        )
    if spec.kind == "mma":
        case = mma_case(spec.dtype, spec.shape, spec.seed)
        return _known_answer(
            lambda: mma_case(spec.dtype, spec.shape, spec.seed),
            mma_reference,
            np.zeros((case.inputs.threads, 4), dtype=np.uint32),
        )
    return (lambda: None), None, lambda: None  # HBM: patterns made and checked on the device


def burst_requests(config: CanaryConfig) -> tuple[BurstRequest, BurstRequest]:
    """A simulated GPU's burst (the CPU backend standing in, as on a simulated
    node) and the host cores' burst, as the default schedule runs them."""
    gpu = BurstRequest(
        "cpu",
        default_suite("cpu", config.seed, config.seed, config.hbm_bytes),
        gpu=0,
        stand_in_model="simulated H100",
        stand_in_sm_count=132,
    )
    cores = tuple(sorted(os.sched_getaffinity(0)))
    return gpu, BurstRequest("cpu", host_suite(config.seed), cpu_cores=cores)


def main() -> None:
    # The first paragraph: its first line alone ends mid-sentence.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="runs timed of each (default 10)")
    parser.add_argument(
        "--cuda-host",
        action="store_true",
        help="time the host's work around each canary of the CUDA-sized suite instead",
    )
    args = parser.parse_args()
    if args.cuda_host:
        cuda_host_work()
        return
    repeat = args.repeat
    config = CanaryConfig()
    clock = SystemClock()
    gpu, host = burst_requests(config)
    run_in_process(gpu, timeout=config.timeout, clock=clock)  # warm the reference cache

    per_canary: dict[str, list[float]] = {}
    bursts = []
    for _ in range(repeat):
        outcome = run_in_process(gpu, timeout=config.timeout, clock=clock)
        bursts.append(outcome.device_seconds)
        for result in outcome.results:
            per_canary.setdefault(result.canary, []).append(result.duration_seconds)
    worker = timed(lambda: run_burst(gpu, timeout=config.timeout, clock=clock), max(3, repeat // 3))
    cores = host.cpu_cores
    host_burst = timed(lambda: run_burst(host, timeout=config.timeout, clock=clock), 3)

    burst = statistics.median(bursts)
    print(f"CPU backend, one GPU's suite ({len(gpu.specs)} canaries), median of {repeat}:")
    for name, durations in per_canary.items():
        print(f"  {name:<28} {statistics.median(durations) * 1000:8.2f} ms")
    print(
        f"  {'burst (canaries only)':<28} {burst * 1000:8.2f} ms (max {max(bursts) * 1000:.2f} ms)"
    )
    print(f"  {'burst in a worker process':<28} {statistics.median(worker) * 1000:8.2f} ms")
    host_ms = statistics.median(host_burst) * 1000
    print(f"host cores: {len(cores)} core(s), one burst {host_ms:.2f} ms in a worker process")
    print(f"default schedule: a burst every {config.interval:g} s, sized for {config.burst:g} s")
    print(f"  duty cycle, burst budget / interval: {config.burst / config.interval:.4%}")
    print(f"  duty cycle, measured CPU burst / interval: {burst / config.interval:.4%}")
    print(f"  busy-GPU budget (when: always): {config.duty_cycle:.2%} of {config.duty_window:g} s")


if __name__ == "__main__":
    main()
