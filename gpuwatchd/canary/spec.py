"""What one canary run computes: its kind, number format, shape and seed.

A `CanarySpec` names the inputs completely, so a mismatch can be re-run on
the very same inputs (on the same GPU and on a sibling). The default suites
here are sized so that one burst stays within about a second of device time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal[
    "gemm_exact",
    "gemm_random",
    "gemm_bounded",
    "gemm_burn",
    "int_chain",
    "fma_chain",
    "convert",
    "sfu",
    "mma",
    "hbm_walking_ones",
    "hbm_own_address",
    "hbm_moving_inversions",
]
HBM_KINDS: tuple[Kind, ...] = ("hbm_walking_ones", "hbm_own_address", "hbm_moving_inversions")

# Input formats of the exact GEMMs: the three tensor-core formats and the two
# of the regular FP32/FP64 units.
EXACT_GEMM_DTYPES = ("fp16", "bf16", "tf32", "fp32", "fp64")
# The full-mantissa GEMMs: every format, so every datapath sees operands
# that use all their significand bits (and the rounding the exact GEMMs
# never need).
RANDOM_GEMM_DTYPES = ("fp16", "bf16", "tf32", "fp32", "fp64")
FMA_CHAIN_DTYPES = ("fp32", "fp64")
# The tensor cores' integer and FP8 datapaths, through mma.sync (mma.py),
# where the GPU has them: the oldest compute capability whose PTX has each
# m16n8k32 form (PTX ISA, mma's target notes: .s8 sm_80, .e4m3 sm_89).
MMA_CAPABILITIES = {"int8": (8, 0), "fp8_e4m3": (8, 9)}
MMA_DTYPES = tuple(MMA_CAPABILITIES)


def mma_supported(dtype: str, capability: tuple[int, int] | None) -> bool:
    return capability is not None and capability >= MMA_CAPABILITIES[dtype]


BackendKind = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class CanarySpec:
    """One canary: `shape` is (m, k, n) for a GEMM or an mma tile GEMM,
    (m, k, n, repeats) for a burn, (threads, steps) for a chain, (threads,)
    for the conversions and the transcendentals, and (words,) for an HBM
    pattern test."""

    kind: Kind
    dtype: str
    shape: tuple[int, ...]
    seed: int

    @property
    def name(self) -> str:
        """The canary's name in results and metrics: kind and format, unique per GPU."""
        return f"{self.kind}_{self.dtype}"


@dataclass(frozen=True)
class SuiteSize:
    """How big each canary of a suite is on one backend."""

    gemm_exact: tuple[int, int, int]
    gemm_random: tuple[int, int, int]
    chain_threads: int
    chain_steps: int
    mma: tuple[int, int, int]


# On a GPU: exact GEMMs of a short k and a wide output, 2048 x 2048 = 256
# output tiles of 128 x 128, so every SM of a GPU of up to 256 SMs (an H100
# has 132, a B200 148) runs the tensor cores; k = 16 leaves the operands of
# A most of their significand (a long k forces them down to a few bits to
# keep the sum exact). Their references are cached per seed. 4096^3
# full-mantissa GEMMs for a meaningful TFLOP/s; chains of 64k threads of
# 1024 dependent steps. The mma canaries: 64 x 128 tiles, a warp each, 1024
# blocks of 8 warps.
CUDA_SIZE = SuiteSize(
    gemm_exact=(2048, 16, 2048),
    gemm_random=(4096, 4096, 4096),
    chain_threads=65536,
    chain_steps=1024,
    mma=(1024, 32, 1024),
)
# On the CPU (standing in for a GPU, or checking the host's cores): small
# enough that a whole burst takes a few hundredths of a second.
CPU_SIZE = SuiteSize(
    gemm_exact=(128, 128, 128),
    gemm_random=(192, 192, 192),
    chain_threads=4096,
    chain_steps=256,
    mma=(128, 32, 128),
)
# HBM pattern test slice on the CPU backend (the host's RAM, or the stand-in GPU's).
CPU_HBM_BYTES = 2 * 1024 * 1024


def default_suite(
    backend: BackendKind,
    seed: int,
    random_seed: int,
    hbm_bytes: int,
    capability: tuple[int, int] | None = None,
) -> tuple[CanarySpec, ...]:
    """The whole suite for one GPU. `seed` varies from burst to burst so other
    inputs get exercised over time; `random_seed` stays fixed so that the
    full-mantissa GEMM's result can be compared across GPUs and runs.
    `hbm_bytes` is an upper bound: the worker shrinks it to the free memory.
    `capability` is the GPU's CUDA compute capability: the mma canaries run
    where it has their instruction, none where it is unknown (the CPU, which
    emulates them, runs them all unless it stands in for a GPU whose
    capability it was given). They come last: a toolkit that cannot
    compile one ends the burst with an error after everything else ran."""
    size = CUDA_SIZE if backend == "cuda" else CPU_SIZE
    words = (min(hbm_bytes, CPU_HBM_BYTES) if backend == "cpu" else hbm_bytes) // 8
    chain = (size.chain_threads, size.chain_steps)
    return (
        *(CanarySpec("gemm_exact", dtype, size.gemm_exact, seed) for dtype in EXACT_GEMM_DTYPES),
        CanarySpec("int_chain", "u32", chain, seed),
        *(CanarySpec("fma_chain", dtype, chain, seed) for dtype in FMA_CHAIN_DTYPES),
        CanarySpec("convert", "fp32", (size.chain_threads,), seed),
        CanarySpec("sfu", "fp32", (size.chain_threads,), seed),
        *(
            CanarySpec("gemm_random", dtype, size.gemm_random, random_seed)
            for dtype in RANDOM_GEMM_DTYPES
        ),
        *(CanarySpec(kind, "u64", (words,), seed) for kind in HBM_KINDS),
        *(
            CanarySpec("mma", dtype, size.mma, seed)
            for dtype in MMA_DTYPES
            if mma_supported(dtype, capability) or (backend == "cpu" and capability is None)
        ),
    )


# `gpuwatchd canary --long`: sustained GEMMs at full power, each burst
# `repeats` back-to-back products of one randomized input, per format.
LONG_GEMM = {"cuda": (8192, 8192, 8192, 50), "cpu": (192, 192, 192, 3)}


def long_suite(backend: BackendKind, seed: int) -> tuple[CanarySpec, ...]:
    """One burst of the burn-in tier: every format's full-mantissa GEMM,
    repeated on the device, with inputs of `seed`."""
    return tuple(
        CanarySpec("gemm_burn", dtype, LONG_GEMM[backend], seed) for dtype in RANDOM_GEMM_DTYPES
    )


def host_suite(seed: int) -> tuple[CanarySpec, ...]:
    """What each of the host's CPU cores runs: the chains and the exact GEMMs
    of the regular units, the ones that exercise a core's integer, FMA and
    vector paths."""
    size = CPU_SIZE
    chain = (size.chain_threads, size.chain_steps)
    return (
        CanarySpec("int_chain", "u32", chain, seed),
        *(CanarySpec("fma_chain", dtype, chain, seed) for dtype in FMA_CHAIN_DTYPES),
        *(CanarySpec("gemm_exact", dtype, size.gemm_exact, seed) for dtype in ("fp32", "fp64")),
    )
