"""The process heap handed back to the system as the daemon frees it.

glibc's malloc gives freed memory at the top of its heap back to the system
once more than M_TRIM_THRESHOLD lies free there, and raises that threshold to
the size of any large block freed (mallopt(3), "dynamic mmap threshold"). A
daemon that allocates and frees the same few MiB every poll then keeps heap
it no longer uses: measured on the 8-GPU node, its resident memory rose 1.9
MiB in steps after its history was full, with no live object more
(bench/memory.py; `malloc_trim(0)` at each measurement took the steps away).
A fixed threshold, set once at start, keeps the resident set at what the
daemon holds. Other C libraries (musl) have no mallopt: nothing to do there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# mallopt's parameter number (glibc's malloc.h) and glibc's default threshold,
# which setting it fixes: freed memory above 128 KiB at the heap's top goes back.
M_TRIM_THRESHOLD = -1
TRIM_THRESHOLD_BYTES = 128 * 1024


def return_freed_heap() -> bool:
    """Fix glibc's trim threshold; False where the C library has no mallopt."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in the C library (%s): the heap is left as it is", name)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
