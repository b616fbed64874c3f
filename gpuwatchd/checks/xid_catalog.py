"""What each XID means for the GPU that raised it: severity, suggested action,
whether it condemns the GPU, and whether it quarantines at once.

Sources: NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors, the
"Immediate Resolution" column gives the action), DCGM's health module (XIDs
48, 74, 79, 95, 119, 120 and 140 fail a GPU, 94 warns) and gpud's catalog.
An XID whose fault lies in the application (13, 31, 43, 45...) says nothing
about the GPU: it is recorded (severity ok) and does not change its health.
XIDs that NVIDIA lists as unused are left out; an XID not listed here is
judged by `UNKNOWN`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from gpuwatchd.model import Action, Severity


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    severity: Severity
    action: Action
    # The fault lies in the GPU (or its links and firmware), not in the application.
    condemns: bool
    # A hardware fault that quarantines at once, without a confirmation window.
    definitive: bool = False


OK, WARN, CRITICAL = Severity.OK, Severity.WARN, Severity.CRITICAL
NONE, RESTART_APP, RESET_GPU, REBOOT, INSPECT = (
    Action.NONE,
    Action.RESTART_APP,
    Action.RESET_GPU,
    Action.REBOOT,
    Action.INSPECT_HARDWARE,
)

_ENTRIES: tuple[XidInfo, ...] = (
    # Application faults: the catalog's resolution is to restart (or debug) the app.
    XidInfo(8, "GPU stopped processing", OK, RESTART_APP, condemns=False),
    XidInfo(11, "Invalid or corrupted push buffer stream", OK, RESTART_APP, condemns=False),
    XidInfo(13, "Graphics Engine Exception", OK, RESTART_APP, condemns=False),
    XidInfo(25, "Invalid or illegal push buffer stream", OK, RESTART_APP, condemns=False),
    XidInfo(31, "GPU memory page fault", OK, RESTART_APP, condemns=False),
    XidInfo(32, "Invalid or corrupted push buffer stream", OK, RESTART_APP, condemns=False),
    XidInfo(43, "GPU stopped processing", OK, NONE, condemns=False),
    # 45 follows other XIDs (a DBE, most often) when the driver cleans up channels.
    XidInfo(45, "Preemptive cleanup, due to previous errors", OK, NONE, condemns=False),
    XidInfo(68, "NVDEC0 Exception", OK, RESTART_APP, condemns=False),
    XidInfo(69, "Graphics Engine class error", OK, RESTART_APP, condemns=False),
    XidInfo(80, "Corrupted data sent to GPU", OK, RESTART_APP, condemns=False),
    # Driver and firmware events the catalog says to ignore or merely note.
    XidInfo(37, "Driver firmware error", OK, NONE, condemns=False),
    XidInfo(38, "Driver firmware error", OK, NONE, condemns=False),
    XidInfo(63, "GPU memory remapping event", OK, NONE, condemns=False),
    XidInfo(154, "GPU Recovery Action Changed", OK, NONE, condemns=False),
    # A context-switch timeout is as often the application's as the GPU's; it
    # needs a reset but does not condemn the GPU.
    XidInfo(109, "Context Switch Timeout Error", WARN, RESET_GPU, condemns=False),
    XidInfo(155, "NVLINK: SW Defined Error", WARN, RESET_GPU, condemns=False),
    # Hardware faults that DCGM fails the GPU for: quarantine at once.
    XidInfo(48, "Double Bit ECC Error", CRITICAL, RESET_GPU, condemns=True, definitive=True),
    XidInfo(74, "NVLINK Error", CRITICAL, RESET_GPU, condemns=True, definitive=True),
    XidInfo(79, "GPU has fallen off the bus", CRITICAL, REBOOT, condemns=True, definitive=True),
    XidInfo(95, "Uncontained memory error", CRITICAL, RESET_GPU, condemns=True, definitive=True),
    XidInfo(119, "GSP RPC Timeout", CRITICAL, RESET_GPU, condemns=True, definitive=True),
    XidInfo(120, "GSP Error", CRITICAL, RESET_GPU, condemns=True, definitive=True),
    XidInfo(140, "ECC Unrecovered Error", CRITICAL, RESET_GPU, condemns=True, definitive=True),
    # No spare rows (or resources) left: the GPU needs replacing, not a reset.
    XidInfo(64, "GPU memory remapping failure", CRITICAL, INSPECT, condemns=True, definitive=True),
    XidInfo(157, "Resource Retirement Failure", CRITICAL, INSPECT, condemns=True, definitive=True),
    # "Auxiliary power is not connected to the GPU board": check the mechanics.
    XidInfo(54, "Auxiliary power not connected", CRITICAL, INSPECT, condemns=True, definitive=True),
    # Hardware faults a reset usually clears: critical, quarantined once confirmed.
    XidInfo(46, "GPU stopped processing", CRITICAL, RESET_GPU, condemns=True),
    XidInfo(62, "Internal micro-controller halt", CRITICAL, RESET_GPU, condemns=True),
    XidInfo(110, "Security Fault Error", CRITICAL, RESET_GPU, condemns=True),
    XidInfo(136, "Link Training Failed", CRITICAL, RESET_GPU, condemns=True),
    XidInfo(143, "GPU Initialization Error", CRITICAL, RESET_GPU, condemns=True),
    XidInfo(158, "GPU Fatal Timeout", CRITICAL, RESET_GPU, condemns=True),
    # Contained or corrected hardware errors: the GPU goes on; degraded.
    # DCGM warns on 94; gpud never escalates it to a reboot.
    XidInfo(94, "Contained memory error", WARN, RESTART_APP, condemns=True),
    XidInfo(92, "High single-bit ECC error rate", WARN, NONE, condemns=True),
    XidInfo(121, "C2C Error", WARN, NONE, condemns=True),
    XidInfo(156, "Resource Retirement Event", WARN, RESET_GPU, condemns=True),
    # NVLink5 (Blackwell) unit errors: their severity hangs on a decode of the
    # error status the event does not carry, so they warn and ask for a reset.
    *(
        XidInfo(code, f"NVLINK: {unit} Error", WARN, RESET_GPU, condemns=True)
        for code, unit in (
            (144, "SAW"),
            (145, "RLW"),
            (146, "TLW"),
            (147, "TREX"),
            (148, "NVLPW_CTRL"),
            (149, "NETIR"),
            (150, "MSE"),
        )
    ),
)

CATALOG: Mapping[int, XidInfo] = MappingProxyType({entry.code: entry for entry in _ENTRIES})

# An XID this catalog does not know (a newer driver's): worth a look, not a verdict.
UNKNOWN = XidInfo(0, "unknown XID", WARN, NONE, condemns=False)


def lookup(code: int) -> XidInfo:
    entry = CATALOG.get(code)
    return entry if entry is not None else replace(UNKNOWN, code=code)
