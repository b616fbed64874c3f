"""The CUDA backend: the canary suite on an NVIDIA GPU through CuPy.

CuPy is an optional extra (`gpuwatchd[cuda]`) imported here only, when a
backend is opened. GEMMs go through cublasGemmEx with the operand type and
compute type of each format, so fp16, bf16 and tf32 run on the tensor cores
(HMMA), fp32 (pedantic: no TF32 shortcut) on the FP32 units and fp64
(pedantic: no emulation of FP64 by lower-precision units) on the FP64
tensor cores (DMMA) of Ampere and later, all with an fp32 (fp64) output.
The full-mantissa GEMMs' operands are made on the GPU by the kernels of
hashing.py, and every output is digested there: in the common path only
digests, the chains' SM placements and the SFU results cross PCIe (an
output comes back only when its digest is not the known answer's).
The digest scope (`environment`) holds what cuBLAS's choice of algorithm,
and so a full-mantissa result, depends on: the model, its SM count, the
driver, runtime, cuBLAS and CuPy versions and the handle's math mode; the
worker's environment (CUBLAS_WORKSPACE_CONFIG, NVIDIA_TF32_OVERRIDE) is
pinned by the runner. The GPU's UUID is NVML's (the runner's): CuPy 13's
`uuid` property stops at the first NUL byte of the UUID. The chains are
RawKernels from chains.CUDA_SOURCE that record each thread's %smid at its
start and end, and so do the conversion kernel of convert.py, the
transcendentals of sfu.py and the tensor-core tile kernels of mma.py (each
compiled on its first use); the HBM test is memory.ArrayRegion over CuPy.

Every call's device work, copies included, is bracketed by CUDA events on
the stream (`device_seconds`: what the GPU spent, which the duty budget
charges; host work is done before the bracket opens). `release` gives the
memory pool's blocks back after each canary, so a burst holds at most one
canary's memory (CuPy's pool keeps freed blocks until told).
Only reads the GPU's state and runs work on it: it changes no setting.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary import hashing
from gpuwatchd.canary.backend import (
    BackendError,
    BurnRun,
    DeviceInfo,
    GemmRun,
    ThreadRun,
)
from gpuwatchd.canary.chains import (
    CUDA_SOURCE,
    THREADS_PER_BLOCK,
    FmaChainInputs,
    IntChainInputs,
)
from gpuwatchd.canary.convert import CUDA_SOURCE as CONVERT_SOURCE
from gpuwatchd.canary.convert import WORDS_PER_THREAD, ConvertInputs
from gpuwatchd.canary.formats import NumberFormat, bf16_bits
from gpuwatchd.canary.memory import ArrayRegion, MemoryRegion, TimedRegion
from gpuwatchd.canary.mma import C_WORDS, MmaInputs
from gpuwatchd.canary.mma import cuda_source as mma_source
from gpuwatchd.canary.sfu import CUDA_SOURCE as SFU_SOURCE
from gpuwatchd.canary.sfu import FUNCTIONS as SFU_FUNCTIONS
from gpuwatchd.canary.sfu import SfuInputs

# cuBLAS and CUDA enum values (cublas_api.h, library_types.h); CuPy's own
# names for them have moved between releases.
CUBLAS_OP_N = 0
CUDA_R_32F = 0
CUDA_R_64F = 1
CUDA_R_16F = 2
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_PEDANTIC = 69
CUBLAS_COMPUTE_64F = 70
CUBLAS_COMPUTE_64F_PEDANTIC = 71
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
CUBLAS_GEMM_DEFAULT = -1

# Format -> (operand type, compute type).
GEMM_TYPES: Mapping[str, tuple[int, int]] = MappingProxyType(
    {
        "fp16": (CUDA_R_16F, CUBLAS_COMPUTE_32F),
        "bf16": (CUDA_R_16BF, CUBLAS_COMPUTE_32F),
        "tf32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32),
        "fp32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC),
        "fp64": (CUDA_R_64F, CUBLAS_COMPUTE_64F_PEDANTIC),
    }
)
# The type cuBLAS reads each format's operand in, from the words the
# operand kernels write (bf16 stays raw 16-bit words: CuPy has no bf16).
OPERAND_VIEWS: Mapping[str, Any] = MappingProxyType(
    {
        "fp16": np.float16,
        "bf16": np.uint16,
        "tf32": np.float32,
        "fp32": np.float32,
        "fp64": np.float64,
    }
)
# Unsigned words of each element size (bytes): what the kernels write.
WORDS: Mapping[int, Any] = MappingProxyType({2: np.uint16, 4: np.uint32, 8: np.uint64})


def _host_operand(fmt: NumberFormat, values: NDArray[Any]) -> NDArray[Any]:
    """The operand as the device reads it (bf16 as raw 16-bit words)."""
    if fmt.name == "fp16":
        return values.astype(np.float16)
    if fmt.name == "bf16":
        return bf16_bits(values.astype(np.float32))
    if fmt.name == "fp64":
        return values.astype(np.float64)
    return values.astype(np.float32)


def _import_cupy() -> tuple[Any, Any]:
    try:
        import cupy  # type: ignore[import-not-found]
        from cupy_backends.cuda.libs import cublas  # type: ignore[import-not-found]
    except ImportError as error:
        raise BackendError(f"the cuda backend needs CuPy (gpuwatchd[cuda]): {error}") from error
    return cupy, cublas


def _name(properties: Mapping[str, Any]) -> str:
    name = properties["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


class CudaOutput:
    """An output in the GPU's memory, digested there."""

    def __init__(self, backend: CudaBackend, array: Any) -> None:
        self._backend = backend
        self._array = array

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = np.dtype(self._array.dtype)
        return dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    def digest(self, signless_zero: bool = False) -> str:
        return self._backend.digest(self._array, signless_zero)

    def fetch(self) -> NDArray[Any]:
        return self._backend.fetch(self._array)


class CudaBackend:
    def __init__(self, device: int) -> None:
        cupy, cublas = _import_cupy()
        self._cp = cupy
        self._cublas = cublas
        cupy.cuda.Device(device).use()
        runtime = cupy.cuda.runtime
        properties = runtime.getDeviceProperties(device)
        name = _name(properties)
        self._handle = cupy.cuda.device.get_cublas_handle()
        sm_count = int(properties["multiProcessorCount"])
        environment = (
            f"{name}; {sm_count} SMs; CUDA driver {runtime.driverGetVersion()}; "
            f"runtime {runtime.runtimeGetVersion()}; cuBLAS {cublas.getVersion(self._handle)}; "
            f"CuPy {cupy.__version__}; default math mode"
        )
        self._info = DeviceInfo(
            backend="cuda", name=name, uuid=None, environment=environment, sm_count=sm_count
        )
        self._pool = cupy.get_default_memory_pool()
        self._seconds = 0.0
        self._module = cupy.RawModule(code=CUDA_SOURCE)
        self._convert_module = cupy.RawModule(code=CONVERT_SOURCE)
        self._sfu_module = cupy.RawModule(code=SFU_SOURCE)
        self._hashing_module = cupy.RawModule(code=hashing.CUDA_SOURCE)
        # Compiled on first use, each on its own (mma.py).
        self._mma_modules: dict[str, Any] = {}

    @property
    def info(self) -> DeviceInfo:
        return self._info

    @contextmanager
    def _on_device(self) -> Iterator[None]:
        """Device work between two events on the stream: its time is added
        to device_seconds (copies and kernels alike)."""
        cp = self._cp
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        try:
            yield
        finally:
            stop.record()
            stop.synchronize()
            self._seconds += cp.cuda.get_elapsed_time(start, stop) / 1000.0

    def device_seconds(self) -> float:
        return self._seconds

    def release(self) -> int | None:
        held = int(self._pool.total_bytes())
        self._pool.free_all_blocks()
        return held

    def digest(self, array: Any, signless_zero: bool) -> str:
        cp = self._cp
        width = array.dtype.itemsize * 8
        words = array.reshape(-1).view(cp.uint32 if width == 32 else cp.uint64)
        with self._on_device():
            lanes = cp.zeros(2, dtype=cp.uint64)
            kernel = self._hashing_module.get_function(f"digest{width}")
            args = (words, np.int32(words.size), np.int32(signless_zero), lanes)
            kernel((hashing.blocks_for(words.size),), (hashing.BLOCK,), args)
            first, second = (int(lane) for lane in cp.asnumpy(lanes))
        return f"{first:016x}{second:016x}"

    def fetch(self, array: Any) -> NDArray[Any]:
        with self._on_device():
            host: NDArray[Any] = self._cp.asnumpy(array)
        return host

    def _timed_gemm(self, fmt: NumberFormat, device_a: Any, device_b: Any) -> GemmRun:
        cp = self._cp
        output = cp.empty((device_a.shape[0], device_b.shape[1]), dtype=fmt.output_dtype)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        self._gemm_into(fmt, device_a, device_b, output)
        stop.record()
        stop.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, stop) / 1000.0
        return GemmRun(output=CudaOutput(self, output), seconds=seconds)

    def gemm(self, fmt: NumberFormat, a: NDArray[Any], b: NDArray[Any]) -> GemmRun:
        host_a, host_b = _host_operand(fmt, a), _host_operand(fmt, b)
        with self._on_device():
            device_a, device_b = self._cp.asarray(host_a), self._cp.asarray(host_b)
            return self._timed_gemm(fmt, device_a, device_b)

    def device_operand(
        self, fmt: NumberFormat, gemm_shape: tuple[int, int, int], seed: int, operand: int
    ) -> Any:
        """A full-mantissa operand made on the GPU, in the type cuBLAS reads
        (what hashing.host_operand makes on the host, bit for bit)."""
        cp = self._cp
        m, k, n = gemm_shape
        rows, cols = (m, k) if operand == 0 else (k, n)
        key = hashing.operand_key(fmt.name, gemm_shape, seed, operand)
        words = cp.empty(rows * cols, dtype=WORDS[np.dtype(OPERAND_VIEWS[fmt.name]).itemsize])
        kernel = self._hashing_module.get_function(f"operand_{fmt.name}")
        args = (np.uint64(key), np.int32(words.size), words)
        kernel((hashing.blocks_for(words.size),), (hashing.BLOCK,), args)
        return words.view(OPERAND_VIEWS[fmt.name]).reshape(rows, cols)

    def random_gemm(self, fmt: NumberFormat, shape: tuple[int, int, int], seed: int) -> GemmRun:
        with self._on_device():
            device_a, device_b = (
                self.device_operand(fmt, shape, seed, operand) for operand in (0, 1)
            )
            return self._timed_gemm(fmt, device_a, device_b)

    def gemm_repeat(
        self, fmt: NumberFormat, shape: tuple[int, int, int], seed: int, repeats: int
    ) -> BurnRun:
        cp = self._cp
        with self._on_device():
            device_a, device_b = (
                self.device_operand(fmt, shape, seed, operand) for operand in (0, 1)
            )
            first = cp.empty((shape[0], shape[2]), dtype=fmt.output_dtype)
            later = cp.empty_like(first)
            differing = cp.zeros((), dtype=cp.int32)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            self._gemm_into(fmt, device_a, device_b, first)
            for _ in range(repeats - 1):
                # Compared on the device, without a sync: the GPU stays busy.
                self._gemm_into(fmt, device_a, device_b, later)
                differing += (later != first).any()
            stop.record()
            stop.synchronize()
            count = int(differing)
        seconds = cp.cuda.get_elapsed_time(start, stop) / 1000.0
        return BurnRun(output=CudaOutput(self, first), differing=count, seconds=seconds)

    def _gemm_into(self, fmt: NumberFormat, device_a: Any, device_b: Any, output: Any) -> None:
        (m, k), n = device_a.shape, device_b.shape[1]
        operand_type, compute_type = GEMM_TYPES[fmt.name]
        wide = fmt.output_dtype == np.float64
        scale = np.float64 if wide else np.float32
        alpha, beta = np.ones(1, dtype=scale), np.zeros(1, dtype=scale)
        # cuBLAS is column-major: the row-major C = A @ B is the column-major
        # C^T = B^T @ A^T, so B goes first and every leading dimension is a
        # row length.
        self._cublas.gemmEx(
            self._handle,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            n,
            m,
            k,
            alpha.ctypes.data,
            device_b.data.ptr,
            operand_type,
            n,
            device_a.data.ptr,
            operand_type,
            k,
            beta.ctypes.data,
            output.data.ptr,
            CUDA_R_64F if wide else CUDA_R_32F,
            n,
            compute_type,
            CUBLAS_GEMM_DEFAULT,
        )

    def _threads(self, kernel: str, threads: int, *tables: NDArray[Any], dtype: Any) -> ThreadRun:
        cp = self._cp
        host_tables = [table.astype(dtype) for table in tables]
        with self._on_device():
            start, multipliers, addends = (cp.asarray(table) for table in host_tables)
            values = cp.empty(threads, dtype=dtype)
            first_sm, last_sm = self._sm_records(threads)
            args = (start, multipliers, addends, np.int32(multipliers.size), np.int32(threads))
            self._launch(
                self._module.get_function(kernel), threads, (*args, values, first_sm, last_sm)
            )
            units = self._placed(first_sm, last_sm)
        return ThreadRun(values=CudaOutput(self, values), units=units)

    def _sm_records(self, threads: int) -> tuple[Any, Any]:
        cp = self._cp
        return cp.empty(threads, dtype=cp.uint32), cp.empty(threads, dtype=cp.uint32)

    def _placed(self, first_sm: Any, last_sm: Any) -> NDArray[np.int64]:
        """Each thread's SM; -1 for one that moved (preempted and rescheduled)."""
        first, last = (self._cp.asnumpy(sm).astype(np.int64) for sm in (first_sm, last_sm))
        return np.where(first == last, last, -1)

    def _launch(self, kernel: Any, threads: int, args: tuple[Any, ...]) -> None:
        blocks = -(-threads // THREADS_PER_BLOCK)
        kernel((blocks,), (THREADS_PER_BLOCK,), args)

    def convert(self, inputs: ConvertInputs) -> ThreadRun:
        cp = self._cp
        threads = inputs.single.size
        with self._on_device():
            words = cp.empty(threads * WORDS_PER_THREAD, dtype=cp.uint32)
            first_sm, last_sm = self._sm_records(threads)
            single, double = cp.asarray(inputs.single), cp.asarray(inputs.double)
            kernel = self._convert_module.get_function("convert")
            args = (single, double, np.int32(threads), words, first_sm, last_sm)
            self._launch(kernel, threads, args)
            units = self._placed(first_sm, last_sm)
        values = CudaOutput(self, words.reshape(threads, WORDS_PER_THREAD))
        return ThreadRun(values=values, units=units)

    def sfu(self, inputs: SfuInputs) -> ThreadRun:
        cp = self._cp
        threads = inputs.angle.size
        with self._on_device():
            out = cp.empty((threads, len(SFU_FUNCTIONS)), dtype=cp.float32)
            first_sm, last_sm = self._sm_records(threads)
            tables = (cp.asarray(t) for t in (inputs.angle, inputs.scale, inputs.power))
            kernel = self._sfu_module.get_function("sfu")
            self._launch(kernel, threads, (*tables, np.int32(threads), out, first_sm, last_sm))
            units = self._placed(first_sm, last_sm)
        return ThreadRun(values=CudaOutput(self, out), units=units)

    def mma(self, inputs: MmaInputs) -> ThreadRun:
        cp = self._cp
        name = inputs.fmt.name
        if name not in self._mma_modules:
            self._mma_modules[name] = cp.RawModule(code=mma_source(name))
        kernel = self._mma_modules[name].get_function(f"mma_{name}")
        threads = inputs.threads
        with self._on_device():
            out = cp.empty((threads, C_WORDS), dtype=inputs.fmt.output)
            first_sm, last_sm = self._sm_records(threads)
            operands = (cp.asarray(inputs.a), cp.asarray(inputs.b), cp.asarray(inputs.c))
            shape = (np.int32(inputs.tiles_n), np.int32(inputs.warps))
            self._launch(kernel, threads, (*operands, *shape, out, first_sm, last_sm))
            units = self._placed(first_sm, last_sm)
        return ThreadRun(values=CudaOutput(self, out), units=units)

    def int_chain(self, inputs: IntChainInputs) -> ThreadRun:
        tables = (inputs.start, inputs.multipliers, inputs.addends)
        return self._threads("int_chain", inputs.start.size, *tables, dtype=np.uint32)

    def fma_chain(self, inputs: FmaChainInputs) -> ThreadRun:
        tables = (inputs.start, inputs.multipliers, inputs.addends)
        kernel = f"fma_chain_{inputs.fmt.name}"
        return self._threads(kernel, inputs.start.size, *tables, dtype=inputs.fmt.dtype)

    def memory(self, words: int) -> MemoryRegion:
        with self._on_device():
            region = ArrayRegion(self._cp, words, self._cp.asnumpy)
        return TimedRegion(region, self._on_device)

    def free_memory_bytes(self) -> int | None:
        free, _total = self._cp.cuda.runtime.memGetInfo()
        return int(free)


def list_devices() -> list[tuple[int, str]]:
    """(CUDA ordinal, name) of every GPU CUDA sees, in PCI bus order when
    CUDA_DEVICE_ORDER=PCI_BUS_ID (the worker sets it)."""
    cupy, _ = _import_cupy()
    runtime = cupy.cuda.runtime
    return [
        (ordinal, _name(runtime.getDeviceProperties(ordinal)))
        for ordinal in range(runtime.getDeviceCount())
    ]
