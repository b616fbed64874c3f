"""How long one canary burst takes on the CPU backend, and what share of a
GPU's time the default schedule gives the canaries.

Runs the suite the CPU backend runs for a (simulated) GPU: in this process,
to time the canaries themselves, and in a worker process as the daemon runs
it, to time the whole burst with the process start. Then one burst on the
host's cores. The duty cycle is burst time over the default interval.

    python bench/bench_canary.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.runner import BurstRequest, run_burst
from gpuwatchd.canary.spec import default_suite, host_suite
from gpuwatchd.canary.worker import run_in_process
from gpuwatchd.clock import SystemClock


def timed(run: Callable[[], object], repeat: int) -> list[float]:
    durations = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        durations.append(time.perf_counter() - start)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    repeat = parser.parse_args().repeat
    config = CanaryConfig()
    clock = SystemClock()
    gpu = BurstRequest(
        "cpu",
        default_suite("cpu", config.seed, config.seed, config.hbm_bytes),
        gpu=0,
        stand_in_model="simulated H100",
        stand_in_sm_count=132,
    )
    run_in_process(gpu, timeout=config.timeout, clock=clock)  # warm the reference cache

    per_canary: dict[str, list[float]] = {}
    bursts = []
    for _ in range(repeat):
        outcome = run_in_process(gpu, timeout=config.timeout, clock=clock)
        bursts.append(outcome.device_seconds)
        for result in outcome.results:
            per_canary.setdefault(result.canary, []).append(result.duration_seconds)
    worker = timed(lambda: run_burst(gpu, timeout=config.timeout, clock=clock), max(3, repeat // 3))
    cores = tuple(sorted(os.sched_getaffinity(0)))
    host = BurstRequest("cpu", host_suite(config.seed), cpu_cores=cores)
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
