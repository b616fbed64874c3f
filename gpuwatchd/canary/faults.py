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
| `once` | one burst (the first after `at`) has three canaries wrong, then never |
| `stuck_bit` | one HBM cell has a bit stuck at 0 |
| `address_alias` | two HBM words share a cell (a stuck address line) |
| `hang` | the canary never returns |
| `crash` | the canary process dies |
| `error` | the device call fails, as on a CUDA error |

The spec is small and JSON-ready, so it travels to the worker process, where
inject.FaultyBackend applies it. Everything is deterministic given the seed.
Which bursts get a fault is the daemon's side: `ScenarioFaults`. A `once`
fault is a host or worker transient in one burst: no later burst nor re-run
sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

# The modes live with the scenario format, whose parser rejects unknown ones.
from gpuwatchd.sim.scenario import Scenario
from gpuwatchd.sim.scenario import SdcMode as FaultMode

COMPUTE_MODES: tuple[FaultMode, ...] = ("lane", "sm", "consistent", "data", "intermittent", "lsb")
MEMORY_MODES: tuple[FaultMode, ...] = ("stuck_bit", "address_alias")
DEFAULT_MODE: FaultMode = "consistent"


@dataclass(frozen=True)
class FaultSpec:
    mode: FaultMode = DEFAULT_MODE
    seed: int = 0


def _active(scenario: Scenario, at: float | None) -> Iterator[tuple[int, int, FaultSpec]]:
    """(position in the scenario, GPU index, spec) of each `sdc` fault
    active at time `at` (every one when `at` is None)."""
    for position, fault in enumerate(scenario.faults):
        if fault.kind != "sdc" or fault.gpu is None or (at is not None and not fault.active(at)):
            continue
        mode = cast(FaultMode, fault.mode or DEFAULT_MODE)
        yield position, fault.gpu, FaultSpec(mode=mode, seed=scenario.seed * 1000 + position)


def sdc_faults(scenario: Scenario, at: float | None = None) -> dict[int, tuple[FaultSpec, ...]]:
    """GPU index -> the faults of its backend: the scenario's `sdc` faults
    active at time `at`, or all of them when `at` is None (a one-shot run)."""
    faults: dict[int, tuple[FaultSpec, ...]] = {}
    for _, gpu, spec in _active(scenario, at):
        faults[gpu] = (*faults.get(gpu, ()), spec)
    return faults


class ScenarioFaults:
    """The faults of each burst a daemon starts on a simulated node: called
    with a GPU index as the burst (or re-run) starts, it gives the `sdc`
    faults active at the scenario's time `elapsed()`; a `once` fault goes to
    one burst alone, the GPU's first after the fault's `at`."""

    def __init__(self, scenario: Scenario, elapsed: Callable[[], float]) -> None:
        self._scenario = scenario
        self._elapsed = elapsed
        self._spent: set[int] = set()  # the one-burst faults handed out, by position

    def __call__(self, gpu: int) -> tuple[FaultSpec, ...]:
        specs: list[FaultSpec] = []
        for position, target, spec in _active(self._scenario, self._elapsed()):
            if target != gpu or position in self._spent:
                continue
            if spec.mode == "once":
                self._spent.add(position)
            specs.append(spec)
        return tuple(specs)
