"""PCIe check: each GPU's link trained below what it and its slot allow, and
replay storms on it.

Reads each GPU's current and maximum PCIe generation and width, its
utilisation and its replay counter. GPUs lower their link generation when
idle to save power (nvidia-smi shows "Current: Gen1, Max: Gen5" on an idle
H100), so a link is judged only while the GPU is busy: a busy GPU on fewer
lanes or a lower generation than its maximum ("the maximum possible with this
device and system", nvml.h) lost bandwidth to the host, its HCA and its NVMe.
A link trains at reset and stays as it trained until the next one, so a
downtrained link that holds for `critical_windows` busy windows is critical;
it is never definitive, since a reset or reboot retrains it.

Replays are judged as DCGM's PCIe health watch does (DcgmHealthWatch.cpp,
GetExpectedPcieReplayRate and MonitorPcie): over a minute, a link may replay
what a bit error rate of 1e-12 gives at its generation's line rate on each of
its lanes (0.96 a minute per Gen4 lane, 1.92 per Gen5 lane: 31 a minute on a
Gen5 x16 link), rounded up; more is a warning.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_labels, gpu_subject, windows
from gpuwatchd.history import History, Track
from gpuwatchd.model import Action, Finding, GpuSample, Measurement, Severity
from gpuwatchd.settings import Seconds

NAME = "pcie"

# Line rate of one lane by PCIe generation, in gigatransfers per second (PCI-SIG;
# DCGM's table in GetExpectedPcieReplayRate uses the same rates).
GIGATRANSFERS_PER_LANE = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


@dataclass(frozen=True)
class PcieConfig:
    # One downtraining judgement per window, as the clock-drift check.
    window: Seconds = 60.0
    # A link downtrained in this many consecutive busy windows (15 min) is
    # critical: a link keeps the width and generation it trained to until the
    # next reset, so one that has not come back by then will not on its own.
    critical_windows: int = 15
    # Utilisation at or above which a GPU is busy and its link is judged: an
    # idle GPU drops its link generation to save power. The clocks check's 0.8.
    busy_ratio: float = 0.8
    # Replays are counted over this window (DCGM's PCIe watch: one minute).
    replay_window: Seconds = 60.0
    # The bit error rate whose replays a link may show (DCGM: 1e-12, PCIe's
    # specified maximum BER up to Gen5).
    replay_bit_error_rate: float = 1e-12

    def __post_init__(self) -> None:
        if self.window <= 0 or self.replay_window <= 0 or self.critical_windows < 1:
            raise ValueError(
                "window and replay_window must be more than 0s, critical_windows at least 1"
            )
        if not 0 < self.busy_ratio < 1:
            raise ValueError("busy_ratio must be between 0 and 1")
        if not 0 < self.replay_bit_error_rate < 1:
            raise ValueError("replay_bit_error_rate must be between 0 and 1")


def run(history: History, now: float, config: PcieConfig) -> CheckOutput:
    findings: list[Finding] = []
    measurements: list[Measurement] = []
    spans = windows(now, config.window, config.critical_windows)
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        if latest is None or not latest.up:
            continue
        track = history.gpu_track(index)
        downtrained = _downtrained_window(track, *spans[0], config)
        if downtrained is not None:
            # Only a link downtrained in the latest window needs the earlier ones.
            lasting = all(
                _downtrained_window(track, start, end, config) is not None
                for start, end in spans[1:]
            )
            findings.append(_downtrained(latest, downtrained, lasting, config))
        replays = _replays(track, latest, now, config)
        if replays is not None:
            measurements.append(
                Measurement("gpu_pcie_replays_per_minute", gpu_labels(latest), replays.per_minute)
            )
            findings.extend(_replay_storm(latest, replays, config))
    return CheckOutput(findings=tuple(findings), measurements=tuple(measurements))


def _busy(sample: GpuSample, config: PcieConfig) -> bool:
    return (
        sample.up
        and sample.utilization_gpu_ratio is not None
        and sample.utilization_gpu_ratio >= config.busy_ratio
    )


def _below_max(sample: GpuSample) -> bool | None:
    """Whether the link runs below its maximum width or generation; None when
    a value is unknown (absent is not evidence)."""
    values = (
        sample.pcie_link_width,
        sample.pcie_link_max_width,
        sample.pcie_link_generation,
        sample.pcie_link_max_generation,
    )
    width, max_width, generation, max_generation = values
    if width is None or max_width is None or generation is None or max_generation is None:
        return None
    return width < max_width or generation < max_generation


def _downtrained_window(
    track: Track[GpuSample], start: float, end: float, config: PcieConfig
) -> GpuSample | None:
    """The window's last busy sample when every busy sample whose link is
    known shows it downtrained; None when any shows it at its maximum, or
    when the GPU was never busy with its link known (idle is not judged)."""
    first, last = track.span(start, end)
    downtrained = track.gauge((NAME, "downtrained", config.busy_ratio), partial(_judged, config))
    judged = downtrained.last_present(first, last)
    if judged is None or downtrained.total(first, last) < downtrained.count(first, last):
        return None
    return track.samples[judged]


def _judged(config: PcieConfig, sample: GpuSample) -> int | None:
    """1 for a busy sample whose link is below its maximum, 0 for one at it;
    None where the sample is not judged (idle, or its link unknown)."""
    below = _below_max(sample) if _busy(sample, config) else None
    return None if below is None else int(below)


def _downtrained(
    latest: GpuSample, sample: GpuSample, lasting: bool, config: PcieConfig
) -> Finding:
    span = config.window * config.critical_windows
    message = (
        f"PCIe link at Gen{sample.pcie_link_generation} x{sample.pcie_link_width} while busy, "
        f"below its Gen{sample.pcie_link_max_generation} x{sample.pcie_link_max_width}"
    )
    if lasting:
        message += f" for {span:g}s: a reset or reboot retrains it; if it trains down again, "
        message += "reseat or replace the GPU, its riser or its slot"
    return Finding(
        subject=gpu_subject(latest.index),
        check=NAME,
        code="pcie_downtrained",
        severity=Severity.CRITICAL if lasting else Severity.WARN,
        message=message,
        action=Action.INSPECT_HARDWARE if lasting else Action.NONE,
        evidence={
            "generation": sample.pcie_link_generation or 0,
            "max_generation": sample.pcie_link_max_generation or 0,
            "width": sample.pcie_link_width or 0,
            "max_width": sample.pcie_link_max_width or 0,
        },
    )


@dataclass(frozen=True)
class _Replays:
    per_minute: float
    allowed_per_minute: int | None  # None where the link's speed is unknown


def allowed_replays_per_minute(generation: int, width: int, bit_error_rate: float) -> int:
    """DCGM's expected replays a minute: the BER times the line rate of each
    lane over a minute, rounded up; a generation past the table counts as the
    last one in it (as DCGM caps it)."""
    rate = GIGATRANSFERS_PER_LANE[min(max(generation, 1), max(GIGATRANSFERS_PER_LANE))]
    return math.ceil(bit_error_rate * rate * 1e9 * 60 * width)


def _replays(
    track: Track[GpuSample], latest: GpuSample, now: float, config: PcieConfig
) -> _Replays | None:
    first, last = track.at_or_before(now - config.replay_window), track.upto(now)
    grown = track.column((NAME, "replays"), _replay_count).increase(first, last, track.times)
    if grown.seconds <= 0:
        return None
    allowed = None
    if latest.pcie_link_generation and latest.pcie_link_width:
        allowed = allowed_replays_per_minute(
            latest.pcie_link_generation, latest.pcie_link_width, config.replay_bit_error_rate
        )
    return _Replays(grown.rate * 60, allowed)


def _replay_count(sample: GpuSample) -> int | None:
    return sample.pcie_replays


def _replay_storm(latest: GpuSample, replays: _Replays, config: PcieConfig) -> Iterator[Finding]:
    allowed = replays.allowed_per_minute
    if allowed is None or replays.per_minute <= allowed:
        return
    yield Finding(
        subject=gpu_subject(latest.index),
        check=NAME,
        code="pcie_replay_storm",
        severity=Severity.WARN,
        message=(
            f"{replays.per_minute:.0f} PCIe replays a minute, more than the {allowed} a "
            f"Gen{latest.pcie_link_generation} x{latest.pcie_link_width} link shows at a "
            f"{config.replay_bit_error_rate:g} bit error rate"
        ),
        action=Action.INSPECT_HARDWARE,
        evidence={"replays_per_minute": round(replays.per_minute, 2), "allowed": allowed},
    )
