"""Device memory of the fake: NumPy arrays, reachable by their address as
cuBLAS reaches them (`array.data.ptr`), allocated from a pool that keeps
freed blocks as CuPy's does (cupy/cuda/memory.pyx: MemoryPool keeps a freed
block for reuse until free_all_blocks; total_bytes counts what it holds,
used and kept, in 512-byte units), with every copy between host and device
recorded (TRANSFERS) and the host CPU the emulated device spends counted
apart (device_process_seconds): what a GPU would do is no host work of
gpuwatchd's."""

from __future__ import annotations

import time
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

# Weakly: an allocation nobody holds is freed, as on a device.
_BY_ADDRESS: weakref.WeakValueDictionary[int, DeviceArray] = weakref.WeakValueDictionary()
# The type an allocation was last viewed as (cupy's view: the same memory,
# which cuBLAS reads in the type its caller names).
_VIEWED_AS: dict[int, np.dtype[Any]] = {}
# ("h2d" or "d2h", bytes) of every copy, in order.
TRANSFERS: list[tuple[str, int]] = []
# What reached the device, in order: ("event", its number) as one is
# recorded, ("h2d" or "d2h", bytes) for a copy, ("work", 0) for a kernel,
# a cuBLAS call or an array operation; and the (start, stop) event numbers
# whose elapsed time was read. Together: which device work events bracket.
TIMELINE: list[tuple[str, int]] = []
ELAPSED: list[tuple[int, int]] = []
ROUNDING = 512


class _Device:
    """What the emulated device has spent of the host's CPU, and its depth
    of nested device calls (a kernel that uses array operations counts once)."""

    process_seconds = 0.0
    depth = 0


@contextmanager
def device_work() -> Iterator[None]:
    if _Device.depth == 0:
        TIMELINE.append(("work", 0))
    _Device.depth += 1
    start = time.process_time()
    try:
        yield
    finally:
        _Device.depth -= 1
        if _Device.depth == 0:
            _Device.process_seconds += time.process_time() - start


def device_process_seconds() -> float:
    """Host CPU seconds spent emulating the device so far."""
    return _Device.process_seconds


class MemoryPool:
    def __init__(self) -> None:
        self._used = 0
        self._kept: Counter[int] = Counter()
        # The most it ever held (not CuPy's: what tests read of the device).
        self.peak = 0

    def allocate(self, nbytes: int) -> int:
        size = -(-max(nbytes, 1) // ROUNDING) * ROUNDING
        if self._kept[size]:
            self._kept[size] -= 1
        self._used += size
        self.peak = max(self.peak, self.total_bytes())
        return size

    def release(self, size: int) -> None:
        self._used -= size
        self._kept[size] += 1

    def used_bytes(self) -> int:
        return self._used

    def total_bytes(self) -> int:
        return self._used + sum(size * count for size, count in self._kept.items())

    def free_all_blocks(self) -> None:
        self._kept.clear()


POOL = MemoryPool()


class _Pointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class DeviceArray(np.ndarray):
    @property
    def data(self) -> Any:  # type: ignore[override]
        return _Pointer(int(self.ctypes.data))

    def view(self, *args: Any, **kwargs: Any) -> Any:
        viewed = super().view(*args, **kwargs)
        address = int(self.ctypes.data)
        if isinstance(viewed, DeviceArray) and address in _BY_ADDRESS:
            _VIEWED_AS[address] = viewed.dtype
        return viewed

    def __setitem__(self, key: Any, value: Any) -> None:
        with device_work():
            super().__setitem__(key, value)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        plain = [x.view(np.ndarray) if isinstance(x, DeviceArray) else x for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(
                o.view(np.ndarray) if isinstance(o, DeviceArray) else o for o in out
            )
        with device_work():
            result = getattr(ufunc, method)(*plain, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        if isinstance(result, np.ndarray) and result.ndim > 0:
            return register(result.view(DeviceArray))
        return result


def register(array: DeviceArray) -> DeviceArray:
    """A new allocation: reachable by address, taken from the pool until freed."""
    address = int(array.ctypes.data)
    _BY_ADDRESS[address] = array
    size = POOL.allocate(array.nbytes)
    weakref.finalize(array, _free, address, size)
    return array


def _free(address: int, size: int) -> None:
    _VIEWED_AS.pop(address, None)
    POOL.release(size)


def at(address: int) -> np.ndarray:
    """The allocation that starts at `address` (cuBLAS gets no other kind),
    in the type it was last viewed as."""
    if address not in _BY_ADDRESS:
        raise ValueError(f"fake CuPy: {address:#x} is not the start of a device allocation")
    array = _BY_ADDRESS[address].view(np.ndarray)
    viewed = _VIEWED_AS.get(address)
    return array if viewed is None else array.view(viewed)
