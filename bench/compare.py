"""One poll's and one render's cost at any checkout, measured the same way.

Two commits are compared by alternating them in one sitting, the load given:

    git worktree add --detach /tmp/before <commit>
    for tree in /tmp/before . /tmp/before .; do
        .venv/bin/python bench/compare.py --tree $tree
    done

The checkout's own `gpuwatchd` is imported (not the installed one), so a
commit older than bench/run.py's figures is measured too: this uses only
what older commits have as well (`simulate`, `build_sources`, `Daemon`,
`MetricsPage`; used back to dda6f62, before issue 25). It builds the daemon
over the simulated 8 x H100 node (18 NVLinks a GPU, 8 HCAs) on an injected
clock, fills the hour of history, then times `--polls` polls: each poll's
process CPU (every thread) less the fake NVML library's own Python, timed
around its dispatch on the thread that calls it, and the NVML calls it
answered; after each poll, the page rendered anew in OpenMetrics, as the
daemon's prerender does. The simulator moves outside the timed part. One
JSON line is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NODE = "node: {gpus: 8, nvlinks: 18, hcas: 8}\nseed: 1\nfaults: []\n"
# What Prometheus 2.x and 3.x send.
ACCEPT = (
    "application/openmetrics-text;version=1.0.0,"
    "application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


class FakeTime:
    """Thread CPU seconds and calls inside the fake library's dispatch."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fake_class: Any) -> None:
        dispatch = fake_class._dispatch

        def timed(fake: Any, *args: Any) -> Any:
            started = time.thread_time()
            try:
                return dispatch(fake, *args)
            finally:
                self.seconds += time.thread_time() - started
                self.calls += 1

        fake_class._dispatch = timed


def measure(tree: Path, polls: int) -> dict[str, Any]:
    sys.path.insert(0, str(tree))
    from gpuwatchd.assemble import build_sources, simulate
    from gpuwatchd.clock import FakeClock
    from gpuwatchd.config import Config, DaemonConfig
    from gpuwatchd.daemon import Daemon
    from gpuwatchd.exporter import MetricsPage
    from gpuwatchd.sim import fake_nvml
    from gpuwatchd.sim import scenario as scenarios

    fake = FakeTime()
    fake.wrap(fake_nvml.FakeNvml)
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-compare-", dir=where) as scratch:
        root = Path(scratch)
        config = Config(daemon=DaemonConfig(state_dir=str(root / "state")))
        config = config.only_sources(("nvml", "infiniband", "pcie"))
        clock = FakeClock()
        config, node = simulate(config, clock, scenarios.parse(NODE), root / "sysfs")
        sources = build_sources(config, clock, xid_thread=False, uptime=node.uptime(clock))
        daemon = Daemon(config, sources, clock)
        fill = int(config.daemon.history / config.daemon.poll_interval) + 2
        costs, calls, renders = [], [], []
        try:
            for number in range(fill + polls):
                node.advance(clock.now())
                seconds, answered, started = fake.seconds, fake.calls, time.process_time()
                daemon.step()
                cost = time.process_time() - started - (fake.seconds - seconds)
                if number >= fill:
                    costs.append(cost)
                    calls.append(fake.calls - answered)
                    started = time.process_time()
                    MetricsPage(lambda: daemon.snapshot).render(ACCEPT)
                    renders.append(time.process_time() - started)
                clock.advance(config.daemon.poll_interval)
        finally:
            daemon.close()
            node.uninstall()
    return {
        "tree": str(tree),
        "poll_process_cpu_median_ms": round(statistics.median(costs) * 1e3, 2),
        "poll_process_cpu_p90_ms": round(statistics.quantiles(costs, n=10)[-1] * 1e3, 2),
        "nvml_calls_per_poll": round(statistics.mean(calls), 1),
        "render_after_poll_median_ms": round(statistics.median(renders) * 1e3, 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path("."), help="the checkout to measure")
    parser.add_argument(
        "--polls", type=int, default=100, help="polls timed once the history is full"
    )
    args = parser.parse_args()
    # The daemon's log lines are not the figures.
    logging.basicConfig(level=logging.CRITICAL)
    print(json.dumps(measure(args.tree.resolve(), args.polls)))


if __name__ == "__main__":
    main()
