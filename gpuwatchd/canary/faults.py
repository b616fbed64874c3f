"""The faults a canary backend can be made to have.

A scenario's `sdc` fault names a GPU and optionally a `mode` (default
`consistent`):

| mode | what the GPU does |
| --- | --- |
| `lane` | one warp lane flips several bits of every result it computes |
| `sm` | one SM flips several bits of every result it computes |
| `consistent` | one output element is wrong, the same wrong value on every run |
| `data` | results whose sign and top exponent bit are set get bits flipped |
| `intermittent` | now and then one element flips, more often the hotter the GPU |
| `lsb` | the lowest mantissa bit of one output element flips, every run |
| `random_gemm_lsb` | as `lsb`, in the full-mantissa GEMMs only: the exact canaries never see it |
| `once` | one burst (the first after `at`) has three canaries wrong, then never |
| `stuck_bit` | one HBM cell has a bit stuck at 0 |
| `address_alias` | two HBM words share a cell (a stuck address line) |
| `hang` | the canary never returns |
| `crash` | the canary process dies |
| `error` | the device call fails, as on a CUDA error |

The spec is small and JSON-ready, so it travels to the worker process, where
inject.FaultyBackend applies it. Everything is deterministic given the seed.
Which bursts get a fault is the simulated node's side (gpuwatchd/sim), handed
to the agent by the assembly: the canaries know the modes, not scenarios. A
`once` fault is a host or worker transient in one burst: no later burst nor
re-run sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

FaultMode = Literal[
    "lane",
    "sm",
    "consistent",
    "data",
    "intermittent",
    "lsb",
    "random_gemm_lsb",
    "once",
    "stuck_bit",
    "address_alias",
    "hang",
    "crash",
    "error",
]
FAULT_MODES: tuple[FaultMode, ...] = get_args(FaultMode)
COMPUTE_MODES: tuple[FaultMode, ...] = (
    "lane",
    "sm",
    "consistent",
    "data",
    "intermittent",
    "lsb",
    "random_gemm_lsb",
)
MEMORY_MODES: tuple[FaultMode, ...] = ("stuck_bit", "address_alias")
DEFAULT_MODE: FaultMode = "consistent"


@dataclass(frozen=True)
class FaultSpec:
    mode: FaultMode = DEFAULT_MODE
    seed: int = 0
