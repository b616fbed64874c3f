"""What the kernels of gpuwatchd.canary.hashing.CUDA_SOURCE compute, run on
the host and written out again from the C text rather than imported, so that
the CUDA backend's operands and digests through this fake check the CPU
backend's NumPy ones: SplitMix64 (splitmix64.c: state += 0x9E37...; then the
two xor-shift-multiply steps) for the operand bits, and each format's bit
layout as the kernel's gw_*_bits functions assemble it."""

from __future__ import annotations

from typing import Any

import numpy as np

_U = np.uint64
_STEP = _U(0x9E3779B97F4A7C15)


def _splitmix(key: int, count: int) -> np.ndarray:
    """SplitMix64's first `count` outputs from state `key`."""
    state = _U(key) + np.arange(1, count + 1, dtype=_U) * _STEP
    state = (state ^ (state >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    state = (state ^ (state >> _U(27))) * _U(0x94D049BB133111EB)
    return state ^ (state >> _U(31))


def _field(word: np.ndarray, shift: int, bits: int) -> np.ndarray:
    return (word >> _U(shift)) & _U((1 << bits) - 1)


def _float_bits(word: np.ndarray, mantissa: int, exponent_base: int, sign_at: int) -> np.ndarray:
    low = word & _U(0xFFFFFFFF)
    return (
        _field(low, 31, 1) << _U(sign_at)
        | (_field(low, mantissa, 3) + _U(exponent_base)) << _U(mantissa)
        | _field(low, 0, mantissa)
    )


def operand(name: str, key: int, n: int, out: Any) -> None:
    word = _splitmix(key, n)
    if name == "fp16":
        bits = _float_bits(word, 10, 7, 15)
    elif name == "bf16":
        bits = _float_bits(word, 7, 119, 15)
    elif name == "fp32":
        bits = _float_bits(word, 23, 119, 31)
    elif name == "tf32":
        bits = _float_bits(word, 23, 119, 31) & ~_U(0x1FFF)
    else:
        bits = _field(word, 63, 1) << _U(63) | (_field(word, 52, 3) + _U(1015)) << _U(52)
        bits |= _field(word, 0, 52)
    out[:n] = bits.astype(out.dtype)


def digest(words: Any, n: int, signless_zero: int, width: int, lanes: Any) -> None:
    wide = np.asarray(words[:n]).astype(_U)
    if signless_zero:
        wide[wide == _U(1 << (width - 1))] = 0
    with np.errstate(over="ignore"):
        for lane, key in enumerate((0x243F6A8885A308D3, 0x13198A2E03707344)):
            folded = wide ^ _splitmix(key, n)
            folded = (folded ^ (folded >> _U(30))) * _U(0xBF58476D1CE4E5B9)
            folded = (folded ^ (folded >> _U(27))) * _U(0x94D049BB133111EB)
            folded ^= folded >> _U(31)
            lanes[lane] += folded.sum(dtype=_U)
