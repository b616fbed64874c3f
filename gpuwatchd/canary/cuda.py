"""The CUDA backend: the canary suite on an NVIDIA GPU through CuPy.

CuPy is an optional extra (`gpuwatchd[cuda]`) imported here only, when a
backend is opened. GEMMs go through cublasGemmEx with the operand type and
compute type of each format, so fp16, bf16 and tf32 run on the tensor cores
(HMMA), fp32 (pedantic: no TF32 shortcut) on the FP32 units and fp64 on the
FP64 tensor cores (DMMA) of Ampere and later, all with an fp32 (fp64) output.
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
Only reads the GPU's state and runs work on it: it changes no setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpuwatchd.canary.backend import BackendError, BurnRun, DeviceInfo, GemmRun, ThreadRun
from gpuwatchd.canary.chains import (
    CUDA_SOURCE,
    THREADS_PER_BLOCK,
    FmaChainInputs,
    IntChainInputs,
)
from gpuwatchd.canary.convert import CUDA_SOURCE as CONVERT_SOURCE
from gpuwatchd.canary.convert import WORDS_PER_THREAD, ConvertInputs
from gpuwatchd.canary.formats import NumberFormat, bf16_bits
from gpuwatchd.canary.memory import ArrayRegion, MemoryRegion
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
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
CUBLAS_GEMM_DEFAULT = -1

# Format -> (operand type, compute type).
GEMM_TYPES: Mapping[str, tuple[int, int]] = MappingProxyType(
    {
        "fp16": (CUDA_R_16F, CUBLAS_COMPUTE_32F),
        "bf16": (CUDA_R_16BF, CUBLAS_COMPUTE_32F),
        "tf32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32),
        "fp32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC),
        "fp64": (CUDA_R_64F, CUBLAS_COMPUTE_64F),
    }
)


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
        self._module = cupy.RawModule(code=CUDA_SOURCE)
        self._convert_module = cupy.RawModule(code=CONVERT_SOURCE)
        self._sfu_module = cupy.RawModule(code=SFU_SOURCE)
        # Compiled on first use, each on its own (mma.py).
        self._mma_modules: dict[str, Any] = {}

    @property
    def info(self) -> DeviceInfo:
        return self._info

    def gemm(self, fmt: NumberFormat, a: NDArray[Any], b: NDArray[Any]) -> GemmRun:
        cp = self._cp
        device_a, device_b = cp.asarray(_host_operand(fmt, a)), cp.asarray(_host_operand(fmt, b))
        output = cp.empty((a.shape[0], b.shape[1]), dtype=fmt.output_dtype)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        self._gemm_into(fmt, device_a, device_b, output)
        stop.record()
        stop.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, stop) / 1000.0
        return GemmRun(output=cp.asnumpy(output), seconds=seconds)

    def gemm_repeat(
        self, fmt: NumberFormat, a: NDArray[Any], b: NDArray[Any], repeats: int
    ) -> BurnRun:
        cp = self._cp
        device_a, device_b = cp.asarray(_host_operand(fmt, a)), cp.asarray(_host_operand(fmt, b))
        first = cp.empty((a.shape[0], b.shape[1]), dtype=fmt.output_dtype)
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
        seconds = cp.cuda.get_elapsed_time(start, stop) / 1000.0
        return BurnRun(output=cp.asnumpy(first), differing=int(differing), seconds=seconds)

    def _gemm_into(self, fmt: NumberFormat, device_a: Any, device_b: Any, output: Any) -> None:
        (m, k), n = device_a.shape, device_b.shape[1]
        operand_type, compute_type = GEMM_TYPES[fmt.name]
        wide = fmt.output_dtype == np.float64
        scale = np.float64 if compute_type == CUBLAS_COMPUTE_64F else np.float32
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
        start, multipliers, addends = (cp.asarray(table.astype(dtype)) for table in tables)
        values = cp.empty(threads, dtype=dtype)
        first_sm, last_sm = cp.empty(threads, dtype=cp.uint32), cp.empty(threads, dtype=cp.uint32)
        self._launch(
            self._module.get_function(kernel),
            threads,
            (
                start,
                multipliers,
                addends,
                np.int32(multipliers.size),
                np.int32(threads),
                values,
                first_sm,
                last_sm,
            ),
        )
        return ThreadRun(values=cp.asnumpy(values), units=self._placed(first_sm, last_sm))

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
        words = cp.empty(threads * WORDS_PER_THREAD, dtype=cp.uint32)
        first_sm, last_sm = cp.empty(threads, dtype=cp.uint32), cp.empty(threads, dtype=cp.uint32)
        single, double = cp.asarray(inputs.single), cp.asarray(inputs.double)
        kernel = self._convert_module.get_function("convert")
        self._launch(kernel, threads, (single, double, np.int32(threads), words, first_sm, last_sm))
        values = cp.asnumpy(words).reshape(threads, WORDS_PER_THREAD)
        return ThreadRun(values=values, units=self._placed(first_sm, last_sm))

    def sfu(self, inputs: SfuInputs) -> ThreadRun:
        cp = self._cp
        threads = inputs.angle.size
        out = cp.empty((threads, len(SFU_FUNCTIONS)), dtype=cp.float32)
        first_sm, last_sm = cp.empty(threads, dtype=cp.uint32), cp.empty(threads, dtype=cp.uint32)
        tables = (cp.asarray(t) for t in (inputs.angle, inputs.scale, inputs.power))
        kernel = self._sfu_module.get_function("sfu")
        self._launch(kernel, threads, (*tables, np.int32(threads), out, first_sm, last_sm))
        return ThreadRun(values=cp.asnumpy(out), units=self._placed(first_sm, last_sm))

    def mma(self, inputs: MmaInputs) -> ThreadRun:
        cp = self._cp
        name = inputs.fmt.name
        if name not in self._mma_modules:
            self._mma_modules[name] = cp.RawModule(code=mma_source(name))
        kernel = self._mma_modules[name].get_function(f"mma_{name}")
        threads = inputs.threads
        out = cp.empty((threads, C_WORDS), dtype=inputs.fmt.output)
        first_sm, last_sm = cp.empty(threads, dtype=cp.uint32), cp.empty(threads, dtype=cp.uint32)
        args = (
            cp.asarray(inputs.a),
            cp.asarray(inputs.b),
            np.int32(inputs.tiles_n),
            np.int32(inputs.warps),
            out,
            first_sm,
            last_sm,
        )
        self._launch(kernel, threads, args)
        return ThreadRun(values=cp.asnumpy(out), units=self._placed(first_sm, last_sm))

    def int_chain(self, inputs: IntChainInputs) -> ThreadRun:
        tables = (inputs.start, inputs.multipliers, inputs.addends)
        return self._threads("int_chain", inputs.start.size, *tables, dtype=np.uint32)

    def fma_chain(self, inputs: FmaChainInputs) -> ThreadRun:
        tables = (inputs.start, inputs.multipliers, inputs.addends)
        kernel = f"fma_chain_{inputs.fmt.name}"
        return self._threads(kernel, inputs.start.size, *tables, dtype=inputs.fmt.dtype)

    def memory(self, words: int) -> MemoryRegion:
        return ArrayRegion(self._cp, words, self._cp.asnumpy)

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
