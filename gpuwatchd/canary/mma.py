"""The tensor cores' integer and FP8 datapaths: exact GEMM tiles through
`mma.sync`, against a known answer.

cuBLAS's GEMMs (gemm.py) cover the fp16, bf16, tf32 and fp64 tensor cores,
but cublasGemmEx takes no FP8 operand and chooses for itself whether an
INT8 product runs on the tensor cores at all. These canaries issue the
instruction themselves: every warp computes one 16 x 8 tile of A @ B with
one `mma.sync.aligned.m16n8k32.row.col` (PTX ISA 9.7.14.5, "Matrix
Fragments for mma.m16n8k32"), D = A * B + C with a nonzero C, so the
accumulator input is exercised with data too:
- int8: `.s32.s8.s8.s32` (sm_80 and later). Operands are any int8 (every
  bit, both signs); a dot product of 32 of them is within 2^19, C any
  integer within 2^24: every D is an exact int32.
- fp8_e4m3: `.f32.e4m3.e4m3.f32` (sm_89 and later; PTX ISA 8.4, CUDA 12.4).
  Operands are integers of at most 4 significant bits (e4m3's whole
  significand) scaled by powers of two per row and column, like the exact
  GEMMs. The FP8 tensor cores' accumulator is narrower than fp32: about 14
  bits are kept (DeepSeek-V3 technical report, section 3.3.2, measured on
  H800). Every dot product is held to 2^10 and C to 2^10 in units of the
  output's scale, so every partial sum, C included, is an integer of at
  most 12 bits (`E4M3_SUM_BITS`: within 2^11) and exact in any order.

The host does all the layout work: it packs each warp's A and B fragments
lane by lane in the register order the PTX ISA gives, and unpacks the
accumulator fragments, so the kernel only loads four and two 32-bit words,
issues the instruction and stores four. Each output word is one element of
the product, laid out (warp, lane, register); each thread records its
`%smid` at start and end, so a mismatch names its SM and lane and the share
of SMs that ran is known, as for the chains.

The fake CuPy (tests/fake_cupy) emulates the instruction from its own
transcription of the PTX ISA's fragment tables, so the host's packing is
checked against a second reading of the specification; only a real GPU
checks both against the hardware (scripts/sdc-gpu-check.py). Were the two
readings wrong alike, every GPU would compute the same wrong tile: the
canary's mismatch reproduces on the sibling and is a software fault
(confirm.py), never a GPU's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.chains import SMID_SOURCE
from gpuwatchd.canary.formats import NumberFormat
from gpuwatchd.canary.gemm import ExactGemm, exact_gemm
from gpuwatchd.canary.spec import MMA_CAPABILITIES

TILE_M, TILE_N, TILE_K = 16, 8, 32
LANES = 32
A_BYTES, B_BYTES, C_WORDS = 16, 8, 4  # per lane: 4 and 2 registers of 4 bytes, 4 accumulators
WORDS_PER_THREAD = C_WORDS
# e4m3 (OCP 8-bit floating point, v1.0): 4 exponent bits of bias 7, 3
# mantissa bits; 0x7F and 0xFF are NaN, so the largest is 448.
E4M3_BIAS = 7
E4M3_MANTISSA_BITS = 3
E4M3_SUM_BITS = 11
# Significand of 4 bits, dot products within 2^10 (C takes the other half of
# 2^11), scales that keep every operand a normal e4m3 (at least 2^-6) at
# most 2^4 * 16 = 256 < 448.
E4M3_EXACT = NumberFormat("fp8_e4m3", 4, E4M3_SUM_BITS - 1, -6, 4)
# |C| bounds, in units of the output's scale: int8's products stay within
# 32 * 2^14 = 2^19, so C within 2^24 keeps every int32 sum exact.
INT8_C_BITS = 24
E4M3_C_BITS = E4M3_SUM_BITS - 1


@dataclass(frozen=True)
class MmaFormat:
    name: str
    # The instruction's types, and the output's NumPy type.
    ptx_types: str
    output: type[np.generic]

    @property
    def capability(self) -> tuple[int, int]:
        """The oldest GPU (compute capability) whose tensor cores take it."""
        return MMA_CAPABILITIES[self.name]


MMA_FORMATS: Mapping[str, MmaFormat] = MappingProxyType(
    {
        "int8": MmaFormat("int8", "s32.s8.s8.s32", np.int32),
        "fp8_e4m3": MmaFormat("fp8_e4m3", "f32.e4m3.e4m3.f32", np.float32),
    }
)


@dataclass(frozen=True, eq=False)
class MmaInputs:
    """One canary's operands, packed for the warps: `a` (m/16, 32 lanes, 4
    words) and `b` (n/8, 32 lanes, 2 words) of packed 8-bit elements, `c`
    (threads, 4) each thread's accumulator inputs in the output's type; warp
    w computes output tile (w // tiles_n, w % tiles_n)."""

    fmt: MmaFormat
    a: NDArray[np.uint32]
    b: NDArray[np.uint32]
    c: NDArray[Any]

    @property
    def tiles_n(self) -> int:
        return int(self.b.shape[0])

    @property
    def warps(self) -> int:
        return int(self.a.shape[0]) * self.tiles_n

    @property
    def threads(self) -> int:
        return self.warps * LANES


# --- fragment layouts: PTX ISA 9.7.14.5, mma.m16n8k32 with 8-bit types --------------
# groupID = laneid >> 2, threadID_in_group = laneid % 4.


def _lanes() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    lane = np.arange(LANES)
    return lane >> 2, lane & 3


def a_positions() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(row, col) in the 16 x 32 tile of A of element a_i of each lane:
    (32, 16) each. row = groupID for a0..a3 and a8..a11, groupID + 8
    otherwise; col = threadID_in_group * 4 + (i & 3), + 16 for i >= 8."""
    group, thread = _lanes()
    i = np.arange(A_BYTES)
    rows = group[:, None] + 8 * ((i[None, :] >> 2) & 1)
    cols = thread[:, None] * 4 + (i[None, :] & 3) + 16 * (i[None, :] >> 3)
    return rows, cols


def b_positions() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(row, col) in the 32 x 8 tile of B of element b_i of each lane:
    row = threadID_in_group * 4 + (i & 3), + 16 for i >= 4; col = groupID."""
    group, thread = _lanes()
    i = np.arange(B_BYTES)
    rows = thread[:, None] * 4 + (i[None, :] & 3) + 16 * (i[None, :] >> 2)
    cols = np.broadcast_to(group[:, None], rows.shape)
    return rows, cols


def c_positions() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(row, col) in the 16 x 8 tile of C/D of accumulator c_i of each lane:
    row = groupID for c0 and c1, groupID + 8 for c2 and c3; col =
    threadID_in_group * 2 + (i & 1)."""
    group, thread = _lanes()
    i = np.arange(C_WORDS)
    rows = group[:, None] + 8 * (i[None, :] >> 1)
    cols = thread[:, None] * 2 + (i[None, :] & 1)
    return rows, cols


def pack_a(a: NDArray[np.uint8]) -> NDArray[np.uint32]:
    """(m, 32) bytes -> (m/16, 32, 4) words, a lane's elements low byte first."""
    rows, cols = a_positions()
    tiles = a.reshape(-1, TILE_M, TILE_K)
    return np.ascontiguousarray(tiles[:, rows, cols]).view(np.uint32)


def pack_b(b: NDArray[np.uint8]) -> NDArray[np.uint32]:
    """(32, n) bytes -> (n/8, 32, 2) words."""
    rows, cols = b_positions()
    tiles = b.reshape(TILE_K, -1, TILE_N).transpose(1, 0, 2)
    return np.ascontiguousarray(tiles[:, rows, cols]).view(np.uint32)


def unpack_a(words: NDArray[np.uint32]) -> NDArray[np.uint8]:
    rows, cols = a_positions()
    tiles = np.empty((words.shape[0], TILE_M, TILE_K), dtype=np.uint8)
    tiles[:, rows, cols] = np.ascontiguousarray(words).view(np.uint8)
    return tiles.reshape(-1, TILE_K)


def unpack_b(words: NDArray[np.uint32]) -> NDArray[np.uint8]:
    rows, cols = b_positions()
    tiles = np.empty((words.shape[0], TILE_K, TILE_N), dtype=np.uint8)
    tiles[:, rows, cols] = np.ascontiguousarray(words).view(np.uint8)
    return tiles.transpose(1, 0, 2).reshape(TILE_K, -1)


def pack_c(c: NDArray[Any]) -> NDArray[Any]:
    """(m, n) -> (m/16 * n/8 * 32, 4): each thread's accumulators, warps in
    row-major tile order."""
    m, n = c.shape
    rows, cols = c_positions()
    tiles = c.reshape(m // TILE_M, TILE_M, n // TILE_N, TILE_N).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(tiles[:, :, rows, cols]).reshape(-1, C_WORDS)


def unpack_c(values: NDArray[Any], m: int, n: int) -> NDArray[Any]:
    """(m/16 * n/8 * 32, 4) accumulators -> the (m, n) matrix: pack_c's inverse."""
    rows, cols = c_positions()
    tiles = np.empty((m // TILE_M, n // TILE_N, TILE_M, TILE_N), dtype=values.dtype)
    tiles[:, :, rows, cols] = values.reshape(m // TILE_M, n // TILE_N, LANES, C_WORDS)
    return tiles.transpose(0, 2, 1, 3).reshape(m, n)


# --- e4m3 ---------------------------------------------------------------------------


def e4m3_bits(values: NDArray[np.float64]) -> NDArray[np.uint8]:
    """The e4m3 encodings of normal e4m3 values; ValueError for any other."""
    magnitude = np.abs(values)
    mantissa, exponent = np.frexp(magnitude)  # magnitude = mantissa * 2^exponent, [0.5, 1)
    biased = exponent - 1 + E4M3_BIAS
    fraction = mantissa * 2 ** (E4M3_MANTISSA_BITS + 1) - 2**E4M3_MANTISSA_BITS
    if (
        not np.all(np.isfinite(values))
        or np.any(magnitude == 0)
        or np.any((biased < 1) | (biased > 15))
        or np.any(fraction != np.round(fraction))
        or np.any((biased == 15) & (fraction == 7))
    ):
        raise ValueError("a value is not a normal e4m3 number")
    sign = (values < 0).astype(np.uint8) << 7
    bits: NDArray[np.uint8] = (
        sign | (biased.astype(np.uint8) << E4M3_MANTISSA_BITS) | fraction.astype(np.uint8)
    )
    return bits


def e4m3_values(bits: NDArray[np.uint8]) -> NDArray[np.float64]:
    """The values of e4m3 encodings (subnormals included, NaN as NaN)."""
    biased = (bits >> E4M3_MANTISSA_BITS) & 0xF
    fraction = (bits & 0x7).astype(np.float64)
    normal = np.ldexp(1 + fraction / 8, biased.astype(np.int64) - E4M3_BIAS)
    subnormal = np.ldexp(fraction / 8, 1 - E4M3_BIAS)
    value = np.where(biased == 0, subnormal, normal)
    value = np.where((bits & 0x7F) == 0x7F, np.nan, value)
    return np.where(bits & 0x80, -value, value)


# --- inputs and known answers ---------------------------------------------------------


@dataclass(frozen=True, eq=False)
class MmaCase:
    """A canary's operands as values, and their packing for the device."""

    inputs: MmaInputs
    a: NDArray[Any]  # (m, 32) exact values: int64 or float64
    b: NDArray[Any]  # (32, n)
    c: NDArray[Any]  # (m, n) the accumulator input


def _check_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    m, k, n = shape
    if k != TILE_K or m % TILE_M or n % TILE_N:
        raise ValueError(f"an mma canary is (16i, 32, 8j), not {shape}")
    return m, k, n


def _accumulator(
    rng: np.random.Generator, shape: tuple[int, int], bits: int, unit: NDArray[np.float64] | None
) -> NDArray[np.float64]:
    """C: integers within 2^bits, random signs, in units of `unit` (the
    output's power-of-two scale; 1 when None)."""
    c = rng.integers(-(1 << bits), 1 << bits, size=shape, endpoint=True).astype(np.float64)
    return c if unit is None else c * unit


def mma_case(name: str, shape: tuple[int, ...], seed: int) -> MmaCase:
    fmt = MMA_FORMATS[name]
    m, k, n = _check_shape(shape)
    a: NDArray[Any]
    b: NDArray[Any]
    rng = np.random.default_rng([9, m, n, seed])
    if name == "int8":
        a = rng.integers(-128, 128, size=(m, k), dtype=np.int64)
        b = rng.integers(-128, 128, size=(k, n), dtype=np.int64)
        a_bytes, b_bytes = a.astype(np.int8).view(np.uint8), b.astype(np.int8).view(np.uint8)
        c = _accumulator(rng, (m, n), INT8_C_BITS, None)
    else:
        exact: ExactGemm = exact_gemm(E4M3_EXACT, (m, k, n), seed)
        a, b = exact.a, exact.b
        a_bytes, b_bytes = e4m3_bits(a), e4m3_bits(b)
        unit = np.ldexp(1.0, exact.row_scale[:, None] + exact.col_scale[None, :])
        c = _accumulator(rng, (m, n), E4M3_C_BITS, unit)
    packed_c = pack_c(c.astype(fmt.output))
    return MmaCase(MmaInputs(fmt, pack_a(a_bytes), pack_b(b_bytes), packed_c), a, b, c)


def mma_reference(case: MmaCase) -> NDArray[Any]:
    """The exact D = A * B + C, each thread's four accumulators: (threads,
    4). float64 is exact for both: int8 sums stay within 2^25, fp8 within
    E4M3_SUM_BITS."""
    product = case.a.astype(np.float64) @ case.b.astype(np.float64) + case.c
    return pack_c(product.astype(case.inputs.fmt.output))


def mma(inputs: MmaInputs) -> NDArray[Any]:
    """What the tensor cores compute from packed operands, on the host: the
    CPU backend's kernel."""
    a_bytes, b_bytes = unpack_a(inputs.a), unpack_b(inputs.b)
    if inputs.fmt.name == "int8":
        a = a_bytes.view(np.int8).astype(np.float64)
        b = b_bytes.view(np.int8).astype(np.float64)
    else:
        a, b = e4m3_values(a_bytes), e4m3_values(b_bytes)
    accumulators = pack_c(a @ b) + inputs.c.astype(np.float64)
    return accumulators.astype(inputs.fmt.output)


# One module per format: a toolkit whose PTX has no FP8 `mma` (before CUDA
# 12.4) fails that canary's compile alone. A launch on a GPU older than the
# instruction traps (an error, never a wrong answer); the suite plans the
# canary only where the compute capability has it.
_KERNEL = """
extern "C" __global__ void mma_{name}(
    const unsigned int* a, const unsigned int* b, const {out_type}* c, int tiles_n,
    int warps, {out_type}* out, unsigned int* sm_start, unsigned int* sm_end) {{
  int thread = blockIdx.x * blockDim.x + threadIdx.x;
  int warp = thread >> 5;
  // Whole warps leave together: mma.sync needs every lane of its warp.
  if (warp >= warps) return;
  sm_start[thread] = smid();
  {out_type} d0, d1, d2, d3;
  const {out_type}* fc = c + thread * 4;
#if __CUDA_ARCH__ >= {arch}
  int lane = thread & 31;
  const unsigned int* fa = a + ((warp / tiles_n) * 32 + lane) * 4;
  const unsigned int* fb = b + ((warp % tiles_n) * 32 + lane) * 2;
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.{ptx_types} "
      "{{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%10, %11, %12, %13}};"
      : "={reg}"(d0), "={reg}"(d1), "={reg}"(d2), "={reg}"(d3)
      : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]),
        "{reg}"(fc[0]), "{reg}"(fc[1]), "{reg}"(fc[2]), "{reg}"(fc[3]));
#else
  asm volatile("trap;");
  d0 = fc[0]; d1 = fc[1]; d2 = fc[2]; d3 = fc[3];
#endif
  out[thread * 4] = d0;
  out[thread * 4 + 1] = d1;
  out[thread * 4 + 2] = d2;
  out[thread * 4 + 3] = d3;
  sm_end[thread] = smid();
}}
"""


def tile_source(
    name: str, ptx_types: str, output: type[np.generic], capability: tuple[int, int]
) -> str:
    """The tile kernel `mma_<name>` for an m16n8k32 form with 8-bit operands
    (the canaries' formats, or another the device check probes)."""
    major, minor = capability
    integer = output == np.int32
    return SMID_SOURCE + _KERNEL.format(
        name=name,
        out_type="int" if integer else "float",
        reg="r" if integer else "f",
        arch=major * 100 + minor * 10,
        ptx_types=ptx_types,
    )


def cuda_source(name: str) -> str:
    fmt = MMA_FORMATS[name]
    return tile_source(name, fmt.ptx_types, fmt.output, fmt.capability)
