"""Recovery check: what the driver itself says a GPU needs.

Reads, from each GPU's latest sample, the driver's recovery action
(`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, R565 and later; XID 154 announces each
change of it; on R560 the source reads its reset and drain-and-reset status
fields as `gpu_reset` and `drain_and_reset`) and whether any call answered
`NVML_ERROR_RESET_REQUIRED`. Both
are state the driver holds and the source reads every poll, so a daemon that
restarts finds them again: nothing here is remembered.

A verdict of the driver is evidence enough to drain the GPU at once (an
immediate quarantine), but it is not a verdict on the hardware: once the GPU
has been reset (or the node rebooted) and the driver says "none", the finding
clears and the quarantine is released after the usual quiet time. Whether the
hardware is at fault is for the memory check's RMA criteria, the XID history
and the canaries to say.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_subject
from gpuwatchd.history import History
from gpuwatchd.model import GPU_RECOVERY_ACTIONS, Action, Finding, GpuSample, Severity

NAME = "recovery"

# What each recovery action asks an operator to do (nvml.h,
# nvmlDeviceGpuRecoveryAction_t; NVIDIA's memory error management guide,
# "Error Recovery and Response Flags"). "drain_p2p" asks for the GPU's
# peer-to-peer traffic to stop and the field to be read again after.
ACTIONS: Mapping[str, Action] = {
    "gpu_reset": Action.RESET_GPU,
    "drain_and_reset": Action.RESET_GPU,
    "bus_reset": Action.RESET_GPU,
    "node_reboot": Action.REBOOT,
    "system_reboot": Action.REBOOT,
    "drain_p2p": Action.DRAIN_P2P,
    "recover_imex_domain": Action.RECOVER_IMEX_DOMAIN,
}


def run(history: History) -> CheckOutput:
    findings: list[Finding] = []
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        if latest is None or not latest.up:
            continue
        findings.extend(_recovery_action(latest))
        findings.extend(_reset_required(latest))
    return CheckOutput(findings=tuple(findings))


def _recovery_action(sample: GpuSample) -> Iterator[Finding]:
    code = sample.recovery_action
    if code is None or code == 0:
        return
    name = GPU_RECOVERY_ACTIONS.get(code)
    action = ACTIONS.get(name or "")
    # A value newer than this daemon warns: a person decides what it asks.
    known = action is not None
    yield Finding(
        subject=gpu_subject(sample.index),
        check=NAME,
        code="gpu_recovery_action",
        severity=Severity.CRITICAL if known else Severity.WARN,
        message=f"the driver asks for recovery action {name}"
        if known
        else f"the driver asks for recovery action {code}, unknown to this gpuwatchd",
        action=action or Action.NONE,
        evidence={"recovery_action": name or code},
        immediate=known,
    )


def _reset_required(sample: GpuSample) -> Iterator[Finding]:
    if sample.reset_required:
        yield Finding(
            subject=gpu_subject(sample.index),
            check=NAME,
            code="gpu_reset_required",
            severity=Severity.CRITICAL,
            message="NVML answers RESET_REQUIRED: the GPU requires a reset before it can be used",
            action=Action.RESET_GPU,
            immediate=True,
        )
