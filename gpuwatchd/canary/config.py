"""Settings of the canaries: how often, when, how long, and how a mismatch is
confirmed. Loaded under `canary:` in the daemon's YAML config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpuwatchd.settings import Seconds

MIB = 1024 * 1024
# Above any GPU's memory: the largest boards have 288 GB of HBM (B300).
MAX_GPU_BYTES = 1 << 40
# Seeds are 64-bit, as a scenario's are: numpy's generators take no negative seed.
MAX_SEED = 2**64 - 1


# DCGM's diagnostic levels (`dcgmi diag -r 1..4`).
DCGM_LEVELS = (1, 2, 3, 4)


@dataclass(frozen=True)
class DcgmConfig:
    """The offline tier, `gpuwatchd canary --dcgm LEVEL` (never the daemon)."""

    # The dcgmi to run: a name looked up on PATH, or a path.
    dcgmi: str = "dcgmi"
    # Hard limits on `dcgmi diag -r N`, past which it is killed and the run
    # could not run. dcgmi's help gives level 1 "~ seconds", 2 "~ 2 minutes",
    # 3 "~ 15 minutes" and 4 "longer-running" (DCGM 4.6,
    # dcgmi/CommandLineParser.cpp). Each limit is several times that, for a
    # node of eight GPUs; level 4's length is not given there, its 4 h assumed.
    level_1_timeout: Seconds = 300.0
    level_2_timeout: Seconds = 900.0
    level_3_timeout: Seconds = 3600.0
    level_4_timeout: Seconds = 4 * 3600.0

    def __post_init__(self) -> None:
        if not self.dcgmi.strip():
            raise ValueError("dcgmi must name a program (dcgmi, or a path)")
        for level in DCGM_LEVELS:
            if self.timeout(level) <= 0:
                raise ValueError(f"level_{level}_timeout must be more than 0s")

    def timeout(self, level: int) -> float:
        seconds: float = getattr(self, f"level_{level}_timeout")
        return seconds


@dataclass(frozen=True)
class CanaryConfig:
    enabled: bool = True
    # What checks the GPUs: `cuda` (CuPy); `cpu` checks the host's cores only
    # (and stands in for a simulated node's GPUs); `auto` is `cuda` when a
    # worker finds CuPy and a GPU, else `cpu`.
    backend: Literal["auto", "cuda", "cpu"] = "auto"
    # One burst per GPU this often. Ten minutes at about a second each is
    # well under 0.2 % of GPU time, yet a GPU that turns bad is caught within
    # a fraction of a typical checkpoint interval (tens of minutes to hours).
    interval: Seconds = 600.0
    # The device time one burst is sized for; the duty budget reserves it
    # before a burst starts (and then counts what the burst really took).
    burst: Seconds = 1.0
    # Hard limit on one burst's worker process (its start, CUDA context and
    # canaries); past it the worker is killed and the burst is a `timeout`.
    timeout: Seconds = 60.0
    # `always`: also while a job runs, within `duty_cycle`, so a GPU that is
    # busy for days is still checked (GpuwatchdCanaryOverdue expects a pass
    # every few hours); a burst then takes a CUDA context (a few hundred MiB)
    # and the HBM slice from the job's GPU. `idle`: only while the GPU is
    # idle, never competing with a job, but a GPU never idle is never checked.
    when: Literal["idle", "always"] = "always"
    # A GPU whose utilisation is at most this is idle. None (unknown) is busy.
    idle_utilization: float = 0.05
    # Share of GPU time canaries may take from a busy GPU (`when: always`),
    # over a sliding `duty_window`. Idle time is not counted against it.
    duty_cycle: float = 0.005
    duty_window: Seconds = 3600.0
    # After a mismatch that did not reproduce, the GPU is watched: it runs a
    # burst every `watch_interval` for `watch_for` (idle, or within the duty
    # budget when busy).
    watch_interval: Seconds = 60.0
    watch_for: Seconds = 86400.0
    # A GPU's mismatches are kept in the state database this long, by UUID;
    # two of them on different canaries or seeds, each computed right by a
    # sibling GPU on the same inputs, from bursts at least one `interval`
    # apart (or one reproduced), confirm a fault (docs/sdc.md, "Confirmation").
    history_window: Seconds = 30 * 86400.0
    # The same canary failing on more than this share of the GPUs of one
    # model and SM count within one `interval` is a software, driver or
    # reference problem: an alert, and no GPU is quarantined for it.
    software_ratio: float = 0.5
    # Seeds of the known-answer canaries cycle through `seed_rotation` values
    # from `seed`, so their references (cached per seed) are computed only a
    # few times; the full-mantissa GEMMs' seed cycles through as many with
    # the wall-clock slot of `interval`, the same on every GPU at a time, so
    # their results can be compared across GPUs and across runs.
    seed: int = 1
    seed_rotation: int = 16
    # The HBM pattern test covers at most this much of a GPU's memory, and at
    # most `hbm_free_fraction` of what is free, so it never crowds out a job.
    hbm_bytes: int = 256 * MIB
    hbm_free_fraction: float = 0.05
    # Check the host's CPU cores too, each pinned in turn, this often.
    host_cores: bool = True
    host_interval: Seconds = 3600.0
    # Where the digests of exact references are cached across bursts (a
    # directory); None is `canary-references` in the state directory.
    reference_cache: str | None = None
    # A busy GPU with less free memory than this gets no burst: the burst's
    # context, GEMMs and HBM slice would crowd out the job.
    min_free_bytes: int = 4096 * MIB
    # Bursts on busy GPUs start only in the first `aligned_window` seconds
    # (at most half the interval) of a wall-clock slot of `interval` (every
    # node's in the same second under NTP), so a job spanning many nodes stalls once per interval,
    # not once per node (docs/sdc.md, "Cost"). 0 turns the alignment off.
    aligned_window: Seconds = 30.0
    dcgm: DcgmConfig = field(default_factory=DcgmConfig)

    def __post_init__(self) -> None:
        for name in (
            "interval",
            "burst",
            "timeout",
            "duty_window",
            "watch_interval",
            "history_window",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be more than 0s")
        for name in ("idle_utilization", "duty_cycle", "hbm_free_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1")
        if not 0 < self.software_ratio < 1:
            raise ValueError("software_ratio must be more than 0 and less than 1")
        if self.seed_rotation < 1:
            raise ValueError("seed_rotation must be at least 1")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError("seed must be 0 to 2^64-1")
        for name in ("hbm_bytes", "min_free_bytes"):
            if not 0 <= getattr(self, name) <= MAX_GPU_BYTES:
                raise ValueError(f"{name} must be 0 to {MAX_GPU_BYTES} (1 TiB)")
        if self.aligned_window < 0:
            raise ValueError("aligned_window cannot be negative")
        if self.host_interval <= 0:
            raise ValueError("host_interval must be more than 0s")
