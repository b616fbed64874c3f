"""Putting a daemon together from config: its sources, and for `--simulate`
the simulated node they read. Kept apart from the CLI so tests build the very
same daemon with a fake clock."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from gpuwatchd.clock import Clock
from gpuwatchd.config import Config
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.node import SimulatedNode
from gpuwatchd.sources import Source
from gpuwatchd.sources.infiniband import InfinibandSource
from gpuwatchd.sources.nvml import NvmlSource


def build_sources(config: Config, clock: Clock, xid_thread: bool = True) -> list[Source]:
    sources: list[Source] = []
    if config.sources.nvml.enabled:
        sources.append(NvmlSource(clock, config.sources.nvml, xid_thread=xid_thread))
    if config.sources.infiniband.enabled:
        sources.append(InfinibandSource(config.sources.infiniband))
    return sources


def simulate(
    config: Config, clock: Clock, scenario: scenarios.Scenario, sysfs_root: Path
) -> tuple[Config, SimulatedNode]:
    """A simulated node installed under nvidia-ml-py, and the config that reads it."""
    node = SimulatedNode(scenario, sysfs_root, clock.now()).install()
    infiniband = replace(config.sources.infiniband, sysfs_root=str(sysfs_root))
    return replace(config, sources=replace(config.sources, infiniband=infiniband)), node


def build_daemon(
    config: Config, clock: Clock, scenario_name: str | None, stack: ExitStack
) -> Daemon:
    """The daemon `gpuwatchd run` runs; with a scenario, over a simulated node
    whose files and fake library `stack` removes on exit."""
    if scenario_name is None:
        daemon = Daemon(config, build_sources(config, clock), clock)
    else:
        chosen = scenarios.load(scenario_name)
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwatchd-sysfs-")))
        config, node = simulate(config, clock, chosen, root)
        stack.callback(node.uninstall)
        daemon = Daemon(config, build_sources(config, clock), clock, before_poll=node.advance)
    stack.callback(daemon.close)
    return daemon
