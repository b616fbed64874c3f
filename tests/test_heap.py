"""The daemon fixes glibc's trim threshold at start (gpuwatchd/heap.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from gpuwatchd import heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_glibc_takes_the_fixed_trim_threshold() -> None:
    assert heap.return_freed_heap() is True


def test_a_c_library_without_mallopt_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMallopt:
        def __init__(self, name: str | None) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libc.musl-x86_64.so.1")
    assert heap.return_freed_heap() is False
