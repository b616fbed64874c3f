"""What gpuwatchd costs, in one run: one table printed, the same figures as JSON.

Usage:

    .venv/bin/python bench/run.py [--quick] [--json bench/results.json] [--rss-polls 100000]

Measures, on simulated nodes (the fake NVML library under nvidia-ml-py, a
sysfs tree for InfiniBand) on an injected clock:

- poll CPU (the whole process, every thread, less the fake library's own
  Python), the polling thread's alone, and wall time, median and p99, on 1,
  4, 8 and 16 GPUs (18 NVLinks each, 8 HCAs), with the 1-hour history full at
  the default poll interval; the NVML calls a poll makes, and the driver time
  they cost a real node at MEASURED_CALL_LATENCY_S a call. The CPU figures
  come from polls whose fake answers at once: the fake's wait for a charged
  call is a sleep, and waking from one costs the process more CPU than the
  wait itself (28 ms against 14 ms a poll on the 8-GPU node, one process,
  alternating), which a driver's call does not; the wall figure comes from
  as many polls again with the wait charged;
- on 8 GPUs: the /metrics render on a cache miss (the page encoded once per
  poll, in OpenMetrics, which prometheus_client answers Prometheus' Accept
  header with, and in the text format; and, for comparison, by
  prometheus_client's encoder) and a scrape from the cache, in process and
  over HTTP on loopback;
  series and bytes of the page (all shapes);
- resident memory of the 8-GPU node's daemon after its first poll, with the
  history full and after `--rss-polls` polls, each in a fresh process that
  imports only what the daemon and the simulator need, less the simulator's
  own share (measured alone: bench/memory.py);
- the share of one core the daemon takes at the default poll interval and at
  1 s, with the canaries' CPU amortised over their default schedule (the CPU
  backend stands in for each GPU, as on a simulated node);
- the host CPU of one burst of the CUDA-sized suite (an H100's), references
  cached, and its peak of GPU memory, through the CUDA backend on CuPy or
  its fake (bench_canary.cuda_host_figures: the fake device's own CPU taken
  off);
- the InfiniBand read beside the real node_exporter on the same tree
  (bench_infiniband.measure), as ratios;
- for each scenario fault kind, the simulated seconds from the fault to the
  first finding and to the first quarantine, at the default poll interval and
  policy (tests/daemon_support.simulated_daemon).

`--quick` takes few samples of each (CI runs it so that this cannot rot; its
timings mean little), with the 8-GPU node's history filled as in the full
run (the other shapes' not). The
simulator's own work (writing the sysfs tree) is outside every timed poll.
Timings on a shared machine are noisy: say the load.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from bench_canary import burst_requests, cuda_host_figures
from bench_infiniband import measure as measure_infiniband
from bench_infiniband import timed
from bench_node import NodeRun, PollCost, node_run, scratch, series_by_family
from prometheus_client.exposition import choose_encoder

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.runner import run_burst
from gpuwatchd.clock import SystemClock
from gpuwatchd.config import Config
from gpuwatchd.exporter import MetricsPage
from gpuwatchd.model import Health, Severity
from gpuwatchd.server import StatusServer
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.fake_nvml import MEASURED_CALL_LATENCY_S

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from daemon_support import simulated_daemon  # noqa: E402  (test support: the daemon on a fake clock)

SHAPES = (1, 4, 8, 16)
MAIN_SHAPE = 8
# What Prometheus 2 asks for: prometheus_client answers it in OpenMetrics.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
# The fault kinds' node, and when each fault starts (kinds that describe the
# node as booted start at 0 s).
KIND_NODE = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"
FAULT_AT = 10.0
KIND_FAULTS: dict[str, str] = {
    "thermal_throttle": "{kind: thermal_throttle, gpu: 1}",
    "power_cap": "{kind: power_cap, gpu: 1}",
    "power_brake": "{kind: power_brake, gpu: 1}",
    "clock_drift": "{kind: clock_drift, gpu: 1}",
    "clocks_locked": "{kind: clocks_locked, gpu: 1, mhz: 1200}",
    "gpu_idle": "{kind: gpu_idle, gpu: 1}",
    "nvlink_crc_storm": "{kind: nvlink_crc_storm, gpu: 1, link: 2, rate: 2000/s}",
    "nvlink_down": "{kind: nvlink_down, gpu: 1, link: 2}",
    "nvlink_inactive": "{kind: nvlink_inactive, gpu: 1, link: 2}",
    "gpu_missing": "{kind: gpu_missing, gpu: 1}",
    "ecc_sbe_storm": "{kind: ecc_sbe_storm, gpu: 1, rate: 1/s}",
    "ecc_uncorrectable": "{kind: ecc_uncorrectable, gpu: 1}",
    "row_remap_pending": "{kind: row_remap_pending, gpu: 1}",
    "row_remap_failure": "{kind: row_remap_failure, gpu: 1}",
    "row_remap_exhausted": "{kind: row_remap_exhausted, gpu: 1}",
    "gpu_replaced": "{kind: gpu_replaced, gpu: 1}",
    "nvml_init_error": "{kind: nvml_init_error, code: lib_rm_version_mismatch}",
    "xid": "{kind: xid, gpu: 1, code: 79}",
    "gpu_lost": "{kind: gpu_lost, gpu: 1}",
    "nvml_error": "{kind: nvml_error, gpu: 1, call: nvmlDeviceGetRemappedRows, "
    "code: reset_required}",
    "reset_required": "{kind: reset_required, gpu: 1}",
    "recovery_action": "{kind: recovery_action, gpu: 1, action: gpu_reset}",
    "pcie_downtrained": "{kind: pcie_downtrained, gpu: 1, width: 8}",
    "pcie_replay_storm": "{kind: pcie_replay_storm, gpu: 1, rate: 10/s}",
    "fabric_unregistered": "{kind: fabric_unregistered, gpu: 1}",
    # Route unhealthy (nvml.h's health mask field at bits 4-5, 1: true).
    "fabric_health": "{kind: fabric_health, gpu: 1, mask: 0x10}",
    "ib_symbol_errors": "{kind: ib_symbol_errors, hca: mlx5_1, port: 1, rate: 50/s}",
    "ib_link_flap": "{kind: ib_link_flap, hca: mlx5_1, port: 1, rate: 1/min}",
    "ib_port_down": "{kind: ib_port_down, hca: mlx5_1, port: 1}",
    "ib_congestion": "{kind: ib_congestion, hca: mlx5_1, port: 1, rate: 20000000/s}",
    "ib_counter_pinned": "{kind: ib_counter_pinned, hca: mlx5_1, port: 1, "
    "counter: excessive_buffer_overrun_errors}",
    "ib_counter_einval": "{kind: ib_counter_einval, hca: mlx5_1, port: 1, counter: port_xmit_wait}",
    "sdc": "{kind: sdc, gpu: 1}",
    "aer_errors": "{kind: aer_errors, gpu: 1, severity: fatal}",
    "config_drift": "{kind: config_drift, gpu: 1, setting: ecc_mode}",
    "kernel_xid": "{kind: kernel_xid, gpu: 1, code: 79, ago: 2m}",
    # A GB200 line (tests/fixtures/kmsg/) on GPU 1's bus.
    "kernel_line": '{kind: kernel_line, text: "NVRM: Xid (PCI:0000:2a:00): 149, NETIR_LINK_EVT'
    "  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000"
    ' 0x00000000)"}',
}


@dataclass(frozen=True)
class Sizes:
    polls: int  # timed polls per shape, after those that fill the history
    fill_every_shape: bool  # else only the 8-GPU node's history is filled first
    scrapes: int
    rss_polls: int
    ib_rounds: int
    canary_bursts: int
    kind_horizon: float  # simulated seconds after the fault


FULL = Sizes(
    polls=200,
    fill_every_shape=True,
    scrapes=200,
    rss_polls=100_000,
    ib_rounds=300,
    canary_bursts=5,
    kind_horizon=1500.0,
)
QUICK = Sizes(
    polls=6,
    fill_every_shape=False,
    scrapes=10,
    rss_polls=400,
    ib_rounds=10,
    canary_bursts=1,
    kind_horizon=40.0,
)


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def spread(values: list[float]) -> dict[str, float]:
    """Median and 99th percentile, in ms."""
    cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values
    return {"median_ms": ms(statistics.median(values)), "p99_ms": ms(cuts[-1])}


def timed_cpu(rounds: int, action: Callable[[], object]) -> list[float]:
    return timed(rounds, action, time.thread_time)


def shape_scenario(gpus: int) -> scenarios.Scenario:
    return scenarios.parse(f"node: {{gpus: {gpus}, nvlinks: 18, hcas: 8}}\nseed: 1\nfaults: []\n")


def scrape(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": PROMETHEUS_ACCEPT})
    with urllib.request.urlopen(request, timeout=30) as response:
        body: bytes = response.read()
        return body


def fresh_renders(run: NodeRun, polls: int) -> tuple[list[float], list[float]]:
    """CPU seconds of the page rendered anew after each of `polls` polls, in
    OpenMetrics (what Prometheus asks for) and then in text: what the
    daemon's prerender costs a poll. A render of a Snapshot already rendered
    would find every held family's text ready and say less than a poll costs."""
    daemon = run.daemon

    def render(accept: str) -> float:
        started = time.thread_time()
        MetricsPage(lambda: daemon.snapshot).render(accept)
        return time.thread_time() - started

    openmetrics, text = [], []
    for _ in range(polls):
        run.poll()
        openmetrics.append(render(PROMETHEUS_ACCEPT))
        text.append(render(""))
    return openmetrics, text


def page_figures(run: NodeRun, sizes: Sizes) -> dict[str, Any]:
    """The /metrics render after a poll, and the scrape of the node as it stands."""
    daemon = run.daemon
    uncached, text = fresh_renders(run, sizes.scrapes)
    encoder, _ = choose_encoder(PROMETHEUS_ACCEPT)
    library = timed_cpu(sizes.scrapes, lambda: encoder(daemon.registry))
    daemon.metrics.prerender()
    daemon.metrics.render(PROMETHEUS_ACCEPT)
    cached = timed_cpu(sizes.scrapes, lambda: daemon.metrics.render(PROMETHEUS_ACCEPT))
    server = StatusServer(
        ("127.0.0.1", 0), daemon.metrics, lambda: daemon.snapshot, 3600.0, run.clock.now
    )
    server.start()
    try:
        http = timed(sizes.scrapes, lambda: scrape(f"{server.url}/metrics"))
    finally:
        server.stop()
    return {
        "render_uncached": spread(uncached),
        "render_uncached_text": spread(text),
        "render_by_prometheus_client": spread(library),
        "scrape_cached": spread(cached),
        "http_scrape_cached": spread(http),
    }


def poll_figures(costs: list[PollCost], waiting: list[PollCost]) -> dict[str, Any]:
    """CPU figures from `costs` (the fake answering at once), wall time and
    driver time from `waiting` (the fake waiting the driver's time a call)."""
    polls = len(costs)
    return {
        "poll_process_cpu": spread([c.process_cpu for c in costs]),
        "poll_thread_cpu": spread([c.thread_cpu for c in costs]),
        "poll_wall": spread([c.wall for c in waiting]),
        "fake_nvml_cpu": spread([c.fake_cpu for c in costs]),
        "nvml_calls_per_poll": round(sum(c.nvml_calls for c in costs) / polls, 1),
        "nvml_driver_ms_per_poll": ms(sum(c.driver for c in waiting) / len(waiting)),
        "nvml_call_latency_us": round(MEASURED_CALL_LATENCY_S * 1e6, 1),
    }


def shape_figures(gpus: int, sizes: Sizes, root: Path) -> dict[str, Any]:
    with node_run(root / f"gpus-{gpus}", shape_scenario(gpus)) as run:
        warm = run.polls_to_fill() if sizes.fill_every_shape or gpus == MAIN_SHAPE else 3
        for _ in range(warm):
            run.poll()
        costs = [run.poll() for _ in range(sizes.polls)]
        run.node.nvml.call_latency_s = MEASURED_CALL_LATENCY_S
        waiting = [run.poll() for _ in range(sizes.polls)]
        run.node.nvml.call_latency_s = 0.0
        body, _ = run.daemon.metrics.render("")
        figures: dict[str, Any] = {
            **poll_figures(costs, waiting),
            "series": sum(series_by_family(body).values()),
            "bytes": len(body),
        }
        if gpus == MAIN_SHAPE:
            figures.update(page_figures(run, sizes))
    return figures


def memory_run(what: str, polls: int) -> tuple[dict[int, float], int]:
    """bench/memory.py's samples (poll -> MiB) in a fresh process, and the poll
    that fills the history."""
    command = [sys.executable, str(REPO / "bench" / "memory.py"), what, str(polls)]
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=6 * 3600, cwd=REPO / "bench"
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {int(n): float(mib) for n, mib in result["samples"]}, int(result["history_full_at"])


def rss_figures(polls: int) -> dict[str, Any]:
    """The daemon's resident memory (the simulator's share taken out) after
    its first poll, once the history is full, and after `polls` polls."""
    daemon, full = memory_run("daemon", polls)
    simulator, _ = memory_run("simulator", polls)

    def own(poll: int) -> float:
        return round(daemon[poll] - (simulator[poll] - simulator[0]), 1)

    samples = [(poll, own(poll)) for poll in sorted(daemon) if poll]
    settled = [mib for poll, mib in samples if poll >= full] or [samples[-1][1]]
    return {
        "polls": polls,
        "imports_mib": round(daemon[0], 1),
        "simulator_share_mib": round(simulator[polls] - simulator[0], 1),
        "start_mib": own(1),
        "full_history_mib": own(full) if full in daemon else None,
        "history_full_at": full,
        "end_mib": own(polls),
        "growth_after_fill_mib": round(max(settled) - min(settled), 1),
        "samples": samples,
    }


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def canary_figures(bursts: int) -> dict[str, Any]:
    """CPU seconds of one burst in its worker process (start-up and imports
    included, as the daemon runs it) for a GPU stand-in and the host cores;
    and the host's work in a CUDA-sized burst (its worker's start left out)."""
    config = CanaryConfig()
    clock = SystemClock()
    figures: dict[str, Any] = {}
    for name, request in zip(("gpu_burst", "host_burst"), burst_requests(config), strict=True):
        cpu = []
        for _ in range(bursts):
            before = children_cpu()
            run_burst(request, timeout=config.timeout, clock=clock)
            cpu.append(children_cpu() - before)
        figures[f"{name}_cpu_ms"] = ms(statistics.median(cpu))
    figures["gpu_interval_s"] = config.interval
    figures["host_interval_s"] = config.host_interval
    cuda = cuda_host_figures(bursts)
    figures["cuda_host_cpu_s_per_burst"] = cuda["cuda_host_cpu_s_per_burst"]
    figures["gpu_memory_peak_mib"] = cuda["gpu_memory_peak_mib"]
    figures["cuda_backend"] = cuda["cuda_backend"]
    return figures


def cpu_share(shapes: dict[str, Any], canary: dict[str, Any]) -> dict[str, Any]:
    """Percent of one core: a poll and one page render per interval, plus the
    canaries' bursts amortised over their default schedule on 8 GPUs."""
    main = shapes[str(MAIN_SHAPE)]
    per_poll = main["poll_process_cpu"]["median_ms"] + main["render_uncached"]["median_ms"]
    canaries = (
        MAIN_SHAPE * canary["gpu_burst_cpu_ms"] / canary["gpu_interval_s"]
        + canary["host_burst_cpu_ms"] / canary["host_interval_s"]
    ) / 10  # ms per s -> percent of a core
    default_interval = Config().daemon.poll_interval
    share = {}
    for label, interval in (("default", default_interval), ("1s", 1.0)):
        daemon = per_poll / interval / 10
        share[label] = {
            "interval_s": interval,
            "daemon_percent": round(daemon, 3),
            "canaries_percent": round(canaries, 3),
            "total_percent": round(daemon + canaries, 3),
        }
    return share


def infiniband_figures(rounds: int) -> dict[str, Any]:
    figures = measure_infiniband(rounds, NODE_EXPORTER, report=False)
    collector, http = figures["node_exporter_collector"], figures["node_exporter_http"]
    return {
        **{k: ms(v) if "series" not in k and "bytes" not in k else v for k, v in figures.items()},
        "ratio_read_render_vs_collector": round(figures["read_render"] / collector, 2),
        "ratio_read_families_vs_collector": round(
            (figures["read"] + figures["build"]) / collector, 2
        ),
        "ratio_http_cached_vs_node_exporter": round(figures["http_cached"] / http, 2),
        "ratio_http_read_render_vs_node_exporter": round(figures["http_read_render"] / http, 2),
    }


def kind_figures(kind: str, horizon: float, root: Path) -> dict[str, Any]:
    """Simulated seconds from the fault to its first finding (warn or worse)
    and to its first quarantine, on any subject (a missing GPU is the node's)."""
    at = 0.0 if kind in scenarios.FROM_BOOT else FAULT_AT
    fault = KIND_FAULTS[kind]
    text = KIND_NODE + f"faults: [{fault[:-1]}, at: {at:g}s}}]\n"
    found: tuple[float, str] | None = None
    decided: tuple[float, str] | None = None
    with simulated_daemon(text, root / kind, canary=kind == "sdc") as sim:
        interval = sim.daemon.config.daemon.poll_interval
        while decided is None and (elapsed := sim.clock.now() - sim.start - at) <= horizon:
            snapshot = sim.daemon.step()
            if elapsed < 0:  # before the fault: nothing of it to find yet
                sim.clock.advance(interval)
                continue
            if found is None:
                finding = next(
                    (f for f in snapshot.findings if f.severity is not Severity.OK),
                    None,
                )
                if finding is not None:
                    found = (max(0.0, elapsed), f"{finding.subject} {finding.code}")
            quarantined = sorted(
                (s for s, health in snapshot.health.items() if health is Health.QUARANTINED),
                key=lambda subject: subject == "node",  # the node follows what it holds
            )
            if quarantined:
                decided = (max(0.0, elapsed), quarantined[0])
            sim.clock.advance(interval)
    return {
        "finding_s": None if found is None else found[0],
        "finding": None if found is None else found[1],
        "decision_s": None if decided is None else decided[0],
        "quarantined": None if decided is None else decided[1],
        "horizon_s": horizon,
    }


def all_kinds(horizon: float, root: Path) -> dict[str, Any]:
    missing = sorted(set(scenarios.FAULT_FIELDS) - set(KIND_FAULTS))
    if missing:
        raise SystemExit(f"bench/run.py: no fault to measure for kind(s) {', '.join(missing)}")
    return {kind: kind_figures(kind, horizon, root) for kind in sorted(scenarios.FAULT_FIELDS)}


def machine() -> dict[str, Any]:
    load = psutil.getloadavg()
    return {
        "cpus": psutil.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in load],
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }


def run(sizes: Sizes) -> dict[str, Any]:
    results: dict[str, Any] = {"machine_before": machine(), "sizes": sizes.__dict__}
    with scratch("gpuwatchd-bench-") as directory:
        root = Path(directory)
        results["shapes"] = {str(g): shape_figures(g, sizes, root) for g in SHAPES}
        results["infiniband"] = infiniband_figures(sizes.ib_rounds)
        results["canary"] = canary_figures(sizes.canary_bursts)
        results["cpu_share"] = cpu_share(results["shapes"], results["canary"])
        results["kinds"] = all_kinds(sizes.kind_horizon, root)
    results["rss"] = rss_figures(sizes.rss_polls)
    results["machine_after"] = machine()
    return results


def rows(results: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(figure, measured, target) for the table."""
    shapes = results["shapes"]
    for gpus in SHAPES:
        shape = shapes[str(gpus)]
        main = gpus == MAIN_SHAPE
        for key, label, target in (
            ("poll_process_cpu", "process CPU, less the fake's", "≤ 5 ms median" if main else ""),
            ("poll_thread_cpu", "polling thread's CPU", ""),
            ("poll_wall", "wall (driver waits included)", ""),
            ("fake_nvml_cpu", "the fake library's own CPU (left out)", ""),
        ):
            figure = shape[key]
            yield (
                f"poll, {gpus} GPU(s): {label}, median / p99",
                f"{figure['median_ms']:.1f} / {figure['p99_ms']:.1f} ms",
                target,
            )
        yield (
            f"poll, {gpus} GPU(s): NVML calls, driver time at "
            f"{shape['nvml_call_latency_us']:g} us a call",
            f"{shape['nvml_calls_per_poll']:g}, {shape['nvml_driver_ms_per_poll']:.1f} ms",
            f"≤ {25 * gpus} calls (25 a GPU)" if main else "",
        )
        yield f"page, {gpus} GPU(s): series, bytes", f"{shape['series']}, {shape['bytes']}", ""
    main = shapes[str(MAIN_SHAPE)]
    for key, label, target in (
        ("render_uncached", "render after a poll, OpenMetrics, CPU", "≤ 3 ms"),
        ("render_uncached_text", "render after a poll, then in text 0.0.4 too, CPU", ""),
        ("render_by_prometheus_client", "OpenMetrics render by prometheus_client, CPU", ""),
        ("scrape_cached", "scrape from the cache, CPU", "≤ 3 ms"),
        ("http_scrape_cached", "HTTP scrape on loopback, wall", "≤ 3 ms"),
    ):
        figure = main[key]
        yield (
            f"/metrics, 8 GPUs: {label} median / p99",
            f"{figure['median_ms']:.2f} / {figure['p99_ms']:.2f} ms",
            target,
        )
    rss = results["rss"]
    yield (
        "RSS, 8 GPUs, after the first poll (the simulator's share out)",
        f"{rss['start_mib']:.1f} MiB",
        "",
    )
    yield (
        f"RSS with the history full (poll {rss['history_full_at']})",
        f"{rss['full_history_mib']:.1f} MiB ({rss['full_history_mib'] - rss['start_mib']:+.1f})",
        "≤ start + 8 MiB, ≤ 48 MiB",
    )
    yield (
        f"RSS after {rss['polls']} polls: end, spread once full",
        f"{rss['end_mib']:.1f} MiB, {rss['growth_after_fill_mib']:.1f} MiB",
        "flat",
    )
    for label, share in results["cpu_share"].items():
        yield (
            f"CPU share at {share['interval_s']:g} s ({label}), daemon + canaries",
            f"{share['daemon_percent']:.3f} + {share['canaries_percent']:.3f} = "
            f"{share['total_percent']:.3f} % of a core",
            "≤ 0.2 %" if label == "default" else "",
        )
    canary = results["canary"]
    yield (
        "canary burst CPU, GPU stand-in / host cores",
        f"{canary['gpu_burst_cpu_ms']:.0f} / {canary['host_burst_cpu_ms']:.0f} ms",
        "",
    )
    yield (
        f"CUDA-sized burst ({canary['cuda_backend']}): host CPU, references cached",
        f"{canary['cuda_host_cpu_s_per_burst']:.3f} s",
        "≤ 0.5 s",
    )
    peak = canary["gpu_memory_peak_mib"]
    yield (
        "CUDA-sized burst: GPU memory at its peak (the pool's)",
        "unknown" if peak is None else f"{peak:.0f} MiB",
        "≤ 512 MiB",
    )
    ib = results["infiniband"]
    yield (
        "InfiniBand read + render / node_exporter collector",
        f"{ib['read_render']:.2f} ms / {ib['node_exporter_collector']:.2f} ms = "
        f"{ib['ratio_read_render_vs_collector']:.2f}x",
        "≤ 1.0x",
    )
    yield (
        "InfiniBand read + families (no encoding) / collector",
        f"{ib['read'] + ib['build']:.2f} ms: {ib['ratio_read_families_vs_collector']:.2f}x",
        "",
    )
    yield (
        "InfiniBand HTTP scrape, cached page / node_exporter",
        f"{ib['http_cached']:.2f} ms / {ib['node_exporter_http']:.2f} ms = "
        f"{ib['ratio_http_cached_vs_node_exporter']:.2f}x",
        "≤ 1.0x",
    )
    for kind, figure in results["kinds"].items():
        found = "-" if figure["finding_s"] is None else f"{figure['finding_s']:g} s"
        decided = "-" if figure["decision_s"] is None else f"{figure['decision_s']:g} s"
        yield (
            f"fault {kind}: to finding / to quarantine",
            f"{found} / {decided}",
            f"({figure['finding'] or 'no finding'})",
        )


def table(results: dict[str, Any]) -> str:
    lines = ["| figure | measured | target |", "| --- | --- | --- |"]
    lines += [f"| {figure} | {measured} | {target} |" for figure, measured, target in rows(results)]
    where = results["machine_before"]
    lines.append(
        f"\n{where['cpus']} CPUs, Python {where['python']}, load average "
        f"{' '.join(map(str, where['load_average']))} at the start, "
        f"{' '.join(map(str, results['machine_after']['load_average']))} at the end; "
        f"{where['date_utc']} UTC"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few samples of each (CI)")
    parser.add_argument(
        "--json",
        type=Path,
        default=REPO / "bench" / "results.json",
        help="write the figures here (default bench/results.json)",
    )
    parser.add_argument("--rss-polls", type=int, help="polls before RSS is read (default 10^5)")
    args = parser.parse_args()
    # The simulated faults' findings and decisions are the daemon's log lines: not the table's.
    logging.basicConfig(level=logging.ERROR)
    sizes = QUICK if args.quick else FULL
    if args.rss_polls is not None:
        sizes = Sizes(**{**sizes.__dict__, "rss_polls": args.rss_polls})
    results = run(sizes)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
