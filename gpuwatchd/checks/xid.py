"""XID check: every XID of the window, judged by NVIDIA's catalog, escalated across reboots.

Reads the XID events in History (every occurrence counts, not only the last
one) and a `BootRecord`: the boots the store has seen and which XIDs each saw,
and when. For each GPU it gives one finding per kind of XID the catalog names
(`xid_hardware`, `xid_software`, `xid_application`, `xid_informational`,
`xid_recovery_action`) and one for XIDs it does not know (`xid_unknown`).

The kernel log's line of an NVLink5 XID (144-150) names its link and its
severity: such an XID is judged on that link (`nvlink:<gpu>/<link>`,
`xid_nvlink`) by NVIDIA's XID 144-150 decode, critical and asking for a GPU
reset when the decode resets for it, a warning otherwise; one without a link
(`Link -1`), or without its line, is the GPU's, as the catalog says. Critical
here is confirmed by policy like any reset XID, never at once.

Escalation follows gpud: a hardware XID that NVIDIA resets or reboots and
investigates as hardware (`XidInfo.escalates`), and that comes back after
`reboots_before_inspection` reboots, has shown that rebooting does not fix it,
so its action becomes `inspect_hardware` and it quarantines at once. As in
gpud, only the XIDs of the last `reboot_window` count: gpud looks back over its
event store's retention, 3 days, so a rare XID seen months apart is two
separate events, not one fault that survived reboots.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_subject, link_subject
from gpuwatchd.checks.xid_catalog import XidInfo, lookup, lookup_event, nvlink_fatal
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, NvlinkXidDetail, Severity, XidEvent
from gpuwatchd.settings import Seconds
from gpuwatchd.units import format_duration

NAME = "xid"
# NVIDIA's XID catalog numbers errors from 1 and has reached the 150s; three
# digits leave room for the ones to come.
MAX_XID = 999

# From least to most drastic, to pick the one action of several XIDs.
ACTION_ORDER = (
    Action.NONE,
    Action.RESTART_APP,
    Action.RESET_GPU,
    Action.REBOOT,
    Action.INSPECT_HARDWARE,
)


@dataclass(frozen=True)
class XidConfig:
    # How long an XID keeps its finding. Ten minutes lets a burst of related
    # XIDs (a 48 with its 45s and 63) read as one event; definitive ones
    # quarantine at once, and the quarantine outlives the finding. The sxid
    # check keeps an NVSwitch SXid's as long.
    window: Seconds = 600.0
    # gpud's DefaultRebootThreshold: a reboot-remedied XID that returns after
    # this many reboots asks for hardware inspection.
    reboots_before_inspection: int = 2
    # Only reboots after an XID seen this recently count (gpud's
    # DefaultLookbackPeriod, its event store's retention of 3 days).
    reboot_window: Seconds = 3 * 86400.0
    # XIDs never to report (one a platform raises as noise, say).
    ignore: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.window <= 0 or self.reboot_window <= 0 or self.reboots_before_inspection < 1:
            raise ValueError(
                "window and reboot_window must be more than 0s, reboots_before_inspection 1 or more"
            )
        if not all(0 < code <= MAX_XID for code in self.ignore):
            raise ValueError(f"ignore holds XIDs, each 1 to {MAX_XID}")


# "GPU has fallen off the bus": what the driver logs when NVML reports the
# GPU lost (GPU_IS_LOST), and how the boot record counts a lost GPU.
FALLEN_OFF_BUS = 79


@dataclass(frozen=True)
class BootXid:
    """An XID seen on a board during one boot, last at `last_time` (at index
    `gpu` then, for showing it)."""

    boot_id: str
    gpu: int
    uuid: str
    code: int
    last_time: float


@dataclass(frozen=True)
class BootRecord:
    """The boots seen, oldest first (the last is the current one), and the XIDs of each."""

    boot_ids: tuple[str, ...] = ()
    xids: tuple[BootXid, ...] = ()

    def reboots_since_first(self, uuid: str | None, code: int, since: float) -> int:
        """Reboots since the first boot in which the board `uuid` raised this
        XID at `since` or later; 0 for a GPU whose UUID is not known (it
        cannot be told from the board that had its index before)."""
        if uuid is None:
            return 0
        position = {boot: number for number, boot in enumerate(self.boot_ids)}
        firsts = [
            position[seen.boot_id]
            for seen in self.xids
            if seen.code == code
            and seen.uuid == uuid
            and seen.last_time >= since
            and seen.boot_id in position
        ]
        return len(self.boot_ids) - 1 - min(firsts) if firsts else 0


@dataclass(frozen=True)
class _Judged:
    """One XID code on one GPU, as the catalog and the boot record judge it."""

    info: XidInfo
    count: int
    severity: Severity
    action: Action
    definitive: bool
    reboots: int


def run(
    history: History, now: float, config: XidConfig, boots: BootRecord | None = None
) -> CheckOutput:
    record = boots or BootRecord()
    by_gpu: dict[int, list[XidEvent]] = defaultdict(list)
    by_link: dict[tuple[int, int], list[_LinkXid]] = defaultdict(list)
    for event in history.xid_events(since=now - config.window):
        if event.code in config.ignore:
            continue
        if event.nvlink is not None and event.nvlink.link >= 0:
            by_link[(event.gpu, event.nvlink.link)].append((event, event.nvlink))
        else:
            by_gpu[event.gpu].append(event)
    findings: list[Finding] = []
    for gpu, events in sorted(by_gpu.items()):
        uuid = _uuid(history, events)
        judged = [
            _judge(info, count, uuid, record, now, config)
            for info, count in sorted(_counts(events).items(), key=lambda item: item[0].code)
        ]
        for code, members in _categorise(judged).items():
            findings.append(_finding(gpu, code, members, config))
    for (gpu, link), xids in sorted(by_link.items()):
        findings.append(_link_finding(gpu, link, xids, config))
    return CheckOutput(findings=tuple(findings))


def _uuid(history: History, events: Sequence[XidEvent]) -> str | None:
    known = next((event.uuid for event in events if event.uuid), None)
    if known:
        return known
    latest = history.latest_gpu(events[0].gpu)
    return latest.uuid if latest is not None else None


def _counts(events: Sequence[XidEvent]) -> dict[XidInfo, int]:
    counts: dict[XidInfo, int] = defaultdict(int)
    for event in events:
        counts[lookup_event(event)] += 1
    return counts


def _judge(
    info: XidInfo,
    count: int,
    uuid: str | None,
    record: BootRecord,
    now: float,
    config: XidConfig,
) -> _Judged:
    reboots = record.reboots_since_first(uuid, info.code, since=now - config.reboot_window)
    if info.escalates and reboots >= config.reboots_before_inspection:
        return _Judged(info, count, Severity.CRITICAL, Action.INSPECT_HARDWARE, True, reboots)
    return _Judged(info, count, info.severity, info.action, info.definitive, reboots)


def _categorise(judged: Sequence[_Judged]) -> dict[str, list[_Judged]]:
    groups: dict[str, list[_Judged]] = defaultdict(list)
    for item in judged:
        groups[f"xid_{item.info.kind.value}"].append(item)
    return groups


def _finding(gpu: int, code: str, members: Sequence[_Judged], config: XidConfig) -> Finding:
    worst = max(members, key=lambda item: (item.severity, ACTION_ORDER.index(item.action)))
    listed = "; ".join(f"XID {m.info.code} ({m.info.name}) x{m.count}" for m in members)
    evidence: dict[str, float | int | str] = {
        "xid": worst.info.code,
        "xids": ",".join(str(m.info.code) for m in members),
        "count": sum(m.count for m in members),
        "window_seconds": config.window,
        "nvidia_immediate": worst.info.immediate,
        "nvidia_investigatory": worst.info.investigatory,
    }
    message = f"{listed} in the last {config.window:g}s"
    message += "".join(f"; XID {m.info.code}: {m.info.advice}" for m in members if m.info.advice)
    if worst.action is Action.INSPECT_HARDWARE and worst.reboots:
        evidence["reboots"] = worst.reboots
        message += (
            f"; XID {worst.info.code} came back after {worst.reboots} reboots"
            f" within {format_duration(config.reboot_window)}"
        )
    return Finding(
        subject=gpu_subject(gpu),
        check=NAME,
        code=code,
        severity=worst.severity,
        message=message,
        action=max((m.action for m in members), key=ACTION_ORDER.index),
        evidence=evidence,
        definitive=any(m.definitive and m.severity is Severity.CRITICAL for m in members),
        immediate=any(m.info.drains and m.severity is Severity.CRITICAL for m in members),
    )


# One NVLink5 XID of a link, with what its line says after the code.
_LinkXid = tuple[XidEvent, NvlinkXidDetail]


def _link_finding(gpu: int, link: int, xids: Sequence[_LinkXid], config: XidConfig) -> Finding:
    """The NVLink5 XIDs of one link, as their lines and NVIDIA's decode say."""
    resets = [(event, detail) for event, detail in xids if nvlink_fatal(event.code, detail)]
    shown, detail = (resets or xids)[-1]
    counts = Counter(
        f"XID {event.code} ({lookup(event.code).name}) {detail.unit} "
        + ("Fatal" if detail.fatal else "Nonfatal")
        for event, detail in xids
    )
    listed = "; ".join(f"{what} x{count}" for what, count in counts.items())
    decode = "resets the GPU for it" if resets else "asks for no reset"
    return Finding(
        subject=link_subject(gpu, link),
        check=NAME,
        code="xid_nvlink",
        severity=Severity.CRITICAL if resets else Severity.WARN,
        message=(
            f"{listed} on NVLink {link} in the last {config.window:g}s; "
            f"NVIDIA's XID 144-150 decode {decode}"
        ),
        action=Action.RESET_GPU if resets else Action.NONE,
        evidence={
            "xid": shown.code,
            "count": len(xids),
            "fatal": len(resets),
            "unit": detail.unit,
            "intrinfo": f"0x{detail.intrinfo:08x}",
            "error_status": f"0x{detail.error_status:08x}",
            "window_seconds": config.window,
        },
    )
