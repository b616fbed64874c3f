"""Resident memory of the daemon over the 8-GPU node as its history fills.

Usage (bench/run.py runs both, each in a fresh process):

    .venv/bin/python bench/memory.py daemon POLLS      # the daemon over the simulated node
    .venv/bin/python bench/memory.py simulator POLLS   # the simulated node alone

Each prints one JSON line: the resident set (MiB, from /proc/self/status)
with the modules imported (poll 0), at poll 1, at the poll that fills the
history, at every twentieth of the run and at its end. Both import the same
modules first (what the daemon and the simulator need, nothing of the rest of
the benchmark), so the second run's growth is the simulator's own share of
the first's: its model, its fake library and its sysfs writer. What is left
is the daemon's.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

from bench_node import node_run, scratch

from gpuwatchd.clock import FakeClock
from gpuwatchd.config import DaemonConfig
from gpuwatchd.heap import return_freed_heap
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.node import SimulatedNode

NODE = "node: {gpus: 8, nvlinks: 18, hcas: 8}\nseed: 1\nfaults: []\n"
_RSS = re.compile(r"^VmRSS:\s+(\d+) kB$", re.MULTILINE)


def resident_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        match = _RSS.search(status.read())
    assert match is not None
    return int(match.group(1)) / 1024


def polls_to_fill() -> int:
    daemon = DaemonConfig()
    return int(daemon.history / daemon.poll_interval) + 2


def sampled(polls: int) -> set[int]:
    every = max(1, polls // 20)
    return {1, polls_to_fill(), polls} | set(range(every, polls + 1, every))


def daemon(polls: int, root: Path) -> list[tuple[int, float]]:
    samples = [(0, resident_mib())]
    marks = sampled(polls)
    with node_run(root, scenarios.parse(NODE)) as run:
        for number in range(1, polls + 1):
            run.poll()
            if number in marks:
                samples.append((number, resident_mib()))
    return samples


def simulator(polls: int, root: Path) -> list[tuple[int, float]]:
    """The simulated node moved as the daemon's run moves it, read by no one."""
    samples = [(0, resident_mib())]
    marks = sampled(polls)
    clock = FakeClock()
    node = SimulatedNode(scenarios.parse(NODE), root / "sysfs", clock.now()).install()
    interval = DaemonConfig().poll_interval
    try:
        for number in range(1, polls + 1):
            node.advance(clock.now())
            clock.advance(interval)
            if number in marks:
                samples.append((number, resident_mib()))
    finally:
        node.uninstall()
    return samples


def main() -> None:
    runs = {"daemon": daemon, "simulator": simulator}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "what", choices=sorted(runs), help="the daemon over the node, or the node alone"
    )
    parser.add_argument(
        "polls", type=int, help="polls to run; the line printed says which filled the history"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    # As `gpuwatchd run` does at start, in both runs alike.
    return_freed_heap()
    with scratch("gpuwatchd-memory-") as directory:
        samples = runs[args.what](args.polls, Path(directory))
    print(json.dumps({"samples": samples, "history_full_at": polls_to_fill()}))


if __name__ == "__main__":
    main()
