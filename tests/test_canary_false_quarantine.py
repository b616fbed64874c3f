"""What must never make a healthy GPU look wrong: a host core that computes a
wrong reference, the sign of an exact zero, a full-mantissa GEMM whose
digest changed with the configuration."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from gpuwatchd.canary.backend import GemmRun
from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.crosscheck import DigestBook, crosscheck
from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.formats import FORMATS, NumberFormat
from gpuwatchd.canary.gemm import exact_gemm, exact_reference, random_gemm
from gpuwatchd.canary.inject import FaultyBackend
from gpuwatchd.canary.runner import BurstRequest
from gpuwatchd.canary.spec import CanarySpec
from gpuwatchd.canary.suite import (
    HostReferenceError,
    ReferenceCache,
    RunContext,
    _known_answer,
    error_bound,
    run_canary,
)
from gpuwatchd.canary.worker import run_in_process
from gpuwatchd.clock import FakeClock

CORES = tuple(sorted(os.sched_getaffinity(0)))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two host cores")


def mercurial(good: NDArray[Any], bad_core: int) -> NDArray[Any]:
    """A reference as a host whose core `bad_core` flips a bit computes it."""
    if os.sched_getaffinity(0) != {bad_core}:
        return good
    wrong = good.copy()
    wrong.reshape(-1).view(np.uint32)[0] ^= np.uint32(1 << 20)
    return wrong


@two_cores
def test_a_wrong_reference_from_a_bad_host_core_is_an_error_not_a_mismatch() -> None:
    spec = CanarySpec("gemm_exact", "fp32", (32, 32, 32), 1)
    fmt = FORMATS["fp32"]
    right = exact_reference(fmt, exact_gemm(fmt, spec.shape, spec.seed))
    context = RunContext(ReferenceCache(), reference_cores=CORES)
    with pytest.raises(HostReferenceError, match="host CPU fault"):
        _known_answer(context, spec, right, lambda: mercurial(right, CORES[0]))
    # The GPU's output (right) matched nothing on record; nothing was cached.
    assert context.cache.get("gemm_exact_fp32-32x32x32-seed1") is None


@two_cores
def test_a_device_mismatch_names_the_cores_its_reference_was_checked_on() -> None:
    spec = CanarySpec("gemm_exact", "fp32", (32, 32, 32), 1)
    fmt = FORMATS["fp32"]
    right = exact_reference(fmt, exact_gemm(fmt, spec.shape, spec.seed))
    wrong = right.copy()
    wrong.reshape(-1).view(np.uint32)[5] ^= np.uint32(1)
    known = _known_answer(RunContext(reference_cores=CORES), spec, wrong, lambda: right)
    assert known.comparison.count == 1
    assert known.note == f"reference checked on cores {CORES[0]}, {CORES[-1]}"


@two_cores
def test_the_host_core_under_test_never_computes_its_own_reference() -> None:
    spec = CanarySpec("gemm_exact", "fp32", (32, 32, 32), 1)
    fmt = FORMATS["fp32"]
    right = exact_reference(fmt, exact_gemm(fmt, spec.shape, spec.seed))
    under_test = CORES[0]
    # The core computes wrong, its own output and a reference alike: the
    # reference comes from the other cores, so its output mismatches.
    output = right.copy()
    output.reshape(-1).view(np.uint32)[0] ^= np.uint32(1 << 20)
    context = RunContext(cpu_core=under_test, reference_cores=CORES)
    known = _known_answer(context, spec, output, lambda: mercurial(right, under_test))
    assert known.comparison.count == 1


class SignedZeros:
    """A GPU whose adder signs exact cancellations negative (allowed: the
    sign of such a zero is not documented for tensor cores)."""

    def __init__(self) -> None:
        self._inner = CpuBackend()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def gemm(self, fmt: NumberFormat, a: NDArray[Any], b: NDArray[Any]) -> GemmRun:
        run = self._inner.gemm(fmt, a, b)
        output = np.where(run.output == 0, -run.output.dtype.type(0), run.output)
        return GemmRun(output=output.astype(run.output.dtype), seconds=run.seconds)


def test_a_negative_zero_from_an_exact_cancellation_is_the_right_answer() -> None:
    # bf16 seed 6 at 128^3 has an exact-zero output.
    spec = CanarySpec("gemm_exact", "bf16", (128, 128, 128), 6)
    fmt = FORMATS["bf16"]
    reference = exact_reference(fmt, exact_gemm(fmt, spec.shape, spec.seed))
    assert (reference == 0).any()
    backend: Any = SignedZeros()
    assert np.signbit(backend.gemm(fmt, *_operands(fmt, spec)).output[reference == 0]).all()
    assert run_canary(backend, spec, RunContext()).result == "pass"


def _operands(fmt: NumberFormat, spec: CanarySpec) -> tuple[NDArray[Any], NDArray[Any]]:
    inputs = exact_gemm(fmt, (spec.shape[0], spec.shape[1], spec.shape[2]), spec.seed)
    return inputs.a, inputs.b


def test_the_error_bound_holds_for_every_summation_order() -> None:
    # fp32 sums of the same random products in different orders differ in
    # their last bits; all stay within the bound of the fp64 reference.
    fmt = FORMATS["fp32"]
    a, b = random_gemm(fmt, (8, 4096, 8), 3)
    exact = a @ b
    scale = np.abs(a) @ np.abs(b)
    products = (a[:, :, None] * b[None, :, :]).astype(np.float32)
    rng = np.random.default_rng(0)
    for _ in range(4):
        order = rng.permutation(a.shape[1])
        total = np.zeros((8, 8), np.float32)
        for index in order:
            total = total + products[:, index, :]
        assert (np.abs(total - exact) <= error_bound(fmt, a.shape[1]) * scale).all()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_bounded_gemm_passes_a_healthy_gpu_and_catches_a_wrong_element(dtype: str) -> None:
    spec = CanarySpec("gemm_bounded", dtype, (192, 192, 192), 1)
    assert run_canary(CpuBackend(), spec, RunContext()).result == "pass"
    faulty = FaultyBackend(CpuBackend(), FaultSpec("consistent", seed=3))
    result = run_canary(faulty, spec, RunContext())
    assert result.result == "mismatch" and result.mismatch_count == 1


def test_a_bounded_gemm_cannot_see_a_last_bit_flip() -> None:
    # The price of judging without a known answer: a flip within the
    # rounding error of some summation order is invisible (docs/sdc.md).
    spec = CanarySpec("gemm_bounded", "fp32", (192, 192, 192), 1)
    faulty = FaultyBackend(CpuBackend(), FaultSpec("lsb", seed=3))
    assert run_canary(faulty, spec, RunContext()).result == "pass"


def test_a_digest_from_another_configuration_is_not_comparable() -> None:
    # The same model and libraries with fewer SMs (an MPS thread limit, a
    # green context) is another scope: never judged against the other.
    request = BurstRequest("cpu", (CanarySpec("gemm_random", "fp32", (64, 64, 64), 1),), gpu=0)
    whole = run_in_process(
        replace(request, stand_in_sm_count=132), timeout=60, clock=FakeClock()
    ).results
    part = run_in_process(
        replace(request, gpu=1, stand_in_sm_count=66), timeout=60, clock=FakeClock()
    ).results
    assert whole[0].environment != part[0].environment
    book, _ = crosscheck(DigestBook(), whole, quorum=1)
    _, judged = crosscheck(book, part, quorum=1)
    assert judged[0].result == "pass"


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "tf32", "fp32", "fp64"])
def test_full_mantissa_operands_use_every_bit_sign_and_exponent(dtype: str) -> None:
    fmt = FORMATS[dtype]
    a, _ = random_gemm(fmt, (64, 64, 64), 5)
    bits = a.view(np.dtype(f"<u{a.dtype.itemsize}")).reshape(-1)
    explicit = fmt.significand_bits - 1
    native = {2: 10, 4: 23, 8: 52}[a.dtype.itemsize]
    # OR of the bits of the format's explicit mantissa (the top `explicit`
    # bits of the host type's mantissa field): every one is used.
    field = bits & type(bits[0])((1 << native) - 1)
    used = int(np.bitwise_or.reduce(field)) >> (native - explicit)
    assert used == (1 << explicit) - 1
    assert (a < 0).any() and (a > 0).any()
    # Eight binades, and a ninth where rounding to nearest carries into 1.
    assert len(np.unique(np.floor(np.log2(np.abs(a))))) in (8, 9)
