"""The outcome of one canary run, with the evidence a verdict rests on.

A `CanaryResult` is what a burst produces for each canary: where it ran (GPU
index and UUID, or the host's CPU core), what it computed (canary, format,
seed, shape), the outcome, and the evidence of a mismatch: how many elements
differ, the first of them with its expected and actual bits, which bits
flipped (a histogram, LSB first), and for per-thread chains the SMs (CPU
cores) and warp lanes whose threads went wrong. GEMMs add their TFLOP/s; the
GPU's temperature and clocks come from the caller's telemetry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpuwatchd.canary.spec import CanarySpec, Kind

Outcome = Literal["pass", "mismatch", "error", "timeout"]
OUTCOMES: tuple[Outcome, ...] = ("pass", "mismatch", "error", "timeout")


@dataclass(frozen=True)
class Telemetry:
    """The GPU's temperature and clocks while a canary ran; None when unknown."""

    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None


# GPU index -> what the GPU reads now (the daemon serves it from its NVML samples).
TelemetrySource = Callable[[int], Telemetry]


def no_telemetry(gpu: int) -> Telemetry:
    return Telemetry()


@dataclass(frozen=True)
class CanaryResult:
    canary: str  # CanarySpec.name: kind and format, e.g. gemm_exact_fp16
    kind: Kind
    dtype: str
    seed: int
    shape: tuple[int, ...]
    result: Outcome
    duration_seconds: float
    gpu: int | None = None
    uuid: str | None = None
    cpu_core: int | None = None  # set when the host's CPU core was checked
    backend: str = "cpu"
    time: float | None = None  # when the runner received the result (the daemon's clock)
    mismatch_count: int = 0
    first_mismatch_index: int | None = None  # flat index into the output
    first_expected_bits: str | None = None  # hex, as wide as an output element
    first_actual_bits: str | None = None
    bit_histogram: tuple[int, ...] = ()  # mismatching elements with each bit flipped
    mismatch_units: tuple[int, ...] = ()  # SMs (CPU cores) of mismatching threads
    mismatch_lanes: tuple[int, ...] = ()  # warp lanes of mismatching threads
    tflops: float | None = None
    # Chains on a GPU: the share of its SMs on which a thread ran from
    # start to end (a burst beside a job, or a preempted one, covers less).
    sm_coverage_ratio: float | None = None
    # The device's SMs as its backend counts them (CUDA's multiProcessorCount,
    # a simulated GPU's): with the model, which GPUs compute alike
    # (peers.py). None on the host's cores and for a canary that never ran.
    sm_count: int | None = None
    digest: str | None = None  # hashing.digest_words of the output (full-mantissa GEMMs)
    environment: str | None = None  # model, driver and library versions of the digest
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    message: str | None = None  # why it did not pass: the error, the timeout, the digest
    # The device time of the canary's calls, copies included (CUDA events on
    # a GPU, the computations' time on the CPU backend); None for a canary
    # that did not finish.
    device_seconds: float | None = None
    # The most device memory the canary held (CuPy's pool); None where the
    # backend cannot tell.
    device_memory_bytes: int | None = None

    @property
    def target(self) -> str:
        """`gpu:<index>` or `cpu:<core>`: what the canary judged."""
        if self.cpu_core is not None:
            return f"cpu:{self.cpu_core}"
        return f"gpu:{self.gpu}"

    @property
    def spec(self) -> CanarySpec:
        return CanarySpec(self.kind, self.dtype, self.shape, self.seed)

    @property
    def mismatched_bits(self) -> int:
        return sum(self.bit_histogram)


def failed(
    spec: CanarySpec,
    outcome: Outcome,
    message: str,
    *,
    gpu: int | None,
    cpu_core: int | None,
    backend: str,
    uuid: str | None = None,
    duration_seconds: float = 0.0,
) -> CanaryResult:
    """A canary that did not finish: `error` (crash, CUDA error) or `timeout` (hang)."""
    return CanaryResult(
        canary=spec.name,
        kind=spec.kind,
        dtype=spec.dtype,
        seed=spec.seed,
        shape=spec.shape,
        result=outcome,
        duration_seconds=duration_seconds,
        gpu=gpu,
        uuid=uuid,
        cpu_core=cpu_core,
        backend=backend,
        message=message,
    )
