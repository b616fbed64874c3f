"""SXid check: NVSwitch errors judged on the node, fatal ones (by the nvswitch
driver's own word) critical and asking for a reboot, the others warnings."""

from __future__ import annotations

from gpu_history import T0

from gpuwatchd.checks import sxid
from gpuwatchd.checks.xid import XidConfig
from gpuwatchd.history import History
from gpuwatchd.model import Action, Finding, Reading, Severity, SxidEvent

NOW = T0 + 100.0
CONFIG = XidConfig()


def judged(*events: SxidEvent, now: float = NOW) -> list[Finding]:
    history = History(max_age_seconds=3600.0)
    history.record(Reading(source="nvml", time=NOW, sxid_events=events))
    return list(sxid.run(history, now, CONFIG).findings)


def error(switch: int, code: int, severity: str, description: str = "Link 48") -> SxidEvent:
    return SxidEvent(
        f"nvidia-nvswitch{switch}", f"0000:0{5 + switch}:00.0", code, severity, NOW - 5, description
    )


def test_a_fatal_sxid_is_critical_on_the_node_and_asks_for_a_reboot() -> None:
    [finding] = judged(error(1, 20034, "Fatal", "Link 48 LTSSM Fault Up"), error(0, 20034, "Fatal"))
    assert (finding.subject, finding.code, finding.severity, finding.action) == (
        "node",
        "nvswitch_sxid",
        Severity.CRITICAL,
        Action.REBOOT,
    )
    assert not finding.definitive and not finding.immediate
    assert finding.evidence["switches"] == "nvidia-nvswitch0,nvidia-nvswitch1"
    assert (
        "nvidia-nvswitch1 (PCI 0000:06:00.0): SXid 20034, Fatal, Link 48 LTSSM" in finding.message
    )


def test_non_fatal_and_correctable_sxids_warn() -> None:
    [finding] = judged(error(3, 12028, "Non-fatal"), error(3, 11012, "Correctable"))
    assert (finding.severity, finding.action) == (Severity.WARN, Action.NONE)
    assert (finding.evidence["count"], finding.evidence["fatal"]) == (2, 0)
    assert finding.evidence["sxids"] == "11012,12028"


def test_an_sxid_older_than_the_xid_window_is_forgotten() -> None:
    assert judged(error(1, 20034, "Fatal"), now=NOW + CONFIG.window) == []
