"""The conversion canary: the GPU's F2F and F2I conversions, whose results
IEEE 754 and the PTX ISA define to the bit, against a known answer.

Each thread converts one fp32 value to fp16 (`cvt.rn.f16.f32`), to bf16
(`cvt.rn.bf16.f32`) and to a 32-bit integer rounded to nearest even
(`cvt.rni.s32.f32`), and one fp64 value to fp32 (`cvt.rn.f32.f64`): four
32-bit words per thread, every one exactly determined by its input and
round-to-nearest-even. The fp32 inputs carry 24 significant bits and reach
down into fp16's subnormal range; the fp64 inputs carry 53. Unlike the
transcendentals of the special-function units, whose results are only
bounded, a conversion has one right answer, so any flipped bit is a
mismatch, never a judgement call.

`convert` is the CPU backend's kernel (NumPy's conversions); the reference
takes another path to the same bits (CPython's own IEEE half and single
packing, and round() for ties to even), so the two check each other.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.chains import SMID_SOURCE
from gpuwatchd.canary.formats import bf16_bits

WORDS_PER_THREAD = 4
# fp32 inputs: sign, 24 significant bits, binary exponents from -20 (fp16
# subnormals start below 2^-14) to 14 (below fp16's 65504 and far inside
# int32).
SINGLE_EXPONENTS = (-20, 14)
# fp64 inputs: 53 significant bits, exponents well inside fp32's normal range.
DOUBLE_EXPONENTS = (-100, 100)
BF16_KEPT_BITS = 8  # significant bits of bf16, the implicit one included
# Exact halfway cases lead the inputs, so rounding ties to even is checked
# on every run: for fp16 (11 bits kept), bf16 (8), the integer, and fp32 (24).
SINGLE_TIES = (1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, -(1 + 3 * 2**-8), 0.5, 1.5, 2.5, -2.5)
DOUBLE_TIES = (1 + 2**-24, 1 + 3 * 2**-24, -(1 + 2**-24), 2**-100 * (1 + 3 * 2**-24))


@dataclass(frozen=True, eq=False)
class ConvertInputs:
    single: NDArray[np.float32]  # (threads,)
    double: NDArray[np.float64]  # (threads,)


def _random_floats(
    rng: np.random.Generator, threads: int, bits: int, exponents: tuple[int, int]
) -> NDArray[np.float64]:
    significand = rng.integers(1 << (bits - 1), 1 << bits, size=threads, dtype=np.int64)
    exponent = rng.integers(exponents[0], exponents[1] + 1, size=threads)
    sign = rng.choice(np.array([-1.0, 1.0]), size=threads)
    return sign * np.ldexp(significand.astype(np.float64), exponent - (bits - 1))


def convert_inputs(threads: int, seed: int) -> ConvertInputs:
    rng = np.random.default_rng([7, threads, seed])
    single = _random_floats(rng, threads, 24, SINGLE_EXPONENTS).astype(np.float32)
    double = _random_floats(rng, threads, 53, DOUBLE_EXPONENTS)
    single[: len(SINGLE_TIES)] = SINGLE_TIES[:threads]
    double[: len(DOUBLE_TIES)] = DOUBLE_TIES[:threads]
    return ConvertInputs(single=single, double=double)


def convert(inputs: ConvertInputs) -> NDArray[np.uint32]:
    """The four conversions of every thread, as NumPy computes them:
    (threads, 4) words of fp16 bits, bf16 bits, int32 bits, fp32 bits."""
    single = inputs.single
    return np.stack(
        [
            single.astype(np.float16).view(np.uint16).astype(np.uint32),
            bf16_bits(single).astype(np.uint32),
            np.rint(single).astype(np.int32).view(np.uint32),
            inputs.double.astype(np.float32).view(np.uint32),
        ],
        axis=1,
    )


def _bf16(value: float) -> int:
    """bf16 bits of a finite float, rounded to nearest even, by arithmetic."""
    if value == 0:
        return 0x8000 if math.copysign(1.0, value) < 0 else 0
    mantissa, exponent = math.frexp(abs(value))  # value = m * 2^e, 0.5 <= m < 1
    kept = round(math.ldexp(mantissa, BF16_KEPT_BITS))  # ties to even
    rounded = math.copysign(math.ldexp(kept, exponent - BF16_KEPT_BITS), value)
    return int.from_bytes(struct.pack("<f", rounded), "little") >> 16


def convert_reference(inputs: ConvertInputs) -> NDArray[np.uint32]:
    """The same words by another path: CPython's IEEE half and single packing
    (both round to nearest even) and round() for the integer."""
    rows = []
    for single, double in zip(inputs.single.tolist(), inputs.double.tolist(), strict=True):
        half = int.from_bytes(struct.pack("<e", single), "little")
        integer = round(single) & 0xFFFF_FFFF
        narrowed = int.from_bytes(struct.pack("<f", double), "little")
        rows.append((half, _bf16(single), integer, narrowed))
    return np.array(rows, dtype=np.uint32).reshape(-1, WORDS_PER_THREAD)


# A module of its own: were its inline PTX refused on some GPU, the chains
# would still compile and run.
CUDA_SOURCE = (
    SMID_SOURCE
    + """
extern "C" __global__ void convert(
    const float* single, const double* wide, int threads,
    unsigned int* out, unsigned int* sm_start, unsigned int* sm_end) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) return;
  sm_start[i] = smid();
  float x = single[i];
  unsigned short half, brain;
  int integer;
  float narrowed;
  asm volatile("cvt.rn.f16.f32 %0, %1;" : "=h"(half) : "f"(x));
#if __CUDA_ARCH__ >= 800
  asm volatile("cvt.rn.bf16.f32 %0, %1;" : "=h"(brain) : "f"(x));
#else
  // No bf16 conversion before sm_80: the same rounding in integer arithmetic.
  unsigned int u;
  asm volatile("mov.b32 %0, %1;" : "=r"(u) : "f"(x));
  brain = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
#endif
  asm volatile("cvt.rni.s32.f32 %0, %1;" : "=r"(integer) : "f"(x));
  asm volatile("cvt.rn.f32.f64 %0, %1;" : "=f"(narrowed) : "d"(wide[i]));
  out[4 * i] = half;
  out[4 * i + 1] = brain;
  out[4 * i + 2] = (unsigned int)integer;
  unsigned int narrowed_bits;
  asm volatile("mov.b32 %0, %1;" : "=r"(narrowed_bits) : "f"(narrowed));
  out[4 * i + 3] = narrowed_bits;
  sm_end[i] = smid();
}
"""
)
