"""AER check: PCIe errors that a GPU's or an HCA's PCIe function reported.

Reads each function's AER counters and link from History, and the GPUs' NVML
PCI bus ids to name the GPU a function is (an HCA is named by its InfiniBand
ports). The PCIe specification and the kernel's AER guide
(Documentation/PCI/pcieaer-howto.rst) grade the errors:

- fatal: "the link is unreliable"; the kernel resets the link to recover. Any
  new one is critical (`aer_fatal_errors`, inspect hardware). Never
  definitive: a reset that recovers leaves a working device, so policy
  confirms it (`confirm_for`) while the finding holds for `window`.
- non-fatal: "the link is reliable but a transaction is unreliable" (a
  completion timeout, an unsupported request, a poisoned TLP): the driver or
  application may have lost that transaction. Any new one warns
  (`aer_nonfatal_errors`).
- correctable: "corrected by hardware without any loss of information". Only
  a storm warns (`aer_correctable_storm`), and never more: a correctable
  error is a retried transfer. The allowance is the one DCGM gives a link's
  replays (DcgmHealthWatch.cpp, GetExpectedPcieReplayRate, and checks/pcie.py):
  what a bit error rate of 1e-12 gives at the link's line rate over a minute.
  Correctable errors are the receiver errors, bad TLPs/DLLPs and replay
  timeouts that make those replays, so a function reporting more than that
  has a worse link than PCIe specifies. Without the link's speed there is no
  allowance and nothing is judged.

Counts are the kernel's since boot; only growth is judged, from the first
sample the daemon saw (its last one before a restart, which the state
database keeps) on; the counters themselves are exported from boot on. A function the
checks cannot name (a GPU NVML does not list, an HCA with no port read) is
judged on the node, at warning at most.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import NODE, gpu_subject
from gpuwatchd.checks.pcie import allowed_replays_per_minute
from gpuwatchd.counters import Increase
from gpuwatchd.history import History, Track
from gpuwatchd.model import (
    Action,
    Finding,
    PcieFunctionSample,
    Severity,
    canonical_address,
    port_subject,
)
from gpuwatchd.settings import Seconds

NAME = "aer"


@dataclass(frozen=True)
class AerConfig:
    # How long a fatal or non-fatal AER error keeps its finding: long enough
    # for policy's confirm_for (5 min) to see a fatal one through.
    window: Seconds = 3600.0
    # Correctable errors are counted over this window (DCGM's PCIe watch: a minute).
    correctable_window: Seconds = 60.0
    # The bit error rate whose correctable errors a link may show (DCGM's
    # expected PCIe replay rate: 1e-12, PCIe's specified maximum up to Gen5).
    correctable_bit_error_rate: float = 1e-12

    def __post_init__(self) -> None:
        if self.window <= 0 or self.correctable_window <= 0:
            raise ValueError("window and correctable_window must be more than 0s")
        if not 0 < self.correctable_bit_error_rate < 1:
            raise ValueError("correctable_bit_error_rate must be between 0 and 1")


def _gpu_subjects(history: History) -> dict[str, str]:
    """Each GPU's PCIe address, as NVML gives it, to its subject."""
    subjects = {}
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        address = canonical_address(latest.pci_bus_id) if latest and latest.pci_bus_id else None
        if address is not None:
            subjects[address] = gpu_subject(index)
    return subjects


def _subjects(function: PcieFunctionSample, history: History, gpus: dict[str, str]) -> list[str]:
    if function.kind == "gpu":
        return [gpus[function.address]] if function.address in gpus else []
    ports = history.port_keys()
    return [port_subject(device, port) for device, port in ports if device == function.name]


def run(history: History, now: float, config: AerConfig) -> CheckOutput:
    findings: list[Finding] = []
    gpus: dict[str, str] | None = None
    longest = max(config.window, config.correctable_window)
    for address in history.pcie_addresses():
        track = history.pcie_track(address)
        latest = track.samples[-1]
        # From this position on the counts stood still, so none grew in a
        # window that starts there: on a healthy node one comparison a poll,
        # where each severity's Column would take every sample in.
        changed = track.last_change((NAME, "counts"), _counts)
        if changed <= track.at_or_before(now - longest):
            # Nothing grew in any window (`_grown`): no finding to name a subject for.
            continue
        if gpus is None:
            gpus = _gpu_subjects(history)
        subjects = _subjects(latest, history, gpus) or [NODE]
        for subject in subjects:
            findings.extend(_judged(track, latest, changed, subject, now, config))
    return CheckOutput(findings=tuple(findings))


@dataclass(frozen=True)
class _Grade:
    code: str
    severity: Severity
    meaning: str
    action: Action


# What a new uncorrectable error of each severity means (pcieaer-howto.rst).
UNCORRECTABLE = {
    "fatal": _Grade(
        "aer_fatal_errors",
        Severity.CRITICAL,
        "the link was unreliable and reset; reseat or replace the device, its riser or "
        "its slot if it repeats",
        Action.INSPECT_HARDWARE,
    ),
    "nonfatal": _Grade("aer_nonfatal_errors", Severity.WARN, "a transaction was lost", Action.NONE),
}


def _judged(
    track: Track[PcieFunctionSample],
    latest: PcieFunctionSample,
    changed: int,
    subject: str,
    now: float,
    config: AerConfig,
) -> Iterator[Finding]:
    """`changed`: the position of the last change of the counts (`_grown`)."""
    for name, grade in UNCORRECTABLE.items():
        counted = _grown(track, changed, name, now, config.window)
        if counted is None or counted.increase <= 0:
            continue
        grown = counted.increase
        yield Finding(
            subject=subject,
            check=NAME,
            code=grade.code,
            # Unnamed, the node would carry it: a warning there, not a drain.
            severity=min(grade.severity, Severity.WARN) if subject == NODE else grade.severity,
            message=(
                f"{grown:.0f} {name} PCIe error(s) on {_what(latest)} in the last "
                f"{config.window:g}s{_causes(latest, name)}: {grade.meaning}"
            ),
            action=grade.action,
            evidence={"address": latest.address, f"{name}_errors": int(grown)},
        )
    storm = _correctable_storm(track, latest, changed, now, config)
    if storm is None:
        return
    per_minute, allowed = storm
    yield Finding(
        subject=subject,
        check=NAME,
        code="aer_correctable_storm",
        severity=Severity.WARN,
        message=(
            f"{per_minute:.1f} correctable PCIe errors a minute on {_what(latest)}"
            f"{_causes(latest, 'correctable')}, more than the {allowed} a "
            f"Gen{latest.link_generation} x{latest.link_width} link shows at a "
            f"{config.correctable_bit_error_rate:g} bit error rate"
        ),
        action=Action.INSPECT_HARDWARE,
        evidence={
            "address": latest.address,
            "correctable_per_minute": round(per_minute, 2),
            "allowed": allowed,
        },
    )


def _correctable_storm(
    track: Track[PcieFunctionSample],
    latest: PcieFunctionSample,
    changed: int,
    now: float,
    config: AerConfig,
) -> tuple[float, int] | None:
    """Correctable errors a minute and the link's allowance, when over it."""
    if not (latest.link_generation and latest.link_width):
        return None
    grown = _grown(track, changed, "correctable", now, config.correctable_window)
    if grown is None:
        return None
    allowed = allowed_replays_per_minute(
        latest.link_generation, latest.link_width, config.correctable_bit_error_rate
    )
    if grown.seconds <= 0 or grown.rate * 60 <= allowed:
        return None
    return grown.rate * 60, allowed


def _errors(severity: str, sample: PcieFunctionSample) -> int | None:
    return sample.aer_errors.get(severity)


def _counts(sample: PcieFunctionSample) -> Mapping[str, int]:
    return sample.aer_errors


def _grown(
    track: Track[PcieFunctionSample], changed: int, severity: str, now: float, seconds: float
) -> Increase | None:
    """How much the `severity` count grew over the intervals ending in the
    last `seconds`: a subtraction of the track's running totals. None when
    the counts, last `changed` at that position, stood still over them."""
    first = track.at_or_before(now - seconds)
    if changed <= first:
        return None
    column = track.column((NAME, severity), partial(_errors, severity))
    return column.increase(first, track.upto(now), track.times)


def _what(function: PcieFunctionSample) -> str:
    name = f" {function.name}" if function.name else ""
    return f"{function.kind.upper()}{name} ({function.address})"


def _causes(function: PcieFunctionSample, severity: str) -> str:
    """`: CmpltTO 2, UnsupReq 1` from the counts since boot, or nothing."""
    prefix = f"{severity}:"
    named = [
        f"{key.removeprefix(prefix)} {count}"
        for key, count in sorted(function.aer_causes.items())
        if key.startswith(prefix)
    ]
    return f" (since boot: {', '.join(named)})" if named else ""
