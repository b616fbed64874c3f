"""The one explicit list of checks the daemon runs each poll, and their settings.

A check is added here and nowhere else: its config section under `checks:`
and its entry in CHECKS. (The list lives beside the check modules rather than
in `checks/__init__.py`, which each check imports for CheckOutput.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import chain

from gpuwatchd.checks import (
    CheckOutput,
    aer,
    clocks,
    config_drift,
    driver,
    fabric,
    gpu_lost,
    infiniband,
    memory,
    nvlink,
    pcie,
    recovery,
    sxid,
    thermal,
    xid,
)
from gpuwatchd.history import History

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChecksConfig:
    thermal: thermal.ThermalConfig = field(default_factory=thermal.ThermalConfig)
    clocks: clocks.ClocksConfig = field(default_factory=clocks.ClocksConfig)
    nvlink: nvlink.NvlinkConfig = field(default_factory=nvlink.NvlinkConfig)
    memory: memory.MemoryConfig = field(default_factory=memory.MemoryConfig)
    xid: xid.XidConfig = field(default_factory=xid.XidConfig)
    gpu_lost: gpu_lost.GpuLostConfig = field(default_factory=gpu_lost.GpuLostConfig)
    pcie: pcie.PcieConfig = field(default_factory=pcie.PcieConfig)
    fabric: fabric.FabricConfig = field(default_factory=fabric.FabricConfig)
    aer: aer.AerConfig = field(default_factory=aer.AerConfig)
    infiniband: infiniband.InfinibandCheckConfig = field(
        default_factory=infiniband.InfinibandCheckConfig
    )


@dataclass(frozen=True)
class CheckInputs:
    """What every check may read: the history, the time, the boots seen, and
    the GPUs of the node's first healthy start, the InfiniBand ports the node
    learned it must keep (`ib:<device>/<port>`), and the NVLinks seen up on
    each board (GPU UUID -> link numbers)."""

    history: History
    now: float
    boots: xid.BootRecord
    known_gpus: tuple[gpu_lost.KnownGpu, ...] = ()
    expected_ports: frozenset[str] = frozenset()
    learned_links: nvlink.LearnedLinks = field(default_factory=dict)
    # Whether the daemon runs canaries (which need CUDA's nvidia-uvm module).
    canaries: bool = False


Check = Callable[[CheckInputs, ChecksConfig], CheckOutput]

CHECKS: tuple[tuple[str, Check], ...] = (
    (thermal.NAME, lambda i, c: thermal.run(i.history, i.now, c.thermal)),
    (clocks.NAME, lambda i, c: clocks.run(i.history, i.now, c.clocks)),
    (nvlink.NAME, lambda i, c: nvlink.run(i.history, i.now, c.nvlink, i.learned_links)),
    (memory.NAME, lambda i, c: memory.run(i.history, i.now, c.memory)),
    (pcie.NAME, lambda i, c: pcie.run(i.history, i.now, c.pcie)),
    (fabric.NAME, lambda i, c: fabric.run(i.history, i.now, c.fabric)),
    (aer.NAME, lambda i, c: aer.run(i.history, i.now, c.aer)),
    (config_drift.NAME, lambda i, c: config_drift.run(i.history)),
    (recovery.NAME, lambda i, c: recovery.run(i.history)),
    (driver.NAME, lambda i, c: driver.run(i.history, i.canaries)),
    (xid.NAME, lambda i, c: xid.run(i.history, i.now, c.xid, i.boots)),
    (sxid.NAME, lambda i, c: sxid.run(i.history, i.now, c.xid)),
    (
        gpu_lost.NAME,
        lambda i, c: gpu_lost.run(i.history, i.now, c.gpu_lost, i.known_gpus, i.boots, c.xid),
    ),
    (
        infiniband.NAME,
        lambda i, c: infiniband.run(i.history, i.now, c.infiniband, i.expected_ports),
    ),
)
CHECK_NAMES = tuple(name for name, _ in CHECKS)


@dataclass(frozen=True)
class ChecksRun:
    """Every check's output, and the checks that raised instead (name -> error)."""

    output: CheckOutput
    failed: Mapping[str, str]


def run_all(inputs: CheckInputs, config: ChecksConfig) -> ChecksRun:
    """Every check's findings and measurements, in registry order. A check
    that raises is left out and named in `failed`; the others still run."""
    outputs = []
    failed: dict[str, str] = {}
    for name, check in CHECKS:
        try:
            outputs.append(check(inputs, config))
        except Exception as error:  # one check's bug must not end the poll loop
            failed[name] = f"{type(error).__name__}: {error}"
            log.debug("check %s failed", name, exc_info=True)
    return ChecksRun(
        output=CheckOutput(
            findings=tuple(chain.from_iterable(output.findings for output in outputs)),
            measurements=tuple(chain.from_iterable(output.measurements for output in outputs)),
        ),
        failed=failed,
    )
