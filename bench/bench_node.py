"""Benchmark: what gpuwatchd costs on a full node, and its series budget.

Usage:

    python bench/bench_node.py [--warmup 360] [--polls 120] [--scrapes 200] [--profile FILE]

Builds the production daemon over a simulated HGX node (8 x H100, 18 NVLinks
each, 8 HCAs; the default scenario's faults, so findings and quarantines are
in play) on an injected clock, then measures:

- one poll: every source (NVML through nvidia-ml-py over the fake library,
  InfiniBand from a sysfs tree), every check, policy and the state database,
  in wall time and in the polling thread's CPU time, and the CPU time of each
  of those parts;
- one scrape: rendering /metrics from the held Snapshot;
- the series one node exports, by family, and the size of a scrape;
- the daemon's resident memory after the polls.

The polls are timed once the history is full (`--warmup` polls first: 360 at
the default 10 s interval fill the default hour), since a check's cost may
grow with the history it holds.

The fake library answers faster than a real driver (an NVML call on a real
H100 takes tens of microseconds), so the poll time is the daemon's own cost,
not the driver's. Canaries are left out: they run in worker processes on
their own duty budget (bench/bench_canary.py).
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd import daemon as daemon_module
from gpuwatchd.assemble import build_sources, simulate
from gpuwatchd.checks import registry
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim import scenario as scenarios


class Parts:
    """CPU time of the parts of a poll (thread time, so another process's load
    on the shared machine is not counted), per poll."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)
        self.timing = False

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.thread_time()
        try:
            yield
        finally:
            if self.timing:
                self.times[name].append(time.thread_time() - started)

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.part(name):
                return function(*args, **kwargs)

        return timed


def _instrument(daemon: Daemon, parts: Parts) -> None:
    """Time each source, each check, policy and the store, in place: the
    daemon's code runs unchanged inside the timers."""
    for source in daemon.sources:
        source.poll = parts.wrap(f"source {source.name}", source.poll)  # type: ignore[method-assign]
    registry.CHECKS = tuple(
        (name, parts.wrap(f"check {name}", check)) for name, check in registry.CHECKS
    )
    daemon_module.run_all = parts.wrap("checks (all)", daemon_module.run_all)  # type: ignore[attr-defined]
    daemon_module.evaluate = parts.wrap("policy.evaluate", daemon_module.evaluate)  # type: ignore[attr-defined]
    daemon_module.observed_subjects = parts.wrap(  # type: ignore[attr-defined]
        "policy.observed_subjects", daemon_module.observed_subjects
    )
    daemon.store.save_poll = parts.wrap("store.save_poll", daemon.store.save_poll)  # type: ignore[method-assign]
    daemon.history.record = parts.wrap("history.record", daemon.history.record)  # type: ignore[method-assign]


def _report(label: str, durations: list[float]) -> float:
    median = statistics.median(durations)
    p99 = statistics.quantiles(durations, n=100)[-1] if len(durations) > 1 else median
    print(f"{label:<34} median {median * 1e3:8.2f} ms   p99 {p99 * 1e3:8.2f} ms")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=360, help="untimed polls first")
    parser.add_argument("--polls", type=int, default=120)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--profile", help="write a cProfile of the timed polls here")
    args = parser.parse_args()

    parts = Parts()
    profiler = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        config = Config(daemon=DaemonConfig(state_dir=str(root / "state")))
        config = config.only_sources(("nvml", "infiniband"))
        clock = FakeClock()
        config, node = simulate(config, clock, scenarios.load("default"), root / "sysfs")
        # The simulator moves outside the timed part: writing its sysfs tree
        # is not the daemon's cost.
        daemon = Daemon(config, build_sources(config, clock, xid_thread=False), clock)
        _instrument(daemon, parts)
        walls: list[float] = []
        cpus: list[float] = []
        for poll in range(args.warmup + args.polls):
            timed = poll >= args.warmup
            parts.timing = timed
            node.advance(clock.now())
            started, started_cpu = time.perf_counter(), time.thread_time()
            if profiler is not None and timed:
                profiler.enable()
            daemon.step()
            if profiler is not None and timed:
                profiler.disable()
            if timed:
                cpus.append(time.thread_time() - started_cpu)
                walls.append(time.perf_counter() - started)
            clock.advance(config.daemon.poll_interval)
        scrapes: list[float] = []
        body = b""
        for _ in range(args.scrapes):
            started = time.perf_counter()
            body = generate_latest(daemon.registry)
            scrapes.append(time.perf_counter() - started)
        rss = psutil.Process().memory_info().rss
        daemon.close()
        node.uninstall()
    if profiler is not None:
        profiler.dump_stats(args.profile)

    print(f"{args.polls} polls after {args.warmup} untimed ones")
    _report("one poll, wall", walls)
    poll = _report("one poll, CPU", cpus)
    for name, durations in sorted(parts.times.items(), key=lambda item: item[0]):
        # Parts that run more than once a poll (none now) would show per call.
        _report(f"  {name}", durations)
    _report("one scrape (render /metrics)", scrapes)
    per_hour = poll * 3600 / config.daemon.poll_interval
    print(
        f"CPU for polling at {config.daemon.poll_interval:g}s: {per_hour:.1f} s/hour "
        f"({per_hour / 36:.3f} % of one core)"
    )
    series: Counter[str] = Counter()
    for family in text_string_to_metric_families(body.decode()):
        series[family.name] += len(family.samples)
    print(
        f"series per node: {sum(series.values())}, scrape size {len(body) / 1024:.0f} KiB, "
        f"resident memory {rss / 2**20:.0f} MiB"
    )
    for name, count in series.most_common(8):
        print(f"  {count:5d}  {name}")


if __name__ == "__main__":
    main()
