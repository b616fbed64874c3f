"""cupy_backends.cuda.libs.cublas of the fake: gemmEx checked as cuBLAS
would take it.

CuPy 13's binding (cupy_backends/cuda/libs/cublas.pyx:1426-1454):
gemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype,
ldb, beta, C, Ctype, ldc, computeType, algo), pointers as integers; a
computeType >= 64 is a cublasComputeType_t (cublas_api.h: 68 32F, 69
32F_PEDANTIC, 70 64F, 71 64F_PEDANTIC, 77 32F_FAST_TF32). Column-major, as cuBLAS. The type
combinations are those of cublasGemmEx's table in the cuBLAS guide.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from cupy._memory import at, device_work
from cupy.cuda import device

CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14
_STORAGE = {
    CUDA_R_32F: np.float32,
    CUDA_R_64F: np.float64,
    CUDA_R_16F: np.float16,
    CUDA_R_16BF: np.uint16,
}
# computeType -> (scale type of alpha/beta, allowed (A/B type, C type) pairs).
_COMPUTE = {
    68: (
        ctypes.c_float,
        {
            (CUDA_R_16F, CUDA_R_32F),
            (CUDA_R_16BF, CUDA_R_32F),
            (CUDA_R_32F, CUDA_R_32F),
            (CUDA_R_16F, CUDA_R_16F),
            (CUDA_R_16BF, CUDA_R_16BF),
        },
    ),
    69: (
        ctypes.c_float,
        {(CUDA_R_16F, CUDA_R_32F), (CUDA_R_16BF, CUDA_R_32F), (CUDA_R_32F, CUDA_R_32F)},
    ),
    77: (ctypes.c_float, {(CUDA_R_32F, CUDA_R_32F)}),
    70: (ctypes.c_double, {(CUDA_R_64F, CUDA_R_64F)}),
    71: (ctypes.c_double, {(CUDA_R_64F, CUDA_R_64F)}),
}
CALLS: list[dict[str, Any]] = []


def getVersion(handle: int) -> int:
    return 120401


def _values(address: int, kind: int) -> np.ndarray:
    array = np.asarray(at(address)).view(np.ndarray)
    if array.dtype != _STORAGE[kind]:
        raise TypeError(f"cuBLAS type {kind} given a {array.dtype} buffer")
    if kind == CUDA_R_16BF:
        return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return array.astype(np.float64)


def _matrix(address: int, kind: int, rows: int, cols: int, ld: int) -> np.ndarray:
    if ld < max(1, rows):
        raise ValueError(f"leading dimension {ld} < rows {rows}")
    flat = _values(address, kind).reshape(-1)
    if flat.size < ld * (cols - 1) + rows:
        raise ValueError(f"a {rows}x{cols} matrix (ld {ld}) overruns a {flat.size}-element buffer")
    step = flat.strides[0]
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (step, ld * step)).copy()


def gemmEx(
    handle: int,
    transa: int,
    transb: int,
    m: int,
    n: int,
    k: int,
    alpha: int,
    A: int,
    Atype: int,
    lda: int,
    B: int,
    Btype: int,
    ldb: int,
    beta: int,
    C: int,
    Ctype: int,
    ldc: int,
    computeType: int,
    algo: int,
) -> None:
    if handle != device.CUBLAS_HANDLE:
        raise ValueError("CUBLAS_STATUS_NOT_INITIALIZED: not this device's handle")
    if (transa, transb) != (0, 0):
        raise ValueError("the fake takes CUBLAS_OP_N only")
    if not all(isinstance(v, int) and v > 0 for v in (m, n, k)):
        raise ValueError(f"m, n, k must be positive ints: {m, n, k}")
    if (
        computeType not in _COMPUTE
        or Atype != Btype
        or (Atype, Ctype) not in _COMPUTE[computeType][1]
    ):
        raise ValueError(f"CUBLAS_STATUS_NOT_SUPPORTED: {Atype, Btype, Ctype, computeType}")
    scale = _COMPUTE[computeType][0]
    a_, b_ = scale.from_address(alpha).value, scale.from_address(beta).value
    out = at(C)
    if out.dtype != _STORAGE[Ctype] or ldc < m or out.size < ldc * (n - 1) + m:
        raise ValueError("C does not fit the output")
    with device_work():
        left = _matrix(A, Atype, m, k, lda)
        right = _matrix(B, Btype, k, n, ldb)
        # Accumulated in the output's precision, as the tensor cores do (the
        # exact GEMMs are exact in it; a wider sum would hide nothing).
        wide = _STORAGE[Ctype] == np.float64
        accumulator = np.float64 if wide else np.float32
        result = a_ * (left.astype(accumulator) @ right.astype(accumulator))
        flat = out.view(np.ndarray).reshape(-1)
        if ldc == m:
            flat[: m * n] = (result + b_ * 0).T.reshape(-1)
        else:
            for column in range(n):
                flat[column * ldc : column * ldc + m] = result[:, column] + b_ * 0
    CALLS.append({"m": m, "n": n, "k": k, "types": (Atype, Ctype, computeType), "algo": algo})
