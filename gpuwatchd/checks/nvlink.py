"""NVLink check: error storms, recoveries, links that went down or never came up.

Reads each GPU's NVLink samples: state, the cumulative counters (NVLink 2-4's
CRC flit, CRC data, replay, recovery and ECC data; NVLink5's effective errors,
recovery events and failures, malformed packets and link integrity errors) and
NVLink5's effective BER. Each error family is judged over consecutive windows:
a rate over its threshold in the latest window (or, for the families in
`warn_on_any`, any increase) warns; over the threshold in every one of the
last `storm_windows` windows is a storm, critical. An effective BER over its
limit is critical. A link that was up earlier and is down now is critical on
the link (`nvlink:<gpu>/<link>`); a GPU with fewer links up than expected, for
a whole window, is critical on the GPU (`gpu:<index>`), which catches links
that never came up (gpud issue #1085: a B200 whose links stayed inactive
after boot). The links expected are the configured count or else what the
fabric says: the links ever seen up on that board (by GPU UUID, learned by the
daemon and kept in the state database, `links_after`) and, while the GPU is
registered with the NVSwitch fabric, its model's count. A GPU with neither (an
SXM board passed through to a VM, outside the fabric) is expected to have
none: its product name alone says nothing about the links it was given.
Nothing here is definitive: every finding clears when the link behaves, and
quarantines only after policy's confirm_for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import (
    Point,
    gpu_subject,
    increase_between,
    link_subject,
    windows,
)
from gpuwatchd.history import History, series
from gpuwatchd.model import (
    FABRIC_STATE_COMPLETED,
    Action,
    Finding,
    GpuSample,
    LinkSample,
    Reading,
    Severity,
)
from gpuwatchd.settings import PerSecond, Seconds

NAME = "nvlink"
# nvml.h NVML_NVLINK_MAX_LINKS (36 from CUDA 13; 18 before): the most links a GPU has.
MAX_LINKS = 36

# Error families and the NVML counters in each. CRC flit and CRC data errors
# are one symptom (bit errors on the wire) and share a threshold; a failed
# recovery is a recovery too; NVLink5's malformed packets and local link
# integrity errors are both packets the link could not deliver whole.
FAMILIES: dict[str, tuple[str, ...]] = {
    "crc": ("crc_flit", "crc_data"),
    "replay": ("replay",),
    "recovery": ("recovery", "recovery_failed"),
    "ecc": ("ecc_data",),
    "effective": ("effective_errors",),
    "packet": ("malformed_packets", "link_integrity"),
}

# NVLinks per GPU of the SXM boards registered with an NVSwitch fabric, by the
# name NVML gives them (nvidia-smi -q "Product Name"): NVLink 4 (H100, H200)
# and NVLink5 (B200) have 18. Only Hopper and newer report a fabric state
# (nvml.h, nvmlDeviceGetGpuFabricInfoV), so V100 and A100 boards are expected
# the links seen up on them. PCIe boards are left out: their links depend on
# the bridges fitted.
MODEL_NVLINKS: Mapping[str, int] = {
    "NVIDIA H100 80GB HBM3": 18,
    "NVIDIA H200": 18,
    "NVIDIA B200": 18,
}

# The state database fact (Store.fact) of the NVLinks seen up on each board:
# {GPU UUID: [link numbers]}, so that after a restart or a reboot a link that
# does not come up again is missed by name.
LINKS_SEEN_UP_FACT = "nvlinks_seen_up"

# GPU UUID -> the link numbers seen up on that board.
LearnedLinks = Mapping[str, frozenset[int]]
NONE_LEARNED: LearnedLinks = MappingProxyType({})


@dataclass(frozen=True)
class NvlinkConfig:
    # DCGM's NVLink health watch judges the last minute of counters.
    window: Seconds = 60.0
    # A storm is a rate over threshold in this many consecutive windows, so a
    # single burst (a cable touched, a link retrained once) is not one.
    storm_windows: int = 3
    # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR: "RM has informed us that CRC errors
    # only matter at rates of 100+ per second" (DCGM's hardware limits; DCGM
    # fails at it). DCGM also warns at one CRC error a minute below it; we do
    # not: each such error is replayed, and replays are judged themselves.
    crc_storm_rate: PerSecond = 100.0
    # ECC data errors are lane errors the link corrected, like CRC errors; DCGM
    # does not judge them on NVLink 2-4. Our own choice: CRC's 100/s.
    ecc_storm_rate: PerSecond = 100.0
    # DCGM fails on any replay (MonitorNVLink4Fields). A replay every minute,
    # window after window, is a sustained increase: a storm.
    replay_storm_rate: PerSecond = 1 / 60
    # DCGM fails on any recovery. A recovery retrains the link; one every
    # minute, window after window, is a link that keeps dropping.
    recovery_storm_rate: PerSecond = 1 / 60
    # NVLink5's errors that FEC did not correct: DCGM fails on an increase of
    # one in a minute (MonitorNVLink5Fields, DCGM_LIMIT_MAX_NVLINK_ERROR 1).
    effective_storm_rate: PerSecond = 1 / 60
    # Malformed packets and link integrity errors: DCGM fails on one a minute.
    packet_storm_rate: PerSecond = 1 / 60
    # Families for which any increase in the latest window warns (DCGM fails on
    # each; CRC and ECC errors are normal at low rates).
    warn_on_any: tuple[str, ...] = ("replay", "recovery", "effective", "packet")
    # NVLink5 effective BER above which a link is critical: DCGM's
    # IsEffectiveBerThresholdExceeded fails above 1e-12.
    effective_ber_critical: float = 1e-12
    # NVLinks each GPU must have up. None: the larger of the links seen up on
    # that board (learned, by UUID) and, while it is registered with the
    # NVSwitch fabric, its model's count (MODEL_NVLINKS); none for a GPU with
    # neither (passed through to a VM outside the fabric). 0: none expected
    # (an NVSwitch partition whose GPUs are registered without their links).
    expected_links: int | None = None

    def __post_init__(self) -> None:
        unknown = set(self.warn_on_any) - set(FAMILIES)
        if unknown:
            raise ValueError(f"warn_on_any: unknown famil(ies) {', '.join(sorted(unknown))}")
        if self.window <= 0 or self.storm_windows < 1:
            raise ValueError("window must be more than 0s and storm_windows at least 1")
        for family in FAMILIES:
            if self.storm_rate(family) <= 0:
                raise ValueError(f"{family}_storm_rate must be more than 0/s")
        if self.effective_ber_critical <= 0:
            raise ValueError("effective_ber_critical must be more than 0")
        # More than a GPU can have would call every GPU short of links.
        if self.expected_links is not None and not 0 <= self.expected_links <= MAX_LINKS:
            raise ValueError(f"expected_links must be 0 to {MAX_LINKS}")

    def storm_rate(self, family: str) -> float:
        rate: float = getattr(self, f"{family}_storm_rate")
        return rate


def links_after(learned: LearnedLinks, readings: Iterable[Reading]) -> dict[str, frozenset[int]]:
    """The boards (by UUID) with links up in `readings` not in `learned`, and
    all their links seen up: what the daemon records, when there is any."""
    grown: dict[str, frozenset[int]] = {}
    for reading in readings:
        for gpu in reading.gpus or ():
            up = {link.link for link in gpu.nvlinks if link.up}
            if gpu.uuid is None or not up:
                continue
            known = grown.get(gpu.uuid, learned.get(gpu.uuid, frozenset()))
            if not up <= known:
                grown[gpu.uuid] = known | up
    return grown


def encode_learned(learned: LearnedLinks) -> dict[str, list[int]]:
    return {uuid: sorted(links) for uuid, links in learned.items()}


def decode_learned(data: Any) -> dict[str, frozenset[int]]:
    """LINKS_SEEN_UP_FACT's value as recorded; what is not a UUID's list of
    link numbers is left out (learned again)."""
    if not isinstance(data, dict):
        return {}
    return {
        uuid: frozenset(number for number in links if isinstance(number, int))
        for uuid, links in data.items()
        if isinstance(uuid, str) and isinstance(links, list)
    }


def run(
    history: History, now: float, config: NvlinkConfig, learned: LearnedLinks = NONE_LEARNED
) -> CheckOutput:
    """`learned`: the links seen up on each board (GPU UUID), this run and before."""
    findings: list[Finding] = []
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        # A lost GPU, or one whose read hung, has no links read: the gpu_lost
        # check speaks for it.
        if latest is None or not latest.read:
            continue
        track = history.gpu_track(index)
        first = track.at_or_before(now - config.window * config.storm_windows)
        window = [
            (time, s) for time, s in track.tail(track.at_or_before(now - config.window)) if s.read
        ]
        links = _distinct_links(window)
        down = {link.link for sample_links in links for link in sample_links if link.up is False}
        was_up = _seen_up(track.samples[:-1], down) if down else set()
        # A link whose counters have not moved since before the oldest window
        # grew by nothing in any window: nothing to judge. One mark over all
        # the links says so for a healthy GPU at one comparison a poll.
        moved = track.last_change((NAME, "links"), _links_errors) > first
        recent = track.tail(first) if moved else []
        for link in latest.nvlinks:
            # Each judgement asked only of a link it can speak of: 144 links a
            # node, nearly all up, still and without a BER.
            if link.link in was_up:
                findings.extend(_down(link, was_up))
            if (
                moved
                and track.last_change((NAME, link.link), partial(_link_errors, link.link)) > first
            ):
                findings.extend(_errors(link, _link_series(recent, link.link), now, config))
            if link.ber:
                findings.extend(_ber(link, config))
        if track.times[0] <= now - config.window:
            findings.extend(_missing(latest, window, links, was_up, learned, config))
    return CheckOutput(findings=tuple(findings))


def _distinct_links(window: Sequence[tuple[float, GpuSample]]) -> list[tuple[LinkSample, ...]]:
    """The window's links, oldest first, a run of samples with the same links
    once: the NVML source hands a GPU's sample the last one's links where none
    changed, so a healthy GPU's window judges its 18 links once, not each poll's."""
    distinct: list[tuple[LinkSample, ...]] = []
    for _, sample in window:
        if not distinct or sample.nvlinks is not distinct[-1]:
            distinct.append(sample.nvlinks)
    return distinct


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


def _link_errors(number: int, sample: GpuSample) -> Mapping[str, int] | None:
    link = _link(number, sample)
    return None if link is None else link.errors


def _links_errors(sample: GpuSample) -> tuple[tuple[int, Mapping[str, int]], ...]:
    """Every link's counters by its number: where these are the same, so is
    each link's `_link_errors`."""
    return tuple((link.link, link.errors) for link in sample.nvlinks)


def _seen_up(samples: Sequence[GpuSample], numbers: set[int]) -> set[int]:
    """Which of the links `numbers` were up in any of `samples` (newest first,
    stopping once all are found: only a link never up costs the whole history)."""
    pending, seen = set(numbers), set()
    for sample in reversed(samples):
        if not pending:
            break
        for link in sample.nvlinks:
            if link.up and link.link in pending:
                pending.discard(link.link)
                seen.add(link.link)
    return seen


def _down(link: LinkSample, was_up: set[int]) -> Iterator[Finding]:
    # Only a link seen up earlier is judged here, on its own subject; one
    # never seen up counts against the GPU's expected links (`_missing`).
    if link.up is False and link.link in was_up:
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
    # Only the counters this link reports now (each generation reports a few
    # of NVLINK_ERROR_TYPES): the others have no series to judge.
    counts = {
        error_type: series(links, partial(_error_count, error_type)) for error_type in link.errors
    }
    for family, all_types in FAMILIES.items():
        types = tuple(error_type for error_type in all_types if error_type in counts)
        if not types:
            continue
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


def _ber(link: LinkSample, config: NvlinkConfig) -> Iterator[Finding]:
    ber = link.ber.get("effective")
    if ber is None or ber <= config.effective_ber_critical:
        return
    yield Finding(
        subject=link_subject(link.gpu, link.link),
        check=NAME,
        code="nvlink_effective_ber",
        severity=Severity.CRITICAL,
        message=(
            f"NVLink {link.link} of GPU {link.gpu}: effective bit error rate {ber:.2g}, "
            f"over {config.effective_ber_critical:.2g}"
        ),
        action=Action.RESET_GPU,
        evidence={"ber": ber, "threshold": config.effective_ber_critical},
    )


def _shortfall(
    links: tuple[LinkSample, ...], expected: int, was_up: set[int]
) -> tuple[int, list[int]]:
    """How many links short of `expected` the GPU is with `links` (one
    sample's), and which of them were never up. A link of unknown state is
    given the benefit of the doubt; one down after being up is `_down`'s."""
    never_up = [link.link for link in links if link.up is False]
    never_up = [number for number in never_up if number not in was_up]
    return expected - (len(links) - len(never_up)), never_up


def _expected(
    latest: GpuSample,
    window: Sequence[tuple[float, GpuSample]],
    learned: LearnedLinks,
    config: NvlinkConfig,
) -> tuple[int, str]:
    """How many links the GPU must have up, and why; 0 for none. Registered
    with the fabric means so in any sample of the window, so that one poll's
    unread fabric state does not lift the expectation."""
    if config.expected_links is not None:
        return config.expected_links, "checks.nvlink.expected_links"
    seen = len(learned.get(latest.uuid or "", ()))
    registered = any(sample.fabric_state == FABRIC_STATE_COMPLETED for _, sample in window)
    model = MODEL_NVLINKS.get(latest.name or "", 0) if registered else 0
    if model >= seen:
        return model, "its model's, registered with the NVSwitch fabric"
    return seen, "seen up on this board before"


def _missing(
    latest: GpuSample,
    window: Sequence[tuple[float, GpuSample]],
    links: Sequence[tuple[LinkSample, ...]],
    was_up: set[int],
    learned: LearnedLinks,
    config: NvlinkConfig,
) -> Iterator[Finding]:
    """Fewer links up than expected in every sample of the last window (the
    caller makes sure history covers it): a one-poll gap (a link state that
    timed out at the first poll) is not one. `links`: the window's, as
    `_distinct_links` gives them."""
    expected, why = _expected(latest, window, learned, config)
    if not expected or not window:
        return
    short = [_shortfall(sample_links, expected, was_up) for sample_links in links]
    if min(missing for missing, _ in short) <= 0:
        return
    missing, never_up = short[-1]
    up = expected - missing
    listed = ", ".join(str(link) for link in never_up) or "none"
    yield Finding(
        subject=gpu_subject(latest.index),
        check=NAME,
        code="nvlink_missing",
        severity=Severity.CRITICAL,
        message=(
            f"GPU {latest.index} has {up} of {expected} expected NVLinks up (expected: {why}; "
            f"never up: {listed}; not reported by NVML: "
            f"{max(0, expected - len(latest.nvlinks))}); "
            "check nvidia-fabricmanager and the NVSwitch fabric, then reset the GPU"
        ),
        action=Action.RESET_GPU,
        evidence={"expected": expected, "up": up, "never_up": listed},
    )
