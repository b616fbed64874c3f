"""What a canary backend does, and how the worker gets one.

A backend runs the suite's primitives on one device: a GEMM in a given input
format (of host operands, or of full-mantissa operands it makes itself from
their key, hashing.py), the per-thread chains and kernels, and an HBM region
for the pattern test. Everything else (inputs, references, comparison,
evidence) is shared code in suite.py, so the CPU backend's tests cover the
paths the CUDA backend takes.

Outputs stay where the device computed them (`DeviceOutput`): their digest
is computed there, and their values come to the host only when asked (a
digest that differs from the known answer's). The backend counts the device
time its calls took, copies included (`device_seconds`), and gives back the
memory a canary held when told (`release`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.chains import FmaChainInputs, IntChainInputs
from gpuwatchd.canary.convert import ConvertInputs
from gpuwatchd.canary.formats import NumberFormat
from gpuwatchd.canary.hashing import digest_words
from gpuwatchd.canary.memory import MemoryRegion
from gpuwatchd.canary.mma import MmaInputs
from gpuwatchd.canary.sfu import SfuInputs
from gpuwatchd.canary.spec import BackendKind


class BackendError(RuntimeError):
    """The device failed a call (a CUDA error, a missing library)."""


@dataclass(frozen=True)
class DeviceInfo:
    backend: BackendKind
    name: str
    uuid: str | None
    # Model, driver and library versions: the scope in which a full-mantissa
    # GEMM's digest is comparable. A change of any of them starts afresh.
    environment: str
    sm_count: int | None


class DeviceOutput(Protocol):
    """An output where the device keeps it."""

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    def digest(self, signless_zero: bool = False) -> str:
        """hashing.digest_words of the output, computed on the device."""
        ...

    def fetch(self) -> NDArray[Any]:
        """The values, on the host."""
        ...


class HostOutput:
    """An output that is already on the host (the CPU backend's)."""

    def __init__(self, values: NDArray[Any]) -> None:
        self.values = values

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.values.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def digest(self, signless_zero: bool = False) -> str:
        return digest_words(self.values, signless_zero)

    def fetch(self) -> NDArray[Any]:
        return self.values


@dataclass(frozen=True, eq=False)
class GemmRun:
    output: DeviceOutput
    seconds: float  # the GEMM alone, without transfers


@dataclass(frozen=True, eq=False)
class BurnRun:
    output: DeviceOutput  # the first product
    differing: int  # later products not bit-identical to the first
    seconds: float  # all of them, on the device


@dataclass(frozen=True, eq=False)
class ThreadRun:
    values: DeviceOutput  # (threads,) or (threads, words a thread)
    units: NDArray[Any]  # (threads,) the SM (GPU) or core (CPU) that ran it; -1 unknown

    @property
    def words_per_thread(self) -> int:
        return int(np.prod(self.values.shape)) // max(self.units.size, 1)

    @property
    def element_units(self) -> NDArray[Any]:
        """The unit of every output word, flat."""
        return np.repeat(np.asarray(self.units), self.words_per_thread)


class Backend(Protocol):
    @property
    def info(self) -> DeviceInfo: ...

    def gemm(self, fmt: NumberFormat, a: NDArray[Any], b: NDArray[Any]) -> GemmRun:
        """A @ B with operands in `fmt` and an fp32 (fp64 for fp64) output;
        `a` and `b` are float arrays of values representable in `fmt`."""
        ...

    def random_gemm(self, fmt: NumberFormat, shape: tuple[int, int, int], seed: int) -> GemmRun:
        """A @ B of the full-mantissa operands of (fmt, shape, seed), made on
        the device (hashing.host_operand's bits)."""
        ...

    def gemm_repeat(
        self, fmt: NumberFormat, shape: tuple[int, int, int], seed: int, repeats: int
    ) -> BurnRun:
        """random_gemm's product `repeats` times back to back on the device
        (one library call sequence, so every product must be bit-identical
        to the first)."""
        ...

    def int_chain(self, inputs: IntChainInputs) -> ThreadRun: ...

    def fma_chain(self, inputs: FmaChainInputs) -> ThreadRun: ...

    def convert(self, inputs: ConvertInputs) -> ThreadRun:
        """The conversions of convert.py, a thread per input pair."""
        ...

    def sfu(self, inputs: SfuInputs) -> ThreadRun:
        """The transcendentals of sfu.py, a thread per input triple."""
        ...

    def mma(self, inputs: MmaInputs) -> ThreadRun:
        """The tile products of mma.py, a warp per output tile."""
        ...

    def memory(self, words: int) -> MemoryRegion: ...

    def free_memory_bytes(self) -> int | None: ...

    def device_seconds(self) -> float:
        """The device time of every call so far, measured on the device
        (copies included) where the backend can: what the duty budget charges."""
        ...

    def release(self) -> int | None:
        """Give back the memory the canary since the last release held; the
        most it held (None where the backend cannot tell)."""
        ...


def open_backend(
    kind: BackendKind,
    device: int | None,
    *,
    stand_in_sm_count: int | None = None,
    name: str | None = None,
    uuid: str | None = None,
) -> Backend:
    """A CUDA backend on `device`, or the CPU backend (standing in for a GPU
    with `stand_in_sm_count` SMs, or checking the host when that is None)."""
    if kind == "cuda":
        from gpuwatchd.canary.cuda import CudaBackend

        return CudaBackend(0 if device is None else device)
    from gpuwatchd.canary.cpu import CpuBackend

    return CpuBackend(sm_count=stand_in_sm_count, name=name, uuid=uuid)
