"""The number formats of the exact GEMMs, their exactness bounds, and the CPU's
emulation of converting to them.

An integer n is exact in a format with p significand bits (the implicit bit
included) when |n| <= 2^p; so is n * 2^e while n * 2^e stays in the format's
range. A dot product is exact in an accumulator of p_acc bits when the sum of
|products| is at most 2^p_acc: then every partial sum, in any order, is an
integer of at most p_acc bits, and neither summation order nor rounding mode
can change the result.

The CPU backend emulates the tensor-core formats: fp16 through NumPy's IEEE
half, bf16 and tf32 by rounding (or truncating, as tensor cores do with fp32
operands in TF32 mode) the low mantissa bits of float32 bit patterns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

Rounding = Literal["nearest", "truncate"]

FLOAT32_MANTISSA_BITS = 23


@dataclass(frozen=True)
class NumberFormat:
    name: str
    # p: significand bits, the implicit leading bit included.
    significand_bits: int
    # Significand bits of the accumulator: 24 (fp32) or 53 (fp64).
    accumulator_bits: int
    # Power-of-two row and column scales that keep every exact input and
    # output of a GEMM within the format's normal range.
    min_scale: int
    max_scale: int
    # How the CPU emulation gets an operand into the format.
    rounding: Rounding = "nearest"

    @property
    def output_dtype(self) -> type[np.floating[Any]]:
        return np.float64 if self.accumulator_bits == 53 else np.float32


FORMATS: Mapping[str, NumberFormat] = MappingProxyType(
    {
        # fp16 tops out at 65504 = 2^16 - 32: inputs of up to 2^11 scaled by
        # up to 2^4 stay below it; 2^-8 keeps the smallest far from subnormals.
        "fp16": NumberFormat("fp16", 11, 24, -8, 4),
        "bf16": NumberFormat("bf16", 8, 24, -32, 32),
        # Tensor cores read fp32 operands in TF32 mode by dropping the low 13
        # mantissa bits (cuBLAS' CUBLAS_COMPUTE_32F_FAST_TF32).
        "tf32": NumberFormat("tf32", 11, 24, -32, 32, rounding="truncate"),
        "fp32": NumberFormat("fp32", 24, 24, -32, 32),
        "fp64": NumberFormat("fp64", 53, 53, -128, 128),
    }
)


def round_mantissa(
    values: NDArray[np.float32], explicit_bits: int, rounding: Rounding
) -> NDArray[np.float32]:
    """float32 values with only `explicit_bits` mantissa bits kept, rounded to
    nearest (ties to even) or truncated toward zero. Values must be finite."""
    drop = FLOAT32_MANTISSA_BITS - explicit_bits
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    if rounding == "nearest":
        kept_lsb = (bits >> np.uint64(drop)) & np.uint64(1)
        bits = bits + np.uint64((1 << (drop - 1)) - 1) + kept_lsb
    bits &= np.uint64(0xFFFFFFFF ^ ((1 << drop) - 1))
    return bits.astype(np.uint32).view(np.float32)


def quantize(fmt: NumberFormat, values: NDArray[np.floating[Any]]) -> NDArray[np.floating[Any]]:
    """`values` converted to `fmt` as the hardware would see them (the CPU
    emulation), held in the smallest NumPy type that represents the format."""
    if fmt.name == "fp16":
        return values.astype(np.float16)
    if fmt.name == "fp64":
        return values.astype(np.float64)
    single = values.astype(np.float32)
    if fmt.significand_bits == 24:
        return single
    return round_mantissa(single, fmt.significand_bits - 1, fmt.rounding)


def bf16_bits(values: NDArray[np.float32]) -> NDArray[np.uint16]:
    """The bf16 bit patterns of float32 values (rounded to nearest), for
    devices that take bf16 as raw 16-bit words (NumPy has no bf16 type)."""
    rounded = round_mantissa(values, FORMATS["bf16"].significand_bits - 1, "nearest")
    return (rounded.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
