"""A backend wrapper that corrupts results the way faulty hardware does.

`FaultyBackend` runs the inner backend and then applies a `FaultSpec` to what
comes back (fetched to the host, so a CUDA backend's outputs leave the
device here: simulation and tests only): compute faults rewrite output bits
(per lane, per SM, at fixed positions, where the data matches a trigger, at
random with a temperature dependent probability, in the lowest mantissa bit
of every output or of the full-mantissa GEMMs' alone, or in the first few
results of one burst), memory faults rewrite
stored HBM words after every write (a stuck bit, two aliased addresses), and
process faults hang, kill the worker or fail the call. Used by the tests and
by `canary --simulate` for scenarios with `sdc` faults.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.backend import (
    Backend,
    BackendError,
    BurnRun,
    DeviceInfo,
    GemmRun,
    HostOutput,
    ThreadRun,
)
from gpuwatchd.canary.chains import LANES, THREADS_PER_BLOCK, FmaChainInputs, IntChainInputs
from gpuwatchd.canary.compare import Comparison, as_bits
from gpuwatchd.canary.convert import ConvertInputs
from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.formats import NumberFormat
from gpuwatchd.canary.memory import MemoryRegion, Pattern
from gpuwatchd.canary.mma import MmaInputs
from gpuwatchd.canary.sfu import SfuInputs

FAULTY_LANE = 5
FAULTY_SM = 3
# Bits 4, 13 and 24 of a 32-bit word: low and high mantissa and the lowest
# exponent bit of an fp32, several bits at once as a broken lane flips them.
MULTI_BIT_FLIP = 0x0100_2010
# Sign and top exponent bit set: a negative float of magnitude 2 or more (an
# integer word of the top quarter).
DATA_TRIGGER_BITS = 2
# Intermittent faults: this probability per call at the reference
# temperature, doubling every `DOUBLING_CELSIUS` above it (and halving below).
INTERMITTENT_PROBABILITY = 0.01
INTERMITTENT_REFERENCE_CELSIUS = 60.0
INTERMITTENT_DOUBLING_CELSIUS = 5.0
STUCK_BIT = 17
# A `once` fault (a transient of the host or the worker, not of the GPU)
# spoils this many results in a row: several canaries of one burst, so that
# one event shows as several mismatches.
ONCE_WRONG_RESULTS = 3
ALIAS_ADDRESS_BIT = 6


def flip_mask(width: int) -> int:
    return MULTI_BIT_FLIP if width == 32 else MULTI_BIT_FLIP << 32 | MULTI_BIT_FLIP


def intermittent_probability(temperature_celsius: float | None) -> float:
    if temperature_celsius is None:
        return INTERMITTENT_PROBABILITY
    excess = temperature_celsius - INTERMITTENT_REFERENCE_CELSIUS
    return min(
        1.0, INTERMITTENT_PROBABILITY * float(2.0 ** (excess / INTERMITTENT_DOUBLING_CELSIUS))
    )


class FaultyBackend:
    def __init__(
        self,
        inner: Backend,
        fault: FaultSpec,
        temperature_celsius: float | None = None,
        draw: int = 0,
    ) -> None:
        """`draw` numbers the bursts an intermittent fault is drawn for: the
        same seed, draw and calls give the same flips, and the next burst
        (a re-run, say) draws afresh."""
        self._inner = inner
        self._fault = fault
        self._temperature = temperature_celsius
        self._random = np.random.default_rng([fault.seed, 7, draw])
        self._once_left = ONCE_WRONG_RESULTS

    @property
    def info(self) -> DeviceInfo:
        return self._inner.info

    def gemm(self, fmt: NumberFormat, a: NDArray[Any], b: NDArray[Any]) -> GemmRun:
        self._process_fault()
        return self._corrupt_gemm(self._inner.gemm(fmt, a, b), full_mantissa=False)

    def random_gemm(self, fmt: NumberFormat, shape: tuple[int, int, int], seed: int) -> GemmRun:
        self._process_fault()
        return self._corrupt_gemm(self._inner.random_gemm(fmt, shape, seed), full_mantissa=True)

    def _corrupt_gemm(self, run: GemmRun, full_mantissa: bool) -> GemmRun:
        output = run.output.fetch()
        corrupted = self._corrupt(output, self._gemm_units(output), full_mantissa)
        return GemmRun(output=HostOutput(corrupted), seconds=run.seconds)

    def gemm_repeat(
        self, fmt: NumberFormat, shape: tuple[int, int, int], seed: int, repeats: int
    ) -> BurnRun:
        self._process_fault()
        run = self._inner.gemm_repeat(fmt, shape, seed, repeats)
        output = run.output.fetch()
        units = self._gemm_units(output)
        first = self._corrupt(output, units, full_mantissa=True)
        # Every product is corrupted afresh: a consistent fault the same way
        # each time, an intermittent one by its own draw.
        differing = sum(
            not np.array_equal(as_bits(self._corrupt(output, units, True)), as_bits(first))
            for _ in range(repeats - 1)
        )
        return BurnRun(HostOutput(first), run.differing + differing, run.seconds)

    def _gemm_units(self, output: NDArray[Any]) -> NDArray[Any]:
        """The SM each output element is taken to come from (blocks in turn)."""
        sm_count = self._inner.info.sm_count or 1
        return (np.arange(output.size) // THREADS_PER_BLOCK) % sm_count

    def int_chain(self, inputs: IntChainInputs) -> ThreadRun:
        self._process_fault()
        return self._corrupt_threads(self._inner.int_chain(inputs))

    def fma_chain(self, inputs: FmaChainInputs) -> ThreadRun:
        self._process_fault()
        return self._corrupt_threads(self._inner.fma_chain(inputs))

    def convert(self, inputs: ConvertInputs) -> ThreadRun:
        self._process_fault()
        return self._corrupt_threads(self._inner.convert(inputs))

    def sfu(self, inputs: SfuInputs) -> ThreadRun:
        self._process_fault()
        return self._corrupt_threads(self._inner.sfu(inputs))

    def mma(self, inputs: MmaInputs) -> ThreadRun:
        self._process_fault()
        return self._corrupt_threads(self._inner.mma(inputs))

    def _corrupt_threads(self, run: ThreadRun) -> ThreadRun:
        values = self._corrupt(run.values.fetch(), run.element_units, full_mantissa=False)
        return ThreadRun(values=HostOutput(values), units=run.units)

    def memory(self, words: int) -> MemoryRegion:
        self._process_fault()
        region = self._inner.memory(words)
        if self._fault.mode in ("stuck_bit", "address_alias"):
            return FaultyRegion(region, self._fault)
        return region

    def free_memory_bytes(self) -> int | None:
        return self._inner.free_memory_bytes()

    def device_seconds(self) -> float:
        return self._inner.device_seconds()

    def release(self) -> int | None:
        return self._inner.release()

    def _process_fault(self) -> None:
        mode = self._fault.mode
        if mode == "hang":
            threading.Event().wait()
        elif mode == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "error":
            raise BackendError("simulated CUDA error: an illegal memory access was encountered")

    def _positions(self, size: int) -> np.random.Generator:
        """The same positions for the same seed and output size, every run."""
        return np.random.default_rng([self._fault.seed, size])

    def _corrupt(
        self, values: NDArray[Any], units: NDArray[Any], full_mantissa: bool
    ) -> NDArray[Any]:
        """`values` as the fault leaves them; `full_mantissa`: they are a
        full-mantissa GEMM's (the only outputs `random_gemm_lsb` spoils)."""
        output = np.array(values, copy=True)
        bits = as_bits(output).reshape(-1)
        width = bits.dtype.itemsize * 8
        mask = bits.dtype.type(flip_mask(width))
        mode = self._fault.mode
        index = np.arange(bits.size)
        if mode == "lane":
            bits[index % LANES == FAULTY_LANE] ^= mask
        elif mode == "sm":
            bits[np.asarray(units).reshape(-1) == FAULTY_SM] ^= mask
        elif mode == "consistent":
            bits[self._positions(bits.size).integers(bits.size)] ^= mask
        elif mode == "data":
            top = bits >> bits.dtype.type(width - DATA_TRIGGER_BITS)
            bits[top == (1 << DATA_TRIGGER_BITS) - 1] ^= mask
        elif mode == "intermittent":
            if self._random.random() < intermittent_probability(self._temperature):
                bits[self._random.integers(bits.size)] ^= mask
        elif mode == "lsb" or (mode == "random_gemm_lsb" and full_mantissa):
            bits[self._positions(bits.size).integers(bits.size)] ^= bits.dtype.type(1)
        elif mode == "once" and self._once_left > 0:
            self._once_left -= 1
            bits[self._positions(bits.size).integers(bits.size)] ^= mask
        return output


class FaultyRegion:
    """An HBM region with one bad cell: after every write, the cell is
    rewritten as the fault would have left it."""

    def __init__(self, inner: MemoryRegion, fault: FaultSpec) -> None:
        self._inner = inner
        self._fault = fault
        self._victim = int(np.random.default_rng([fault.seed, inner.words]).integers(inner.words))
        self._aggressor = self._victim ^ (1 << ALIAS_ADDRESS_BIT)
        if self._aggressor >= inner.words:
            self._aggressor = self._victim

    @property
    def words(self) -> int:
        return self._inner.words

    def fill(self, pattern: Pattern, start: int, stop: int) -> None:
        self._inner.fill(pattern, start, stop)
        if self._fault.mode == "stuck_bit" and start <= self._victim < stop:
            self.poke(self._victim, self.peek(self._victim))
        elif self._fault.mode == "address_alias" and start <= self._aggressor < stop:
            # The victim's address decodes to the aggressor's cell: it reads
            # whatever was last written there.
            self._inner.poke(self._victim, self._inner.peek(self._aggressor))

    def verify(self, pattern: Pattern, start: int, stop: int) -> Comparison:
        return self._inner.verify(pattern, start, stop)

    def agrees(self, pattern: Pattern, start: int, stop: int) -> bool:
        return self._inner.agrees(pattern, start, stop)

    def peek(self, index: int) -> int:
        return self._inner.peek(index)

    def poke(self, index: int, value: int) -> None:
        if self._fault.mode == "stuck_bit" and index == self._victim:
            value &= ~(1 << STUCK_BIT)
        self._inner.poke(index, value)
