"""Inputs and known answers of the GEMM canaries.

Exact GEMMs: integer-valued operands small enough that every product and
every partial sum is exactly representable (see formats.py), so the answer
is the same on every GPU, in every summation order, under every library
version. To exercise more than the low bits of small integers:
- magnitudes are drawn with a random bit length up to the format's bound,
  so full significands appear alongside small values;
- every element has a random sign (the sign paths);
- every row of A and column of B is scaled by a random power of two (the
  exponent paths), which scales each output by 2^(row + column) exactly.
No operand is zero: a sum of products that are all -0 is -0 on one
implementation and +0 on another, which no known answer could pin down.

The bound holds by construction: |b| <= 2^bits_b and the absolute row sums
of A are at most 2^(acc - bits_b), so sum_k |a_ik * b_kj| <= 2^acc.

The reference is computed in float64 on the CPU, then scaled: every
partial sum is an integer of at most 53 bits by the bound, so float64 BLAS
computes it exactly, in any order, in milliseconds.

Full-mantissa GEMM: random operands using every significand bit; its result
depends on the summation order (the library's algorithm), so it is judged by
comparison across GPUs of one model and driver, not against a known answer.
Its operands are random bit patterns (sign, an exponent in [-8, -1], every
mantissa bit) made by counter from a key (hashing.py): the GPU makes them
itself, the host the same ones for the CPU backend and the fp64 bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.formats import NumberFormat
from gpuwatchd.canary.hashing import host_operand

_FORMAT_CODES = {"fp16": 1, "bf16": 2, "tf32": 3, "fp32": 4, "fp64": 5, "fp8_e4m3": 6}


@dataclass(frozen=True, eq=False)
class ExactGemm:
    """Integer parts, signs included, and the power-of-two scales."""

    a_int: NDArray[np.int64]  # (m, k)
    b_int: NDArray[np.int64]  # (k, n)
    row_scale: NDArray[np.int64]  # (m,) exponents applied to the rows of A
    col_scale: NDArray[np.int64]  # (n,) exponents applied to the columns of B

    @property
    def a(self) -> NDArray[np.float64]:
        return np.ldexp(self.a_int.astype(np.float64), self.row_scale[:, None])

    @property
    def b(self) -> NDArray[np.float64]:
        return np.ldexp(self.b_int.astype(np.float64), self.col_scale[None, :])


def bit_budgets(fmt: NumberFormat) -> tuple[int, int, int]:
    """(bits of each |a|, bits of each |b|, bits of each absolute row sum of A)."""
    b_bits = min(fmt.significand_bits, fmt.accumulator_bits // 2)
    row_bits = fmt.accumulator_bits - b_bits
    return min(fmt.significand_bits, row_bits), b_bits, row_bits


def _rng(
    kind: int, fmt: NumberFormat, shape: tuple[int, int, int], seed: int
) -> np.random.Generator:
    return np.random.default_rng([kind, _FORMAT_CODES[fmt.name], *shape, seed])


def _magnitudes(rng: np.random.Generator, shape: tuple[int, int], bits: int) -> NDArray[np.int64]:
    """Integers in [1, 2^bits], each with a random bit length."""
    lengths = rng.integers(0, bits + 1, size=shape)
    return rng.integers(1, np.left_shift(1, lengths), size=shape, endpoint=True)


def _fit_rows(magnitudes: NDArray[np.int64], row_bits: int) -> NDArray[np.int64]:
    """Shift each row right just enough that its sum is at most 2^row_bits
    (a shifted value never drops below 1, so no zero appears)."""
    budget = 1 << row_bits
    fitted = magnitudes.copy()
    for shift in range(1, 64):
        over = fitted.sum(axis=1) > budget
        if not over.any():
            return fitted
        fitted[over] = np.maximum(magnitudes[over] >> shift, 1)
    raise ValueError(f"rows of {magnitudes.shape[1]} elements cannot sum to 2^{row_bits}")


def exact_gemm(fmt: NumberFormat, shape: tuple[int, int, int], seed: int) -> ExactGemm:
    m, k, n = shape
    if k > 1 << (bit_budgets(fmt)[2] - 1):
        raise ValueError(f"k={k} is too long for an exact {fmt.name} GEMM")
    rng = _rng(1, fmt, shape, seed)
    a_bits, b_bits, row_bits = bit_budgets(fmt)
    a_mag = _fit_rows(_magnitudes(rng, (m, k), a_bits), row_bits)
    b_mag = _magnitudes(rng, (k, n), b_bits)
    a_sign = rng.choice(np.array([-1, 1], dtype=np.int64), size=(m, k))
    b_sign = rng.choice(np.array([-1, 1], dtype=np.int64), size=(k, n))
    return ExactGemm(
        a_int=a_sign * a_mag,
        b_int=b_sign * b_mag,
        row_scale=rng.integers(fmt.min_scale, fmt.max_scale, size=m, endpoint=True),
        col_scale=rng.integers(fmt.min_scale, fmt.max_scale, size=n, endpoint=True),
    )


def exact_reference(fmt: NumberFormat, gemm: ExactGemm) -> NDArray[np.floating[Any]]:
    """A @ B, computed exactly (float64, within the bound) and scaled, in
    the output format."""
    sums = gemm.a_int.astype(np.float64) @ gemm.b_int.astype(np.float64)
    exponents = gemm.row_scale[:, None] + gemm.col_scale[None, :]
    scaled: NDArray[np.float64] = np.ldexp(sums.astype(np.float64), exponents)
    return scaled.astype(fmt.output_dtype)


def random_gemm(
    fmt: NumberFormat, shape: tuple[int, int, int], seed: int
) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
    """The full-mantissa operands, made on the host: magnitudes in
    [2^-8, 1) that use every significand bit of `fmt`, in float16 (fp16),
    float32 (bf16, tf32, fp32) or float64 (fp64)."""
    a, b = (host_operand(fmt.name, shape, seed, operand) for operand in (0, 1))
    return a, b


def flop_count(shape: tuple[int, ...]) -> int:
    m, k, n = shape
    return 2 * m * k * n
