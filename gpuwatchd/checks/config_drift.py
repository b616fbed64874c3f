"""Config drift check: GPUs of one node whose configuration disagrees.

Reads each answering GPU's latest VBIOS version, ECC, persistence and MIG
modes, enforced power limit and application clocks. GPUs of one model on one
node are installed and configured together: one with ECC off, MIG on,
persistence off, another VBIOS, a lower power limit or other application
clocks was changed by hand or missed a fleet change, and a job spread over
the node runs at its slowest GPU's pace or fails on its mode. The finding
(`config_drift`, on the node) names each setting and which GPUs read what.

A warning only, never a quarantine: the GPUs work, and the daemon never
changes a setting itself. Settings a GPU does not report are left out of
the comparison (absent is not a disagreement). The driver version is one per
node (NVML reads it once), so it drifts only across nodes: the fleet rules
compare it (config/prometheus/rules/gpuwatchd-fleet.yml).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import NODE
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, GpuSample, Severity

NAME = "config_drift"
_MHZ = 1e6


def _watts(value: float | None) -> str | None:
    # Limits are set in whole watts (nvidia-smi -pl); milliwatt noise is not drift.
    return None if value is None else f"{value:.0f} W"


def _megahertz(value: float | None) -> str | None:
    return None if value is None else f"{value / _MHZ:.0f} MHz"


def _mode(value: bool | None) -> str | None:
    return None if value is None else ("enabled" if value else "disabled")


# The settings compared, each as the text its GPUs are grouped by.
SETTINGS: Mapping[str, Callable[[GpuSample], str | None]] = MappingProxyType(
    {
        "vbios_version": lambda gpu: gpu.vbios_version,
        "ecc_mode": lambda gpu: _mode(gpu.ecc_enabled),
        "persistence_mode": lambda gpu: _mode(gpu.persistence_enabled),
        "mig_mode": lambda gpu: _mode(gpu.mig_enabled),
        "power_limit": lambda gpu: _watts(gpu.power_limit_watts),
        "sm_application_clock": lambda gpu: _megahertz(gpu.sm_application_clock_hertz),
        "memory_application_clock": lambda gpu: _megahertz(gpu.memory_application_clock_hertz),
    }
)


def run(history: History) -> CheckOutput:
    by_model: dict[str | None, list[GpuSample]] = defaultdict(list)
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        if latest is not None and latest.up:
            by_model[latest.name].append(latest)
    disagreements = {
        setting: spread
        for gpus in by_model.values()
        for setting, read in SETTINGS.items()
        if len(spread := _spread(gpus, read)) > 1
    }
    if not disagreements:
        return CheckOutput()
    described = "; ".join(
        f"{setting}: " + ", ".join(f"{value} on GPU {_indices(gpus)}" for value, gpus in spread)
        for setting, spread in disagreements.items()
    )
    finding = Finding(
        subject=NODE,
        check=NAME,
        code="config_drift",
        severity=Severity.WARN,
        message=f"the node's GPUs disagree on {described}: set them alike (the daemon never "
        "changes a setting)",
        action=Action.NONE,
        evidence={"settings": ",".join(disagreements)},
    )
    return CheckOutput(findings=(finding,))


def _spread(
    gpus: Sequence[GpuSample], read: Callable[[GpuSample], str | None]
) -> list[tuple[str, list[int]]]:
    """Each value read and the GPUs that read it, the commonest first."""
    groups: dict[str, list[int]] = defaultdict(list)
    for gpu in gpus:
        value = read(gpu)
        if value is not None:
            groups[value].append(gpu.index)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[1]))


def _indices(gpus: list[int]) -> str:
    return ",".join(str(index) for index in gpus)
