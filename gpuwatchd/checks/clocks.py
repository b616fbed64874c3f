"""Clock-drift check: a busy GPU running slower than its peers with no reason given.

Reads each GPU's SM clock, its maximum and application SM clocks, its
utilisation, its clocks-event reason bits and its model. A sample counts only
when the GPU is busy and no reason bit explains a lower clock (power cap,
thermal, idle, sync boost...): what is left is a GPU that is slow for no
stated reason, the classic straggler of a synchronous training job. Drift in
the latest window warns; drift in every one of the last `critical_windows`
windows, each with a second reference, is critical.

Drift is judged against the clock the GPU is allowed to run at. Application
clocks an operator set (`nvidia-smi -ac`) are read back from the driver
(NVML_CLOCK_ID_APP_CLOCK_TARGET differing from the default). Locked clocks
(`nvidia-smi -lgc`) are not: nvml.h has setters for them and no getter, and a
locked GPU sets no clocks-event reason (nvml.h marks ApplicationsClocksSetting
"No longer used" from CUDA 13.0). So a GPU below its allowed clock whose
clock agrees with the other busy GPUs of its model is not drifting: a
node-wide clock is an operator's setting, not a hardware fault. A GPU below
its locked peers is still judged against them. GPUs are compared with GPUs
of their own model only: a node may mix models.

Only a second reference, a peer's clock, tells a lock from a fault, so
without one drift is never critical. A GPU that is the only busy one of its
model in a window is held to its peers' last busy clocks: each other GPU's
mean over the window that ends at its last busy sample within the history.
With none (no peer was busy within the history) it warns at most. The clock
a GPU reaches under a canary burst would be such a reference too, but a
canary result carries the daemon's last NVML sample when the result arrived,
not a reading under the burst, so it is not used.

Cost per poll: the samples of the `critical_windows` windows of every GPU.
The peers' last busy clocks, needed only when some window has a GPU busy
alone, add a bisection and one window of samples per GPU: the last busy
sample is found from the Track's change marks, which take in each sample
once as it arrives, not by a scan of the hour.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property, partial

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_labels, gpu_subject, windows
from gpuwatchd.history import History, Track
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
    # its model on the node. GPUs of one HGX board differ by a few percent
    # (per-chip boost bins); 10% is outside that spread.
    peer_drop_ratio: float = 0.1
    # Drift when the SM clock is this far below the clock the GPU may run at
    # (its maximum, or the application clock target an operator set) with no
    # reason given, unless its clock agrees with the other busy GPUs of its
    # model (or, busy alone, with their last busy clocks): NVML reports a
    # reason for the driver's own cuts, but none for an operator's lock, which
    # holds every GPU of the node alike.
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
class _Mean:
    """One GPU's mean unexplained busy SM clock over a window, and its last
    busy sample there (its model and allowed clocks)."""

    hertz: float
    sample: GpuSample


@dataclass(frozen=True)
class _Clock:
    """One GPU over one window: its mean unexplained busy SM clock and how it compares."""

    mean_hertz: float
    # The clock it may run at: its maximum or an application clock target set below it.
    allowed_hertz: float | None
    application_clocks: bool  # whether allowed_hertz is an application clock target
    # Median of the window's busy GPUs of its model when there are at least min_peers.
    peer_median_hertz: float | None
    # Its second reference: the median of the window's busy GPUs of its model
    # (itself among them) when it is not alone, else the median of its peers'
    # last busy clocks; None when it has neither.
    reference_hertz: float | None
    alone: bool  # the only busy GPU of its model in the window

    @property
    def peer_ratio(self) -> float | None:
        return None if self.peer_median_hertz is None else self.mean_hertz / self.peer_median_hertz

    @property
    def allowed_ratio(self) -> float | None:
        return None if not self.allowed_hertz else self.mean_hertz / self.allowed_hertz

    @property
    def reference_ratio(self) -> float | None:
        return None if not self.reference_hertz else self.mean_hertz / self.reference_hertz

    def agrees_with_node(self, config: ClocksConfig) -> bool:
        """Within peer_drop_ratio of its second reference: a node-wide clock."""
        ratio = self.reference_ratio
        return ratio is not None and abs(ratio - 1) <= config.peer_drop_ratio

    def drifting(self, config: ClocksConfig) -> bool:
        peer, allowed = self.peer_ratio, self.allowed_ratio
        if peer is not None and peer < 1 - config.peer_drop_ratio:
            return True
        return (
            allowed is not None
            and allowed < 1 - config.max_drop_ratio
            and not self.agrees_with_node(config)
        )


def run(history: History, now: float, config: ClocksConfig) -> CheckOutput:
    spans = windows(now, config.window, config.critical_windows)
    judged = _Windows(history, config)
    findings: list[Finding] = []
    measurements: list[Measurement] = []
    for index, clock in sorted(judged.window(*spans[0]).items()):
        sample = history.latest_gpu(index)
        if sample is None:
            continue
        if clock.peer_ratio is not None:
            measurements.append(
                Measurement("gpu_clock_drift_ratio", gpu_labels(sample), clock.peer_ratio)
            )
        if clock.drifting(config):
            lasting = all(
                index in window
                and window[index].drifting(config)
                and window[index].reference_hertz is not None
                for window in map(judged.window, *zip(*spans, strict=True))
            )
            findings.append(_finding(sample, clock, lasting, config))
    return CheckOutput(findings=tuple(findings), measurements=tuple(measurements))


class _Windows:
    """The GPUs' clocks judged window by window, for one run: each window
    when first asked for (only a GPU drifting in the latest one needs the
    earlier ones), and the peers' last busy clocks once a window has a GPU
    busy alone."""

    def __init__(self, history: History, config: ClocksConfig) -> None:
        self._history = history
        self._config = config
        self._judged: dict[tuple[float, float], dict[int, _Clock]] = {}
        self._last_busy: dict[int, _Mean] | None = None

    def window(self, start: float, end: float) -> dict[int, _Clock]:
        judged = self._judged.get((start, end))
        if judged is None:
            means = _window_means(self._history, start, end, self._config)
            last_busy = self._peers_busy() if _has_lone_gpu(means) else {}
            judged = self._judged[start, end] = _judge(means, last_busy, self._config)
        return judged

    def _peers_busy(self) -> dict[int, _Mean]:
        if self._last_busy is None:
            self._last_busy = _last_busy_clocks(self._history, self._config)
        return self._last_busy


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


def _window_means(
    history: History, start: float, end: float, config: ClocksConfig
) -> dict[int, _Mean]:
    means = {}
    for index in history.gpu_indices():
        track = history.gpu_track(index)
        mean = _busy_mean(track, *track.span(start, end), config)
        if mean is not None:
            means[index] = mean
    return means


def _busy_mean(
    track: Track[GpuSample], first: int, last: int, config: ClocksConfig
) -> _Mean | None:
    """The mean SM clock of the unexplained busy samples at positions
    first..last, if any: `statistics.fmean` of their clocks, from the track's
    running totals."""
    key = (NAME, "busy clock", config.busy_ratio, config.explaining_mask)
    clocks = track.gauge(key, partial(_unexplained_busy_clock, config=config))
    busy = clocks.last_present(first, last)
    if busy is None:
        return None
    return _Mean(clocks.total(first, last) / clocks.count(first, last), track.samples[busy])


def _by_model(means: dict[int, _Mean]) -> dict[str | None, list[float]]:
    clocks: dict[str | None, list[float]] = defaultdict(list)
    for mean in means.values():
        clocks[mean.sample.name].append(mean.hertz)
    return clocks


def _has_lone_gpu(means: dict[int, _Mean]) -> bool:
    return any(len(clocks) == 1 for clocks in _by_model(means).values())


def _last_busy_clocks(history: History, config: ClocksConfig) -> dict[int, _Mean]:
    """Each GPU's mean clock over the window that ends at its last unexplained
    busy sample within the history, for the GPUs busy at all in it."""
    key = (NAME, "busy", config.busy_ratio, config.explaining_mask)

    def busy(sample: GpuSample) -> bool:
        return _unexplained_busy_clock(sample, config) is not None

    clocks = {}
    for index in history.gpu_indices():
        # A GPU's track keeps at least its latest sample. From `changed` on,
        # every sample is busy or every one is not: the last busy sample is
        # the latest one, or the one just before `changed` (none at 0).
        track = history.gpu_track(index)
        changed = track.last_change(key, busy)
        last = len(track) - 1 if busy(track.samples[-1]) else changed - 1
        if last < 0:
            continue
        end = track.times[last]
        mean = _busy_mean(track, *track.span(end - config.window, end), config)
        if mean is not None:
            clocks[index] = mean
    return clocks


def _judge(
    means: dict[int, _Mean], last_busy: dict[int, _Mean], config: ClocksConfig
) -> dict[int, _Clock]:
    by_model = _by_model(means)
    # A model's median once, not once for each of its GPUs.
    medians = {model: statistics.median(busy) for model, busy in by_model.items()}
    judged = {}
    for index, mean in means.items():
        busy = by_model[mean.sample.name]
        median = medians[mean.sample.name]
        alone = len(busy) == 1
        allowed, application = _allowed_clock(mean.sample)
        judged[index] = _Clock(
            mean_hertz=mean.hertz,
            allowed_hertz=allowed,
            application_clocks=application,
            peer_median_hertz=median if len(busy) >= config.min_peers else None,
            reference_hertz=_peers_last_busy(index, mean, last_busy) if alone else median,
            alone=alone,
        )
    return judged


def _peers_last_busy(index: int, mean: _Mean, last_busy: dict[int, _Mean]) -> float | None:
    """The median of the last busy clocks of the other GPUs of its model; None
    when none of them was busy within the history."""
    peers = [
        other.hertz
        for other_index, other in last_busy.items()
        if other_index != index and other.sample.name == mean.sample.name
    ]
    return statistics.median(peers) if peers else None


def _unexplained_busy_clock(sample: GpuSample, config: ClocksConfig) -> float | None:
    """The SM clock of a sample busy with every reason bit known and none that
    explains a lower clock; None for any other. Unknown utilisation or reasons
    cannot rule an explanation out."""
    unexplained_busy = (
        sample.up
        and sample.utilization_gpu_ratio is not None
        and sample.utilization_gpu_ratio >= config.busy_ratio
        and sample.clocks_event_reasons is not None
        and not sample.clocks_event_reasons & config.explaining_mask
    )
    return sample.sm_clock_hertz if unexplained_busy else None


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
    if clock.alone:
        parts.append(_alone_part(clock, evidence))
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


def _alone_part(clock: _Clock, evidence: dict[str, float | int | str]) -> str:
    """What a GPU busy alone was held to: its peers' last busy clocks, or nothing."""
    if clock.reference_hertz is None or clock.reference_ratio is None:
        evidence["second_reference"] = "none"
        return (
            "the only busy GPU of its model, no peer busy within the history: "
            "no second reference to tell a fault from a lock, so a warning at most"
        )
    evidence["second_reference"] = "peers_last_busy"
    evidence["peers_last_busy_hertz"] = round(clock.reference_hertz)
    return f"{clock.reference_ratio:.0%} of its peers' last busy clocks"
