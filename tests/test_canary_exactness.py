"""The exactness bounds the known-answer canaries rest on are real: values
up to each bound give bit-exact results in every summation order, and just
past the bound they do not."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatchd.canary.chains import FMA_FORMATS, fma_chain, fma_chain_inputs, fma_chain_reference
from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.formats import FORMATS, bf16_bits, quantize, round_mantissa
from gpuwatchd.canary.gemm import bit_budgets, exact_gemm, exact_reference

EMULATED = ("fp16", "bf16", "tf32")
INPUT_FORMATS = ("fp16", "bf16", "tf32", "fp32")
backend = CpuBackend()


def bits_of(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values).tobytes()


@given(name=st.sampled_from(INPUT_FORMATS), data=st.data())
def test_integers_up_to_two_to_the_p_are_exact_in_every_scale(
    name: str, data: st.DataObject
) -> None:
    fmt = FORMATS[name]
    n = data.draw(st.integers(-(2**fmt.significand_bits), 2**fmt.significand_bits))
    scale = data.draw(st.integers(fmt.min_scale, fmt.max_scale))
    value = np.array([math.ldexp(n, scale)])
    assert quantize(fmt, value).astype(np.float64)[0] == value[0]


@given(name=st.sampled_from(INPUT_FORMATS), data=st.data())
def test_odd_integers_just_past_two_to_the_p_are_not(name: str, data: st.DataObject) -> None:
    p = FORMATS[name].significand_bits
    n = data.draw(st.integers(2**p // 2, 2**p - 1)) * 2 + 1  # odd, in (2^p, 2^(p+1))
    sign = data.draw(st.sampled_from([-1, 1]))
    value = np.array([float(sign * n)])
    assert quantize(FORMATS[name], value).astype(np.float64)[0] != value[0]


def _reference_round(x: float, keep_bits: int, nearest: bool) -> float:
    """Rounding to `keep_bits` significant bits by exact arithmetic."""
    mantissa, exponent = math.frexp(x)
    scaled = mantissa * 2**keep_bits  # exact: a float32 has 24 significant bits
    rounded = round(scaled) if nearest else math.trunc(scaled)  # round(): ties to even
    return math.ldexp(rounded, exponent - keep_bits)


float32_values = (
    st.integers(0, 2**32 - 1)
    .map(lambda bits: struct.unpack("<f", struct.pack("<I", bits))[0])
    .filter(lambda x: math.isfinite(x) and (x == 0 or 2**-100 < abs(x) < 2**100))
)


@given(x=float32_values, rounding=st.sampled_from(["nearest", "truncate"]))
def test_bf16_and_tf32_emulation_round_like_exact_arithmetic(x: float, rounding: str) -> None:
    for name in ("bf16", "tf32"):
        keep = FORMATS[name].significand_bits
        got = round_mantissa(np.array([x], dtype=np.float32), keep - 1, rounding)[0]  # type: ignore[arg-type]
        assert float(got) == _reference_round(x, keep, rounding == "nearest")


@given(x=float32_values)
def test_bf16_words_are_the_top_half_of_the_rounded_float32(x: float) -> None:
    rounded = round_mantissa(np.array([x], dtype=np.float32), 7, "nearest")
    assert (
        int(bf16_bits(np.array([x], dtype=np.float32))[0]) == int(rounded.view(np.uint32)[0]) >> 16
    )
    assert int(rounded.view(np.uint32)[0]) & 0xFFFF == 0


shapes = st.tuples(st.integers(1, 24), st.integers(1, 48), st.integers(1, 24))


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(FORMATS)), shape=shapes, seed=st.integers(0, 2**32))
def test_generated_gemms_stay_within_the_bounds_and_are_bit_exact(
    name: str, shape: tuple[int, int, int], seed: int
) -> None:
    fmt = FORMATS[name]
    gemm = exact_gemm(fmt, shape, seed)
    a_bits, b_bits, _ = bit_budgets(fmt)
    assert np.abs(gemm.a_int).max() <= 2**a_bits and np.abs(gemm.b_int).max() <= 2**b_bits
    assert (np.abs(gemm.a_int) @ np.abs(gemm.b_int)).max() <= 2**fmt.accumulator_bits
    assert np.all(gemm.a_int != 0) and np.all(gemm.b_int != 0)
    assert np.array_equal(quantize(fmt, gemm.a).astype(np.float64), gemm.a)
    assert np.array_equal(quantize(fmt, gemm.b).astype(np.float64), gemm.b)
    output = backend.gemm(fmt, gemm.a, gemm.b).output.fetch()
    assert bits_of(output) == bits_of(exact_reference(fmt, gemm))


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(EMULATED), shape=shapes, seed=st.integers(0, 2**32), data=st.data())
def test_one_operand_just_past_the_input_bound_breaks_the_gemm(
    name: str, shape: tuple[int, int, int], seed: int, data: st.DataObject
) -> None:
    fmt = FORMATS[name]
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 5, size=(m, k)) * rng.choice([-1, 1], size=(m, k))
    b = rng.integers(1, 5, size=(k, n)) * rng.choice([-1, 1], size=(k, n))
    i, kk, j = (data.draw(st.integers(0, d - 1)) for d in shape)
    p = fmt.significand_bits
    a[i, kk] = data.draw(st.sampled_from([-1, 1])) * (
        2 * data.draw(st.integers(2**p // 2, 2**p - 1)) + 1
    )
    b[kk, j] = 1
    exact = a @ b  # every |sum| stays far below 2^24: only the input rounding can differ
    output = backend.gemm(fmt, a.astype(np.float64), b.astype(np.float64)).output.fetch()
    assert output[i, j] != exact[i, j]


@pytest.mark.parametrize(("accumulator", "dtype"), [(24, np.float32), (53, np.float64)])
@settings(max_examples=200, deadline=None)
@given(k=st.integers(2, 64), seed=st.integers(0, 2**32))
def test_dot_products_are_exact_up_to_the_accumulator_bound_in_any_order(
    accumulator: int, dtype: type, k: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    half = accumulator // 2
    a = rng.integers(1, 2**half, size=k, endpoint=True)
    budget = 2**accumulator // k
    b = np.array([rng.integers(1, max(1, budget // int(x)), endpoint=True) for x in a])
    signs = rng.choice([-1, 1], size=k)
    a = a * signs
    assert int(np.abs(a) @ np.abs(b)) <= 2**accumulator
    exact = int(a @ b)
    for order in (np.arange(k), rng.permutation(k), np.arange(k)[::-1]):
        total = dtype(0)
        for index in order:  # one rounding per step, in this order
            total = dtype(total + dtype(a[index]) * dtype(b[index]))
        assert int(total) == exact
    fmt = FORMATS["fp32" if accumulator == 24 else "fp64"]
    output = backend.gemm(
        fmt, a.astype(np.float64)[None, :], b.astype(np.float64)[:, None]
    ).output.fetch()
    assert int(output[0, 0]) == exact


@pytest.mark.parametrize(("accumulator", "dtype"), [(24, np.float32), (53, np.float64)])
@settings(max_examples=100, deadline=None)
@given(extra=st.integers(1, 40), seed=st.integers(0, 2**32))
def test_dot_products_just_past_the_accumulator_bound_are_not_exact(
    accumulator: int, dtype: type, extra: int, seed: int
) -> None:
    # One product of exactly 2^acc and an odd number of unit products: the
    # true sum is odd and above 2^acc, which no result of that width holds.
    ones = 2 * extra - 1
    half = accumulator // 2
    a = np.array([2**half, *([1] * ones)], dtype=np.int64)
    b = np.array([2 ** (accumulator - half), *([1] * ones)], dtype=np.int64)
    order = np.random.default_rng(seed).permutation(a.size)
    a, b = a[order], b[order]
    exact = int(a @ b)
    assert exact > 2**accumulator and exact % 2 == 1
    fmt = FORMATS["fp32" if accumulator == 24 else "fp64"]
    output = backend.gemm(
        fmt, a.astype(np.float64)[None, :], b.astype(np.float64)[:, None]
    ).output.fetch()
    assert int(output[0, 0]) != exact


@settings(max_examples=50, deadline=None)
@given(
    name=st.sampled_from(sorted(FMA_FORMATS)),
    threads=st.integers(1, 64),
    steps=st.integers(1, 64),
    seed=st.integers(0, 2**32),
)
def test_fma_chains_are_exact_in_floating_point(
    name: str, threads: int, steps: int, seed: int
) -> None:
    inputs = fma_chain_inputs(FMA_FORMATS[name], threads, steps, seed)
    assert bits_of(fma_chain(inputs)) == bits_of(fma_chain_reference(inputs))


def test_fma_chain_intermediates_fit_the_significand() -> None:
    for fmt in FMA_FORMATS.values():
        p = np.finfo(fmt.dtype).nmant + 1
        largest = (2**fmt.modulus_bits - 1) * (2**fmt.multiplier_bits - 1) + 2**fmt.addend_bits - 1
        assert largest < 2**p
