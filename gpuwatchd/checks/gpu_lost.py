"""GPU-lost check: a GPU that fell off the bus or is missing, and what that
means for the node.

Reads the latest sample of every GPU and the boot record; `up` is False for a
GPU the driver reports as fallen off the bus (GPU_IS_LOST, or XID 79 in the
kernel log: sources/nvml.py). That GPU is critical and drained at once
(`immediate`), and so is the node, since the reboot that brings it back (XID
79's remedy in NVIDIA's catalog: RESTART_BM) takes every GPU of it. Once the
board answers again, after the reboot, and has stayed quiet for policy's
`release_after`, both are released. As NVIDIA's catalog has it (support only
if it repeats) and as other hardware XIDs escalate (checks/xid.py), a board
that falls off the bus again after `reboots_before_inspection` reboots within
`reboot_window` is definitive: condemned, `inspect_hardware`.

Four GPUs that are not lost but cannot be watched are said too: one that is
up but gave no value in the latest poll (no handle, or every call answered
an error such as TIMEOUT or UNKNOWN) is `gpu_unresponsive`, critical once that
has held for policy's `confirm_for`, since no fault on it could be seen, and
released once it answers and stays quiet; one whose handle NVML refuses with
NO_PERMISSION is a configuration error of the node, `nvml_no_permission`, a
warning naming the GPUs and what the daemon's user lacks; one whose read hung
(an NVML call that did not return within the source's read timeout) warns,
since a hang alone is no evidence of a fault; one whose XID events are not
being received (the event wait keeps failing) warns, since faults the driver
announces would be missed.

A node on which NVML enumerates fewer GPUs than expected (`expected_gpus`,
or the GPUs of its first healthy start, which the daemon records in the
state database) is critical on the node, `gpu_missing`, naming the GPUs
recorded then that are not there now. It is not definitive: a GPU that did
not come up at boot may after a reboot, and the finding clears when it is back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import NODE, gpu_subject
from gpuwatchd.checks.xid import FALLEN_OFF_BUS, BootRecord, XidConfig
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, GpuSample, Severity
from gpuwatchd.units import format_duration

NAME = "gpu_lost"
# The most GPUs `expected_gpus` may name: a node's HGX boards hold 8 or 16,
# and scenarios and captures take at most 64 too.
MAX_GPUS = 64


@dataclass(frozen=True)
class GpuLostConfig:
    # Also judge the node: the reboot that brings a lost GPU back takes the
    # whole node, so it is drained with the GPU. Turn off where single GPUs are
    # scheduled and a lost one may wait for the next maintenance window.
    node_finding: bool = True
    # GPUs NVML must enumerate. None: as many as at the node's first healthy
    # start (every GPU answering), recorded in the state database (which also
    # names the missing ones); 0: not checked.
    expected_gpus: int | None = None

    def __post_init__(self) -> None:
        # More than a node holds would call every node short of GPUs.
        if self.expected_gpus is not None and not 0 <= self.expected_gpus <= MAX_GPUS:
            raise ValueError(f"expected_gpus must be 0 to {MAX_GPUS}")


@dataclass(frozen=True)
class KnownGpu:
    """A GPU the node had at a healthy start, as recorded in the state database."""

    uuid: str
    pci_bus_id: str | None = None


# The state database's key for the GPUs of the node's first healthy start.
KNOWN_GPUS_FACT = "gpus_at_healthy_start"


def known_after(
    known: Sequence[KnownGpu], gpus: Sequence[GpuSample]
) -> tuple[KnownGpu, ...] | None:
    """The GPUs to record after a poll that read `gpus`, or None to keep `known`.

    Only a healthy poll is recorded: some GPUs, every one up and with its UUID.
    It replaces the record when it has at least as many GPUs and not the same
    ones (a GPU replaced after an RMA), so the expectation never shrinks.
    """
    if not gpus or any(not gpu.up or not gpu.uuid for gpu in gpus) or len(gpus) < len(known):
        return None
    learned = tuple(KnownGpu(str(gpu.uuid), gpu.pci_bus_id) for gpu in gpus)
    return None if set(learned) == set(known) else learned


def decode_known(data: Any) -> tuple[KnownGpu, ...]:
    """The recorded GPUs from their JSON; none from anything else."""
    if not isinstance(data, list):
        return ()
    return tuple(
        KnownGpu(str(item["uuid"]), item.get("pci_bus_id"))
        for item in data
        if isinstance(item, dict) and "uuid" in item
    )


def run(
    history: History,
    now: float,
    config: GpuLostConfig,
    known: Sequence[KnownGpu] = (),
    boots: BootRecord | None = None,
    xid: XidConfig | None = None,
) -> CheckOutput:
    """`boots` and `xid` (its reboot_window and reboots_before_inspection) say
    whether a lost board was lost in earlier boots too."""
    record, escalation = boots or BootRecord(), xid or XidConfig()
    samples = [s for index in history.gpu_indices() if (s := history.latest_gpu(index))]
    lost = [sample for sample in samples if not sample.up]
    findings = [_lost(sample, record, now, escalation) for sample in lost]
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
                immediate=True,
            )
        )
    findings.extend(_missing(history, config, known))
    for sample in samples:
        if sample.up:
            findings.extend(_unwatched(sample))
    findings.extend(_no_permission([sample for sample in samples if sample.no_permission]))
    return CheckOutput(findings=tuple(findings))


def _lost(sample: GpuSample, boots: BootRecord, now: float, xid: XidConfig) -> Finding:
    """A lost GPU: drained at once, condemned when it was lost (or logged XID
    79) in `reboots_before_inspection` earlier boots within `reboot_window`."""
    reboots = boots.reboots_since_first(sample.uuid, FALLEN_OFF_BUS, since=now - xid.reboot_window)
    escalated = reboots >= xid.reboots_before_inspection
    evidence: dict[str, float | int | str] = {"uuid": sample.uuid} if sample.uuid else {}
    why = "; reboot the node"
    if escalated:
        evidence["reboots"] = reboots
        why = (
            f", and fell off the bus in each of the last {reboots} reboots within "
            f"{format_duration(xid.reboot_window)}: a reboot does not cure it; inspect the board"
        )
    return Finding(
        subject=gpu_subject(sample.index),
        check=NAME,
        code="gpu_lost",
        severity=Severity.CRITICAL,
        message=f"GPU {sample.index} is lost: it no longer answers on the bus{why}",
        action=Action.INSPECT_HARDWARE if escalated else Action.REBOOT,
        evidence=evidence,
        definitive=escalated,
        immediate=not escalated,
    )


def _unwatched(sample: GpuSample) -> Iterator[Finding]:
    subject = gpu_subject(sample.index)
    if sample.read_hung is not None:
        # A warning however long it lasts: a call stuck in the driver is no
        # evidence of a fault on the GPU (see sources/nvml.py).
        yield Finding(
            subject=subject,
            check=NAME,
            code="gpu_read_hung",
            severity=Severity.WARN,
            message=f"GPU {sample.index} cannot be read: {sample.read_hung}",
        )
    elif not sample.responsive and not sample.no_permission:
        why = f" ({sample.unanswered})" if sample.unanswered else ""
        yield Finding(
            subject=subject,
            check=NAME,
            code="gpu_unresponsive",
            severity=Severity.CRITICAL,
            message=f"GPU {sample.index} answered no NVML call with a value{why}",
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


def _no_permission(samples: Sequence[GpuSample]) -> Iterator[Finding]:
    """GPUs whose handle NVML refuses the daemon's user (NO_PERMISSION: nvml.h,
    "the user doesn't have permission to talk to this device")."""
    if not samples:
        return
    gpus = ",".join(str(sample.index) for sample in samples)
    devices = " ".join(f"/dev/nvidia{sample.index}" for sample in samples)
    yield Finding(
        subject=NODE,
        check=NAME,
        code="nvml_no_permission",
        severity=Severity.WARN,
        message=(
            f"NVML refuses GPU(s) {gpus} to the daemon (NO_PERMISSION): it cannot open "
            f"{devices} (`ls -l /dev/nvidia*`; the device minor is usually the index), so "
            "nothing on them is watched. The daemon's user needs read-write access to them "
            "and the unit DeviceAllow=char-nvidia rw, as systemd/gpuwatchd.service ships it"
        ),
        evidence={"gpus": gpus},
    )


def _missing(
    history: History, config: GpuLostConfig, known: Sequence[KnownGpu]
) -> Iterator[Finding]:
    expected = len(known) if config.expected_gpus is None else config.expected_gpus
    tracks = [history.gpu_track(index) for index in history.gpu_indices()]
    latest = [(track.times[-1], track.samples[-1]) for track in tracks if len(track)]
    # The GPUs of the last poll only: older samples (another run's, restored
    # from the state database) may hold a GPU that is gone now.
    last_poll = max((time for time, _ in latest), default=None)
    samples = [sample for time, sample in latest if time == last_poll]
    # No sample at all is the NVML source's failure (said by its own series),
    # not evidence that GPUs are gone.
    if not samples or len(samples) >= expected:
        return
    present = {sample.uuid for sample in samples}
    absent = [gpu for gpu in known if gpu.uuid not in present]
    named = ", ".join(f"{gpu.uuid} (bus {gpu.pci_bus_id or 'unknown'})" for gpu in absent)
    yield Finding(
        subject=NODE,
        check=NAME,
        code="gpu_missing",
        severity=Severity.CRITICAL,
        message=(
            f"NVML enumerates {len(samples)} of {expected} expected GPUs"
            + (f"; missing: {named}" if named else "")
            + ": reboot the node, and reseat or replace a GPU that stays missing"
        ),
        action=Action.REBOOT,
        evidence={"expected": expected, "present": len(samples), "missing": named or "unknown"},
    )
