"""Clock-drift check: a busy GPU running slower than its peers with no reason given.

Reads each GPU's SM clock, its maximum and application SM clocks, its
utilisation and its clocks-event reason bits. A sample counts only when the
GPU is busy and no reason bit explains a lower clock (power cap, thermal,
idle, sync boost...): what is left is a GPU that is slow for no stated
reason, the classic straggler of a synchronous training job. Drift in the
latest window warns; drift in every one of the last `critical_windows`
windows is critical.

Drift is judged against the clock the GPU is allowed to run at. Application
clocks an operator set (`nvidia-smi -ac`) are read back from the driver
(NVML_CLOCK_ID_APP_CLOCK_TARGET differing from the default). Locked clocks
(`nvidia-smi -lgc`) are not: nvml.h has setters for them and no getter, and a
locked GPU sets no clocks-event reason (nvml.h marks ApplicationsClocksSetting
"No longer used" from CUDA 13.0). So a GPU below its allowed clock whose
clock agrees with the node's other busy GPUs is not drifting: a node-wide
clock is an operator's setting, not a hardware fault. A GPU below its locked
peers is still judged against them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cached_property

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_labels, gpu_subject, windows
from gpuwatchd.history import History
from gpuwatchd.model import (
    CLOCKS_EVENT_REASONS,
    Action,
    Finding,
    GpuSample,
    Measurement,
    Severity,
)
from gpuwatchd.settings import Seconds

NAME = "clocks"


@dataclass(frozen=True)
class ClocksConfig:
    # One judgement per window; a minute holds six 10 s polls, enough to
    # average out a momentary clock change.
    window: Seconds = 60.0
    # Drift in this many consecutive windows (15 min) is critical: by then it
    # is no transient, and a straggler costs every GPU of the job that long.
    critical_windows: int = 15
    # A GPU at or above this utilisation is busy; clocks of an idle or lightly
    # loaded GPU say nothing about its health.
    busy_ratio: float = 0.8
    # Drift when the SM clock is this far below the median of the busy GPUs of
    # the node. GPUs of one HGX board differ by a few percent (per-chip boost
    # bins); 10% is outside that spread.
    peer_drop_ratio: float = 0.1
    # Drift when the SM clock is this far below the clock the GPU may run at
    # (its maximum, or the application clock target an operator set) with no
    # reason given, unless its clock agrees with the node's other busy GPUs:
    # NVML reports a reason for the driver's own cuts, but none for an
    # operator's lock, which holds every GPU of the node alike.
    max_drop_ratio: float = 0.2
    # Fewer busy GPUs than this make no peer median (two GPUs cannot tell
    # which of them is the slow one); the comparison with the allowed clock
    # remains, and two GPUs that agree still count as a node-wide clock.
    min_peers: int = 3
    # Clocks-event reasons that explain a lower clock. NVML documents each of
    # these as a cause of reduced clocks; by default every known reason does.
    explaining_reasons: tuple[str, ...] = tuple(CLOCKS_EVENT_REASONS)

    def __post_init__(self) -> None:
        unknown = set(self.explaining_reasons) - set(CLOCKS_EVENT_REASONS)
        if unknown:
            known = ", ".join(CLOCKS_EVENT_REASONS)
            raise ValueError(f"unknown reason(s) {', '.join(sorted(unknown))} (known: {known})")
        if self.window <= 0 or self.critical_windows < 1 or self.min_peers < 2:
            raise ValueError(
                "window must be more than 0s, critical_windows at least 1, min_peers 2"
            )
        for name in ("busy_ratio", "peer_drop_ratio", "max_drop_ratio"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be between 0 and 1")

    @cached_property
    def explaining_mask(self) -> int:
        mask = 0
        for reason in self.explaining_reasons:
            mask |= CLOCKS_EVENT_REASONS[reason]
        return mask


@dataclass(frozen=True)
class _Clock:
    """One GPU over one window: its mean unexplained busy SM clock and how it compares."""

    mean_hertz: float
    # The clock it may run at: its maximum or an application clock target set below it.
    allowed_hertz: float | None
    application_clocks: bool  # whether allowed_hertz is an application clock target
    # Median of the window's busy GPUs when there are at least min_peers of them.
    peer_median_hertz: float | None
    # Whether its clock is within peer_drop_ratio of the other busy GPUs' median.
    agrees_with_node: bool

    @property
    def peer_ratio(self) -> float | None:
        return None if self.peer_median_hertz is None else self.mean_hertz / self.peer_median_hertz

    @property
    def allowed_ratio(self) -> float | None:
        return None if not self.allowed_hertz else self.mean_hertz / self.allowed_hertz

    def drifting(self, config: ClocksConfig) -> bool:
        peer, allowed = self.peer_ratio, self.allowed_ratio
        if peer is not None and peer < 1 - config.peer_drop_ratio:
            return True
        return (
            allowed is not None
            and allowed < 1 - config.max_drop_ratio
            and not self.agrees_with_node
        )


def run(history: History, now: float, config: ClocksConfig) -> CheckOutput:
    spans = windows(now, config.window, config.critical_windows)
    judged = [_window_clocks(history, start, end, config) for start, end in spans]
    latest_window = judged[0]
    findings: list[Finding] = []
    measurements: list[Measurement] = []
    for index, clock in sorted(latest_window.items()):
        sample = history.latest_gpu(index)
        if sample is None:
            continue
        if clock.peer_ratio is not None:
            measurements.append(
                Measurement("gpu_clock_drift_ratio", gpu_labels(sample), clock.peer_ratio)
            )
        if clock.drifting(config):
            lasting = all(index in window and window[index].drifting(config) for window in judged)
            findings.append(_finding(sample, clock, lasting, config))
    return CheckOutput(findings=tuple(findings), measurements=tuple(measurements))


def _allowed_clock(sample: GpuSample) -> tuple[float | None, bool]:
    """The SM clock this GPU may run at, and whether it is an application clock
    target: one an operator set below the maximum (it differs from the
    default), else the maximum."""
    top = sample.sm_max_clock_hertz
    target = sample.sm_application_clock_hertz
    default = sample.sm_default_application_clock_hertz
    if top and target and default and target != default and target < top:
        return target, True
    return top, False


def _window_clocks(
    history: History, start: float, end: float, config: ClocksConfig
) -> dict[int, _Clock]:
    means: dict[int, tuple[float, GpuSample]] = {}
    for index in history.gpu_indices():
        busy = [
            sample
            for sample in history.gpu_track(index).between(start, end)
            if _unexplained_busy(sample, config)
        ]
        clocks = [sample.sm_clock_hertz for sample in busy if sample.sm_clock_hertz is not None]
        if clocks:
            means[index] = (statistics.fmean(clocks), busy[-1])
    median = statistics.median(mean for mean, _ in means.values()) if means else None
    judged = {}
    for index, (mean, sample) in means.items():
        allowed, application = _allowed_clock(sample)
        judged[index] = _Clock(
            mean_hertz=mean,
            allowed_hertz=allowed,
            application_clocks=application,
            peer_median_hertz=median if len(means) >= config.min_peers else None,
            agrees_with_node=(
                median is not None
                and len(means) >= 2
                and abs(mean / median - 1) <= config.peer_drop_ratio
            ),
        )
    return judged


def _unexplained_busy(sample: GpuSample, config: ClocksConfig) -> bool:
    """Busy, with every reason bit known and none that explains a lower clock.
    Unknown utilisation or reasons cannot rule an explanation out."""
    return (
        sample.up
        and sample.utilization_gpu_ratio is not None
        and sample.utilization_gpu_ratio >= config.busy_ratio
        and sample.clocks_event_reasons is not None
        and not sample.clocks_event_reasons & config.explaining_mask
    )


def _finding(sample: GpuSample, clock: _Clock, lasting: bool, config: ClocksConfig) -> Finding:
    span = config.window * config.critical_windows
    evidence: dict[str, float | int | str] = {"sm_clock_hertz": round(clock.mean_hertz)}
    parts = [f"SM clock {clock.mean_hertz / 1e6:.0f} MHz with no clocks-event reason"]
    if clock.peer_median_hertz is not None and clock.peer_ratio is not None:
        evidence["peer_median_hertz"] = round(clock.peer_median_hertz)
        evidence["peer_ratio"] = round(clock.peer_ratio, 4)
        parts.append(f"{clock.peer_ratio:.0%} of the busy GPUs' median")
    if clock.allowed_hertz and clock.allowed_ratio is not None:
        what = "application clock target" if clock.application_clocks else "maximum"
        evidence["allowed_clock_hertz"] = round(clock.allowed_hertz)
        evidence["allowed_ratio"] = round(clock.allowed_ratio, 4)
        parts.append(f"{clock.allowed_ratio:.0%} of its {what}")
    if lasting:
        parts.append(f"for {span:g}s")
    return Finding(
        subject=gpu_subject(sample.index),
        check=NAME,
        code="clock_drift",
        severity=Severity.CRITICAL if lasting else Severity.WARN,
        message=", ".join(parts),
        # A slow GPU that names no reason for a quarter of an hour is a power
        # delivery or board problem more often than anything software can fix.
        action=Action.INSPECT_HARDWARE if lasting else Action.NONE,
        evidence=evidence,
    )
