"""Which canary faults a simulated node's GPUs have, and when: a scenario's
`sdc` faults as the canaries' fault specs (gpuwatchd.canary.faults). The
assembly hands them to the canary agent and to `gpuwatchd canary
--simulate`, as it hands the daemon the fake NVML library: the canaries
never read a scenario themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

from gpuwatchd.canary.faults import DEFAULT_MODE, FaultMode, FaultSpec
from gpuwatchd.sim.scenario import Scenario


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
