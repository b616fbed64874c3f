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

A poll's cost is the process CPU of all its threads (the NVML reads run on
a reader thread of their own) less the fake library's own Python, which a
real node does not run; the NVML calls it made are counted, and the driver
time they would take on a real node is charged at `call_latency_s` a call
(`MEASURED_CALL_LATENCY_S`, from public measurements) as a wait, not as CPU.
Canaries are left out: they run in worker processes on their own duty
budget (bench/bench_canary.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
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

# Memory-backed files where the system has them: the simulator rewrites its
# sysfs tree before every poll, and on a shared disk its renames wait on I/O
# for longer than the daemon's whole poll takes.
_SHARED_MEMORY = "/dev/shm"


def scratch(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary directory for a simulated node's files, in memory where possible."""
    where = _SHARED_MEMORY if os.path.isdir(_SHARED_MEMORY) else None
    return tempfile.TemporaryDirectory(prefix=prefix, dir=where)


@dataclass(frozen=True)
class PollCost:
    """What one poll cost: CPU seconds of the whole process (every thread)
    less the fake library's own, of the polling thread alone, and wall
    seconds; the NVML calls it made and the driver time charged for them."""

    process_cpu: float
    thread_cpu: float
    wall: float
    fake_cpu: float
    nvml_calls: int
    driver: float


@dataclass
class NodeRun:
    """The production daemon over a simulated node, on an injected clock; the
    simulator moves outside the timed part (writing its sysfs tree is not the
    daemon's cost)."""

    daemon: Daemon
    node: SimulatedNode
    clock: FakeClock
    config: Config

    def poll(self) -> PollCost:
        """One poll, and what it cost."""
        self.node.advance(self.clock.now())
        nvml = self.node.nvml
        fake, calls, driver = nvml.own_seconds, sum(nvml.calls.values()), nvml.charged_seconds
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        self.daemon.step()
        process, thread = time.process_time() - process, time.thread_time() - thread
        wall = time.perf_counter() - wall
        fake = nvml.own_seconds - fake
        self.clock.advance(self.config.daemon.poll_interval)
        return PollCost(
            process_cpu=process - fake,
            thread_cpu=thread,
            wall=wall,
            fake_cpu=fake,
            nvml_calls=sum(nvml.calls.values()) - calls,
            driver=nvml.charged_seconds - driver,
        )

    def polls_to_fill(self) -> int:
        """Polls after which the history holds its whole length (and one to expire)."""
        daemon = self.config.daemon
        return int(daemon.history / daemon.poll_interval) + 2


@contextlib.contextmanager
def node_run(
    root: Path, scenario: scenarios.Scenario, call_latency_s: float = 0.0
) -> Iterator[NodeRun]:
    """`scenario`'s node under `root`, read by the NVML, InfiniBand and PCIe
    sources; its fake library charges `call_latency_s` a call and times its
    own Python."""
    config = Config(daemon=DaemonConfig(state_dir=str(root / "state")))
    config = config.only_sources(("nvml", "infiniband", "pcie"))
    clock = FakeClock()
    config, node = simulate(config, clock, scenario, root / "sysfs")
    node.nvml.call_latency_s = call_latency_s
    node.nvml.metered = True
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
        scratch("gpuwatchd-bench-node-") as directory,
        node_run(Path(directory), scenarios.load("default")) as run,
    ):
        polls = [run.poll().process_cpu for _ in range(args.polls)]
        scrapes: list[float] = []
        body = b""
        for _ in range(args.scrapes):
            started = time.perf_counter()
            body = generate_latest(run.daemon.registry)
            scrapes.append(time.perf_counter() - started)
        rss = psutil.Process().memory_info().rss
        interval = run.config.daemon.poll_interval

    poll = _report("one poll, process CPU (less the fake's)", polls)
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
