"""Random bits by counter and output digests: the same on the host and on the GPU.

The full-mantissa GEMMs' operands are made where they are used: element i
of an operand is the i-th output of SplitMix64 (Steele, Lea and Flood,
"Fast splittable pseudorandom number generators", OOPSLA 2014; Vigna's
splitmix64.c) started from a key of the canary's format, shape, seed and
operand, so any element is computed from its index alone, in any order, by
any number of threads. The GPU makes a 4096 x 4096 operand in a kernel of
its own (nothing crosses PCIe); the host makes the same bits with NumPy for
the CPU backend and for the fp64 reference of a re-run, which
tests/test_canary_hashing.py holds to the very C text the GPU compiles.

A digest sums, modulo 2^64, a keyed mix of every output word with its index,
in two lanes of different keys (128 bits): a sum needs no order, so
thousands of GPU threads add their parts in whatever order they finish and
the digest is the same bit for bit; and since the mix is a bijection of the
word for a fixed index, a change of any one word always changes both lanes.
The GPU digests its outputs where they are, so only a digest comes back
when an output is right; the host digests a reference the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB
# Keys of the two digest lanes, and the start of every operand key: the
# first words of pi's fraction (as Random123's test vectors use them).
DIGEST_KEYS = (0x243F6A8885A308D3, 0x13198A2E03707344)
OPERAND_TAG = 0xA4093822299F31D0
FORMAT_CODES: Mapping[str, int] = MappingProxyType(
    {"fp16": 1, "bf16": 2, "tf32": 3, "fp32": 4, "fp64": 5}
)
# Rows of an operand made at once on the host (bounds its temporaries).
HOST_ROWS_AT_ONCE = 256


def mix64(z: int) -> int:
    """SplitMix64's output function (a bijection of 64-bit words)."""
    z = ((z ^ (z >> 30)) * MIX_1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_2) & MASK64
    return z ^ (z >> 31)


def _mix64(z: NDArray[np.uint64]) -> NDArray[np.uint64]:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX_1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX_2)
    return z ^ (z >> np.uint64(31))


def stream(key: int, start: int, count: int) -> NDArray[np.uint64]:
    """Outputs start .. start + count - 1 of SplitMix64 started from `key`:
    output i is mix64(key + (i + 1) * GOLDEN)."""
    index = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix64(np.uint64(key) + index * np.uint64(GOLDEN))


def operand_key(fmt: str, shape: tuple[int, ...], seed: int, operand: int) -> int:
    """The key of operand 0 (A) or 1 (B) of a full-mantissa GEMM."""
    key = OPERAND_TAG
    for word in (FORMAT_CODES[fmt], operand, *shape, seed):
        key = mix64(((key ^ (word & MASK64)) + GOLDEN) & MASK64)
    return key


# Bit layouts of an operand element from its 64 random bits: a random sign,
# an exponent that puts the magnitude in [2^-8, 1), every mantissa bit of
# the format random (tf32: fp32 words with the 13 bits tf32 drops cleared).
# (storage dtype, sign bit, mantissa bits, exponent shift, lowest biased exponent)
_LAYOUTS: Mapping[str, tuple[type[np.unsignedinteger[Any]], int, int, int]] = MappingProxyType(
    {
        "fp16": (np.uint16, 15, 10, 15 - 8),
        "bf16": (np.uint16, 15, 7, 127 - 8),
        "tf32": (np.uint32, 31, 23, 127 - 8),
        "fp32": (np.uint32, 31, 23, 127 - 8),
        "fp64": (np.uint64, 63, 52, 1023 - 8),
    }
)
TF32_DROPPED = (1 << 13) - 1


def operand_bits(fmt: str, bits: NDArray[np.uint64]) -> NDArray[np.unsignedinteger[Any]]:
    """Elements in `fmt`'s storage (fp16, bf16: 16-bit words; tf32, fp32:
    32-bit; fp64: 64-bit) from their random bits."""
    dtype, sign_bit, mantissa_bits, lowest = _LAYOUTS[fmt]
    word = bits if dtype is np.uint64 else bits & np.uint64(0xFFFFFFFF)
    sign = (word >> np.uint64(31 if dtype is not np.uint64 else 63)) & np.uint64(1)
    exponent = (word >> np.uint64(mantissa_bits)) & np.uint64(7)
    mantissa = word & np.uint64((1 << mantissa_bits) - 1)
    if fmt == "tf32":
        mantissa &= np.uint64(~TF32_DROPPED & ((1 << 23) - 1))
    pattern = (
        sign << np.uint64(sign_bit)
        | (exponent + np.uint64(lowest)) << np.uint64(mantissa_bits)
        | mantissa
    )
    stored: NDArray[np.unsignedinteger[Any]] = pattern.astype(dtype)
    return stored


def operand_values(fmt: str, bits: NDArray[np.unsignedinteger[Any]]) -> NDArray[np.floating[Any]]:
    """The values of stored elements: float16, float32 (bf16 and tf32 as
    the float32 values they are) or float64."""
    if fmt == "fp16":
        return bits.view(np.float16)
    if fmt == "bf16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if fmt == "fp64":
        return bits.view(np.float64)
    return bits.view(np.float32)


def host_operand(
    fmt: str, gemm_shape: tuple[int, ...], seed: int, operand: int, rows: slice | None = None
) -> NDArray[np.floating[Any]]:
    """Operand A (0, m x k) or B (1, k x n) of a full-mantissa GEMM, or the
    rows `rows` of it, made on the host as the GPU makes it."""
    m, k, n = gemm_shape
    height, width = (m, k) if operand == 0 else (k, n)
    start, stop, _ = (rows or slice(None)).indices(height)
    if start >= stop:
        raise ValueError(f"no rows {rows} in an operand of {height}")
    key = operand_key(fmt, gemm_shape, seed, operand)
    parts = []
    for first in range(start, stop, HOST_ROWS_AT_ONCE):
        last = min(first + HOST_ROWS_AT_ONCE, stop)
        bits = operand_bits(fmt, stream(key, first * width, (last - first) * width))
        parts.append(operand_values(fmt, bits).reshape(last - first, width))
    return np.concatenate(parts)


def _word_layout(values: NDArray[Any]) -> tuple[NDArray[np.uint64], int]:
    """The output's words widened to 64 bits, and the width of one."""
    flat = np.ascontiguousarray(values).reshape(-1)
    width = flat.dtype.itemsize * 8
    if width not in (32, 64):
        raise ValueError(f"outputs are digested in 32- or 64-bit words, not {flat.dtype}")
    return flat.view(np.dtype(f"<u{width // 8}")).astype(np.uint64), width


def digest_words(values: NDArray[Any], signless_zero: bool = False) -> str:
    """The digest of an output (32- or 64-bit elements), as the GPU's kernel
    computes it. `signless_zero`: a float -0 is digested as +0 (how a tensor
    core signs an exact cancellation is undocumented: one answer)."""
    words, width = _word_layout(values)
    if signless_zero:
        words[words == np.uint64(1 << (width - 1))] = 0
    lanes = []
    with np.errstate(over="ignore"):
        for key in DIGEST_KEYS:
            folded = _mix64(words ^ stream(key, 0, words.size))
            lanes.append(int(folded.sum(dtype=np.uint64)))
    return "".join(f"{lane:016x}" for lane in lanes)


DIGEST_HEX_DIGITS = 32

# The same arithmetic in C, for the GPU (and, with __host__ and __device__
# defined away, for the host compiler that tests/test_canary_hashing.py runs).
FUNCTIONS_SOURCE = f"""
#define GW_GOLDEN 0x{GOLDEN:016X}ull
__host__ __device__ __forceinline__ unsigned long long gw_mix64(unsigned long long z) {{
  z = (z ^ (z >> 30)) * 0x{MIX_1:016X}ull;
  z = (z ^ (z >> 27)) * 0x{MIX_2:016X}ull;
  return z ^ (z >> 31);
}}
// Output i of SplitMix64 started from `key`.
__host__ __device__ __forceinline__ unsigned long long gw_stream(
    unsigned long long key, unsigned long long i) {{
  return gw_mix64(key + (i + 1ull) * GW_GOLDEN);
}}
// sign, exponent (3 random bits over the lowest biased exponent) and mantissa
__host__ __device__ __forceinline__ unsigned long long gw_layout(
    unsigned long long word, int sign_from, int sign_bit, int mantissa_bits,
    unsigned long long lowest, unsigned long long mantissa_mask) {{
  unsigned long long sign = (word >> sign_from) & 1ull;
  unsigned long long exponent = (word >> mantissa_bits) & 7ull;
  return sign << sign_bit | (exponent + lowest) << mantissa_bits | (word & mantissa_mask);
}}
__host__ __device__ __forceinline__ unsigned short gw_fp16_bits(unsigned long long r) {{
  return (unsigned short)gw_layout(r & 0xFFFFFFFFull, 31, 15, 10, 7ull, 0x3FFull);
}}
__host__ __device__ __forceinline__ unsigned short gw_bf16_bits(unsigned long long r) {{
  return (unsigned short)gw_layout(r & 0xFFFFFFFFull, 31, 15, 7, 119ull, 0x7Full);
}}
__host__ __device__ __forceinline__ unsigned int gw_fp32_bits(unsigned long long r) {{
  return (unsigned int)gw_layout(r & 0xFFFFFFFFull, 31, 31, 23, 119ull, 0x7FFFFFull);
}}
__host__ __device__ __forceinline__ unsigned int gw_tf32_bits(unsigned long long r) {{
  return (unsigned int)gw_layout(r & 0xFFFFFFFFull, 31, 31, 23, 119ull, 0x7FE000ull);
}}
__host__ __device__ __forceinline__ unsigned long long gw_fp64_bits(unsigned long long r) {{
  return gw_layout(r, 63, 63, 52, 1015ull, 0xFFFFFFFFFFFFFull);
}}
// One word's part of a digest lane.
__host__ __device__ __forceinline__ unsigned long long gw_fold(
    unsigned long long word, unsigned long long key, unsigned long long i) {{
  return gw_mix64(word ^ gw_stream(key, i));
}}
"""

# Storage type of each format's operand kernel.
OPERAND_C_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "fp16": "unsigned short",
        "bf16": "unsigned short",
        "tf32": "unsigned int",
        "fp32": "unsigned int",
        "fp64": "unsigned long long",
    }
)
# Threads per block of these kernels, and the most blocks a launch takes
# (each thread strides over the rest).
BLOCK = 256
MAX_BLOCKS = 2048


def _operand_kernel(fmt: str) -> str:
    c_type = OPERAND_C_TYPES[fmt]
    return f"""
extern "C" __global__ void operand_{fmt}(unsigned long long key, int n, {c_type}* out) {{
  long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
    out[i] = gw_{fmt}_bits(gw_stream(key, (unsigned long long)i));
  }}
}}
"""


def _digest_kernel(width: int) -> str:
    c_type = "unsigned int" if width == 32 else "unsigned long long"
    return f"""
extern "C" __global__ void digest{width}(
    const {c_type}* words, int n, int signless_zero, unsigned long long* lanes) {{
  unsigned long long first = 0, second = 0;
  long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
    unsigned long long word = words[i];
    if (signless_zero && word == (1ull << {width - 1})) word = 0;
    first += gw_fold(word, 0x{DIGEST_KEYS[0]:016X}ull, (unsigned long long)i);
    second += gw_fold(word, 0x{DIGEST_KEYS[1]:016X}ull, (unsigned long long)i);
  }}
  // A sum modulo 2^64 needs no order: the warp's, then one atomic a warp.
  for (int offset = 16; offset > 0; offset >>= 1) {{
    first += __shfl_down_sync(0xFFFFFFFFu, first, offset);
    second += __shfl_down_sync(0xFFFFFFFFu, second, offset);
  }}
  if ((threadIdx.x & 31) == 0) {{
    atomicAdd(lanes, first);
    atomicAdd(lanes + 1, second);
  }}
}}
"""


CUDA_SOURCE = (
    FUNCTIONS_SOURCE
    + "".join(_operand_kernel(fmt) for fmt in FORMAT_CODES)
    + _digest_kernel(32)
    + _digest_kernel(64)
)


def blocks_for(count: int) -> int:
    return max(1, min(MAX_BLOCKS, -(-count // BLOCK)))
