"""What each of the daemon's bursts runs, and how a worker is asked to run it.

`BurstMaker` turns a target (`gpu:<index>`, `cpu:<core>`, or the host's
cores) and a seed into the canaries of its burst and the `BurstRequest` a
worker takes: the GPU's suite as its compute capability allows (the
full-mantissa GEMMs' seed rotating with the wall-clock slot, the same on
every GPU), the stand-in model of a simulated GPU and the faults the
simulated node gives it, and the state directory's caches. No numpy: the
daemon's side.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gpuwatchd.canary import schedule
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.runner import BurstRequest
from gpuwatchd.canary.spec import BackendKind, CanarySpec, default_suite, host_suite
from gpuwatchd.model import GpuSample


@dataclass(frozen=True)
class StandIn:
    """A model of simulated GPU the CPU backend stands in for."""

    model: str
    sm_count: int


@dataclass(frozen=True)
class WorkerCaches:
    """Where a GPU burst's worker keeps what it compiles (None: in memory,
    or the driver's default): CuPy's kernels, and the driver's JIT of PTX."""

    kernels: str | None = None
    jit: str | None = None


IN_MEMORY = WorkerCaches()


def no_faults(gpu: int) -> tuple[FaultSpec, ...]:
    return ()


class BurstMaker:
    def __init__(
        self,
        config: CanaryConfig,
        gpu_backend: BackendKind | None,
        host_cores: Collection[int],
        stand_ins: Sequence[StandIn] = (),
        faults: Callable[[int], tuple[FaultSpec, ...]] = no_faults,
        caches: WorkerCaches = IN_MEMORY,
    ) -> None:
        """`stand_ins`: a simulated GPU stands in as the one of its NVML
        name, the first where NVML names none of them; `faults`: a simulated
        GPU's faults as its burst starts."""
        self._config = config
        self._gpu_backend = gpu_backend
        self._cores = tuple(sorted(host_cores))
        self._stand_ins = {stand_in.model: stand_in for stand_in in stand_ins}
        self._first_stand_in = stand_ins[0] if stand_ins else None
        self._faults = faults
        self._caches = caches

    def suite(
        self, key: str, seed: int, now: float, capability: tuple[int, int] | None
    ) -> tuple[CanarySpec, ...]:
        """The canaries of schedule key `key`'s burst with `seed`, at `now`."""
        if key == schedule.HOST:
            return host_suite(seed)
        assert self._gpu_backend is not None
        # The full-mantissa GEMMs' seed rotates with the wall-clock slot, the
        # same on every GPU (and node) in it, so their digests can agree.
        config = self._config
        slot_seed = config.seed + int(now // config.interval) % config.seed_rotation
        return default_suite(self._gpu_backend, seed, slot_seed, config.hbm_bytes, capability)

    def request(
        self, target: str, specs: tuple[CanarySpec, ...], sample: GpuSample | None, draw: int
    ) -> BurstRequest:
        """The worker's request for `specs` on `target`; `sample` is the
        GPU's latest, `draw` numbers the burst (simulated faults' draws)."""
        config = self._config
        kind, _, index = target.partition(":")
        if kind != "gpu":
            cores = (int(index),) if index else self._cores
            return BurstRequest(
                "cpu",
                specs,
                cpu_cores=cores,
                reference_cache=config.reference_cache,
                hbm_free_fraction=config.hbm_free_fraction,
            )
        assert self._gpu_backend is not None
        gpu = int(index)
        stand_in = self._stand_ins.get((sample.name if sample else None) or "")
        stand_in = stand_in or self._first_stand_in
        return BurstRequest(
            self._gpu_backend,
            specs,
            gpu=gpu,
            uuid=sample.uuid if sample else None,
            stand_in_model=stand_in.model if stand_in else None,
            stand_in_sm_count=stand_in.sm_count if stand_in else None,
            faults=self._faults(gpu),
            temperature_celsius=sample.temperature_gpu_celsius if sample else None,
            fault_draw=draw,
            reference_cache=config.reference_cache,
            hbm_free_fraction=config.hbm_free_fraction,
            kernel_cache=self._caches.kernels,
            jit_cache=self._caches.jit,
        )
