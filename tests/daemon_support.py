"""Test support: the production daemon over a simulated node, on a fake clock.

`simulated_daemon` builds the daemon exactly as `gpuwatchd run --simulate`
does (assemble.simulate and assemble.build_sources), except that the clock is
a FakeClock and XIDs are drained inline, so a test runs minutes of node time
in milliseconds and without sleeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from gpuwatchd.assemble import build_canary, build_sources, simulate
from gpuwatchd.canary.worker import run_in_process
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.node import SimulatedNode
from gpuwatchd.snapshot import Snapshot

T = TypeVar("T")


class InlineExecutor(Executor):
    """Runs each canary burst as it is submitted, in this process: the agent
    sees it done at its next poll, so canary tests are deterministic."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


@dataclass
class SimulatedDaemon:
    daemon: Daemon
    clock: FakeClock
    node: SimulatedNode
    start: float

    def run_until(self, seconds: float) -> Snapshot:
        """Poll every interval until `seconds` after start; the last Snapshot."""
        interval = self.daemon.config.daemon.poll_interval
        snapshot = self.daemon.snapshot
        while self.clock.now() - self.start <= seconds + 1e-9:
            snapshot = self.daemon.step()
            self.clock.advance(interval)
        return snapshot


@contextlib.contextmanager
def simulated_daemon(
    scenario_text: str,
    state_dir: Path,
    config: Config | None = None,
    canary: bool = False,
    start: float | None = None,
    host_cores: bool = False,
    links_from_scenario: bool = True,
) -> Iterator[SimulatedDaemon]:
    """`canary` runs the canary agent too (bursts inline; the host's cores
    only with `host_cores`); `start` is the injected clock's time at the start
    (a restart later on). `links_from_scenario` False expects NVLinks as on a
    real node (config, the fabric, the links seen up), not the scenario's."""
    config = config or Config()
    config = replace(config, canary=replace(config.canary, enabled=canary, host_cores=host_cores))
    config = replace(config, daemon=replace(config.daemon, state_dir=str(state_dir / "state")))
    clock = FakeClock() if start is None else FakeClock(start)
    scenario = scenarios.parse(scenario_text, "test-scenario")
    configured_links = config.checks.nvlink
    config, node = simulate(config, clock, scenario, state_dir / "sysfs")
    if not links_from_scenario:
        config = replace(config, checks=replace(config.checks, nvlink=configured_links))
    agent = build_canary(config, clock, scenario, run_in_process, InlineExecutor())
    sources = build_sources(config, clock, xid_thread=False, uptime=node.uptime(clock))
    daemon = Daemon(
        config, sources, clock, node.advance, boot_id_path=str(node.boot_id_path), canary=agent
    )
    try:
        yield SimulatedDaemon(daemon, clock, node, clock.now())
    finally:
        daemon.close()
        node.uninstall()
