"""SXid check: the NVSwitch errors the nvswitch driver logged, judged on the node.

Reads the SXid events in History (the kernel log's `nvidia-nvswitchN: SXid`
records, which the NVML source reads with the XIDs) over `checks.xid.window`:
an SXid is the switch's XID, and a burst of them reads as one event as a
burst of XIDs does. A switch is none of policy's subjects (node, GPU, NVLink,
port), and its fault reaches every GPU the fabric joins, so the finding is
the node's (`nvswitch_sxid`), naming each switch and its errors.

The driver's word for each error decides. `Fatal` is its "uncorrectable
error that is fatal to the fabric" (NVIDIA open-gpu-kernel-modules,
src/common/nvswitch/kernel/inc/intr_nvswitch.h, NVSWITCH_REPORT_FATAL, which
also marks the port or the switch failed); the Fabric Manager user guide's
fatal and always-fatal SXids ask for the switch, and so the node's GPUs, to
be reset: a restart of the VM or of the host. So a fatal SXid is critical on
the node, asking for a reboot, and confirmed by policy like any fault (a
reset cures it: never definitive). `Non-fatal` and `Correctable` errors
warn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import NODE
from gpuwatchd.checks.xid import XidConfig
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, Severity, SxidEvent

NAME = "sxid"


def run(history: History, now: float, config: XidConfig) -> CheckOutput:
    events = history.sxid_events(since=now - config.window)
    if not events:
        return CheckOutput()
    return CheckOutput(findings=(_finding(events, config),))


def _finding(events: Sequence[SxidEvent], config: XidConfig) -> Finding:
    fatal = [event for event in events if event.fatal]
    counts = Counter(
        (event.switch, event.address, event.code, event.severity, event.description)
        for event in events
    )
    listed = "; ".join(
        f"{switch} (PCI {address}): SXid {code}, {severity}, {description} x{count}"
        for (switch, address, code, severity, description), count in counts.items()
    )
    ask = (
        "fatal to the fabric: reset the switch and its GPUs"
        if fatal
        else "none fatal to the fabric"
    )
    return Finding(
        subject=NODE,
        check=NAME,
        code="nvswitch_sxid",
        severity=Severity.CRITICAL if fatal else Severity.WARN,
        message=f"{listed} in the last {config.window:g}s; {ask}",
        action=Action.REBOOT if fatal else Action.NONE,
        evidence={
            "sxids": ",".join(sorted({str(event.code) for event in events})),
            "switches": ",".join(sorted({event.switch for event in events})),
            "count": len(events),
            "fatal": len(fatal),
            "window_seconds": config.window,
        },
    )
