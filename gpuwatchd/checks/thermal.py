"""Thermal check: throttling and temperature headroom of every GPU.

Reads each GPU's cumulative violation (throttle) time, which integrates every
short slowdown between polls, including the driver's HW thermal and power
brake slowdown counters where its branch has them (R575 on) and they behave
as counters (the source leaves out an id that answers something else); its
clocks-event reason bits (HW slowdown's only signal on older drivers, and the
only one of its fast-trigger cause on any); its GPU and HBM temperatures and
the driver's thresholds for them. Sustained thermal throttling and thin headroom are
warnings; HW slowdown or power brake on a cool GPU means a board, power or
sensor fault and is critical.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial, reduce
from operator import or_

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_labels, gpu_subject
from gpuwatchd.history import History, Track
from gpuwatchd.model import (
    CLOCKS_EVENT_REASONS,
    THROTTLE_REASONS,
    Action,
    Finding,
    GpuSample,
    Measurement,
    Severity,
)
from gpuwatchd.settings import Seconds

NAME = "thermal"

# Reason bits that slow the GPU from outside the driver's own control loop.
# nvml.h's HwSlowdown (0x8) names temperature, the external power brake and
# fast-trigger power protection as its causes; HwThermalSlowdown (0x40) and
# HwPowerBrakeSlowdown (0x80) name the first two on their own.
HW_SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
_HW_SLOWDOWN_BITS = reduce(or_, (CLOCKS_EVENT_REASONS[reason] for reason in HW_SLOWDOWN_REASONS))
# The driver's cumulative counters of those causes (THROTTLE_REASONS names).
HW_SLOWDOWN_COUNTERS = ("hw_thermal_slowdown", "hw_power_brake_slowdown")
# The violation counters that stand still on a healthy board, watched by one
# change mark (where they did not move, none did) before a mark each: a busy
# board at its power limit counts power throttling nearly every poll (the
# simulated H100s do), the other reasons hardly ever.
STEADY_REASONS = tuple(reason for reason in THROTTLE_REASONS if reason != "power")


@dataclass(frozen=True)
class ThermalConfig:
    # Window over which throttle shares are taken. DCGM's thermal and power
    # health watches look at the last minute; five minutes separates a
    # sustained problem from the short excursions of a load step.
    window: Seconds = 300.0
    # Share of the window in thermal violation that is "sustained throttling".
    # DCGM warns on any increase of the thermal violation counter; a tenth of
    # the window (30 s of 5 min) is past what a healthy, well-cooled HGX board
    # shows at a load step, so the warning is worth acting on.
    thermal_warn_ratio: float = 0.1
    # Share of the window in HW slowdown (by the driver's counters, or by the
    # share of samples with a HW slowdown bit where the counters are absent)
    # that counts as "in HW slowdown". NVML documents HW slowdown as cutting
    # clocks by half or more, so a quarter of the window is already costly.
    hw_slowdown_ratio: float = 0.25
    # A GPU this far below its slowdown threshold (and its HBM this far below
    # hbm_max_celsius) throughout the window is cool: HW slowdown there has no
    # thermal cause, which points at the board, its power or a sensor.
    cool_margin_celsius: float = 15.0
    # Warn when the GPU is this close to its slowdown threshold
    # (NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, `GPU Slowdown Temp` in nvidia-smi).
    gpu_margin_warn_celsius: float = 5.0
    # HBM's maximum operating temperature where the driver does not give it:
    # the driver's own NVML_TEMPERATURE_THRESHOLD_MEM_MAX (`Memory Max
    # Operating Temp` in nvidia-smi -q, 95 C on H100 and H200) is used where
    # it answers. A fallback only, for drivers or GPUs that refuse it.
    hbm_max_celsius: float = 95.0
    # Warn when HBM is this close to its maximum operating temperature.
    hbm_margin_warn_celsius: float = 5.0

    def __post_init__(self) -> None:
        if self.window <= 0:
            raise ValueError("window must be more than 0s")
        for name in ("thermal_warn_ratio", "hw_slowdown_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be more than 0 and at most 1")
        if self.hbm_max_celsius <= 0:
            raise ValueError("hbm_max_celsius must be more than 0")
        for name in ("cool_margin_celsius", "gpu_margin_warn_celsius", "hbm_margin_warn_celsius"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} cannot be negative")


def run(history: History, now: float, config: ThermalConfig) -> CheckOutput:
    findings: list[Finding] = []
    measurements: list[Measurement] = []
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        if latest is None or not latest.up:
            continue
        track = history.gpu_track(index)
        ratios = _throttle_ratios(track, now, config.window)
        labels = gpu_labels(latest)
        measurements.extend(
            Measurement("gpu_throttle_ratio", {**labels, "reason": reason}, ratio)
            for reason, ratio in ratios.items()
        )
        recent = track.between(now - config.window, now)
        # The part of the window the daemon has seen: what it did not see
        # counts as unthrottled, so a daemon that just started judges a
        # share of the whole window, as a long-running one does.
        seen = min(1.0, (now - track.times[0]) / config.window)
        findings.extend(_throttling(latest, ratios, config))
        findings.extend(_hw_slowdown(latest, recent, ratios, config, seen))
        findings.extend(_headroom(latest, config))
    return CheckOutput(findings=tuple(findings), measurements=tuple(measurements))


def _throttle_ratios(track: Track[GpuSample], now: float, window: float) -> dict[str, float]:
    """Share of the window spent in each violation, for the reasons NVML counts."""
    first, last = track.at_or_before(now - window), track.upto(now)
    latest, spanned = track.samples[-1], track.times[last] > track.times[first]
    steady = track.last_change((NAME, "steady"), _steady_seconds) <= first
    ratios: dict[str, float] = {}
    for reason in THROTTLE_REASONS:
        seconds = _VIOLATION_SECONDS[reason]
        # Power, which moves nearly every poll, goes to its Column at once: a
        # mark would cost it a poll more. Where a mark says a counter stood
        # still over the window, its Column would say it grew by nothing.
        if reason in STEADY_REASONS and (
            steady or track.last_change((NAME, "moved", reason), seconds) <= first
        ):
            # Stood still over the window (a change mark costs a poll less
            # than a Column): no throttling, wherever the counter is present.
            if seconds(latest) is not None and spanned:
                ratios[reason] = 0.0
            continue
        grown = track.column((NAME, reason), seconds).increase(first, last, track.times)
        if grown.seconds > 0:
            # Over the whole window, the time before the first sample unthrottled.
            ratios[reason] = min(1.0, grown.increase / max(grown.seconds, window))
    return ratios


def _violation_seconds(reason: str, sample: GpuSample) -> float | None:
    return sample.throttle_seconds.get(reason)


_VIOLATION_SECONDS = {reason: partial(_violation_seconds, reason) for reason in THROTTLE_REASONS}


def _steady_seconds(sample: GpuSample) -> tuple[float | None, ...]:
    seconds = sample.throttle_seconds
    return tuple(seconds.get(reason) for reason in STEADY_REASONS)


def _throttling(
    latest: GpuSample, ratios: dict[str, float], config: ThermalConfig
) -> Iterator[Finding]:
    ratio = ratios.get("thermal")
    if ratio is not None and ratio >= config.thermal_warn_ratio:
        yield Finding(
            subject=gpu_subject(latest.index),
            check=NAME,
            code="thermal_throttling",
            severity=Severity.WARN,
            message=f"thermally throttled {ratio:.0%} of the last {config.window:g}s",
            action=Action.INSPECT_HARDWARE,
            evidence={"throttle_ratio": round(ratio, 4), "window_seconds": config.window},
        )


def _hw_slowdown(
    latest: GpuSample,
    recent: Sequence[GpuSample],
    ratios: dict[str, float],
    config: ThermalConfig,
    seen: float,
) -> Iterator[Finding]:
    """HW slowdown's share of the window: the larger of what the counters
    integrated (events shorter than a poll count) and of the share of samples
    with a HW slowdown bit (fast-trigger protection has no counter), of the
    part of the window `seen`."""
    known = [sample for sample in recent if sample.clocks_event_reasons is not None]
    slowed = [sample for sample in known if (sample.clocks_event_reasons or 0) & _HW_SLOWDOWN_BITS]
    sample_share = len(slowed) / len(known) * seen if known else 0.0
    counted = {r: ratios[r] for r in HW_SLOWDOWN_COUNTERS if ratios.get(r, 0.0) > 0}
    share = max([sample_share, *counted.values()])
    if share < config.hw_slowdown_ratio:
        return
    active = [
        r for r in HW_SLOWDOWN_REASONS if r in counted or any(s.reason_active(r) for s in slowed)
    ]
    cool = _cool(latest, recent, config)
    evidence: dict[str, float | int | str] = {
        "window_ratio": round(share, 4),
        "sample_ratio": round(sample_share, 4),
        "reasons": ",".join(active),
    }
    if cool:
        yield Finding(
            subject=gpu_subject(latest.index),
            check=NAME,
            code="hw_slowdown_while_cool",
            severity=Severity.CRITICAL,
            message=(
                f"{' and '.join(active)} for {share:.0%} of the last {config.window:g}s "
                "while the GPU is cool: a board, power or sensor fault"
            ),
            action=Action.INSPECT_HARDWARE,
            evidence=evidence,
        )
    else:
        yield Finding(
            subject=gpu_subject(latest.index),
            check=NAME,
            code="hw_slowdown",
            severity=Severity.WARN,
            message=f"{' and '.join(active)} for {share:.0%} of the last {config.window:g}s",
            action=Action.INSPECT_HARDWARE,
            evidence=evidence,
        )


def _against(margin: float, limit: float) -> str:
    if margin == 0:
        return f"at its {limit:g} C limit"
    return f"{abs(margin):g} C {'below' if margin > 0 else 'above'} its {limit:g} C limit"


def _hbm_limit(sample: GpuSample, config: ThermalConfig) -> float:
    """The driver's HBM maximum operating temperature, or the configured one."""
    if sample.temperature_memory_max_celsius is not None:
        return sample.temperature_memory_max_celsius
    return config.hbm_max_celsius


def _cool(latest: GpuSample, recent: Sequence[GpuSample], config: ThermalConfig) -> bool:
    """True only when the readings show headroom; an unknown threshold or
    temperature is not evidence of a cool GPU."""
    slowdown = latest.temperature_slowdown_celsius
    gpu_temps = [s.temperature_gpu_celsius for s in recent if s.temperature_gpu_celsius is not None]
    if slowdown is None or not gpu_temps:
        return False
    if max(gpu_temps) > slowdown - config.cool_margin_celsius:
        return False
    hbm_temps = [
        s.temperature_memory_celsius for s in recent if s.temperature_memory_celsius is not None
    ]
    hbm_limit = _hbm_limit(latest, config)
    return not hbm_temps or max(hbm_temps) <= hbm_limit - config.cool_margin_celsius


def _headroom(latest: GpuSample, config: ThermalConfig) -> Iterator[Finding]:
    checks = (
        (
            "gpu_temperature_high",
            "GPU",
            latest.temperature_gpu_celsius,
            latest.temperature_slowdown_celsius,
            config.gpu_margin_warn_celsius,
        ),
        (
            "hbm_temperature_high",
            "HBM",
            latest.temperature_memory_celsius,
            _hbm_limit(latest, config),
            config.hbm_margin_warn_celsius,
        ),
    )
    for code, what, temperature, limit, warn_margin in checks:
        if temperature is None or limit is None:
            continue
        margin = limit - temperature
        if margin <= warn_margin:
            yield Finding(
                subject=gpu_subject(latest.index),
                check=NAME,
                code=code,
                severity=Severity.WARN,
                message=f"{what} at {temperature:g} C, {_against(margin, limit)}",
                evidence={"temperature_celsius": temperature, "margin_celsius": margin},
            )
