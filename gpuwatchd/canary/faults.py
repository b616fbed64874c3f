"""The faults a canary backend can be made to have, and where they come from
in a scenario.

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
| `stuck_bit` | one HBM cell has a bit stuck at 0 |
| `address_alias` | two HBM words share a cell (a stuck address line) |
| `hang` | the canary never returns |
| `crash` | the canary process dies |
| `error` | the device call fails, as on a CUDA error |

The spec is small and JSON-ready, so it travels to the worker process, where
inject.FaultyBackend applies it. Everything is deterministic given the seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

# The modes live with the scenario format, whose parser rejects unknown ones.
from gpuwatchd.sim.scenario import Scenario
from gpuwatchd.sim.scenario import SdcMode as FaultMode

COMPUTE_MODES: tuple[FaultMode, ...] = ("lane", "sm", "consistent", "data", "intermittent", "lsb")
MEMORY_MODES: tuple[FaultMode, ...] = ("stuck_bit", "address_alias")
DEFAULT_MODE: FaultMode = "consistent"
# SMs of the GPU the CPU backend stands in for on a simulated node (an H100
# SXM's count): it only places the chains' threads, for SM faults to hit.
SIMULATED_SM_COUNT = 132


@dataclass(frozen=True)
class FaultSpec:
    mode: FaultMode = DEFAULT_MODE
    seed: int = 0


def sdc_faults(scenario: Scenario, at: float | None = None) -> dict[int, tuple[FaultSpec, ...]]:
    """GPU index -> the faults of its backend: the scenario's `sdc` faults
    active at time `at`, or all of them when `at` is None (a one-shot run)."""
    faults: dict[int, tuple[FaultSpec, ...]] = {}
    for position, fault in enumerate(scenario.faults):
        if fault.kind != "sdc" or fault.gpu is None or (at is not None and not fault.active(at)):
            continue
        mode = cast(FaultMode, fault.mode or DEFAULT_MODE)
        spec = FaultSpec(mode=mode, seed=scenario.seed * 1000 + position)
        faults[fault.gpu] = (*faults.get(fault.gpu, ()), spec)
    return faults
