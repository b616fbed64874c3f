"""What the kernels of gpuwatchd.canary.chains.CUDA_SOURCE compute, run on
the host: the same recurrences and conversions as the CPU backend, with
`%smid` the block's SM in a round-robin placement; and the mma.py kernels,
whose `mma.sync.aligned.m16n8k32` is emulated here from the PTX ISA's own
fragment tables (9.7.14.5, "Matrix Fragments for mma.m16n8k32", 8-bit
.s8/.e4m3 operands, .s32/.f32 accumulators), written out independently of
gpuwatchd's packing so that each checks the other's reading of them."""

from __future__ import annotations

from typing import Any

import numpy as np

from cupy import _hashing
from cupy.cuda import runtime
from gpuwatchd.canary.chains import (
    FMA_FORMATS,
    FmaChainInputs,
    IntChainInputs,
    fma_chain,
    int_chain,
)
from gpuwatchd.canary.convert import WORDS_PER_THREAD, ConvertInputs, convert
from gpuwatchd.canary.sfu import SfuInputs, sfu


def launch(name: str, launched: int, block: int, args: tuple[Any, ...]) -> None:
    if name.startswith("operand_"):
        key, n, out = args
        _hashing.operand(name.removeprefix("operand_"), int(key), int(n), out)
        return
    if name.startswith("digest"):
        words, n, signless_zero, lanes = args
        _hashing.digest(words, int(n), int(signless_zero), int(name.removeprefix("digest")), lanes)
        return
    if name.startswith("mma_"):
        threads = _mma(name.removeprefix("mma_"), args)
        sm_start, sm_end = args[-2:]
    elif name == "sfu":
        angle, scale, power, threads, out, sm_start, sm_end = args
        threads = int(threads)
        inputs = SfuInputs(*(np.asarray(t[:threads]) for t in (angle, scale, power)))
        out[:threads] = sfu(inputs)
    elif name == "convert":
        single, wide, threads, out, sm_start, sm_end = args
        threads = int(threads)
        inputs = ConvertInputs(np.asarray(single[:threads]), np.asarray(wide[:threads]))
        out[: threads * WORDS_PER_THREAD] = convert(inputs).reshape(-1)
    else:
        start, mul, add, steps, threads, out, sm_start, sm_end = args
        threads = int(threads)
        _chain(name, start[:threads], mul[: int(steps)], add[: int(steps)], out)
    if launched < threads:
        raise ValueError(f"{name}: {launched} threads launched for {threads}")
    sms = runtime.getDeviceProperties(0)["multiProcessorCount"]
    placed = (np.arange(threads) // block) % sms
    sm_start[:threads] = placed
    sm_end[:threads] = placed


def _chain(name: str, start: Any, mul: Any, add: Any, out: Any) -> None:
    threads = start.size
    if name == "int_chain":
        out[:threads] = int_chain(IntChainInputs(start, mul, add))
    else:
        fmt = FMA_FORMATS[name.removeprefix("fma_chain_")]
        inputs = FmaChainInputs(fmt, *(np.asarray(t).astype(np.int64) for t in (start, mul, add)))
        out[:threads] = fma_chain(inputs)


# The compute capability each instruction needs (PTX ISA, mma's target
# ISA notes): m16n8k32 .s8 sm_80, .e4m3 and .e5m2 sm_89 (the device check
# probes e5m2). An older GPU traps.
MMA_CAPABILITY = {"int8": (8, 0), "fp8_e4m3": (8, 9), "fp8_e5m2": (8, 9)}


def _e4m3(byte: int) -> float:
    """OCP FP8 v1.0 E4M3: bias 7, no infinities, S.1111.111 NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


E4M3 = np.array([_e4m3(byte) for byte in range(256)])


def _e5m2(byte: int) -> float:
    """OCP FP8 v1.0 E5M2: bias 15, IEEE-like infinities and NaN at exponent 31."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 2) & 0x1F, byte & 0x3
    if exponent == 0x1F:
        return sign * float("inf") if mantissa == 0 else float("nan")
    if exponent == 0:
        return sign * mantissa / 4 * 2.0**-14
    return sign * (1 + mantissa / 4) * 2.0 ** (exponent - 15)


E5M2 = np.array([_e5m2(byte) for byte in range(256)])
DECODE = {"fp8_e4m3": E4M3.__getitem__, "fp8_e5m2": E5M2.__getitem__}


def _fragment_tables() -> tuple[list[tuple[int, int]], ...]:
    """(row, col) of each lane's elements, lane by lane, straight from the
    ISA's piecewise tables: A (16 per lane), B (8), C/D (4)."""
    a, b, c = [], [], []
    for lane in range(32):
        group, in_group = lane // 4, lane % 4
        for i in range(16):
            row = group if i < 4 or 8 <= i < 12 else group + 8
            a.append((row, in_group * 4 + i % 4 + (16 if i >= 8 else 0)))
        for i in range(8):
            b.append((in_group * 4 + i % 4 + (16 if i >= 4 else 0), group))
        for i in range(4):
            c.append((group if i < 2 else group + 8, in_group * 2 + i % 2))
    return a, b, c


def _mma(kind: str, args: tuple[Any, ...]) -> int:
    """D = A * B + C for every warp's tile: the fragments gathered into tiles
    by the tables, multiplied in float64 (exact for the canaries' operands),
    and D scattered back by the same table as C."""
    a, b, c, tiles_n, warps, out = args[:6]
    properties = runtime.getDeviceProperties(0)
    if (properties["major"], properties["minor"]) < MMA_CAPABILITY[kind]:
        raise runtime.CUDARuntimeError("cudaErrorIllegalInstruction: an illegal instruction")
    tiles_n, warps = int(tiles_n), int(warps)
    a_bytes = np.asarray(a).view(np.uint8).reshape(-1, 32 * 16)
    b_bytes = np.asarray(b).view(np.uint8).reshape(-1, 32 * 8)
    decode = (lambda x: x.view(np.int8).astype(np.float64)) if kind == "int8" else DECODE[kind]
    table_a, table_b, table_c = (np.array(t) for t in _fragment_tables())
    tiles_a = np.zeros((a_bytes.shape[0], 16, 32))
    tiles_a[:, table_a[:, 0], table_a[:, 1]] = decode(a_bytes)
    tiles_b = np.zeros((b_bytes.shape[0], 32, 8))
    tiles_b[:, table_b[:, 0], table_b[:, 1]] = decode(b_bytes)
    warp = np.arange(warps)
    product = tiles_a[warp // tiles_n] @ tiles_b[warp % tiles_n]  # (warps, 16, 8)
    accumulator = np.asarray(c).reshape(warps, 32 * 4)
    result = np.asarray(out).reshape(warps, 32 * 4)
    result[:] = product[:, table_c[:, 0], table_c[:, 1]] + accumulator
    return warps * 32
