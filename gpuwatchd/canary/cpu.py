"""The CPU backend: the canary suite in NumPy, everywhere.

Tensor-core formats are emulated (formats.quantize) and accumulated in fp32,
so the exactness the GPU relies on is the exactness checked here. Standing in
for a GPU (simulation), threads of the chains are spread over emulated SMs
block by block, as a GPU schedules them; checking the host, every thread
records the core the worker is pinned to. Its "device time" is the time its
computations take; what memory it holds it cannot tell.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.backend import BurnRun, DeviceInfo, GemmRun, HostOutput, ThreadRun
from gpuwatchd.canary.chains import (
    THREADS_PER_BLOCK,
    FmaChainInputs,
    IntChainInputs,
    fma_chain,
    int_chain,
)
from gpuwatchd.canary.compare import as_bits
from gpuwatchd.canary.convert import ConvertInputs, convert
from gpuwatchd.canary.formats import NumberFormat, quantize
from gpuwatchd.canary.gemm import random_gemm
from gpuwatchd.canary.memory import ArrayRegion, MemoryRegion, TimedRegion
from gpuwatchd.canary.mma import MmaInputs, mma
from gpuwatchd.canary.sfu import SfuInputs, sfu


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass  # no /proc (not Linux): the architecture names the CPU instead
    return platform.machine() or "cpu"


def pinned_core() -> int:
    """The core this thread is pinned to, or -1 when it may run on several."""
    cores = os.sched_getaffinity(0)
    return next(iter(cores)) if len(cores) == 1 else -1


class CpuBackend:
    def __init__(
        self, sm_count: int | None = None, name: str | None = None, uuid: str | None = None
    ) -> None:
        model = name or cpu_model()
        self._sm_count = sm_count
        self._seconds = 0.0
        self._info = DeviceInfo(
            backend="cpu",
            name=model,
            uuid=uuid,
            environment=f"{model}; {sm_count} SMs; numpy {np.__version__}"
            if sm_count
            else f"{model}; numpy {np.__version__}",
            sm_count=sm_count,
        )

    @property
    def info(self) -> DeviceInfo:
        return self._info

    @contextmanager
    def _timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds += time.perf_counter() - start

    def gemm(self, fmt: NumberFormat, a: NDArray[Any], b: NDArray[Any]) -> GemmRun:
        accumulator = fmt.output_dtype
        qa = quantize(fmt, a).astype(accumulator)
        qb = quantize(fmt, b).astype(accumulator)
        start = self._seconds
        with self._timed():
            output = qa @ qb
        return GemmRun(output=HostOutput(output), seconds=self._seconds - start)

    def random_gemm(self, fmt: NumberFormat, shape: tuple[int, int, int], seed: int) -> GemmRun:
        return self.gemm(fmt, *random_gemm(fmt, shape, seed))

    def gemm_repeat(
        self, fmt: NumberFormat, shape: tuple[int, int, int], seed: int, repeats: int
    ) -> BurnRun:
        a, b = random_gemm(fmt, shape, seed)
        start = self._seconds
        first = self.gemm(fmt, a, b).output.fetch()
        differing = sum(
            not np.array_equal(as_bits(self.gemm(fmt, a, b).output.fetch()), as_bits(first))
            for _ in range(repeats - 1)
        )
        return BurnRun(HostOutput(first), differing, self._seconds - start)

    def _units(self, threads: int) -> NDArray[np.int64]:
        if self._sm_count is None:
            return np.full(threads, pinned_core(), dtype=np.int64)
        blocks = np.arange(threads, dtype=np.int64) // THREADS_PER_BLOCK
        return blocks % self._sm_count

    def _run(self, compute: Callable[[], NDArray[Any]], threads: int) -> ThreadRun:
        with self._timed():
            values = compute()
        return ThreadRun(HostOutput(values), self._units(threads))

    def int_chain(self, inputs: IntChainInputs) -> ThreadRun:
        return self._run(lambda: int_chain(inputs), inputs.start.size)

    def fma_chain(self, inputs: FmaChainInputs) -> ThreadRun:
        return self._run(lambda: fma_chain(inputs), inputs.start.size)

    def convert(self, inputs: ConvertInputs) -> ThreadRun:
        return self._run(lambda: convert(inputs), inputs.single.size)

    def sfu(self, inputs: SfuInputs) -> ThreadRun:
        return self._run(lambda: sfu(inputs), inputs.angle.size)

    def mma(self, inputs: MmaInputs) -> ThreadRun:
        return self._run(lambda: mma(inputs), inputs.threads)

    def memory(self, words: int) -> MemoryRegion:
        return TimedRegion(ArrayRegion(np, words, np.asarray), self._timed)

    def free_memory_bytes(self) -> int | None:
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None

    def device_seconds(self) -> float:
        return self._seconds

    def release(self) -> int | None:
        return None
