"""Putting a daemon together from config: its sources, and for `--simulate`
the simulated node they read. Kept apart from the CLI so tests build the very
same daemon with a fake clock."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from gpuwatchd.canary.agent import BurstRunner, CanaryAgent
from gpuwatchd.canary.bursts import StandIn, WorkerCaches
from gpuwatchd.canary.cli import SimulatedGpu
from gpuwatchd.canary.modes import read_modes
from gpuwatchd.canary.runner import choose_gpu_backend, run_burst
from gpuwatchd.clock import Clock
from gpuwatchd.config import Config
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.canary_faults import ScenarioFaults, sdc_faults
from gpuwatchd.sim.gpu import spec_for
from gpuwatchd.sim.node import SimulatedNode
from gpuwatchd.sources import Source
from gpuwatchd.sources.infiniband import InfinibandSource
from gpuwatchd.sources.kmsg import system_uptime
from gpuwatchd.sources.nvml import NvmlSource
from gpuwatchd.sources.pcie import PcieSource

log = logging.getLogger(__name__)


def build_canary(
    config: Config,
    clock: Clock,
    scenario: scenarios.Scenario | None = None,
    runner: BurstRunner = run_burst,
    executor: Executor | None = None,
) -> CanaryAgent | None:
    """The canary agent (None when canaries are off). On a simulated node the
    CPU backend stands in for each GPU, as its model with its SM count, and
    the scenario's `sdc` faults corrupt the stand-in of the GPUs they name,
    while they are active.
    `runner` and `executor` say where bursts run (worker processes by default)."""
    if not config.canary.enabled:
        return None
    backend, why = choose_gpu_backend(
        config.canary.backend, simulated=scenario is not None, probe_timeout=config.canary.timeout
    )
    log.info("canaries: %s", why)
    state_dir = config.daemon.state_dir
    digests = os.path.join(state_dir, "canary-digests.json")
    # References, CuPy's kernels and the driver's JIT cache live in the state
    # directory: the only place the systemd unit lets the daemon write.
    canary_config = config.canary
    if canary_config.reference_cache is None:
        references = os.path.join(state_dir, "canary-references")
        canary_config = replace(canary_config, reference_cache=references)
    caches = WorkerCaches(
        kernels=os.path.join(state_dir, "cupy-kernel-cache"),
        jit=os.path.join(state_dir, "cuda-jit-cache"),
    )
    cores = os.sched_getaffinity(0)
    if scenario is None:
        return CanaryAgent(
            canary_config,
            clock,
            gpu_backend=backend,
            host_cores=cores,
            digest_path=digests,
            runner=runner,
            executor=executor,
            modes=read_modes,
            caches=caches,
        )
    start = clock.now()
    models = scenario.node.distinct_models
    return CanaryAgent(
        canary_config,
        clock,
        gpu_backend=backend,
        host_cores=cores,
        stand_ins=tuple(StandIn(model, spec_for(model).sm_count) for model in models),
        faults=ScenarioFaults(scenario, lambda: clock.now() - start),
        digest_path=digests,
        runner=runner,
        executor=executor,
        modes=read_modes,
        caches=caches,
    )


def simulated_canary_node(name: str) -> tuple[SimulatedGpu, ...]:
    """The GPUs of scenario `name` as `gpuwatchd canary --simulate` stands in
    for them: each as its model, with the scenario's `sdc` faults on it
    (all of them, whatever their `at`: a one-shot run). ValueError for a bad
    scenario or a model with no simulated hardware."""
    scenario = scenarios.load(name)
    faults = sdc_faults(scenario)
    gpus = []
    for index in range(scenario.node.gpus):
        spec = spec_for(scenario.node.model_of(index))
        gpus.append(
            SimulatedGpu(spec.name, spec.sm_count, spec.compute_capability, faults.get(index, ()))
        )
    return tuple(gpus)


def build_sources(
    config: Config,
    clock: Clock,
    xid_thread: bool = True,
    uptime: Callable[[], float] = system_uptime,
) -> list[Source]:
    """`uptime`: the kernel log's clock (a simulated node's own)."""
    sources: list[Source] = []
    if config.sources.nvml.enabled:
        # The PCI tree the PCIe source reads says whether the node has GPUs.
        root = config.sources.pcie.sysfs_root
        sources.append(NvmlSource(clock, config.sources.nvml, xid_thread, uptime, root))
    if config.sources.infiniband.enabled:
        sources.append(InfinibandSource(config.sources.infiniband))
    if config.sources.pcie.enabled:
        sources.append(PcieSource(config.sources.pcie))
    return sources


def simulate(
    config: Config, clock: Clock, scenario: scenarios.Scenario, sysfs_root: Path
) -> tuple[Config, SimulatedNode]:
    """A simulated node installed under nvidia-ml-py, and the config that reads it."""
    node = SimulatedNode(scenario, sysfs_root, clock.now()).install()
    infiniband = replace(config.sources.infiniband, sysfs_root=str(sysfs_root))
    # A capture holds no PCIe tree: a captured node has no PCIe source to read.
    captured = scenario.node.capture is not None
    enabled = config.sources.pcie.enabled and not captured
    pcie = replace(config.sources.pcie, sysfs_root=str(sysfs_root), enabled=enabled)
    nvml = replace(config.sources.nvml, kernel_log=str(node.kernel_log.path))
    sources = replace(config.sources, nvml=nvml, infiniband=infiniband, pcie=pcie)
    config = replace(config, sources=sources)
    return _expecting_the_scenario_node(config, scenario), node


def simulated_node(
    stack: ExitStack, config: Config, clock: Clock, name: str
) -> tuple[Config, Callable[[float], None]]:
    """The node of scenario `name` (a file or a built-in name) installed until
    `stack` closes, the config that reads it, and what moves it before each
    poll: for the CLI's one-off readers (capture, report, canary --dcgm).
    ScenarioError for a scenario that does not load."""
    root = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwatchd-sim-"))
    config, node = simulate(config, clock, scenarios.load(name), Path(root))
    stack.callback(node.uninstall)
    return config, node.advance


def _expecting_the_scenario_node(config: Config, scenario: scenarios.Scenario) -> Config:
    """The scenario's node shape is what its hardware should have (faults such
    as `gpu_missing` and `nvlink_inactive` take from it); unless configured,
    expect that many GPUs and NVLinks, not what the first start, the fabric or
    the links seen up say. On a node that mixes models, the fewest NVLinks any
    of its GPUs has: `expected_links` is one count for every GPU, and more
    would call every GPU of the smaller model short of links (critical, a
    quarantine)."""
    node = scenario.node
    checks = config.checks
    if checks.gpu_lost.expected_gpus is None:
        gpus = replace(checks.gpu_lost, expected_gpus=node.gpus)
        checks = replace(checks, gpu_lost=gpus)
    if checks.nvlink.expected_links is None:
        count = min(min(node.nvlinks, spec_for(m).nvlinks) for m in node.distinct_models)
        links = replace(checks.nvlink, expected_links=count)
        checks = replace(checks, nvlink=links)
    return replace(config, checks=checks)


def build_daemon(
    config: Config, clock: Clock, scenario_name: str | None, stack: ExitStack
) -> Daemon:
    """The daemon `gpuwatchd run` runs; with a scenario, over a simulated node
    whose files and fake library `stack` removes on exit."""
    if scenario_name is None:
        sources = build_sources(config, clock)
        daemon = Daemon(config, sources, clock, canary=build_canary(config, clock))
    else:
        chosen = scenarios.load(scenario_name)
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwatchd-sysfs-")))
        config, node = simulate(config, clock, chosen, root)
        stack.callback(node.uninstall)
        daemon = Daemon(
            config,
            build_sources(config, clock, uptime=node.uptime(clock)),
            clock,
            before_poll=node.advance,
            boot_id_path=str(node.boot_id_path),
            canary=build_canary(config, clock, chosen),
        )
    stack.callback(daemon.close)
    return daemon
