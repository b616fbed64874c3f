"""Fake CuPy: host NumPy arrays standing in for device arrays (see README.md)."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from cupy import cuda
from cupy._memory import (
    POOL,
    TIMELINE,
    TRANSFERS,
    DeviceArray,
    MemoryPool,
    device_process_seconds,
    device_work,
    register,
)

__version__ = "13.6.0"
# Not CuPy: what measures the host's work takes the emulated device's off.
FAKE = True
__all__ = ["FAKE", "device_process_seconds"]
int32 = np.int32
float16 = np.float16
float32 = np.float32
float64 = np.float64
uint16 = np.uint16
uint32 = np.uint32
uint64 = np.uint64


def get_default_memory_pool() -> MemoryPool:
    return POOL


def asarray(values: Any, dtype: Any = None) -> DeviceArray:
    if isinstance(values, DeviceArray):
        with device_work():
            copied = np.array(values.view(np.ndarray), dtype=dtype, copy=True)
        return register(copied.view(DeviceArray))
    array = np.array(values, dtype=dtype, copy=True)
    TRANSFERS.append(("h2d", array.nbytes))
    TIMELINE.append(("h2d", array.nbytes))
    return register(array.view(DeviceArray))


def empty(shape: Any, dtype: Any = float) -> DeviceArray:
    return register(np.empty(shape, dtype=dtype).view(DeviceArray))


def empty_like(array: Any) -> DeviceArray:
    return empty(array.shape, dtype=array.dtype)


def zeros(shape: Any, dtype: Any = float) -> DeviceArray:
    with device_work():
        return register(np.zeros(shape, dtype=dtype).view(DeviceArray))


def arange(*args: Any, dtype: Any = None) -> DeviceArray:
    with device_work():
        return register(np.arange(*args, dtype=dtype).view(DeviceArray))


def flatnonzero(array: Any) -> DeviceArray:
    with device_work():
        return register(np.flatnonzero(array.view(np.ndarray)).view(DeviceArray))


def count_nonzero(array: Any) -> Any:
    with device_work():
        return np.count_nonzero(array.view(np.ndarray))


def asnumpy(array: Any) -> np.ndarray:
    host = np.array(array, copy=True).view(np.ndarray)
    if isinstance(array, DeviceArray):
        TRANSFERS.append(("d2h", host.nbytes))
        TIMELINE.append(("d2h", host.nbytes))
    return host


# `extern "C" __global__ void name(params)`: the kernels' C signatures.
_KERNEL = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)')
_POINTEE = {
    "unsigned short": np.uint16,
    "unsigned int": np.uint32,
    "unsigned long long": np.uint64,
    "int": np.int32,
    "float": np.float32,
    "double": np.float64,
}


_SCALARS = {"int": np.int32, "unsigned long long": np.uint64}


def _signature(params: str) -> list[tuple[str, Any]]:
    """(kind, dtype) per parameter: ("pointer", dtype) or ("scalar", dtype)."""
    parsed = []
    for param in params.split(","):
        base = param.replace("const", "").strip().rsplit(" ", 1)[0].strip()
        if base.endswith("*"):
            parsed.append(("pointer", _POINTEE[base.rstrip("*").strip()]))
        elif base in _SCALARS:
            parsed.append(("scalar", _SCALARS[base]))
        else:
            raise TypeError(f"fake CuPy: unsupported kernel parameter {param!r}")
    return parsed


class RawModule:
    """cupy.RawModule(code=...): compiled with NVRTC on first use, and the
    binary cached on disk like every CuPy compile (cupy/cuda/compiler.py:
    501 `~/.cupy/kernel_cache` unless CUPY_CACHE_DIR; 589-593 makedirs of
    the directory unless CUPY_CACHE_IN_MEMORY is set)."""

    def __init__(self, code: str) -> None:
        self._code = code
        self._kernels = {name: _signature(params) for name, params in _KERNEL.findall(code)}
        self._compiled = False

    def get_function(self, name: str) -> _Kernel:
        if not self._compiled:
            _cache_compile(self._code)
            self._compiled = True
        if name not in self._kernels:
            raise cuda.CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found: {name}")
        return _Kernel(name, self._kernels[name])


def _cache_compile(code: str) -> None:
    if os.environ.get("CUPY_CACHE_IN_MEMORY"):
        return
    directory = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{abs(hash(code)):x}.cubin"), "wb") as handle:
        handle.write(code.encode())


class _Kernel:
    def __init__(self, name: str, signature: list[tuple[str, Any]]) -> None:
        self.name = name
        self._signature = signature

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]
    ) -> None:
        if len(args) != len(self._signature):
            raise TypeError(f"{self.name} takes {len(self._signature)} arguments, not {len(args)}")
        for position, (arg, (kind, dtype)) in enumerate(zip(args, self._signature, strict=True)):
            if kind == "pointer" and not (isinstance(arg, DeviceArray) and arg.dtype == dtype):
                raise TypeError(
                    f"{self.name} argument {position}: expected a {np.dtype(dtype)} array"
                )
            # CuPy passes a Python int as a 64-bit value: only a NumPy scalar
            # of the parameter's own width is safe.
            if kind == "scalar" and not isinstance(arg, dtype):
                raise TypeError(f"{self.name} argument {position}: expected {np.dtype(dtype)}")
        from cupy._kernels import launch

        with device_work():
            launch(self.name, grid[0] * block[0], block[0], args)
