"""GPU-lost check: a GPU that fell off the bus, and what that means for the node.

Reads the latest sample of every GPU; `up` is False for a GPU NVML reports as
lost. That GPU is critical and definitive (it will not come back without a
reboot, XID 79's remedy), and so is the node, since a reboot takes every GPU
of it. A GPU that answers again clears the finding; its quarantine stays
until an operator releases it.

Two GPUs that are not lost but cannot be watched are said too: one that is
up but gave no value in the latest poll (every call answered an error such as
TIMEOUT) is critical once that has held for policy's `confirm_for`, since no
fault on it could be seen; one whose XID events are not being received (the
event wait keeps failing) warns, since faults the driver announces would be
missed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import NODE, gpu_subject
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, GpuSample, Severity

NAME = "gpu_lost"


@dataclass(frozen=True)
class GpuLostConfig:
    # Also judge the node: the reboot that brings a lost GPU back takes the
    # whole node, so it is drained with the GPU. Turn off where single GPUs are
    # scheduled and a lost one may wait for the next maintenance window.
    node_finding: bool = True


def run(history: History, now: float, config: GpuLostConfig) -> CheckOutput:
    lost = [
        sample
        for index in history.gpu_indices()
        if (sample := history.latest_gpu(index)) is not None and not sample.up
    ]
    findings = [
        Finding(
            subject=gpu_subject(sample.index),
            check=NAME,
            code="gpu_lost",
            severity=Severity.CRITICAL,
            message=f"GPU {sample.index} is lost: it no longer answers on the bus",
            action=Action.REBOOT,
            evidence={"uuid": sample.uuid} if sample.uuid else {},
            definitive=True,
        )
        for sample in lost
    ]
    if lost and config.node_finding:
        gpus = ",".join(str(sample.index) for sample in lost)
        findings.append(
            Finding(
                subject=NODE,
                check=NAME,
                code="gpu_lost",
                severity=Severity.CRITICAL,
                message=f"GPU(s) {gpus} lost: the node needs a reboot",
                action=Action.REBOOT,
                evidence={"gpus": gpus},
                definitive=True,
            )
        )
    for index in history.gpu_indices():
        sample = history.latest_gpu(index)
        if sample is not None and sample.up:
            findings.extend(_unwatched(sample))
    return CheckOutput(findings=tuple(findings))


def _unwatched(sample: GpuSample) -> Iterator[Finding]:
    subject = gpu_subject(sample.index)
    if not sample.responsive:
        yield Finding(
            subject=subject,
            check=NAME,
            code="gpu_unresponsive",
            severity=Severity.CRITICAL,
            message=f"GPU {sample.index} answered no NVML call with a value",
            action=Action.RESET_GPU,
        )
    if sample.xid_events_received is False:
        yield Finding(
            subject=subject,
            check=NAME,
            code="xid_events_not_received",
            severity=Severity.WARN,
            message=f"XID events of GPU {sample.index} are not being received",
        )
