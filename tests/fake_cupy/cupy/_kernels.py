"""What the kernels of gpuwatchd.canary.chains.CUDA_SOURCE compute, run on
the host: the same recurrences as the CPU backend, with `%smid` the block's
SM in a round-robin placement."""

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


def launch(name: str, launched: int, block: int, args: tuple[Any, ...]) -> None:
    start, mul, add, steps, threads, out, sm_start, sm_end = args
    steps, threads = int(steps), int(threads)
    if launched < threads:
        raise ValueError(f"{name}: {launched} threads launched for {threads}")
    if name == "int_chain":
        out[:threads] = int_chain(IntChainInputs(start[:threads], mul[:steps], add[:steps]))
    else:
        fmt = FMA_FORMATS[name.removeprefix("fma_chain_")]
        tables = (start[:threads], mul[:steps], add[:steps])
        inputs = FmaChainInputs(fmt, *(np.asarray(t).astype(np.int64) for t in tables))
        out[:threads] = fma_chain(inputs)
    sms = runtime.getDeviceProperties(0)["multiProcessorCount"]
    placed = (np.arange(threads) // block) % sms
    sm_start[:threads] = placed
    sm_end[:threads] = placed
