"""What the kernels of gpuwatchd.canary.chains.CUDA_SOURCE compute, run on
the host: the same recurrences and conversions as the CPU backend, with
`%smid` the block's SM in a round-robin placement."""

from __future__ import annotations

from typing import Any

import numpy as np

from cupy.cuda import runtime
from gpuwatchd.canary.chains import (
    FMA_FORMATS,
    FmaChainInputs,
    IntChainInputs,
    fma_chain,
    int_chain,
)
from gpuwatchd.canary.convert import WORDS_PER_THREAD, ConvertInputs, convert


def launch(name: str, launched: int, block: int, args: tuple[Any, ...]) -> None:
    if name == "convert":
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
