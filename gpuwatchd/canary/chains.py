"""Per-thread dependent chains: integer hashing and exact FMA recurrences.

Each thread runs a long chain in which every step depends on the one before,
so a single wrong operation anywhere corrupts the thread's final value; each
thread also records where it ran (the SM on a GPU, the core on a CPU), so a
mismatch points at an SM and a warp lane. On a GPU a thread reads `%smid`
at its start and at its end: the PTX ISA calls the register volatile ("may
change during execution, e.g. due to rescheduling of threads following
preemption"), so a thread whose two readings differ has no place (-1). The
SMs with a placed thread are the chain's coverage, which the burst reports
against the GPU's SM count: a localisation aid and a coverage figure, never
evidence by itself.

Integer chain (uint32, wrapping): x = x * mul[t] + add[t]; x ^= x >> 15;
x *= 0x2C1B3C6D; x ^= x >> 12 — the multiplier, adder and shifter.

FMA chain: x = (a[t] * x + b[t]) mod 2^s, computed in floating point as
y = fma(x, a, b); q = floor(y * 2^-s); x = fma(q, -2^s, y). With x < 2^s,
a < 2^s_a and |b| < 2^s_b every intermediate is an integer below 2^p (24
bits for fp32, 53 for fp64), so fused and unfused arithmetic agree exactly
and the reference is the same recurrence in int64.

The NumPy functions here are both the CPU backend's kernels and the
references; the CUDA kernels in `CUDA_SOURCE` are generated from the same
constants, one thread per chain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

LANES = 32  # threads of a warp
THREADS_PER_BLOCK = 256

INT_SHIFT_A = 15
INT_MIX = 0x2C1B3C6D
INT_SHIFT_B = 12
_UINT32_MASK = np.uint64(0xFFFFFFFF)


@dataclass(frozen=True)
class FmaFormat:
    name: str
    modulus_bits: int  # s: the state stays in [0, 2^s)
    multiplier_bits: int  # a < 2^s_a
    addend_bits: int  # |b| < 2^s_b
    dtype: type[np.floating[Any]]
    c_type: str
    c_suffix: str  # of the C maths functions: fmaf/floorf for float


FMA_FORMATS: Mapping[str, FmaFormat] = MappingProxyType(
    {
        # 2^12 * 2^11 + 2^23 <= 2^24: fp32 holds every y exactly.
        "fp32": FmaFormat("fp32", 12, 11, 23, np.float32, "float", "f"),
        # 2^26 * 2^26 + 2^52 <= 2^53: fp64 likewise.
        "fp64": FmaFormat("fp64", 26, 26, 52, np.float64, "double", ""),
    }
)


@dataclass(frozen=True, eq=False)
class IntChainInputs:
    start: NDArray[np.uint32]  # (threads,)
    multipliers: NDArray[np.uint32]  # (steps,) odd
    addends: NDArray[np.uint32]  # (steps,)


@dataclass(frozen=True, eq=False)
class FmaChainInputs:
    fmt: FmaFormat
    start: NDArray[np.int64]  # (threads,) in [0, 2^s)
    multipliers: NDArray[np.int64]  # (steps,) odd, in [1, 2^s_a)
    addends: NDArray[np.int64]  # (steps,) in (-2^s_b, 2^s_b)


def int_chain_inputs(threads: int, steps: int, seed: int) -> IntChainInputs:
    rng = np.random.default_rng([3, threads, steps, seed])
    return IntChainInputs(
        start=rng.integers(0, 1 << 32, size=threads, dtype=np.uint32),
        multipliers=rng.integers(0, 1 << 31, size=steps, dtype=np.uint32) * np.uint32(2)
        + np.uint32(1),
        addends=rng.integers(0, 1 << 32, size=steps, dtype=np.uint32),
    )


def fma_chain_inputs(fmt: FmaFormat, threads: int, steps: int, seed: int) -> FmaChainInputs:
    rng = np.random.default_rng([4, fmt.modulus_bits, threads, steps, seed])
    return FmaChainInputs(
        fmt=fmt,
        start=rng.integers(0, 1 << fmt.modulus_bits, size=threads, dtype=np.int64),
        multipliers=rng.integers(0, 1 << (fmt.multiplier_bits - 1), size=steps, dtype=np.int64) * 2
        + 1,
        addends=rng.integers(
            -(1 << fmt.addend_bits) + 1, 1 << fmt.addend_bits, size=steps, dtype=np.int64
        ),
    )


def int_chain(inputs: IntChainInputs) -> NDArray[np.uint32]:
    """The chain in uint32 arithmetic that wraps, as the GPU's does."""
    x = inputs.start.copy()
    for mul, add in zip(inputs.multipliers, inputs.addends, strict=True):
        x = x * mul + add
        x ^= x >> np.uint32(INT_SHIFT_A)
        x *= np.uint32(INT_MIX)
        x ^= x >> np.uint32(INT_SHIFT_B)
    return x


def int_chain_reference(inputs: IntChainInputs) -> NDArray[np.uint32]:
    """The same chain in 64-bit arithmetic reduced mod 2^32 after every
    product and sum: another path to the same answer."""
    x = inputs.start.astype(np.uint64)
    for mul, add in zip(
        inputs.multipliers.astype(np.uint64), inputs.addends.astype(np.uint64), strict=True
    ):
        x = (x * mul + add) & _UINT32_MASK
        x ^= x >> np.uint64(INT_SHIFT_A)
        x = (x * np.uint64(INT_MIX)) & _UINT32_MASK
        x ^= x >> np.uint64(INT_SHIFT_B)
    return x.astype(np.uint32)


def fma_chain(inputs: FmaChainInputs) -> NDArray[np.floating[Any]]:
    """The chain in the format's floating point (NumPy has no fused
    multiply-add; with every intermediate exact, the unfused form is equal)."""
    fmt = inputs.fmt
    modulus = fmt.dtype(1 << fmt.modulus_bits)
    inverse = fmt.dtype(1.0 / (1 << fmt.modulus_bits))
    x = inputs.start.astype(fmt.dtype)
    for a, b in zip(
        inputs.multipliers.astype(fmt.dtype), inputs.addends.astype(fmt.dtype), strict=True
    ):
        y = x * a + b
        x = y - np.floor(y * inverse) * modulus
    return x


def fma_chain_reference(inputs: FmaChainInputs) -> NDArray[np.floating[Any]]:
    """The same recurrence in int64: x = (a * x + b) mod 2^s."""
    modulus = np.int64(1 << inputs.fmt.modulus_bits)
    x = inputs.start.copy()
    for a, b in zip(inputs.multipliers, inputs.addends, strict=True):
        x = np.mod(x * a + b, modulus)
    return x.astype(inputs.fmt.dtype)


def _fma_kernel(fmt: FmaFormat) -> str:
    t, f = fmt.c_type, fmt.c_suffix
    return f"""
extern "C" __global__ void fma_chain_{fmt.name}(
    const {t}* start, const {t}* mul, const {t}* add, int steps, int threads,
    {t}* out, unsigned int* sm_start, unsigned int* sm_end) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) return;
  sm_start[i] = smid();
  const {t} modulus = ({t}){1 << fmt.modulus_bits}.0;
  const {t} inverse = ({t})1.0 / modulus;
  {t} x = start[i];
  for (int s = 0; s < steps; ++s) {{
    {t} y = fma{f}(x, mul[s], add[s]);
    {t} q = floor{f}(y * inverse);
    x = fma{f}(q, -modulus, y);
  }}
  out[i] = x;
  sm_end[i] = smid();
}}
"""


# The SM a thread runs on now (PTX special register %smid).
SMID_SOURCE = """
__device__ __forceinline__ unsigned int smid() {
  unsigned int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
"""

CUDA_SOURCE = (
    SMID_SOURCE
    + """
extern "C" __global__ void int_chain(
    const unsigned int* start, const unsigned int* mul, const unsigned int* add,
    int steps, int threads, unsigned int* out, unsigned int* sm_start, unsigned int* sm_end) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) return;
  sm_start[i] = smid();
  unsigned int x = start[i];
  for (int s = 0; s < steps; ++s) {
    x = x * mul[s] + add[s];
"""
    + f"""    x ^= x >> {INT_SHIFT_A};
    x *= {INT_MIX:#x}u;
    x ^= x >> {INT_SHIFT_B};
"""
    + """  }
  out[i] = x;
  sm_end[i] = smid();
}
"""
    + "".join(_fma_kernel(fmt) for fmt in FMA_FORMATS.values())
)
