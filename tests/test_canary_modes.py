"""A GPU's modes, read through NVML (the fake libnvidia-ml under the real
nvidia-ml-py) before each burst: what they allow, and what /metrics says
about the GPUs the canaries leave alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from daemon_support import InlineExecutor
from nvml_support import scenario

from gpuwatchd.canary.agent import CanaryAgent
from gpuwatchd.canary.bursts import StandIn
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.export import families
from gpuwatchd.canary.modes import GpuModes, read_modes, skip_reason
from gpuwatchd.canary.worker import run_in_process
from gpuwatchd.clock import FakeClock
from gpuwatchd.model import GpuSample
from gpuwatchd.sim.fake_nvml import DeviceModes, FakeNvml
from gpuwatchd.sim.gpu import SimulatedGpus

GIB = 1024**3
POLL = 10.0


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    with FakeNvml(SimulatedGpus(scenario(gpus=3), start=0.0)) as installed:
        yield installed


def samples(utilization: float) -> list[GpuSample]:
    return [
        GpuSample(index=i, up=True, uuid=f"GPU-{i}", utilization_gpu_ratio=utilization)
        for i in range(3)
    ]


def run_agent(utilization: float, backend: str | None = "cpu") -> CanaryAgent:
    clock = FakeClock()
    canaries = CanaryAgent(
        CanaryConfig(host_cores=False, aligned_window=0.0),
        clock,
        gpu_backend="cpu" if backend else None,
        stand_ins=(StandIn("NVIDIA H100 80GB HBM3", 132),),
        runner=run_in_process,
        executor=InlineExecutor(),
        modes=read_modes,
    )
    canaries.poll(samples(utilization))
    return canaries


def unchecked(canaries: CanaryAgent, utilization: float = 0.0) -> dict[str, str]:
    view = canaries.poll(samples(utilization))
    [family] = [
        f for f in families(view.stats) if f.name.endswith("unchecked_since_timestamp_seconds")
    ]
    return {s.labels["gpu"]: s.labels["reason"] for s in family.samples}


def test_nvml_modes_are_read_as_the_driver_reports_them(fake: FakeNvml) -> None:
    fake.modes[0] = DeviceModes(memory_total=80 * GIB, memory_used=GIB)
    fake.modes[1] = DeviceModes(
        compute_mode=3, mig_mode=1, mps_pids=(4242,), memory_total=80 * GIB, memory_used=70 * GIB
    )
    fake.modes[2] = DeviceModes(mig_mode=None)  # a GPU without MIG: NotSupported
    assert read_modes(0) == GpuModes("default", False, 0, 79 * GIB, (9, 0))
    assert read_modes(1) == GpuModes("exclusive_process", True, 1, 10 * GIB, (9, 0))
    assert read_modes(2).mig is False


def test_exclusive_process_gpus_get_no_burst_busy_or_idle(fake: FakeNvml) -> None:
    # A burst would hold the only context of an idle GPU: a job the scheduler
    # starts then fails at its first CUDA call.
    fake.modes[1] = DeviceModes(compute_mode=3)
    for utilization in (0.0, 0.9):
        canaries = run_agent(utilization)
        runs = {target for target, _, _ in canaries.poll(samples(utilization)).stats.runs}
        assert runs == {"gpu:0", "gpu:2"}
        assert unchecked(canaries, utilization) == {"1": "exclusive_compute_mode"}


@pytest.mark.parametrize(
    ("modes", "reason"),
    [
        (DeviceModes(compute_mode=2), "compute_prohibited"),
        (DeviceModes(mig_mode=1), "mig"),
        (DeviceModes(mps_pids=(100, 101)), "mps"),
    ],
)
def test_gpus_a_burst_cannot_use_are_skipped_with_a_reason(
    fake: FakeNvml, modes: DeviceModes, reason: str
) -> None:
    fake.modes[2] = modes
    canaries = run_agent(0.0)
    assert "gpu:2" not in {t for t, _, _ in canaries.poll(samples(0.0)).stats.runs}
    assert unchecked(canaries) == {"2": reason}


def test_a_busy_gpu_short_of_free_memory_is_skipped_an_idle_one_is_not(fake: FakeNvml) -> None:
    fake.modes[0] = DeviceModes(memory_total=80 * GIB, memory_used=78 * GIB)
    busy = run_agent(0.9)
    assert unchecked(busy, 0.9) == {"0": "low_free_memory"}
    idle = run_agent(0.0)
    assert ("gpu:0", "gemm_exact_fp16", "pass") in idle.poll(samples(0.0)).stats.runs


def test_a_gpu_whose_modes_nvml_cannot_read_is_skipped(fake: FakeNvml) -> None:
    import pynvml

    fake.fail(pynvml.NVML_ERROR_UNKNOWN, "nvmlDeviceGetComputeMode", gpu=0)
    assert unchecked(run_agent(0.0)) == {"0": "nvml"}


def test_a_node_with_gpus_and_no_gpu_backend_says_so_on_metrics(fake: FakeNvml) -> None:
    canaries = run_agent(0.0, backend=None)
    assert unchecked(canaries) == {"0": "no_backend", "1": "no_backend", "2": "no_backend"}


def test_skip_reasons_are_decided_in_order() -> None:
    config = CanaryConfig()
    plain = GpuModes("default", False, 0, 70 * GIB)
    assert skip_reason(plain, idle=False, config=config) is None
    assert skip_reason(None, idle=True, config=config) == "nvml"
    assert skip_reason(GpuModes("unknown", False, 0, None), True, config) == (
        "exclusive_compute_mode"
    )
    assert skip_reason(GpuModes("default", False, 0, None), False, config) is None
