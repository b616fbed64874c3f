"""Memory check: ECC errors, row remapping and page retirement of every GPU.

Reads the ECC counters (volatile and aggregate), the row-remapper state and
histogram (Ampere and newer), the SRAM error status and retired pages (the
pre-Ampere mechanism). Follows NVIDIA's GPU memory error management guide:

- An uncorrectable error drains the GPU for a reset (an immediate, not a
  hardware, quarantine): A100 and later contain it, and the faulty row is
  remapped at the next reset. The finding holds while the repair it started
  is pending, so the GPU returns to service once it comes back from its reset
  with nothing pending (and stays out if the remap failed).
- Only NVIDIA's RMA criteria condemn for good: the row-remap failure flag,
  the SRAM error threshold exceeded, and (before Ampere) DCGM's retired-page
  limit. A bank with no spare rows left is not one: NVIDIA's RMA policy for
  row remapping meets the criterion "when the row-remapping failure flag is
  set", which the next uncorrectable error in such a bank sets (and on
  Blackwell a spare HBM channel may still repair it), so it warns.
- Pending remaps and retirements of correctable rows wait for a reset and warn.
- The aggregate (lifetime, InfoROM) counters never decrease on one board: a
  lower value is another board at this index or a cleared InfoROM, never new
  errors, so it counts nothing. The volatile ones restart at a driver reload.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import gpu_subject
from gpuwatchd.counters import Increase
from gpuwatchd.history import History, Track
from gpuwatchd.model import Action, Finding, GpuSample, Severity
from gpuwatchd.settings import PerSecond, Seconds

NAME = "memory"


@dataclass(frozen=True)
class MemoryConfig:
    # Window for ECC increases and the corrected-error rate. An uncorrectable
    # error keeps its finding this long; its quarantine outlives it.
    window: Seconds = 600.0
    # Corrected (single-bit) errors per second that make an SBE storm: our
    # choice, a warning only. No DCGM health check judges SBEs (its
    # DCGM_LIMIT_MAX_SBE_RATE is a unitless "dummy value" no check reads), the
    # driver's own SBE-storm signal is XID 92, and NVIDIA's memory error guide
    # leaves corrected HBM errors out of its RMA policy. 10/min over 10 minutes
    # is a hundred corrections, far above a healthy HBM's near zero.
    sbe_storm_rate: PerSecond = 10 / 60
    # Retired pages (single- plus double-bit) at which the GPU has failed:
    # DCGM_LIMIT_MAX_RETIRED_PAGES, 63 since DCGM matched the field diag.
    retired_pages_limit: int = 63

    def __post_init__(self) -> None:
        if self.window <= 0 or self.sbe_storm_rate <= 0:
            raise ValueError("window must be more than 0s and sbe_storm_rate more than 0/s")
        if self.retired_pages_limit < 1:
            raise ValueError("retired_pages_limit must be 1 or more")


def run(history: History, now: float, config: MemoryConfig) -> CheckOutput:
    findings: list[Finding] = []
    for index in history.gpu_indices():
        latest = history.latest_gpu(index)
        if latest is None or not latest.up:
            continue
        findings.extend(_ecc(latest, history.gpu_track(index), now, config))
        findings.extend(_remapping(latest))
        findings.extend(_retirement(latest, config))
    return CheckOutput(findings=tuple(findings))


def _ecc_increase(
    track: Track[GpuSample], error_type: str, scope: str, now: float, window: float
) -> Increase:
    key = (error_type, scope)
    column = track.column((NAME, key), partial(_ecc_count, key), lifetime=scope == "aggregate")
    return column.increase(track.at_or_before(now - window), track.upto(now), track.times)


def _ecc_count(key: tuple[str, str], sample: GpuSample) -> int | None:
    return sample.ecc_errors.get(key)


def _ecc_counts(sample: GpuSample) -> Mapping[tuple[str, str], int]:
    return sample.ecc_errors


def _ecc(
    latest: GpuSample, track: Track[GpuSample], now: float, config: MemoryConfig
) -> Iterator[Finding]:
    subject = gpu_subject(latest.index)
    # Where the counts stood still over the window, none grew: on a healthy
    # GPU one comparison a poll, where each counter's Column takes every
    # sample in.
    first = track.at_or_before(now - config.window)
    moved = track.last_change((NAME, "counts"), _ecc_counts) > first
    # Volatile counters restart at a driver reload (a reset, not errors); the
    # aggregate ones survive it but are written to the InfoROM later. Either
    # growing is a new error (an aggregate one falling is not: see above).
    uncorrected = (
        max(
            _ecc_increase(track, "uncorrected", scope, now, config.window).increase
            for scope in ("volatile", "aggregate")
        )
        if moved
        else 0.0
    )
    since_reset = latest.ecc_errors.get(("uncorrected", "volatile")) or 0
    awaiting_reset = since_reset > 0 and bool(
        latest.row_remap_pending or latest.retired_pages_pending
    )
    if uncorrected > 0 or awaiting_reset:
        message = (
            f"{uncorrected:g} uncorrectable ECC error(s) in the last {config.window:g}s"
            if uncorrected > 0
            else f"{since_reset} uncorrectable ECC error(s) since the last reset, repair pending"
        )
        yield Finding(
            subject=subject,
            check=NAME,
            code="ecc_uncorrectable",
            severity=Severity.CRITICAL,
            message=f"{message}: drain the GPU and reset it",
            # The faulty row is remapped (or the page retired) at the next GPU reset.
            action=Action.RESET_GPU,
            evidence={
                "errors": uncorrected,
                "errors_since_reset": since_reset,
                "window_seconds": config.window,
            },
            immediate=True,
        )
    if not moved:
        return
    corrected = _ecc_increase(track, "corrected", "volatile", now, config.window)
    if corrected.seconds <= 0:
        corrected = _ecc_increase(track, "corrected", "aggregate", now, config.window)
    # Over the whole window, the time before the first sample without errors:
    # a daemon that just started sees the rate a long-running one would.
    rate = corrected.increase / max(corrected.seconds, config.window)
    if corrected.seconds > 0 and rate >= config.sbe_storm_rate:
        yield Finding(
            subject=subject,
            check=NAME,
            code="ecc_sbe_storm",
            severity=Severity.WARN,
            message=f"corrected ECC errors at {rate * 60:.3g}/min",
            evidence={
                "rate_per_second": round(rate, 6),
                "errors": corrected.increase,
                "window_seconds": config.window,
            },
        )


def _remapping(latest: GpuSample) -> Iterator[Finding]:
    subject = gpu_subject(latest.index)
    if latest.sram_threshold_exceeded:
        yield Finding(
            subject=subject,
            check=NAME,
            code="sram_threshold_exceeded",
            severity=Severity.CRITICAL,
            message="SRAM uncorrectable errors past the field-diag threshold",
            # NVIDIA's RMA criterion for SRAM (L2, register file) errors.
            action=Action.INSPECT_HARDWARE,
            definitive=True,
        )
    if latest.row_remap_failed:
        yield Finding(
            subject=subject,
            check=NAME,
            code="row_remap_failure",
            severity=Severity.CRITICAL,
            message="row remapping failed: a faulty row could not be replaced",
            # DCGM fails the GPU; NVIDIA's guidance is to take it out of service.
            action=Action.INSPECT_HARDWARE,
            definitive=True,
        )
    if latest.row_remap_pending:
        yield Finding(
            subject=subject,
            check=NAME,
            code="row_remap_pending",
            severity=Severity.WARN,
            message="row remapping pending: it takes effect at the next GPU reset",
            action=Action.RESET_GPU,
        )
    exhausted = latest.row_remapper_banks.get("none", 0)
    if exhausted > 0:
        yield Finding(
            subject=subject,
            check=NAME,
            code="row_remap_exhausted",
            severity=Severity.WARN,
            message=(
                f"{exhausted} memory bank(s) with no spare rows left to remap: the next "
                "uncorrectable error in such a bank cannot be remapped, which sets the "
                "row-remap failure flag (NVIDIA's RMA criterion); plan a field diagnostic"
            ),
            evidence={
                f"banks_{bucket}": count for bucket, count in latest.row_remapper_banks.items()
            },
        )


def _retirement(latest: GpuSample, config: MemoryConfig) -> Iterator[Finding]:
    subject = gpu_subject(latest.index)
    if latest.retired_pages_pending:
        yield Finding(
            subject=subject,
            check=NAME,
            code="retired_pages_pending",
            severity=Severity.WARN,
            message="page retirement pending: it takes effect at the next GPU reset",
            action=Action.RESET_GPU,
        )
    if not latest.retired_pages:
        return
    retired = sum(latest.retired_pages.values())
    if retired >= config.retired_pages_limit:
        yield Finding(
            subject=subject,
            check=NAME,
            code="retired_pages_limit",
            severity=Severity.CRITICAL,
            message=f"{retired} pages retired, the limit is {config.retired_pages_limit}",
            action=Action.INSPECT_HARDWARE,
            evidence={"retired_pages": retired, **latest.retired_pages},
            # Retired pages never come back: confirming over time adds nothing.
            definitive=True,
        )
