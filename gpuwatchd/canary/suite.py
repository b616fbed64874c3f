"""Running one canary on a backend and judging its output.

Shared by every backend: inputs come from gemm.py and chains.py, the known
answers from their exact references, the verdict from a bit-for-bit
comparison. A reference is computed only when needed: its digest is cached
per canary, shape and seed, so a passing run costs one hash of the output.
The full-mantissa GEMM has no known answer; its digest is judged later,
across GPUs (crosscheck.py).
"""

from __future__ import annotations

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
from gpuwatchd.canary.formats import FORMATS
from gpuwatchd.canary.gemm import exact_gemm, exact_reference, flop_count, random_gemm
from gpuwatchd.canary.memory import PATTERN_TESTS, WORD_BYTES
from gpuwatchd.canary.result import CanaryResult
from gpuwatchd.canary.spec import CanarySpec

log = logging.getLogger(__name__)

# Evidence keeps at most this many distinct SMs and lanes (a broken SM can
# spoil every thread it ran).
MAX_LOCATIONS = 64


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
            self._directory.mkdir(parents=True, exist_ok=True)
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


@dataclass(frozen=True)
class Evidence:
    comparison: Comparison
    shape: tuple[int, ...]
    units: tuple[int, ...] = ()
    lanes: tuple[int, ...] = ()
    tflops: float | None = None
    digest: str | None = None
    environment: str | None = None


def _known_answer(
    cache: ReferenceCache,
    spec: CanarySpec,
    output: NDArray[Any],
    reference: Callable[[], NDArray[Any]],
) -> tuple[Comparison, NDArray[Any] | None]:
    """The comparison with the known answer, and the answer when it had to
    be computed (None when the output's digest matched the cached one)."""
    key = cache_key(spec)
    if cache.get(key) == digest(output):
        return Comparison(width=output.dtype.itemsize * 8), None
    expected = reference()
    cache.put(key, digest(expected))
    return compare_values(output, expected), expected


def _gemm_exact(backend: Backend, spec: CanarySpec, context: RunContext) -> Evidence:
    fmt = FORMATS[spec.dtype]
    m, k, n = spec.shape
    inputs = exact_gemm(fmt, (m, k, n), spec.seed)
    run = backend.gemm(fmt, inputs.a, inputs.b)
    comparison, _ = _known_answer(
        context.cache, spec, run.output, lambda: exact_reference(fmt, inputs)
    )
    return Evidence(comparison, spec.shape, tflops=_tflops(spec.shape, run.seconds))


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
    )


def _tflops(shape: tuple[int, ...], seconds: float) -> float | None:
    return flop_count(shape) / seconds / 1e12 if seconds > 0 else None


def _thread_evidence(
    spec: CanarySpec, context: RunContext, run: ThreadRun, reference: Callable[[], NDArray[Any]]
) -> Evidence:
    comparison, expected = _known_answer(context.cache, spec, run.values, reference)
    if comparison.count == 0 or expected is None:
        return Evidence(comparison, spec.shape)
    bad = mismatching_indices(run.values, expected)
    units = np.unique(np.asarray(run.units)[bad])[:MAX_LOCATIONS]
    lanes = np.unique(bad % LANES)[:MAX_LOCATIONS]
    return Evidence(
        comparison,
        spec.shape,
        units=tuple(int(u) for u in units),
        lanes=tuple(int(lane) for lane in lanes),
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
        "int_chain": _int_chain,
        "fma_chain": _fma_chain,
        **{kind: _hbm for kind in PATTERN_TESTS},
    }
)


def _hex(value: int | None, width: int) -> str | None:
    return None if value is None else f"{value:0{width // 4}x}"


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
        digest=evidence.digest,
        environment=evidence.environment,
    )
