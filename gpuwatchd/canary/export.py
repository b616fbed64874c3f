"""Canary metric families, rendered fresh from CanaryStats on every scrape.

GPU series carry `gpu` (the index) and `canary` (kind and format, e.g.
`gemm_exact_fp16`); the host's cores get their own run counter with
`core`. Every (gpu, canary) seen has all four `result` series, so a first
mismatch is an increase from 0, not a new series that rate() cannot see;
the suite's canaries are there at 0 from the first poll, before any ran.

    gpuwatchd_canary_runs_total{gpu,canary,result}
    gpuwatchd_canary_last_pass_timestamp_seconds{gpu}
    gpuwatchd_canary_duration_seconds{gpu,canary}
    gpuwatchd_canary_tflops{gpu,canary}
    gpuwatchd_canary_sm_coverage_ratio{gpu,canary}
    gpuwatchd_canary_bit_flips_total{gpu,canary}
    gpuwatchd_canary_cpu_runs_total{core,canary,result}
    gpuwatchd_canary_unchecked_since_timestamp_seconds{gpu,reason}
    gpuwatchd_canary_gpu_runs_total{gpu,result}
    gpuwatchd_canary_host_runs_total{canary,result}

The last two sum the runs of a GPU over its canaries and of the host over
its cores, in every detail mode. Per core, runs are exported for the cores
that had a run other than a pass (`export.canary_cores: failed`, the
default) or for every core (`all`). With `export.detail: compact`, a GPU's
per-canary runs, bit flips and durations are exported only once it had a run
other than a pass or while it is not healthy; its TFLOP/s (what the fleet
compares) and last pass always.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwatchd.canary.result import OUTCOMES
from gpuwatchd.canary.stats import CanaryStats
from gpuwatchd.export.detail import ExportConfig

PREFIX = "gpuwatchd_canary_"


def _split(target: str) -> tuple[str, str]:
    kind, _, index = target.partition(":")
    return kind, index


FULL = ExportConfig()


def families(
    stats: CanaryStats, export: ExportConfig = FULL, flagged: Collection[str] = frozenset()
) -> Iterable[Metric]:
    """`flagged`: the subjects that are not healthy (or have an active
    finding), whose GPUs keep their per-canary detail in compact mode."""
    return list(_families(stats, export, flagged))


def _failed(stats: CanaryStats) -> frozenset[str]:
    """Targets (`gpu:<index>`, `cpu:<core>`) that had a run other than a pass."""
    return frozenset(t for (t, _, outcome), n in stats.runs.items() if outcome != "pass" and n)


def _families(
    stats: CanaryStats, export: ExportConfig, flagged: Collection[str]
) -> Iterator[Metric]:
    pairs = sorted({(target, canary) for target, canary, _ in stats.runs} | stats.planned)
    failed = _failed(stats)
    every_gpu = [(_split(t)[1], c) for t, c in pairs if _split(t)[0] == "gpu"]
    detailed = {
        gpu
        for gpu, _ in every_gpu
        if not export.compact or f"gpu:{gpu}" in failed or f"gpu:{gpu}" in flagged
    }
    gpu_pairs = [(gpu, c) for gpu, c in every_gpu if gpu in detailed]
    every_core = [(_split(t)[1], c) for t, c in pairs if _split(t)[0] == "cpu"]
    cpu_pairs = [
        (core, c)
        for core, c in every_core
        if export.canary_cores == "all" or f"cpu:{core}" in failed
    ]
    yield from _summaries(stats, every_gpu, every_core)

    runs = CounterMetricFamily(
        PREFIX + "runs",
        "Canary runs by outcome: pass, mismatch (a wrong answer), error (a crash, a device "
        "error, an XID during the burst) or timeout (killed at the hard timeout).",
        labels=["gpu", "canary", "result"],
    )
    # Not `mismatched_bits_total`: promtool reads `_bits` as a unit (and
    # wants bytes).
    bits = CounterMetricFamily(
        PREFIX + "bit_flips",
        "Bits flipped in the canary outputs that did not match their known answer.",
        labels=["gpu", "canary"],
    )
    for gpu, canary in gpu_pairs:
        for outcome in OUTCOMES:
            runs.add_metric(
                [gpu, canary, outcome], stats.runs.get((f"gpu:{gpu}", canary, outcome), 0)
            )
        bits.add_metric([gpu, canary], stats.mismatched_bits.get((f"gpu:{gpu}", canary), 0))
    yield runs
    yield bits

    last_pass = GaugeMetricFamily(
        PREFIX + "last_pass_timestamp_seconds",
        "When the GPU's last burst in which every canary passed ended (Unix time).",
        labels=["gpu"],
    )
    for target, when in sorted(stats.last_pass.items()):
        kind, index = _split(target)
        if kind == "gpu":
            last_pass.add_metric([index], when)
    yield last_pass

    duration = GaugeMetricFamily(
        PREFIX + "duration_seconds",
        "How long the latest run of the canary took, from inputs to verdict.",
        labels=["gpu", "canary"],
    )
    tflops = GaugeMetricFamily(
        PREFIX + "tflops",
        "Throughput of the latest run of a GEMM canary (10^12 floating-point operations "
        "per second, the GEMM alone); a GPU well below its siblings is throttled or degraded.",
        labels=["gpu", "canary"],
    )
    coverage = GaugeMetricFamily(
        PREFIX + "sm_coverage_ratio",
        "Share of the GPU's SMs on which the latest run of a chain canary ran a thread from "
        "start to end (%smid read at both); below 1 beside a job or after preemption, so "
        "some SMs went unchecked by that run.",
        labels=["gpu", "canary"],
    )
    for gpu, canary in every_gpu:
        latest = stats.latest.get((f"gpu:{gpu}", canary))
        if latest is None:
            continue
        if gpu in detailed:
            duration.add_metric([gpu, canary], latest.duration_seconds)
        if latest.tflops is not None:
            tflops.add_metric([gpu, canary], latest.tflops)
        if gpu in detailed and latest.sm_coverage_ratio is not None:
            coverage.add_metric([gpu, canary], latest.sm_coverage_ratio)
    yield duration
    yield tflops
    yield coverage

    cpu_runs = CounterMetricFamily(
        PREFIX + "cpu_runs",
        "Canary runs on the host's CPU cores (each pinned in turn), by outcome.",
        labels=["core", "canary", "result"],
    )
    for core, canary in cpu_pairs:
        for outcome in OUTCOMES:
            count = stats.runs.get((f"cpu:{core}", canary, outcome), 0)
            cpu_runs.add_metric([core, canary, outcome], count)
    yield cpu_runs

    unchecked = GaugeMetricFamily(
        PREFIX + "unchecked_since_timestamp_seconds",
        "Since when (Unix time) no canary runs on the GPU, and why: no_backend (no working "
        "CUDA backend on a node with GPUs), exclusive_compute_mode (bursts belong in the "
        "scheduler's prolog/epilog), compute_prohibited, mig, mps, low_free_memory, nvml.",
        labels=["gpu", "reason"],
    )
    for number, (why, since) in sorted(stats.unchecked.items()):
        unchecked.add_metric([str(number), why], since)
    yield unchecked


def _summaries(
    stats: CanaryStats, gpu_pairs: Iterable[tuple[str, str]], cpu_pairs: Iterable[tuple[str, str]]
) -> Iterator[Metric]:
    """Runs by outcome per GPU (over its canaries) and per canary on the host
    (over its cores), at 0 from the first poll as the detailed counters are."""
    gpu_runs: dict[tuple[str, str], int] = {}
    for gpu, canary in gpu_pairs:
        for outcome in OUTCOMES:
            count = stats.runs.get((f"gpu:{gpu}", canary, outcome), 0)
            gpu_runs[(gpu, outcome)] = gpu_runs.get((gpu, outcome), 0) + count
    host_runs: dict[tuple[str, str], int] = {}
    for core, canary in cpu_pairs:
        for outcome in OUTCOMES:
            count = stats.runs.get((f"cpu:{core}", canary, outcome), 0)
            host_runs[(canary, outcome)] = host_runs.get((canary, outcome), 0) + count
    by_gpu = CounterMetricFamily(
        PREFIX + "gpu_runs",
        "Canary runs on the GPU by outcome, summed over its canaries (gpuwatchd_canary_runs_total "
        "per canary).",
        labels=["gpu", "result"],
    )
    # Outcomes stay in OUTCOMES' order, as in the per-canary counters.
    for labels, count in sorted(gpu_runs.items(), key=lambda item: int(item[0][0])):
        by_gpu.add_metric(list(labels), count)
    yield by_gpu
    host = CounterMetricFamily(
        PREFIX + "host_runs",
        "Canary runs on the host's CPU cores by outcome, summed over the cores checked "
        "(gpuwatchd_canary_cpu_runs_total per core, for the cores that failed a run).",
        labels=["canary", "result"],
    )
    for labels, count in sorted(host_runs.items(), key=lambda item: item[0][0]):
        host.add_metric(list(labels), count)
    yield host
