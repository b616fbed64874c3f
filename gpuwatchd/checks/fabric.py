"""Fabric check: a GPU of an NVSwitch system that the fabric manager has not
registered.

Reads each GPU's fabric state and status (nvmlDeviceGetGpuFabricInfoV). On
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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_subject
from gpuwatchd.history import History
from gpuwatchd.model import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_SUPPORTED,
    FABRIC_STATES,
    Action,
    Finding,
    GpuSample,
    Severity,
)
from gpuwatchd.settings import Seconds

NAME = "fabric"
_SUCCESS = 0  # NVML_SUCCESS


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
        if latest.fabric_state == FABRIC_STATE_COMPLETED:
            if latest.fabric_status not in (None, _SUCCESS):
                findings.append(_failed(latest))
            continue
        since = _pending_since(history.gpu(index))
        if now - since >= config.registration_timeout:
            findings.append(_unregistered(latest, now - since))
    return CheckOutput(findings=tuple(findings))


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
