"""Benchmark: what gpuwatchd costs on a full node, and its series budget.

Usage:

    .venv/bin/python bench/bench_node.py [--polls 120] [--scrapes 200]

(bench/run.py measures all of this and more, on 1 to 16 GPUs, with the
history full; it builds its node with `node_run` from here.)

Builds the production daemon over a simulated HGX node (8 x H100, 18 NVLinks
each, 8 HCAs; the default scenario's faults, so findings and quarantines are
in play) on an injected clock, then measures:

- one poll: every source (NVML through nvidia-ml-py over the fake library,
  InfiniBand from a sysfs tree), every check, policy and the state database;
- one scrape: rendering /metrics from the held Snapshot;
- the series one node exports, by family, and the size of a scrape;
- the daemon's resident memory after the polls.

The fake library answers faster than a real driver (an NVML call on a real
H100 takes tens of microseconds), so the poll time is the daemon's own cost,
not the driver's. Canaries are left out: they run in worker processes on
their own duty budget (bench/bench_canary.py).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.assemble import build_sources, simulate
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.node import SimulatedNode


@dataclass
class NodeRun:
    """The production daemon over a simulated node, on an injected clock; the
    simulator moves outside the timed part (writing its sysfs tree is not the
    daemon's cost)."""

    daemon: Daemon
    node: SimulatedNode
    clock: FakeClock
    config: Config

    def poll(self) -> tuple[float, float]:
        """One poll: (CPU seconds of the polling thread, wall seconds)."""
        self.node.advance(self.clock.now())
        wall, cpu = time.perf_counter(), time.thread_time()
        self.daemon.step()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        self.clock.advance(self.config.daemon.poll_interval)
        return cpu, wall


@contextlib.contextmanager
def node_run(root: Path, scenario: scenarios.Scenario) -> Iterator[NodeRun]:
    """`scenario`'s node under `root`, read by the NVML, InfiniBand and PCIe sources."""
    config = Config(daemon=DaemonConfig(state_dir=str(root / "state")))
    config = config.only_sources(("nvml", "infiniband", "pcie"))
    clock = FakeClock()
    config, node = simulate(config, clock, scenario, root / "sysfs")
    sources = build_sources(config, clock, xid_thread=False, uptime=node.uptime(clock))
    daemon = Daemon(config, sources, clock)
    try:
        yield NodeRun(daemon, node, clock, config)
    finally:
        daemon.close()
        node.uninstall()


def series_by_family(body: bytes) -> Counter[str]:
    series: Counter[str] = Counter()
    for family in text_string_to_metric_families(body.decode()):
        series[family.name] += len(family.samples)
    return series


def _report(label: str, durations: list[float]) -> float:
    median = statistics.median(durations)
    p90 = statistics.quantiles(durations, n=10)[-1]
    print(f"{label:<34} median {median * 1e3:8.2f} ms   p90 {p90 * 1e3:8.2f} ms")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=120, help="polls timed (default 120)")
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes timed (default 200)")
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory() as scratch,
        node_run(Path(scratch), scenarios.load("default")) as run,
    ):
        polls = [run.poll()[1] for _ in range(args.polls)]
        scrapes: list[float] = []
        body = b""
        for _ in range(args.scrapes):
            started = time.perf_counter()
            body = generate_latest(run.daemon.registry)
            scrapes.append(time.perf_counter() - started)
        rss = psutil.Process().memory_info().rss
        interval = run.config.daemon.poll_interval

    poll = _report("one poll (sources+checks+policy+db)", polls)
    _report("one scrape (render /metrics)", scrapes)
    per_hour = poll * 3600 / interval
    print(
        f"CPU for polling at {interval:g}s: {per_hour:.1f} s/hour "
        f"({per_hour / 36:.3f} % of one core)"
    )
    series = series_by_family(body)
    print(
        f"series per node: {sum(series.values())}, scrape size {len(body) / 1024:.0f} KiB, "
        f"resident memory {rss / 2**20:.0f} MiB"
    )
    for name, count in series.most_common(8):
        print(f"  {count:5d}  {name}")


if __name__ == "__main__":
    main()
