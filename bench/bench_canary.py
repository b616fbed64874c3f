"""How long one canary burst takes on the CPU backend, what share of a
GPU's time the default schedule gives the canaries, and the host's work in
a CUDA-sized burst.

Runs the suite the CPU backend runs for a (simulated) GPU: in this process,
to time the canaries themselves, and in a worker process as the daemon runs
it, to time the whole burst with the process start. Then one burst on the
host's cores. The duty cycle is burst time over the default interval.

`--cuda-host` measures what a burst of the CUDA-sized suite
(default_suite("cuda"), an H100's) costs the host's CPU with its references
cached: the bursts run through the CUDA backend in a process with the
worker's pinned environment, on CuPy where it is installed and otherwise on
the fake CuPy of tests/fake_cupy, whose "device" computes on the host; what
that device spends of the CPU is counted apart and taken off (a GPU spends
none of it). So the figure is gpuwatchd's host work for the burst: inputs,
the backend's conversions and copies, judging, everything but the device's
own kernels. It leaves out the worker's start (Python, CuPy and the CUDA
context), which only a GPU can measure (scripts/sdc-gpu-check.py). With the
fake, the peak of GPU memory is the backend's own report of the pool.

    .venv/bin/python bench/bench_canary.py [--repeat N] [--cuda-host [--bursts N]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.runner import BurstRequest, pinned_environment, run_burst
from gpuwatchd.canary.spec import default_suite, host_suite
from gpuwatchd.canary.worker import run_in_process
from gpuwatchd.clock import SystemClock

FAKE_CUPY = Path(__file__).resolve().parent.parent / "tests" / "fake_cupy"
# An H100's compute capability: every canary, the tensor-core tiles too.
H100 = (9, 0)


def timed(run: Callable[[], object], repeat: int) -> list[float]:
    durations = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        durations.append(time.perf_counter() - start)
    return durations


def cuda_host_bursts(bursts: int) -> dict[str, Any]:
    """In this process (CuPy importable, the worker's environment): one burst
    to fill the reference cache, then `bursts` timed ones."""
    import cupy  # type: ignore[import-not-found]

    # The fake's emulated device; a GPU computes without the host's CPU.
    device_cpu: Callable[[], float] = getattr(cupy, "device_process_seconds", lambda: 0.0)
    config = CanaryConfig()
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-references-") as references:
        request = BurstRequest(
            "cuda",
            default_suite("cuda", config.seed, config.seed, config.hbm_bytes, H100),
            gpu=0,
            uuid="GPU-bench",
            reference_cache=references,
        )
        clock = SystemClock()
        run_in_process(request, timeout=config.timeout, clock=clock)
        host, wall, device, peaks = [], [], [], []
        for _ in range(bursts):
            cpu, emulated, start = time.process_time(), device_cpu(), time.perf_counter()
            outcome = run_in_process(request, timeout=config.timeout, clock=clock)
            wall.append(time.perf_counter() - start)
            host.append(time.process_time() - cpu - (device_cpu() - emulated))
            device.append(outcome.device_seconds)
            peaks.append(getattr(outcome, "device_memory_bytes", None))
            failed = [r.canary for r in outcome.results if r.result != "pass"]
            if failed or len(outcome.results) != len(request.specs):
                raise RuntimeError(f"the CUDA-sized burst did not pass: {failed}")
    held = [peak for peak in peaks if peak is not None]
    return {
        "cuda_host_cpu_s_per_burst": round(statistics.median(host), 3),
        "cuda_host_cpu_s_each": [round(x, 3) for x in host],
        "cuda_burst_wall_s": round(statistics.median(wall), 2),
        "cuda_device_s_per_burst": round(statistics.median(device), 3),
        "gpu_memory_peak_mib": round(max(held) / 2**20, 1) if held else None,
        "cuda_backend": "fake CuPy" if getattr(cupy, "FAKE", False) else f"CuPy {cupy.__version__}",
        "canaries": len(request.specs),
    }


def cuda_host_figures(bursts: int, code: Path | None = None) -> dict[str, Any]:
    """cuda_host_bursts in a process of its own with the worker's pinned
    environment (one BLAS thread); `code`: the gpuwatchd tree to measure
    (another checkout's, to compare), this one's by default."""
    try:
        import cupy  # noqa: F401  (a real CuPy: measure on it)

        fake: list[str] = []
    except ImportError:
        fake = [str(FAKE_CUPY)]
    tree = [str(code)] if code is not None else []
    path = os.pathsep.join([*tree, *fake, *sys.path])
    environment = {**pinned_environment(None), "PYTHONPATH": path}
    script = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "from bench_canary import cuda_host_bursts\n"
        f"print(json.dumps(cuda_host_bursts({bursts})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the CUDA-sized bursts failed: {done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


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
    parser.add_argument(
        "--bursts", type=int, default=3, help="timed CUDA-sized bursts with --cuda-host (default 3)"
    )
    args = parser.parse_args()
    if args.cuda_host:
        print(json.dumps(cuda_host_figures(args.bursts), indent=1))
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
