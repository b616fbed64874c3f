"""Running one canary on a backend and judging its output.

Shared by every backend: inputs come from gemm.py, chains.py and the other
canaries' modules, the known answers from their exact references, the
verdict from a bit-for-bit comparison. A canary runs in three steps:
- `prepare_canary`, on the host, before the worker opens its device (so the
  GPU's memory and a busy GPU's time are never held for it): the inputs, and
  the known answer's digest when the cache lacks it (the first burst of a
  seed);
- its device part (`run_prepared`): the device computes and digests its
  output where it lies; only a digest comes back when it is the known
  answer's, the output itself only when it is not. Its device time
  (backend.device_seconds) is what the duty budget charges, and then the
  backend gives back what memory the canary held;
- its judgement, on the host, with the device's memory given back.
A reference is computed only when needed: its digest is cached per canary,
shape and seed, so a passing run costs a digest on the device. Before an
output is called wrong, its reference is computed again on two host cores:
a host core that computes wrong (a mercurial core) makes the canary an
`error`, never a GPU's mismatch.
The full-mantissa GEMM has no known answer; its digest is judged later,
across GPUs (crosscheck.py), and a digest mismatch is re-run as
`gemm_bounded`: the same product, digested again (the bitwise comparison),
and every element against an fp64 reference and an error bound that holds
in any summation order (the software-fault filter, confirm.py).
"""

from __future__ import annotations

import dataclasses
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

from gpuwatchd.canary.backend import Backend, DeviceOutput, ThreadRun
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
from gpuwatchd.canary.gemm import exact_gemm, exact_reference, flop_count
from gpuwatchd.canary.hashing import DIGEST_HEX_DIGITS, digest_words, host_operand
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


# Names the digest in a cached reference's key: a new digest starts afresh.
DIGEST_NAME = "kh1"


class HostReferenceError(RuntimeError):
    """Two host cores computed different references: the host is wrong."""


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
        if len(stored) == DIGEST_HEX_DIGITS and all(c in "0123456789abcdef" for c in stored):
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
    return f"{spec.name}-{'x'.join(map(str, spec.shape))}-seed{spec.seed}-{DIGEST_NAME}"


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
class Reference:
    """A canary's known answer as far as the device needs it: its digest
    (cached, or computed while preparing), and how to compute it again."""

    key: str
    digest: str
    cached: bool
    compute: Callable[[], NDArray[Any]]
    signless_zero: bool


def prepare_reference(
    context: RunContext, spec: CanarySpec, compute: Callable[[], NDArray[Any]]
) -> Reference:
    """The known answer's digest: from the cache, else computed now (on the
    first reference core), to be cached once an output agrees with it."""
    key = cache_key(spec)
    signless = spec.kind in SIGNLESS_KINDS
    cached = context.cache.get(key)
    if cached is not None:
        return Reference(key, cached, True, compute, signless)
    first, _ = _reference_cores(context)
    expected = digest_words(_on_core(first, compute), signless)
    return Reference(key, expected, False, compute, signless)


@dataclass(frozen=True)
class Observed:
    """What the device gave back of an output: its digest, and the output
    itself when that was not the known answer's."""

    digest: str
    width: int
    values: NDArray[Any] | None


def read_back(output: DeviceOutput, known: Reference) -> Observed:
    seen = output.digest(known.signless_zero)
    width = output.dtype.itemsize * 8
    if seen == known.digest:
        return Observed(seen, width, None)
    values = output.fetch()
    return Observed(seen, width, _signless_zero(values) if known.signless_zero else values)


@dataclass(frozen=True)
class KnownAnswer:
    comparison: Comparison
    expected: NDArray[Any] | None  # None when the known answer's digest matched
    actual: NDArray[Any] | None = None
    note: str | None = None  # where the reference was checked, for a mismatch


def _known_answer(
    context: RunContext, spec: CanarySpec, seen: Observed, known: Reference
) -> KnownAnswer:
    """The comparison with the known answer. An output whose digest is not
    the known answer's is compared with a reference computed afresh, once a
    second core computed the same (HostReferenceError when it did not)."""
    if seen.values is None:
        if not known.cached:
            context.cache.put(known.key, seen.digest)
        return KnownAnswer(Comparison(width=seen.width), None)
    first, second = _reference_cores(context)
    expected = _on_core(first, known.compute)
    expected_digest = digest_words(expected, known.signless_zero)
    if digest_words(_on_core(second, known.compute), known.signless_zero) != expected_digest:
        raise _host_fault(spec, (first, second))
    context.cache.put(known.key, expected_digest)
    note = (
        None if expected_digest == seen.digest else f"reference checked on cores {first}, {second}"
    )
    return KnownAnswer(compare_values(seen.values, expected), expected, seen.values, note)


def _signless_zero(values: NDArray[Any]) -> NDArray[Any]:
    """Float outputs with -0 made +0. How an exact cancellation is signed
    inside a tensor core's adder or a split-K fix-up is undocumented (IEEE
    gives +0): -0 and +0 are one answer. Integers pass unchanged."""
    return values + values.dtype.type(0) if values.dtype.kind == "f" else values


# The canaries whose outputs may hold an exact cancellation's zero.
SIGNLESS_KINDS = frozenset({"gemm_exact", "mma"})

# A canary's judgement, run on the host once the device gave its memory back.
Judge = Callable[[], Evidence]
# A canary's device part, given the backend: returns its judgement.
OnDevice = Callable[[Backend], Judge]


def _gemm_exact(spec: CanarySpec, context: RunContext) -> OnDevice:
    fmt = FORMATS[spec.dtype]
    m, k, n = spec.shape
    inputs = exact_gemm(fmt, (m, k, n), spec.seed)
    known = prepare_reference(context, spec, lambda: exact_reference(fmt, inputs))

    def on_device(backend: Backend) -> Judge:
        seen = read_back(backend.gemm(fmt, inputs.a, inputs.b).output, known)
        # No TFLOP/s: a GEMM this thin is bound by launch latency, its rate
        # says nothing about the GPU (only the full-mantissa GEMMs report one).
        return lambda: _evidence(spec, _known_answer(context, spec, seen, known))

    return on_device


def _evidence(spec: CanarySpec, known: KnownAnswer) -> Evidence:
    return Evidence(known.comparison, spec.shape, note=known.note)


def _gemm_shape(spec: CanarySpec) -> tuple[int, int, int]:
    m, k, n = spec.shape[:3]
    return m, k, n


def _gemm_random(spec: CanarySpec, context: RunContext) -> OnDevice:
    fmt = FORMATS[spec.dtype]

    def on_device(backend: Backend) -> Judge:
        run = backend.random_gemm(fmt, _gemm_shape(spec), spec.seed)
        seen, width = run.output.digest(), run.output.dtype.itemsize * 8
        evidence = Evidence(
            Comparison(width=width),
            spec.shape,
            tflops=_tflops(spec.shape, run.seconds),
            digest=seen,
            environment=backend.info.environment,
        )
        return lambda: evidence

    return on_device


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


def _gemm_bounded(spec: CanarySpec, context: RunContext) -> OnDevice:
    """The full-mantissa GEMM digested again (what crosscheck compares bit
    for bit) and judged element by element: outside the error bound of the
    fp64 reference is wrong in every summation order. Its operands for the
    reference are made on the host from the same key as the GPU's."""
    fmt = FORMATS[spec.dtype]
    shape = _gemm_shape(spec)

    def on_device(backend: Backend) -> Judge:
        run = backend.random_gemm(fmt, shape, spec.seed)
        seen, output = run.output.digest(), run.output.fetch()
        environment = backend.info.environment

        def judge() -> Evidence:
            rows = range(0, shape[0], BOUNDED_ROWS)
            comparison = _within_bound(
                spec, context, output, [slice(r, r + BOUNDED_ROWS) for r in rows]
            )
            return Evidence(comparison, spec.shape, digest=seen, environment=environment)

        return judge

    return on_device


def _within_bound(
    spec: CanarySpec, context: RunContext, output: NDArray[Any], blocks: list[slice]
) -> Comparison:
    """The output's rows in `blocks` against the fp64 bound."""
    fmt = FORMATS[spec.dtype]
    shape = _gemm_shape(spec)
    b64 = host_operand(fmt.name, shape, spec.seed, 1).astype(np.float64)
    cores = _reference_cores(context)
    comparison = Comparison(width=output.dtype.itemsize * 8)
    for rows in blocks:
        a64 = host_operand(fmt.name, shape, spec.seed, 0, rows).astype(np.float64)
        part = _bounded_rows(spec, a64, b64, output[rows], error_bound(fmt, shape[1]), cores)
        comparison = comparison.merge(_offset(part, (rows.start or 0) * shape[2]))
    return comparison


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

    def exact_of() -> NDArray[np.float64]:
        return a @ b

    def outside(exact: NDArray[np.float64]) -> NDArray[np.bool_]:
        return np.abs(output.astype(np.float64) - exact) > bound * scale

    exact = _on_core(cores[0], exact_of)
    return _outside_bound(spec, cores, output, exact, exact_of, outside).comparison


def _outside_bound(
    spec: CanarySpec,
    cores: tuple[int | None, int | None],
    output: NDArray[Any],
    exact: NDArray[np.float64],
    exact_of: Callable[[], NDArray[np.float64]],
    outside: Callable[[NDArray[np.float64]], NDArray[np.bool_]],
) -> KnownAnswer:
    """`output` judged against a bound around `exact` (computed on the first
    reference core): the elements `outside` marks are wrong, once the second
    core computed the same exact values (`exact_of`; HostReferenceError when
    it did not)."""
    bad = outside(exact)
    if not bad.any():
        return KnownAnswer(Comparison(width=output.dtype.itemsize * 8), None)
    if not np.array_equal(_on_core(cores[1], exact_of), exact):
        raise _host_fault(spec, cores)
    expected = np.where(bad, exact, output).astype(output.dtype)
    note = f"reference checked on cores {cores[0]}, {cores[1]}"
    return KnownAnswer(compare_values(output, expected), expected, output, note)


def _gemm_burn(spec: CanarySpec, context: RunContext) -> OnDevice:
    """Sustained GEMMs: every product bit-identical to the first (one
    library call sequence on one device), the first against the fp64 bound
    on sampled rows (the whole reference would take the host minutes)."""
    fmt = FORMATS[spec.dtype]
    m, k, n, repeats = spec.shape
    rows = np.random.default_rng([6, spec.seed]).choice(m, min(m, BURN_SAMPLE_ROWS), replace=False)
    sampled = sorted(int(r) for r in rows)

    def on_device(backend: Backend) -> Judge:
        run = backend.gemm_repeat(fmt, (m, k, n), spec.seed, repeats)
        output = run.output.fetch()

        def judge() -> Evidence:
            blocks = [slice(row, row + 1) for row in sampled]
            comparison = _within_bound(spec, context, output, blocks)
            comparison = dataclasses.replace(comparison, count=comparison.count + run.differing)
            note = f"{run.differing} of {repeats - 1} repeated products differed from the first"
            return Evidence(
                comparison,
                spec.shape,
                tflops=_tflops((m, k, n), run.seconds / repeats),
                note=note if run.differing else None,
            )

        return judge

    return on_device


def _tflops(shape: tuple[int, ...], seconds: float) -> float | None:
    return flop_count(shape[:3]) / seconds / 1e12 if seconds > 0 else None


def _thread_canary(
    spec: CanarySpec,
    context: RunContext,
    launch: Callable[[Backend], ThreadRun],
    compute: Callable[[], NDArray[Any]],
) -> OnDevice:
    """A per-thread canary with a known answer."""
    known = prepare_reference(context, spec, compute)

    def on_device(backend: Backend) -> Judge:
        run = launch(backend)
        seen = read_back(run.values, known)
        units, words = run.units, run.words_per_thread
        return lambda: _located(spec, units, words, _known_answer(context, spec, seen, known))

    return on_device


def _located(
    spec: CanarySpec, units: NDArray[Any], words_per_thread: int, known: KnownAnswer
) -> Evidence:
    """The evidence of a per-thread canary: the SMs (cores) and lanes of
    the threads that went wrong, and how many SMs ran a whole thread."""
    comparison = known.comparison
    placed = np.asarray(units)
    covered = int(np.unique(placed[placed >= 0]).size)
    if comparison.count == 0 or known.expected is None or known.actual is None:
        return Evidence(comparison, spec.shape, units_covered=covered)
    threads = mismatching_indices(known.actual, known.expected) // words_per_thread
    where = np.unique(placed[threads])[:MAX_LOCATIONS]
    lanes = np.unique(threads % LANES)[:MAX_LOCATIONS]
    return Evidence(
        comparison,
        spec.shape,
        units=tuple(int(u) for u in where),
        lanes=tuple(int(lane) for lane in lanes),
        units_covered=covered,
        note=known.note,
    )


def _int_chain(spec: CanarySpec, context: RunContext) -> OnDevice:
    threads, steps = spec.shape
    inputs = int_chain_inputs(threads, steps, spec.seed)
    return _thread_canary(
        spec,
        context,
        lambda backend: backend.int_chain(inputs),
        lambda: int_chain_reference(inputs),
    )


def _fma_chain(spec: CanarySpec, context: RunContext) -> OnDevice:
    threads, steps = spec.shape
    inputs = fma_chain_inputs(FMA_FORMATS[spec.dtype], threads, steps, spec.seed)
    return _thread_canary(
        spec,
        context,
        lambda backend: backend.fma_chain(inputs),
        lambda: fma_chain_reference(inputs),
    )


def _convert(spec: CanarySpec, context: RunContext) -> OnDevice:
    inputs = convert_inputs(spec.shape[0], spec.seed)
    return _thread_canary(
        spec, context, lambda backend: backend.convert(inputs), lambda: convert_reference(inputs)
    )


def _mma(spec: CanarySpec, context: RunContext) -> OnDevice:
    case = mma_case(spec.dtype, spec.shape, spec.seed)
    return _thread_canary(
        spec, context, lambda backend: backend.mma(case.inputs), lambda: mma_reference(case)
    )


def _sfu(spec: CanarySpec, context: RunContext) -> OnDevice:
    """The transcendentals, each against its documented error bound around
    an exact value (sfu.py, computed while preparing); a result outside it
    only once a second host core computed the same exact values."""
    inputs = sfu_inputs(spec.shape[0], spec.seed)
    cores = _reference_cores(context)

    def exact_of() -> NDArray[np.float64]:
        return sfu_reference(inputs)

    exact = _on_core(cores[0], exact_of)

    def on_device(backend: Backend) -> Judge:
        run = backend.sfu(inputs)
        values, units, words = run.values.fetch(), run.units, run.words_per_thread

        def outside(around: NDArray[np.float64]) -> NDArray[np.bool_]:
            return sfu_outside(values, around, inputs)

        def judge() -> Evidence:
            known = _outside_bound(spec, cores, values, exact, exact_of, outside)
            if known.note is not None:
                note = f"outside the documented error bound; {known.note}"
                known = dataclasses.replace(known, note=note)
            return _located(spec, units, words, known)

        return judge

    return on_device


def _hbm(spec: CanarySpec, context: RunContext) -> OnDevice:
    def on_device(backend: Backend) -> Judge:
        words = spec.shape[0]
        free = backend.free_memory_bytes()
        if free is not None:
            words = min(words, int(free * context.hbm_free_fraction) // WORD_BYTES)
        region = backend.memory(max(words, 1))
        evidence = Evidence(PATTERN_TESTS[spec.kind](region), (region.words,))
        return lambda: evidence

    return on_device


_PREPARERS: Mapping[str, Callable[[CanarySpec, RunContext], OnDevice]] = MappingProxyType(
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


@dataclass(frozen=True)
class Prepared:
    """A canary whose host work is done: what is left runs on a backend."""

    spec: CanarySpec
    on_device: OnDevice


def prepare_canary(spec: CanarySpec, context: RunContext) -> Prepared:
    """The canary's inputs and, when the cache lacks it, its known answer's
    digest: host work, done before a device is opened."""
    return Prepared(spec, _PREPARERS[spec.kind](spec, context))


def run_prepared(backend: Backend, prepared: Prepared, context: RunContext) -> CanaryResult:
    """Run a prepared canary's device part, give the device's memory back,
    and judge. Device errors propagate: the worker turns them into `error`
    results."""
    spec = prepared.spec
    start = time.perf_counter()
    device_before = backend.device_seconds()
    try:
        judge = prepared.on_device(backend)
    finally:
        held = backend.release()
    device_seconds = backend.device_seconds() - device_before
    evidence = judge()
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
        device_seconds=device_seconds,
        device_memory_bytes=held,
        message=evidence.note,
    )


def run_canary(backend: Backend, spec: CanarySpec, context: RunContext) -> CanaryResult:
    """Prepare one canary and run it (prepared while the device is open:
    for tests and the device check)."""
    return run_prepared(backend, prepare_canary(spec, context), context)
