"""The CUDA backend without a GPU: through a fake of the CuPy surface it
calls (tests/fake_cupy), which checks cublasGemmEx's arguments and the
kernels' argument types, and keeps CuPy's on-disk kernel cache; and the
worker under the systemd unit's read-only file system."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from daemon_support import InlineExecutor
from nvml_support import scenario

from gpuwatchd.assemble import build_canary
from gpuwatchd.canary.result import CanaryResult
from gpuwatchd.canary.runner import (
    WORKER_MODULE,
    BurstOutcome,
    BurstRequest,
    pinned_environment,
    worker_environment,
)
from gpuwatchd.canary.spec import (
    EXACT_GEMM_DTYPES,
    FMA_CHAIN_DTYPES,
    HBM_KINDS,
    MMA_DTYPES,
    RANDOM_GEMM_DTYPES,
    CanarySpec,
)
from gpuwatchd.canary.wire import from_wire, to_wire
from gpuwatchd.cli.canary import canary
from gpuwatchd.clock import Clock, FakeClock
from gpuwatchd.config import Config
from gpuwatchd.model import GpuSample
from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.sim.gpu import SimulatedGpus

FAKE_CUPY = Path(__file__).parent / "fake_cupy"
# Every kind of canary, small enough for the fake's host arithmetic.
SMALL_SUITE = (
    *(CanarySpec("gemm_exact", dtype, (64, 64, 64), 2) for dtype in EXACT_GEMM_DTYPES),
    CanarySpec("int_chain", "u32", (1024, 64), 2),
    *(CanarySpec("fma_chain", dtype, (1024, 64), 2) for dtype in FMA_CHAIN_DTYPES),
    CanarySpec("convert", "fp32", (1024,), 2),
    CanarySpec("sfu", "fp32", (1024,), 2),
    *(CanarySpec("mma", dtype, (64, 32, 64), 2) for dtype in MMA_DTYPES),
    *(CanarySpec("gemm_random", dtype, (96, 96, 96), 1) for dtype in RANDOM_GEMM_DTYPES),
    *(CanarySpec("gemm_bounded", dtype, (96, 96, 96), 1) for dtype in RANDOM_GEMM_DTYPES),
    *(CanarySpec(kind, "u64", (4096,), 2) for kind in HBM_KINDS),
    *(CanarySpec("gemm_burn", dtype, (64, 64, 64, 3), 1) for dtype in RANDOM_GEMM_DTYPES),
)
UUID = "GPU-3f2c9a10-007b-4e2d-9c1a-5b6e7f809112"


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(FAKE_CUPY))
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    import cupy  # type: ignore[import-not-found]

    yield cupy
    for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupy_backends")]:
        del sys.modules[name]


def run_worker(
    request: BurstRequest, environment: dict[str, str], wrap: tuple[str, ...] = ()
) -> list[CanaryResult]:
    done = subprocess.run(
        [*wrap, sys.executable, "-m", WORKER_MODULE],
        input=json.dumps(to_wire(request)),
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    messages = [json.loads(line) for line in done.stdout.splitlines()]
    return [from_wire(CanaryResult, m["result"]) for m in messages if m["event"] == "result"]


def with_fake_cupy(environment: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join(filter(None, (str(FAKE_CUPY), environment.get("PYTHONPATH"))))
    return {**environment, "PYTHONPATH": path}


def test_every_canary_runs_through_the_cuda_backend(fake_cupy: Any) -> None:
    from cupy_backends.cuda.libs import cublas  # type: ignore[import-not-found]

    from gpuwatchd.canary.cuda import GEMM_TYPES, CudaBackend
    from gpuwatchd.canary.suite import RunContext, run_canary

    backend = CudaBackend(0)
    assert "132 SMs" in backend.info.environment  # the digest's scope has the SM count
    results = [run_canary(backend, spec, RunContext(uuid=UUID)) for spec in SMALL_SUITE]
    assert [(r.canary, r.result) for r in results] == [(s.name, "pass") for s in SMALL_SUITE]
    exact_calls = cublas.CALLS[: len(EXACT_GEMM_DTYPES)]
    expected = [GEMM_TYPES[d] for d in EXACT_GEMM_DTYPES]
    assert [(c["types"][0], c["types"][2]) for c in exact_calls] == expected
    # Row-major A (m x k) @ B (k x n) is column-major B^T A^T: n first.
    assert {(c["m"], c["n"], c["k"]) for c in exact_calls} == {(64, 64, 64)}


def test_a_chain_reports_the_share_of_sms_that_ran_a_whole_thread(
    fake_cupy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cupy._kernels as kernels  # type: ignore[import-not-found]

    from gpuwatchd.canary.cuda import CudaBackend
    from gpuwatchd.canary.suite import RunContext, run_canary

    chain = CanarySpec("int_chain", "u32", (256 * 264, 16), 2)  # two blocks an SM
    backend = CudaBackend(0)
    assert run_canary(backend, chain, RunContext(uuid=UUID)).sm_coverage_ratio == 1.0
    place = kernels.launch

    def preempted(name: str, launched: int, block: int, args: tuple[Any, ...]) -> None:
        # Every thread of SMs 0-65 rescheduled onto another SM before it
        # ended: %smid differs between its start and its end.
        place(name, launched, block, args)
        sm_end = args[-1]
        sm_end[sm_end < 66] += 66

    monkeypatch.setattr(kernels, "launch", preempted)
    result = run_canary(backend, chain, RunContext(uuid=UUID))
    assert (result.result, result.sm_coverage_ratio) == ("pass", 0.5)


def test_the_uuid_is_nvmls_not_cupys(fake_cupy: Any) -> None:
    from gpuwatchd.canary.cuda import CudaBackend
    from gpuwatchd.canary.suite import RunContext, run_canary

    # CuPy's `uuid` stops at the UUID's first NUL byte: worthless.
    assert len(fake_cupy.cuda.runtime.getDeviceProperties(0)["uuid"]) < 16
    backend = CudaBackend(0)
    assert backend.info.uuid is None
    result = run_canary(backend, SMALL_SUITE[0], RunContext(uuid=UUID))
    assert result.uuid == UUID
    request = BurstRequest("cuda", SMALL_SUITE[:1], gpu=3, uuid=UUID)
    assert worker_environment(request)["CUDA_VISIBLE_DEVICES"] == UUID


def test_the_fake_rejects_what_a_gpu_would_get_silently_wrong(fake_cupy: Any) -> None:
    from cupy_backends.cuda.libs import cublas

    from gpuwatchd.canary.chains import CUDA_SOURCE

    kernel = fake_cupy.RawModule(code=CUDA_SOURCE).get_function("int_chain")
    tables = [fake_cupy.asarray(np.ones(4, np.uint32)) for _ in range(3)]
    out = [fake_cupy.empty(4, dtype=np.uint32) for _ in range(3)]
    with pytest.raises(TypeError, match="argument 3"):  # a Python int is 64 bits wide
        kernel((1,), (4,), (*tables, 4, np.int32(4), *out))
    with pytest.raises(TypeError, match="argument 0"):
        kernel(
            (1,), (4,), (fake_cupy.asarray(np.ones(4)), *tables[1:], np.int32(4), np.int32(4), *out)
        )
    a = fake_cupy.asarray(np.ones((4, 4), np.float16))
    c = fake_cupy.empty((4, 4), dtype=np.float32)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    handle = fake_cupy.cuda.device.get_cublas_handle()
    args = (a.data.ptr, 2, 4, a.data.ptr, 2, 4, zero.ctypes.data, c.data.ptr, 0, 4)
    with pytest.raises(ValueError, match="NOT_SUPPORTED"):  # fp16 has no TF32 mode
        cublas.gemmEx(handle, 0, 0, 4, 4, 4, one.ctypes.data, *args, 77, -1)


def sandboxed(state: Path) -> tuple[str, ...]:
    """Run under the unit's file system: everything read-only (as
    ProtectSystem=strict, ProtectHome=yes make it) but the state directory."""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro / && exec "$@"'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(state))


def can_sandbox() -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "true"], check=False).returncode == 0
    except OSError:
        return False


needs_sandbox = pytest.mark.skipif(not can_sandbox(), reason="needs unshare --mount (root)")


@needs_sandbox
def test_under_the_units_read_only_file_system_every_canary_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    request = BurstRequest(
        "cuda",
        SMALL_SUITE,
        gpu=0,
        uuid=UUID,
        reference_cache=str(state / "canary-references"),
        kernel_cache=str(state / "cupy-kernel-cache"),
    )
    environment = with_fake_cupy(worker_environment(request))
    results = run_worker(request, environment, sandboxed(state))
    assert [(r.canary, r.result) for r in results] == [(s.name, "pass") for s in SMALL_SUITE]
    assert list((state / "cupy-kernel-cache").iterdir())  # compiled once, kept
    assert list((state / "canary-references").iterdir())


@needs_sandbox
def test_under_the_unit_cupys_default_kernel_cache_stops_the_burst(tmp_path: Path) -> None:
    # What the worker did before its environment named a cache: CuPy's
    # default ~/.cupy/kernel_cache cannot be created, the first kernel (the
    # first output's digest, on the device) fails.
    state = tmp_path / "state"
    state.mkdir()
    request = BurstRequest("cuda", SMALL_SUITE, gpu=0, uuid=UUID)
    environment = with_fake_cupy(worker_environment(request))
    del environment["CUPY_CACHE_IN_MEMORY"]
    results = run_worker(request, environment, sandboxed(state))
    assert results[-1].canary == "gemm_exact_fp16" and results[-1].result == "error"
    assert "Read-only file system" in (results[-1].message or "")


def test_the_worker_environment_is_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "NVIDIA_TF32_OVERRIDE": "0",
        "CUBLAS_WORKSPACE_CONFIG": ":16:8",
        "CUDA_VISIBLE_DEVICES": "3",
        "CUPY_TF32": "1",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
    }.items():
        monkeypatch.setenv(name, value)
    cpu = BurstRequest("cpu", SMALL_SUITE[:1], cpu_cores=(0,))
    gpu = BurstRequest(
        "cuda", SMALL_SUITE[:1], gpu=1, uuid=UUID, kernel_cache="/var/lib/k", jit_cache="/var/lib/j"
    )
    for request in (cpu, gpu):
        environment = worker_environment(request)
        assert not {"NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG", "CUPY_TF32"} & set(
            environment
        )
        assert environment["CUDA_MPS_PIPE_DIRECTORY"] == "/nonexistent/gpuwatchd-no-mps"
    assert "CUDA_VISIBLE_DEVICES" not in worker_environment(cpu)
    assert worker_environment(gpu)["CUDA_VISIBLE_DEVICES"] == UUID
    assert worker_environment(gpu)["CUPY_CACHE_DIR"] == "/var/lib/k"
    assert worker_environment(gpu)["CUDA_CACHE_PATH"] == "/var/lib/j"
    assert pinned_environment(None)["CUPY_CACHE_IN_MEMORY"] == "1"
    assert "CUDA_CACHE_PATH" not in pinned_environment(None)


def test_the_daemons_workers_keep_what_they_compile_in_the_state_directory(
    tmp_path: Path,
) -> None:
    # CuPy's kernels and the driver's JIT of PTX (an NVRTC older than the
    # GPU): the driver's default, ~/.nv/ComputeCache, is read-only under the unit.
    requests: list[BurstRequest] = []

    def record(request: BurstRequest, *, clock: Clock, **_: Any) -> BurstOutcome:
        requests.append(request)
        return BurstOutcome(request, (), clock.now(), clock.now())

    config = Config()
    config = replace(
        config,
        daemon=replace(config.daemon, state_dir=str(tmp_path)),
        canary=replace(config.canary, backend="cuda", host_cores=False, aligned_window=0.0),
    )
    with FakeNvml(SimulatedGpus(scenario(gpus=1), start=0.0)):
        agent = build_canary(config, FakeClock(), runner=record, executor=InlineExecutor())
        assert agent is not None
        agent.poll([GpuSample(index=0, up=True, uuid=UUID, utilization_gpu_ratio=0.0)])
    [request] = requests
    environment = worker_environment(request)
    assert environment["CUPY_CACHE_DIR"] == str(tmp_path / "cupy-kernel-cache")
    assert environment["CUDA_CACHE_PATH"] == str(tmp_path / "cuda-jit-cache")


def test_a_node_with_gpus_and_no_cuda_backend_exits_2_and_says_why() -> None:
    # Two GPUs by NVML, no CuPy for the worker: never a pass on the host
    # cores alone.
    with FakeNvml(SimulatedGpus(scenario(gpus=2), start=0.0)):
        result = CliRunner().invoke(canary, [])
    assert result.exit_code == 2, result.output
    assert "2 GPU(s) and no working CUDA backend" in result.output
    assert "cuda extra" in result.output
