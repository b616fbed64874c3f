"""What each XID means for the GPU that raised it, as NVIDIA publishes it.

Every row carries NVIDIA's two columns from "Analyzing Xid Errors with the Xid
Catalog" (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), as
gpud mirrors the spreadsheet in `components/accelerator/nvidia/xid/
catalog_generated.go` (generated 2025-10-29): the immediate resolution (what
to do now) and the investigatory one (where to look when it repeats). Our
severity, action and kind follow from them:

- `IGNORE` now: informational. The finding is recorded (severity ok) and
  condemns nothing, whatever the investigatory column says (92, 121, 157...).
- `RESTART_APP` now: the application's fault; the GPU is not judged. 94
  (contained memory error) is the exception: a hardware error that the
  application pays for, so it warns (DCGM warns on it too).
- `RESET_GPU` now: the GPU needs a reset before it is used again, so it is
  drained (critical, not definitive: policy quarantines it once confirmed and
  releases it once quiet). Where NVIDIA's investigation points at software
  (`INVESTIGATE_SW`: 110, 119, 120, 155), the kind is `software`.
- `RESTART_BM` (79, fallen off the bus) drains the GPU and the node at once
  for the reboot NVIDIA asks for, and is released once the board is back and
  quiet; NVIDIA's investigation (`CONTACT_SUPPORT`) is for when it repeats,
  so it escalates like the others below. `CHECK_MECHANICALS` (54, auxiliary
  power not connected) needs a person: it quarantines at once, for good.
- `WORKFLOW_XID_48` and 95 follow NVIDIA's GPU memory error management guide:
  reset the GPU, which applies the row remap; what condemns a GPU for good is
  the RMA criteria (row-remap failure flag, SRAM threshold exceeded), which
  the memory check reads from the driver, not the XID.
- `WORKFLOW_NVLINK_ERR` (74): the fault can sit at either end of the link, so
  the reporting GPU is drained for a reset, never condemned on its own word.
- `WORKFLOW_NVLINK5_ERR` (144-150): the severity hangs on NVIDIA's "XID
  144-150 Decode" of what the driver's line says after the code, which the
  NVML event does not carry, so on its own the XID warns and asks for a
  reset. With the kernel log's line (`NETIR_LINK_EVT  Fatal   XC0 i0 Link 01
  (0x021425c6 ...)`), `nvlink_fatal` follows the decode: its `Fatal` rows
  ask for `RESET_GPU`, all but two link-down reasons it ignores, and its
  `Nonfatal` ones for `IGNORE` or the 154 that follows.
- `XID_154`: the driver changed the GPU's recovery action; the action itself
  is the `gpu_recovery_action` field, judged by its own check. It warns,
  except where the kernel log's line says it changed to None: the recovery
  is done (`lookup_event`).

Only hardware XIDs that NVIDIA resets or reboots and whose investigation is a
hardware one (`CONTACT_SUPPORT`, `INVESTIGATE_LINK_SI`) escalate when they
come back after reboots (`XidInfo.escalates`). Codes the catalog lists as
"Unused", and those it lists without any action (162 onwards in the 2025
sheet), are left out: they are judged by `UNKNOWN`, a warning and no verdict;
so is 142 (NVENC3), whose only column is `CONTACT_SUPPORT`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from types import MappingProxyType

from gpuwatchd.model import Action, NvlinkXidDetail, Severity, XidEvent


class XidKind(Enum):
    """Whose the XID is, which names its finding (`xid_<kind>`)."""

    APPLICATION = "application"
    INFORMATIONAL = "informational"
    SOFTWARE = "software"
    HARDWARE = "hardware"
    RECOVERY_ACTION = "recovery_action"
    UNKNOWN = "unknown"


# NVIDIA's investigatory resolutions that look at the GPU or its links, as
# opposed to IGNORE, INVESTIGATE_SW*, CHECK_APP/CUDA and the workflows.
HARDWARE_INVESTIGATIONS = frozenset({"CONTACT_SUPPORT", "INVESTIGATE_LINK_SI"})
# NVIDIA's immediate resolutions that a reboot performs (a reboot resets every GPU).
REBOOT_CURED = frozenset({"RESET_GPU", "RESTART_BM"})


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    # NVIDIA's catalog columns, verbatim.
    immediate: str
    investigatory: str
    kind: XidKind
    severity: Severity
    action: Action
    # Quarantines at once, and for good, without a confirmation window.
    definitive: bool = False
    # Drains at once, without a confirmation window; released once quiet.
    drains: bool = False
    # Said after the XID in its finding's message.
    advice: str = ""

    @property
    def condemns(self) -> bool:
        """The fault lies in the GPU (or its links and firmware), not elsewhere."""
        return self.kind is XidKind.HARDWARE

    @property
    def escalates(self) -> bool:
        """Coming back after reboots shows that the reset or reboot NVIDIA asks
        for does not cure it, and NVIDIA's investigation is a hardware one."""
        return (
            self.condemns
            and self.immediate in REBOOT_CURED
            and self.investigatory in HARDWARE_INVESTIGATIONS
        )


OK, WARN, CRITICAL = Severity.OK, Severity.WARN, Severity.CRITICAL
APPLICATION, INFORMATIONAL, SOFTWARE, HARDWARE = (
    XidKind.APPLICATION,
    XidKind.INFORMATIONAL,
    XidKind.SOFTWARE,
    XidKind.HARDWARE,
)
CONTACT_SUPPORT, CHECK_APP = "CONTACT_SUPPORT", "CHECK_APP/CUDA"

_MEMORY_ADVICE = (
    "reset the GPU to apply the row remap; the memory check's row-remap failure"
    " and SRAM threshold flags decide an RMA"
)


def _application(code: int, name: str, investigatory: str = CONTACT_SUPPORT) -> XidInfo:
    return XidInfo(code, name, "RESTART_APP", investigatory, APPLICATION, OK, Action.RESTART_APP)


def _informational(
    code: int, name: str, investigatory: str = CONTACT_SUPPORT, immediate: str = "IGNORE"
) -> XidInfo:
    return XidInfo(code, name, immediate, investigatory, INFORMATIONAL, OK, Action.NONE)


def _reset(code: int, name: str, investigatory: str = CONTACT_SUPPORT) -> XidInfo:
    kind = HARDWARE if investigatory in HARDWARE_INVESTIGATIONS else SOFTWARE
    return XidInfo(code, name, "RESET_GPU", investigatory, kind, CRITICAL, Action.RESET_GPU)


def _engines() -> Iterator[XidInfo]:
    """Copy, video and JPEG engine exceptions: each is the channel's application's."""
    yield from (_application(code, "Copy Engine Exception") for code in (39, 40, 41))
    numbered = {
        **{code: f"CE{n}: Unknown Error" for n, code in enumerate((70, 71, 72, 75, 76, 77), 3)},
        85: "CE9: Unknown Error",
        **{code: f"CE{n}: Unknown Error" for n, code in enumerate(range(126, 136), 10)},
        68: "NVDEC0 Exception",
        **{code: f"NVDEC{n} Error" for n, code in enumerate((83, 84, 88, 89, 96, 97, 98), 1)},
        82: "NVJPG0 Error",
        **{code: f"NVJPG{n} Error" for n, code in enumerate(range(99, 106), 1)},
        86: "OFA Exception",
        139: "OFA1 Error",
    }
    yield from (_application(code, name) for code, name in numbered.items())


_ENTRIES: tuple[XidInfo, ...] = (
    _application(8, "GPU stopped processing"),
    _application(11, "Invalid or corrupted push buffer stream", CHECK_APP),
    _application(13, "Graphics Engine Exception", "WORKFLOW_XID_13"),
    _application(25, "Invalid or illegal push buffer stream", CHECK_APP),
    _application(31, "GPU memory page fault", "WORKFLOW_XID_31"),
    _application(32, "Invalid or corrupted push buffer stream", CHECK_APP),
    _application(60, "Video processor exception", "INVESTIGATE_SW"),
    _application(69, "Graphics Engine class error", CHECK_APP),
    _application(80, "Corrupted data sent to GPU", CHECK_APP),
    *_engines(),
    _informational(37, "Driver firmware error", CHECK_APP),
    _informational(38, "Driver firmware error"),
    _informational(43, "GPU stopped processing"),
    _informational(44, "Graphics Engine fault during context switch"),
    # Follows other XIDs (a DBE, most often) when the driver cleans up channels.
    _informational(
        45,
        "Preemptive cleanup, due to previous errors",
        "Solo: RESTART_FM; Not Solo: IGNORE (follow other Xid)",
        immediate="WORKFLOW_XID_45",
    ),
    # A row remapped successfully: the reset that applies it is row_remap_pending's.
    _informational(63, "GPU memory remapping event", "IGNORE"),
    _informational(66, "Illegal access by driver", "INVESTIGATE_SW"),
    _informational(67, "Illegal access by driver"),
    _informational(78, "vGPU Start Error", "UPDATE_SWFW", immediate="UPDATE_SWFW"),
    _informational(92, "High single-bit ECC error rate"),
    _informational(93, "Non-fatal violation of provisioned InfoROM wear limit"),
    _informational(106, "SMBPBI Test Message", "IGNORE"),
    _informational(107, "SMBPBI Test Message Silent", "IGNORE"),
    _informational(121, "C2C Error"),
    _informational(137, "NVLink Privilege Error", "XID_137_FLOW"),
    _informational(141, "CUDA Fast Path Error"),
    _informational(152, "DLA SMMU Error"),
    _informational(153, "DLA timeout Error"),
    _informational(157, "Resource Retirement Failure"),
    _informational(159, "CHI Non-Data Error", "SYMPATHETIC_REPORT_SOLO", immediate="CHECK_UVM"),
    _informational(160, "Channel Retirement Event", "INVESTIGATE_SW"),
    _informational(161, "Channel Retirement Failure", "INVESTIGATE_SW"),
    # Reset, then look at the driver, GSP firmware or the user's NVLink setup.
    _reset(110, "Security Fault Error", "INVESTIGATE_SW"),
    _reset(119, "GSP RPC Timeout", "INVESTIGATE_SW"),
    _reset(120, "GSP Error", "INVESTIGATE_SW"),
    _reset(155, "NVLINK: SW Defined Error", "INVESTIGATE_SW_USER"),
    # Confidential computing: the VM restarts (a reboot, from inside the guest).
    XidInfo(
        151, "Key rotation Error", "RESTART_VM", CONTACT_SUPPORT, SOFTWARE, WARN, Action.REBOOT
    ),
    XidInfo(
        154,
        "GPU Recovery Action Changed",
        "XID_154",
        "N/A Informational only regarding another Xid",
        XidKind.RECOVERY_ACTION,
        WARN,
        Action.NONE,
        advice="the driver announced a GPU recovery action: see the gpu_recovery_action finding",
    ),
    # Hardware faults a reset clears; back after reboots, they escalate.
    _reset(46, "GPU stopped processing"),
    _reset(62, "Internal micro-controller halt"),
    # The remapper failed a remap; the RMA criterion is the row-remap failure
    # flag, which the memory check reads after the reset.
    _reset(64, "GPU memory remapping failure"),
    _reset(109, "Context Switch Timeout Error"),
    _reset(136, "Link Training Failed", "INVESTIGATE_LINK_SI"),
    _reset(140, "ECC Unrecovered Error"),
    _reset(143, "GPU Initialization Error"),
    _reset(158, "GPU Fatal Timeout"),
    # NVIDIA's memory error management: a DBE or an uncontained error asks for
    # a reset (which remaps the row); the RMA criteria condemn, not the XID.
    XidInfo(
        48,
        "Double Bit ECC Error",
        "WORKFLOW_XID_48",
        "WORKFLOW_XID_48",
        HARDWARE,
        CRITICAL,
        Action.RESET_GPU,
        advice=_MEMORY_ADVICE,
    ),
    XidInfo(
        95,
        "Uncontained memory error",
        "RESET_GPU",
        "IGNORE (sympathetic)",
        HARDWARE,
        CRITICAL,
        Action.RESET_GPU,
        advice=_MEMORY_ADVICE,
    ),
    # Contained: only the application that touched the row dies; the GPU goes on.
    XidInfo(
        94,
        "Contained memory error",
        "RESTART_APP",
        "IGNORE (sympathetic)",
        HARDWARE,
        WARN,
        Action.RESTART_APP,
    ),
    XidInfo(
        74,
        "NVLINK Error",
        "WORKFLOW_NVLINK_ERR",
        CONTACT_SUPPORT,
        HARDWARE,
        CRITICAL,
        Action.RESET_GPU,
        advice="NVIDIA's NVLink workflow: the fault may lie at the link's remote end",
    ),
    # The retirement took place; a reset applies it.
    XidInfo(
        156, "Resource Retirement Event", "RESET_GPU", "IGNORE", HARDWARE, WARN, Action.RESET_GPU
    ),
    *(
        XidInfo(
            code,
            f"NVLINK: {unit} Error",
            "WORKFLOW_NVLINK5_ERR",
            "WORKFLOW_NVLINK5_ERR",
            HARDWARE,
            WARN,
            Action.RESET_GPU,
        )
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
    # Gone from the bus: only a reboot brings it back, and the reboot takes the
    # node. Support only when it comes back after reboots (it escalates).
    XidInfo(
        79,
        "GPU has fallen off the bus",
        "RESTART_BM",
        CONTACT_SUPPORT,
        HARDWARE,
        CRITICAL,
        Action.REBOOT,
        drains=True,
    ),
    # A person must look at the board's power cables.
    XidInfo(
        54,
        "Auxiliary power is not connected to the GPU board",
        "CHECK_MECHANICALS",
        CONTACT_SUPPORT,
        HARDWARE,
        CRITICAL,
        Action.INSPECT_HARDWARE,
        definitive=True,
    ),
)

CATALOG: Mapping[int, XidInfo] = MappingProxyType({entry.code: entry for entry in _ENTRIES})

# An XID this catalog does not know (a newer driver's): worth a look, not a verdict.
UNKNOWN = XidInfo(0, "unknown XID", "", "", XidKind.UNKNOWN, WARN, Action.NONE)


def lookup(code: int) -> XidInfo:
    entry = CATALOG.get(code)
    return entry if entry is not None else replace(UNKNOWN, code=code)


# XID 154 names the recovery action it changed to; 0 is None (nvml.h,
# NVML_GPU_RECOVERY_ACTION_NONE): the recovery it announced before is done.
RECOVERY_ACTION_CHANGED = 154
RECOVERY_NONE = 0
RECOVERY_COMPLETED = replace(
    CATALOG[RECOVERY_ACTION_CHANGED],
    name="GPU Recovery Action Changed to None",
    severity=OK,
    advice="the driver's recovery is done: its action is back to None",
)


def lookup_event(event: XidEvent) -> XidInfo:
    """The catalog's row for one event, as the kernel log's line of it refines it."""
    if event.code == RECOVERY_ACTION_CHANGED and event.recovery_action == RECOVERY_NONE:
        return RECOVERY_COMPLETED
    return lookup(event.code)


# NVIDIA's "XID 144-150 Decode" (gpud's catalog_generated.go, `nvlinkRules`)
# asks for RESET_GPU on every Fatal row but two: XID 149's NETIR link-down
# events whose reason (intrinfo bits 20-25) is 0x26 (INVESTIGATE_SW/USER) or
# 0x28 (INVESTIGATE_HOST), which it ignores.
_IGNORED_LINK_DOWN_REASONS = frozenset({0x26, 0x28})
NETIR_XID = 149


def nvlink_fatal(code: int, detail: NvlinkXidDetail) -> bool:
    """Whether an NVLink5 XID's line is one the decode resets the GPU for."""
    if not detail.fatal:
        return False
    reason = (detail.intrinfo >> 20) & 0x3F
    link_down = code == NETIR_XID and detail.unit.startswith("NETIR_LINK")
    return not (link_down and reason in _IGNORED_LINK_DOWN_REASONS)
