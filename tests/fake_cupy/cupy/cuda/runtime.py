"""cupy.cuda.runtime of the fake: an H100 SXM, driver 12.4."""

from __future__ import annotations

from typing import Any

# CUDA's device UUID, with a 0x00 byte: CuPy 13's getDeviceProperties
# converts the char[16] with __Pyx_PyBytes_FromString, which stops at the
# first NUL (cupy_backends/cuda/api/runtime.pyx:317), so `uuid` comes back
# short; gpuwatchd takes UUIDs from NVML.
UUID = bytes.fromhex("3f2c9a10007b4e2d9c1a5b6e7f809112")
TOTAL = 80 * 1024**3


class CUDARuntimeError(RuntimeError):
    pass


def getDeviceCount() -> int:
    return 1


def getDeviceProperties(ordinal: int) -> dict[str, Any]:
    return {
        "name": b"NVIDIA H100 80GB HBM3",
        "multiProcessorCount": 132,
        "major": 9,
        "minor": 0,
        "uuid": UUID.split(b"\x00", 1)[0],
    }


def driverGetVersion() -> int:
    return 12040


def runtimeGetVersion() -> int:
    return 12040


# What the context itself takes (a real one: a few hundred MiB).
CONTEXT = 1024**3


def memGetInfo() -> tuple[int, int]:
    from cupy._memory import POOL

    return TOTAL - CONTEXT - POOL.total_bytes(), TOTAL
