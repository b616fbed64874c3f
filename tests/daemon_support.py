"""Test support: the production daemon over a simulated node, on a fake clock.

`simulated_daemon` builds the daemon exactly as `gpuwatchd run --simulate`
does (assemble.simulate and assemble.build_sources), except that the clock is
a FakeClock and XIDs are drained inline, so a test runs minutes of node time
in milliseconds and without sleeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwatchd.assemble import build_sources, simulate
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.node import SimulatedNode
from gpuwatchd.snapshot import Snapshot


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
) -> Iterator[SimulatedDaemon]:
    config = config or Config()
    config = replace(config, daemon=replace(config.daemon, state_dir=str(state_dir / "state")))
    clock = FakeClock()
    scenario = scenarios.parse(scenario_text, "test-scenario")
    config, node = simulate(config, clock, scenario, state_dir / "sysfs")
    daemon = Daemon(config, build_sources(config, clock, xid_thread=False), clock, node.advance)
    try:
        yield SimulatedDaemon(daemon, clock, node, clock.now())
    finally:
        daemon.close()
        node.uninstall()
