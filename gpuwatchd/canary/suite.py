"""Running one canary on a backend and judging its output.

Shared by every backend: inputs come from gemm.py and chains.py, the known
answers from their exact references, the verdict from a bit-for-bit
comparison. A reference is computed only when needed: its digest is cached
per canary, shape and seed, so a passing run costs one hash of the output.
Before an output is called wrong, its reference is computed again on a
second host core: a host core that computes wrong (a mercurial core) makes
the canary an `error`, never a GPU's mismatch.
The full-mantissa GEMM has no known answer; its digest is judged later,
across GPUs (crosscheck.py), and a digest mismatch is re-run as
`gemm_bounded`: every element against an fp64 reference and an error bound
that holds in any summation order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.backend import Backend, ThreadRun
from gpuwatchd.canary.chains import (
    FMA_FORMATS,
    LANES,
    fma_chain_inputs,
    fma_chain_reference,
    int_chain_inputs,
    int_chain_reference,
)
from gpuwatchd.canary.compare import Comparison, compare_values, mismatching_indices
from gpuwatchd.canary.convert import convert_inputs, convert_reference
from gpuwatchd.canary.formats import FORMATS, NumberFormat
from gpuwatchd.canary.gemm import exact_gemm, exact_reference, flop_count, random_gemm
from gpuwatchd.canary.memory import PATTERN_TESTS, WORD_BYTES
from gpuwatchd.canary.mma import mma_case, mma_reference
from gpuwatchd.canary.result import CanaryResult
from gpuwatchd.canary.sfu import outside as sfu_outside
from gpuwatchd.canary.sfu import sfu_inputs, sfu_reference
from gpuwatchd.canary.spec import CanarySpec

log = logging.getLogger(__name__)

# Evidence keeps at most this many distinct SMs and lanes (a broken SM can
# spoil every thread it ran).
MAX_LOCATIONS = 64
# gemm_bounded compares this many rows at a time (bounds host memory).
BOUNDED_ROWS = 512
# gemm_burn checks this many rows of its first product against the bound.
BURN_SAMPLE_ROWS = 32


class HostReferenceError(RuntimeError):
    """Two host cores computed different references: the host is wrong."""


def digest(values: NDArray[Any]) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()


class ReferenceCache:
    """Digests of exact references by canary, shape and seed: in memory, and
    in `directory` (one small file each) when given, so later bursts skip
    the reference. Only references computed here are ever stored, and an
    output whose digest differs is always compared with a freshly computed
    reference: a stale or damaged entry costs time, never a false mismatch."""

    def __init__(self, directory: str | None = None) -> None:
        self._directory = Path(directory) if directory else None
        self._digests: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        if key in self._digests or self._directory is None:
            return self._digests.get(key)
        try:
            stored = (self._directory / key).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        if len(stored) == 64 and all(c in "0123456789abcdef" for c in stored):
            self._digests[key] = stored
            return stored
        return None

    def put(self, key: str, value: str) -> None:
        self._digests[key] = value
        if self._directory is None:
            return
        try:
            # Not its parents: a burst still running after the daemon stopped
            # and removed its state directory must not create it again.
            self._directory.mkdir(exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", dir=self._directory, delete=False, encoding="ascii"
            ) as handle:
                handle.write(value)
            os.replace(handle.name, self._directory / key)
        except OSError as error:
            log.warning("cannot cache a canary reference in %s: %s", self._directory, error)


def cache_key(spec: CanarySpec) -> str:
    return f"{spec.name}-{'x'.join(map(str, spec.shape))}-seed{spec.seed}"


@dataclass(frozen=True)
class RunContext:
    cache: ReferenceCache = field(default_factory=ReferenceCache)
    gpu: int | None = None
    uuid: str | None = None
    cpu_core: int | None = None
    # The HBM test takes at most this share of the device's free memory.
    hbm_free_fraction: float = 0.05
    # The host cores a reference may be computed on (empty: wherever the
    # worker runs, unchecked).
    reference_cores: tuple[int, ...] = ()


@dataclass(frozen=True)
class Evidence:
    comparison: Comparison
    shape: tuple[int, ...]
    units: tuple[int, ...] = ()
    lanes: tuple[int, ...] = ()
    tflops: float | None = None
    # Distinct SMs (cores) that ran a whole thread of a chain.
    units_covered: int | None = None
    digest: str | None = None
    environment: str | None = None
    # Measured on the device (events), where the backend can: what the duty
    # budget charges.
    device_seconds: float | None = None
    note: str | None = None


def _reference_cores(context: RunContext) -> tuple[int | None, int | None]:
    """Two host cores for a reference and its check, other than the core
    under test where there are enough; None: wherever the worker runs."""
    cores = [c for c in context.reference_cores if c != context.cpu_core]
    cores = cores or list(context.reference_cores)
    if not cores:
        return None, None
    return cores[0], cores[-1] if len(cores) > 1 else cores[0]


def _on_core(core: int | None, compute: Callable[[], NDArray[Any]]) -> NDArray[Any]:
    if core is None:
        return compute()
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        return compute()
    finally:
        os.sched_setaffinity(0, before)


@dataclass(frozen=True)
class KnownAnswer:
    comparison: Comparison
    expected: NDArray[Any] | None  # None when the cached digest matched
    note: str | None = None  # where the reference was checked, for a mismatch


def _known_answer(
    context: RunContext,
    spec: CanarySpec,
    output: NDArray[Any],
    reference: Callable[[], NDArray[Any]],
) -> KnownAnswer:
    """The comparison with the known answer. An output that differs from
    the reference is compared only once a second core computed the same
    reference; HostReferenceError when it did not."""
    key = cache_key(spec)
    seen = digest(output)
    if context.cache.get(key) == seen:
        return KnownAnswer(Comparison(width=output.dtype.itemsize * 8), None)
    first, second = _reference_cores(context)
    expected = _on_core(first, reference)
    expected_digest = digest(expected)
    if expected_digest != seen:
        check = _on_core(second, reference)
        if digest(check) != expected_digest:
            raise _host_fault(spec, (first, second))
    context.cache.put(key, expected_digest)
    note = None if expected_digest == seen else f"reference checked on cores {first}, {second}"
    return KnownAnswer(compare_values(output, expected), expected, note)


def _signless_zero(values: NDArray[Any]) -> NDArray[Any]:
    """Float outputs with -0 made +0. How an exact cancellation is signed
    inside a tensor core's adder or a split-K fix-up is undocumented (IEEE
    gives +0): -0 and +0 are one answer. Integers pass unchanged."""
    return values + values.dtype.type(0) if values.dtype.kind == "f" else values


def _gemm_exact(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    fmt = FORMATS[spec.dtype]
    m, k, n = spec.shape
    inputs = exact_gemm(fmt, (m, k, n), spec.seed)
    run = backend.gemm(fmt, inputs.a, inputs.b)
    output = _signless_zero(run.output)
    known = _known_answer(context, spec, output, lambda: exact_reference(fmt, inputs))
    # No TFLOP/s: a GEMM this thin is bound by launch latency, its rate says
    # nothing about the GPU (only the full-mantissa GEMMs report one).
    return Evidence(known.comparison, spec.shape, device_seconds=run.seconds, note=known.note)


def _gemm_random(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    fmt = FORMATS[spec.dtype]
    m, k, n = spec.shape
    a, b = random_gemm(fmt, (m, k, n), spec.seed)
    run = backend.gemm(fmt, a, b)
    return Evidence(
        Comparison(width=run.output.dtype.itemsize * 8),
        spec.shape,
        tflops=_tflops(spec.shape, run.seconds),
        digest=digest(run.output),
        environment=backend.info.environment,
        device_seconds=run.seconds,
    )


def error_bound(fmt: NumberFormat, k: int) -> float:
    """Relative to sum |a*b|: how far a product of exact operands, summed
    in any order in `fmt`'s accumulator (rounding or truncating each step),
    and rounded to the output, may be from the exact answer."""
    unit = 2.0 ** (1 - fmt.accumulator_bits)  # one ulp: truncation's worst case
    return (k + 2) * unit + k * 2.0**-53  # and the fp64 reference's own error


def _host_fault(spec: CanarySpec, cores: tuple[int | None, int | None]) -> HostReferenceError:
    return HostReferenceError(
        f"host cores {cores[0]} and {cores[1]} computed different references for "
        f"{spec.name} seed {spec.seed}: a host CPU fault, not the device's"
    )


def _gemm_bounded(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    """The full-mantissa GEMM judged element by element: outside the error
    bound of the fp64 reference is wrong in every summation order."""
    fmt = FORMATS[spec.dtype]
    m, k, n = spec.shape
    a, b = random_gemm(fmt, (m, k, n), spec.seed)
    run = backend.gemm(fmt, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cores = _reference_cores(context)
    comparison = Comparison(width=run.output.dtype.itemsize * 8)
    for start in range(0, m, BOUNDED_ROWS):
        rows = slice(start, start + BOUNDED_ROWS)
        part = _bounded_rows(spec, a64[rows], b64, run.output[rows], error_bound(fmt, k), cores)
        comparison = comparison.merge(_offset(part, start * n))
    return Evidence(comparison, spec.shape, device_seconds=run.seconds)


def _offset(comparison: Comparison, offset: int) -> Comparison:
    if comparison.first_index is None:
        return comparison
    return dataclasses.replace(comparison, first_index=comparison.first_index + offset)


def _bounded_rows(
    spec: CanarySpec,
    a: NDArray[np.float64],
    b: NDArray[np.float64],
    output: NDArray[Any],
    bound: float,
    cores: tuple[int | None, int | None],
) -> Comparison:
    scale = _on_core(cores[0], lambda: np.abs(a) @ np.abs(b))
    return _outside_bound(
        spec,
        cores,
        output,
        lambda: a @ b,
        lambda exact: np.abs(output.astype(np.float64) - exact) > bound * scale,
    ).comparison


def _outside_bound(
    spec: CanarySpec,
    cores: tuple[int | None, int | None],
    output: NDArray[Any],
    exact_of: Callable[[], NDArray[np.float64]],
    outside: Callable[[NDArray[np.float64]], NDArray[np.bool_]],
) -> KnownAnswer:
    """`output` judged against a bound around exact values: the elements
    `outside` marks are wrong, once a second host core computed the same
    exact values (HostReferenceError when it did not)."""
    exact = _on_core(cores[0], exact_of)
    bad = outside(exact)
    if not bad.any():
        return KnownAnswer(Comparison(width=output.dtype.itemsize * 8), None)
    if not np.array_equal(_on_core(cores[1], exact_of), exact):
        raise _host_fault(spec, cores)
    expected = np.where(bad, exact, output).astype(output.dtype)
    note = f"reference checked on cores {cores[0]}, {cores[1]}"
    return KnownAnswer(compare_values(output, expected), expected, note)


def _gemm_burn(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    """Sustained GEMMs: every product bit-identical to the first (one
    library call sequence on one device), the first against the fp64 bound
    on sampled rows (the whole reference would take the host minutes)."""
    fmt = FORMATS[spec.dtype]
    m, k, n, repeats = spec.shape
    a, b = random_gemm(fmt, (m, k, n), spec.seed)
    run = backend.gemm_repeat(fmt, a, b, repeats)
    b64 = b.astype(np.float64)
    cores = _reference_cores(context)
    rows = np.random.default_rng([6, spec.seed]).choice(m, min(m, BURN_SAMPLE_ROWS), replace=False)
    comparison = Comparison(width=run.output.dtype.itemsize * 8)
    for row in sorted(int(r) for r in rows):
        only = slice(row, row + 1)
        part = _bounded_rows(
            spec, a[only].astype(np.float64), b64, run.output[only], error_bound(fmt, k), cores
        )
        comparison = comparison.merge(_offset(part, row * n))
    comparison = dataclasses.replace(comparison, count=comparison.count + run.differing)
    note = f"{run.differing} of {repeats - 1} repeated products differed from the first"
    return Evidence(
        comparison,
        spec.shape,
        tflops=_tflops((m, k, n), run.seconds / repeats),
        device_seconds=run.seconds,
        note=note if run.differing else None,
    )


def _tflops(shape: tuple[int, ...], seconds: float) -> float | None:
    return flop_count(shape) / seconds / 1e12 if seconds > 0 else None


def _thread_evidence(
    spec: CanarySpec, context: RunContext, run: ThreadRun, reference: Callable[[], NDArray[Any]]
) -> Evidence:
    return _located(spec, run, _known_answer(context, spec, run.values, reference))


def _located(spec: CanarySpec, run: ThreadRun, known: KnownAnswer) -> Evidence:
    """The evidence of a per-thread canary: the SMs (cores) and lanes of
    the threads that went wrong, and how many SMs ran a whole thread."""
    comparison, expected = known.comparison, known.expected
    placed = np.asarray(run.units)
    covered = int(np.unique(placed[placed >= 0]).size)
    if comparison.count == 0 or expected is None:
        return Evidence(comparison, spec.shape, units_covered=covered)
    threads = mismatching_indices(run.values, expected) // run.words_per_thread
    units = np.unique(placed[threads])[:MAX_LOCATIONS]
    lanes = np.unique(threads % LANES)[:MAX_LOCATIONS]
    return Evidence(
        comparison,
        spec.shape,
        units=tuple(int(u) for u in units),
        lanes=tuple(int(lane) for lane in lanes),
        units_covered=covered,
        note=known.note,
    )


def _int_chain(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    threads, steps = spec.shape
    inputs = int_chain_inputs(threads, steps, spec.seed)
    run = backend.int_chain(inputs)
    return _thread_evidence(spec, context, run, lambda: int_chain_reference(inputs))


def _fma_chain(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    threads, steps = spec.shape
    inputs = fma_chain_inputs(FMA_FORMATS[spec.dtype], threads, steps, spec.seed)
    run = backend.fma_chain(inputs)
    return _thread_evidence(spec, context, run, lambda: fma_chain_reference(inputs))


def _convert(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    inputs = convert_inputs(spec.shape[0], spec.seed)
    run = backend.convert(inputs)
    return _thread_evidence(spec, context, run, lambda: convert_reference(inputs))


def _sfu(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    """The transcendentals, each against its documented error bound around
    an exact value (sfu.py); a result outside it only once a second host
    core computed the same exact values."""
    inputs = sfu_inputs(spec.shape[0], spec.seed)
    run = backend.sfu(inputs)
    known = _outside_bound(
        spec,
        _reference_cores(context),
        run.values,
        lambda: sfu_reference(inputs),
        lambda exact: sfu_outside(run.values, exact, inputs),
    )
    if known.note is not None:
        known = dataclasses.replace(known, note=f"outside the documented error bound; {known.note}")
    return _located(spec, run, known)


def _mma(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    case = mma_case(spec.dtype, spec.shape, spec.seed)
    run = backend.mma(case.inputs)
    run = dataclasses.replace(run, values=_signless_zero(run.values))
    return _thread_evidence(spec, context, run, lambda: mma_reference(case))


def _hbm(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    words = spec.shape[0]
    free = backend.free_memory_bytes()
    if free is not None:
        words = min(words, int(free * context.hbm_free_fraction) // WORD_BYTES)
    region = backend.memory(max(words, 1))
    return Evidence(PATTERN_TESTS[spec.kind](region), (region.words,))


_RUNNERS: Mapping[str, Callable[[Backend, CanarySpec, RunContext], Evidence]] = MappingProxyType(
    {
        "gemm_exact": _gemm_exact,
        "gemm_random": _gemm_random,
        "gemm_bounded": _gemm_bounded,
        "gemm_burn": _gemm_burn,
        "int_chain": _int_chain,
        "fma_chain": _fma_chain,
        "convert": _convert,
        "sfu": _sfu,
        "mma": _mma,
        **{kind: _hbm for kind in PATTERN_TESTS},
    }
)


def _hex(value: int | None, width: int) -> str | None:
    return None if value is None else f"{value:0{width // 4}x}"


def _coverage(evidence: Evidence, sm_count: int | None) -> float | None:
    if evidence.units_covered is None or not sm_count:
        return None
    return min(evidence.units_covered / sm_count, 1.0)


def run_canary(backend: Backend, spec: CanarySpec, context: RunContext) -> CanaryResult:
    """Run one canary and judge it. Device errors propagate: the worker turns
    them into `error` results."""
    start = time.perf_counter()
    evidence = _RUNNERS[spec.kind](backend, spec, context)
    duration = time.perf_counter() - start
    comparison = evidence.comparison
    return CanaryResult(
        canary=spec.name,
        kind=spec.kind,
        dtype=spec.dtype,
        seed=spec.seed,
        shape=evidence.shape,
        result="mismatch" if comparison.count else "pass",
        duration_seconds=duration,
        gpu=context.gpu,
        uuid=context.uuid if context.uuid is not None else backend.info.uuid,
        cpu_core=context.cpu_core,
        backend=backend.info.backend,
        mismatch_count=comparison.count,
        first_mismatch_index=comparison.first_index,
        first_expected_bits=_hex(comparison.first_expected, comparison.width),
        first_actual_bits=_hex(comparison.first_actual, comparison.width),
        bit_histogram=comparison.histogram,
        mismatch_units=evidence.units,
        mismatch_lanes=evidence.lanes,
        tflops=evidence.tflops,
        sm_coverage_ratio=_coverage(evidence, backend.info.sm_count),
        sm_count=backend.info.sm_count,
        digest=evidence.digest,
        environment=evidence.environment,
        device_seconds=evidence.device_seconds,
        message=evidence.note,
    )
