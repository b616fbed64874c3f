"""Device memory of the fake: NumPy arrays, reachable by their address as
cuBLAS reaches them (`array.data.ptr`)."""

from __future__ import annotations

from typing import Any

import numpy as np

_BY_ADDRESS: dict[int, DeviceArray] = {}


class _Pointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class DeviceArray(np.ndarray):
    @property
    def data(self) -> Any:  # type: ignore[override]
        return _Pointer(int(self.ctypes.data))


def register(array: DeviceArray) -> DeviceArray:
    _BY_ADDRESS[int(array.ctypes.data)] = array
    return array


def at(address: int) -> DeviceArray:
    """The allocation that starts at `address` (cuBLAS gets no other kind)."""
    if address not in _BY_ADDRESS:
        raise ValueError(f"fake CuPy: {address:#x} is not the start of a device allocation")
    return _BY_ADDRESS[address]
