"""NVLink check: error storms, recoveries and links that went down, per link.

Reads each GPU's NVLink samples (state and the cumulative CRC flit, CRC data,
replay, recovery and ECC data counters). Each error family is judged over
consecutive windows: a rate over its threshold in the latest window (or, for
replays and recoveries, any increase) warns; over the threshold in every one
of the last `storm_windows` windows is a storm, critical. A link that was up
earlier and is down now is critical. Subjects are `nvlink:<gpu>/<link>`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import Point, increase_between, link_subject, tail_from, windows
from gpuwatchd.history import History, series
from gpuwatchd.model import Action, Finding, GpuSample, LinkSample, Severity
from gpuwatchd.settings import PerSecond, Seconds

NAME = "nvlink"

# Error families and the NVML counters in each: CRC flit and CRC data errors
# are one symptom (bit errors on the wire) and share a threshold.
FAMILIES: dict[str, tuple[str, ...]] = {
    "crc": ("crc_flit", "crc_data"),
    "replay": ("replay",),
    "recovery": ("recovery",),
    "ecc": ("ecc_data",),
}


@dataclass(frozen=True)
class NvlinkConfig:
    # DCGM's NVLink health watch judges the last minute of counters.
    window: Seconds = 60.0
    # A storm is a rate over threshold in this many consecutive windows, so a
    # single burst (a cable touched, a link retrained once) is not one.
    storm_windows: int = 3
    # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR: "RM has informed us that CRC errors
    # only matter at rates of 100+ per second" (DCGM's hardware limits).
    crc_storm_rate: PerSecond = 100.0
    # ECC data errors are lane errors the link corrected, like CRC errors;
    # the same 100/s bound applies.
    ecc_storm_rate: PerSecond = 100.0
    # DCGM fails on any replay increase. RM's bound for PCIe replays is
    # 8/min (DCGM_LIMIT_MAX_PCIREPLAY_RATE); a link retransmitting at that rate
    # for every window is failing, not unlucky.
    replay_storm_rate: PerSecond = 8 / 60
    # DCGM fails on any recovery increase. A recovery retrains the link; one
    # every minute, window after window, is a link that keeps dropping.
    recovery_storm_rate: PerSecond = 1 / 60
    # Families for which any increase in the latest window warns (DCGM treats
    # any replay or recovery as a fault; CRC and ECC errors are normal at low rates).
    warn_on_any: tuple[str, ...] = ("replay", "recovery")

    def __post_init__(self) -> None:
        unknown = set(self.warn_on_any) - set(FAMILIES)
        if unknown:
            raise ValueError(f"warn_on_any: unknown famil(ies) {', '.join(sorted(unknown))}")
        if self.window <= 0 or self.storm_windows < 1:
            raise ValueError("window must be more than 0s and storm_windows at least 1")
        for family in FAMILIES:
            if self.storm_rate(family) <= 0:
                raise ValueError(f"{family}_storm_rate must be more than 0/s")

    def storm_rate(self, family: str) -> float:
        rate: float = getattr(self, f"{family}_storm_rate")
        return rate


def run(history: History, now: float, config: NvlinkConfig) -> CheckOutput:
    findings: list[Finding] = []
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        # A lost GPU has no links to read: the gpu_lost check speaks for it.
        if latest is None or not latest.up:
            continue
        samples = history.gpu(index)
        recent = tail_from(samples, now - config.window * config.storm_windows)
        for link in latest.nvlinks:
            findings.extend(_down(link, samples))
            findings.extend(_errors(link, _link_series(recent, link.link), now, config))
    return CheckOutput(findings=tuple(findings))


def _link_series(
    samples: Sequence[tuple[float, GpuSample]], number: int
) -> list[tuple[float, LinkSample | None]]:
    return series(samples, partial(_link, number))


def _link(number: int, sample: GpuSample) -> LinkSample | None:
    # Sources list the links in order, so the link is nearly always at its own
    # position; look further only when it is not.
    links = sample.nvlinks
    if number < len(links) and links[number].link == number:
        return links[number]
    return next((link for link in links if link.link == number), None)


def _down(link: LinkSample, samples: Sequence[tuple[float, GpuSample]]) -> Iterator[Finding]:
    if link.up is not False:
        return
    # A link that was never seen up may be unconnected by design: only a link
    # that was up earlier is one that should be up.
    earlier = _link_series(samples[:-1], link.link)
    if any(before is not None and before.up for _, before in earlier):
        yield Finding(
            subject=link_subject(link.gpu, link.link),
            check=NAME,
            code="nvlink_down",
            severity=Severity.CRITICAL,
            message=f"NVLink {link.link} of GPU {link.gpu} is down after being up",
            action=Action.RESET_GPU,
        )


def _errors(
    link: LinkSample,
    links: Sequence[tuple[float, LinkSample | None]],
    now: float,
    config: NvlinkConfig,
) -> Iterator[Finding]:
    spans = windows(now, config.window, config.storm_windows)
    counts = {
        error_type: series(links, partial(_error_count, error_type))
        for types in FAMILIES.values()
        for error_type in types
    }
    for family, types in FAMILIES.items():
        threshold = config.storm_rate(family)
        # Per window: the highest rate among the family's counters, and whether any grew.
        judged = [_family_window(counts, types, start, end) for start, end in spans]
        latest_rate, latest_grew = judged[0]
        storm = all(rate >= threshold for rate, _ in judged)
        over = latest_rate >= threshold or (family in config.warn_on_any and latest_grew)
        if not over:
            continue
        evidence: dict[str, float | int | str] = {
            "rate_per_second": round(latest_rate, 6),
            "threshold_per_second": round(threshold, 6),
            "window_seconds": config.window,
        }
        subject = link_subject(link.gpu, link.link)
        if storm:
            yield Finding(
                subject=subject,
                check=NAME,
                code=f"nvlink_{family}_storm",
                severity=Severity.CRITICAL,
                message=(
                    f"NVLink {family} errors at {latest_rate:.3g}/s, over {threshold:.3g}/s "
                    f"in each of the last {config.storm_windows} windows of {config.window:g}s"
                ),
                action=Action.RESET_GPU,
                evidence={**evidence, "windows": config.storm_windows},
            )
        else:
            yield Finding(
                subject=subject,
                check=NAME,
                code=f"nvlink_{family}_errors",
                severity=Severity.WARN,
                message=f"NVLink {family} errors at {latest_rate:.3g}/s over {config.window:g}s",
                evidence=evidence,
            )


def _family_window(
    counts: Mapping[str, Sequence[Point]],
    types: tuple[str, ...],
    start: float,
    end: float,
) -> tuple[float, bool]:
    rate = 0.0
    grew = False
    for error_type in types:
        grown = increase_between(counts[error_type], start, end)
        rate = max(rate, grown.rate)
        grew = grew or grown.increase > 0
    return rate, grew


def _error_count(error_type: str, link: LinkSample | None) -> int | None:
    return None if link is None else link.errors.get(error_type)
