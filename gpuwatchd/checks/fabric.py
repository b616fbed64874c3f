"""Fabric check: a GPU of an NVSwitch system that the fabric manager has not
registered, or whose fabric says it is unwell.

Reads each GPU's fabric state, status and health mask
(nvmlDeviceGetGpuFabricInfoV). On
Hopper and later NVSwitch systems a GPU joins the NVLink fabric only once the
fabric manager has registered it; until then CUDA P2P over NVLink is not set
up and NCCL's initialisation hangs on it (the fabric manager's user guide:
jobs wait for "fabric registration" to complete). A registration that
completed with an error status is critical at once; one not completed after
`registration_timeout` (a node that boots registers its GPUs within a minute
of the fabric manager starting) is critical too. Neither is definitive: a
fabric manager restart or a reset registers the GPU again, so policy confirms
it first. A GPU without a fabric to join (state NOT_SUPPORTED, or the call
refused on older GPUs) raises nothing.

The health mask (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*, decoded field by field:
a field reading "false" or "not supported" is healthy) says how the fabric
carries the GPU's traffic. Bandwidth degraded, or a route or access timeout
recovery in progress, is a warning: NVLink traffic still flows, slower. A
route the fabric calls unhealthy, or a configuration it calls incorrect (a
wrong system GUID or chassis, no partition, too few NVLinks, incompatible
firmware, an invalid location or GPU state), is critical: jobs spanning the
fabric cannot rely on it. Neither is definitive: it is the fabric's state,
which the fabric manager or an operator repairs, so policy confirms it and
releases it once the mask is healthy again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_subject
from gpuwatchd.history import History
from gpuwatchd.model import (
    FABRIC_CONFIGURATION_CORRECT,
    FABRIC_HEALTH_TRUE,
    FABRIC_INCORRECT_CONFIGURATIONS,
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_SUPPORTED,
    FABRIC_STATES,
    Action,
    Finding,
    GpuSample,
    Severity,
    fabric_health_field,
)
from gpuwatchd.settings import Seconds

NAME = "fabric"
_SUCCESS = 0  # NVML_SUCCESS
# The health mask's conditions that slow the fabric's traffic, and those that
# leave it without a route (the configuration is judged apart: it is an
# enumeration of what is wrong, not a yes or no).
_DEGRADING = ("degraded_bandwidth", "route_recovery", "access_timeout_recovery")
_UNHEALTHY = ("route_unhealthy",)


@dataclass(frozen=True)
class FabricConfig:
    # A GPU whose registration has not completed for this long is unregistered.
    # The fabric manager registers a booting node's GPUs within a minute of
    # starting; five minutes leaves room for a slow start.
    registration_timeout: Seconds = 300.0

    def __post_init__(self) -> None:
        if self.registration_timeout <= 0:
            raise ValueError("registration_timeout must be more than 0s")


def run(history: History, now: float, config: FabricConfig) -> CheckOutput:
    findings = []
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        if latest is None or not latest.up or latest.fabric_state is None:
            continue
        if latest.fabric_state == FABRIC_STATE_NOT_SUPPORTED:
            continue
        findings.extend(_health(latest))
        if latest.fabric_state == FABRIC_STATE_COMPLETED:
            if latest.fabric_status not in (None, _SUCCESS):
                findings.append(_failed(latest))
            continue
        since = _pending_since(history.gpu(index))
        if now - since >= config.registration_timeout:
            findings.append(_unregistered(latest, now - since))
    return CheckOutput(findings=tuple(findings))


def _health(sample: GpuSample) -> list[Finding]:
    """The health mask's verdicts: one warning for what slows the fabric, one
    critical finding for what leaves the GPU without a usable fabric."""
    mask = sample.fabric_health_mask
    if mask is None:
        return []
    slowed = [name for name in _DEGRADING if fabric_health_field(mask, name) == FABRIC_HEALTH_TRUE]
    broken = [name for name in _UNHEALTHY if fabric_health_field(mask, name) == FABRIC_HEALTH_TRUE]
    configuration = fabric_health_field(mask, "incorrect_configuration")
    if configuration > FABRIC_CONFIGURATION_CORRECT:
        wrong = FABRIC_INCORRECT_CONFIGURATIONS.get(configuration, str(configuration))
        broken.append(f"incorrect_configuration ({wrong})")
    findings = []
    if broken:
        findings.append(
            _health_finding(sample, "fabric_unhealthy", Severity.CRITICAL, broken, mask)
        )
    if slowed:
        findings.append(_health_finding(sample, "fabric_degraded", Severity.WARN, slowed, mask))
    return findings


def _health_finding(
    sample: GpuSample, code: str, severity: Severity, conditions: list[str], mask: int
) -> Finding:
    what = ", ".join(conditions)
    consequence = (
        "jobs spanning the NVLink fabric cannot rely on it; check the fabric manager's log"
        if severity is Severity.CRITICAL
        else "NVLink traffic flows, slower"
    )
    return Finding(
        subject=gpu_subject(sample.index),
        check=NAME,
        code=code,
        severity=severity,
        message=f"the NVSwitch fabric reports {what} for the GPU: {consequence}",
        action=Action.INSPECT_HARDWARE,
        evidence={"conditions": ",".join(conditions), "health_mask": mask},
    )


def _pending_since(samples: Sequence[tuple[float, GpuSample]]) -> float:
    """When the GPU's current run of unfinished registration began (as far
    back as the history reaches): samples that did not read the state
    neither end nor extend it."""
    since = samples[-1][0]
    for time, sample in reversed(samples):
        if sample.fabric_state is None:
            continue
        if sample.fabric_state in (FABRIC_STATE_COMPLETED, FABRIC_STATE_NOT_SUPPORTED):
            break
        since = time
    return since


def _failed(sample: GpuSample) -> Finding:
    return Finding(
        subject=gpu_subject(sample.index),
        check=NAME,
        code="fabric_registration_failed",
        severity=Severity.CRITICAL,
        message=(
            f"the fabric manager's registration of the GPU completed with NVML error "
            f"{sample.fabric_status}: NCCL initialisation hangs on it; restart the fabric "
            "manager or reset the GPU"
        ),
        action=Action.RESET_GPU,
        evidence={"state": "completed", "status": sample.fabric_status or 0},
    )


def _unregistered(sample: GpuSample, pending_seconds: float) -> Finding:
    state = FABRIC_STATES.get(sample.fabric_state or 0, str(sample.fabric_state))
    return Finding(
        subject=gpu_subject(sample.index),
        check=NAME,
        code="fabric_unregistered",
        severity=Severity.CRITICAL,
        message=(
            f"not registered with the NVSwitch fabric ({state}) for {pending_seconds:.0f}s: "
            "NCCL initialisation hangs on it; check that nvidia-fabricmanager runs"
        ),
        action=Action.RESET_GPU,
        evidence={"state": state, "pending_seconds": round(pending_seconds)},
    )
