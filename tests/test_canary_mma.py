"""The tensor-core tile canaries (mma.py): the fragment layouts as the PTX
ISA tables give them, e4m3 coding, exactness by construction, the planning
by compute capability, and the CUDA kernels through the fake CuPy, whose
emulation of mma.sync reads the PTX tables independently."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_support import InlineExecutor
from nvml_support import scenario

from gpuwatchd.canary import mma
from gpuwatchd.canary.agent import CanaryAgent
from gpuwatchd.canary.backend import HostOutput, ThreadRun
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.gemm import exact_gemm
from gpuwatchd.canary.modes import read_modes
from gpuwatchd.canary.runner import BurstOutcome, BurstRequest
from gpuwatchd.canary.spec import MMA_DTYPES, CanarySpec, default_suite
from gpuwatchd.canary.suite import RunContext, run_canary
from gpuwatchd.clock import Clock, FakeClock
from gpuwatchd.model import GpuSample
from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.sim.gpu import SimulatedGpus

FAKE_CUPY = Path(__file__).parent / "fake_cupy"
SHAPE = (64, 32, 64)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(FAKE_CUPY))
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    from gpuwatchd.canary.cuda import CudaBackend

    yield CudaBackend(0)
    for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupy_backends")]:
        del sys.modules[name]


# (lane, element) -> (row, col), read off the PTX ISA's figures for
# mma.m16n8k32 with 8-bit operands: lane 5 is groupID 1, threadID_in_group 1.
A_CASES = {(0, 0): (0, 0), (5, 0): (1, 4), (5, 3): (1, 7), (5, 4): (9, 4), (5, 8): (1, 20)}
A_CASES |= {(5, 15): (9, 23), (31, 15): (15, 31), (31, 11): (7, 31)}
B_CASES = {(0, 0): (0, 0), (5, 0): (4, 1), (5, 3): (7, 1), (5, 4): (20, 1), (31, 7): (31, 7)}
C_CASES = {(0, 0): (0, 0), (5, 1): (1, 3), (5, 2): (9, 2), (31, 3): (15, 7)}


@pytest.mark.parametrize(
    ("positions", "cases", "shape"),
    [
        (mma.a_positions, A_CASES, (16, 32)),
        (mma.b_positions, B_CASES, (32, 8)),
        (mma.c_positions, C_CASES, (16, 8)),
    ],
)
def test_fragments_follow_the_ptx_tables_and_cover_each_tile_once(
    positions: Any, cases: dict[tuple[int, int], tuple[int, int]], shape: tuple[int, int]
) -> None:
    rows, cols = positions()
    for (lane, element), place in cases.items():
        assert (rows[lane, element], cols[lane, element]) == place
    covered = np.zeros(shape, dtype=int)
    np.add.at(covered, (rows, cols), 1)
    assert (covered == 1).all()


def test_packing_and_unpacking_are_inverse() -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, size=(48, 32), dtype=np.uint8)
    b = rng.integers(0, 256, size=(32, 24), dtype=np.uint8)
    assert np.array_equal(mma.unpack_a(mma.pack_a(a)), a)
    assert np.array_equal(mma.unpack_b(mma.pack_b(b)), b)
    c = np.arange(48 * 24).reshape(48, 24)
    packed = mma.pack_c(c)
    assert packed.shape == (3 * 3 * 32, 4) and sorted(packed.ravel()) == list(range(48 * 24))
    assert np.array_equal(mma.unpack_c(packed, 48, 24), c)


def test_every_e4m3_code_decodes_and_every_normal_one_encodes_back() -> None:
    codes = np.arange(256, dtype=np.uint8)
    values = mma.e4m3_values(codes)
    assert np.isnan(values[[0x7F, 0xFF]]).all()
    assert values[0x7E] == 448 and values[0x08] == 2**-6 and values[0x01] == 2**-9
    normal = codes[((codes >> 3) & 0xF != 0) & (codes & 0x7F != 0x7F)]
    assert np.array_equal(mma.e4m3_bits(mma.e4m3_values(normal)), normal)
    for bad in (0.0, 2**-7, 1.0625, 480.0, np.inf):
        with pytest.raises(ValueError, match="not a normal e4m3"):
            mma.e4m3_bits(np.array([bad]))


@pytest.mark.parametrize("seed", range(6))
def test_every_fp8_dot_product_stays_within_the_accumulators_exact_range(seed: int) -> None:
    exact = exact_gemm(mma.E4M3_EXACT, (256, 32, 256), seed)
    sums = np.abs(exact.a_int) @ np.abs(exact.b_int)
    assert np.abs(exact.a_int).max() <= 16 and np.abs(exact.b_int).max() <= 16
    mma.e4m3_bits(exact.a)  # every operand a normal e4m3
    mma.e4m3_bits(exact.b)
    # C as well, in units of each output's scale: the partial sums with it.
    case = mma.mma_case("fp8_e4m3", (256, 32, 256), seed)
    unit = np.ldexp(1.0, exact.row_scale[:, None] + exact.col_scale[None, :])
    c_units = case.c / unit
    assert (c_units == np.round(c_units)).all() and np.abs(c_units).max() > 0
    assert (sums + np.abs(c_units)).max() <= 2**mma.E4M3_SUM_BITS


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_the_tiles_take_a_nonzero_accumulator_input(dtype: str) -> None:
    case = mma.mma_case(dtype, (128, 32, 128), 3)
    assert (case.c != 0).mean() > 0.99 and (case.c < 0).any() and (case.c > 0).any()
    product = case.a.astype(np.float64) @ case.b.astype(np.float64)
    assert not np.array_equal(mma.mma_reference(case), mma.pack_c(product))


def test_int8_operands_use_every_bit() -> None:
    case = mma.mma_case("int8", (256, 32, 256), 1)
    assert case.a.min() == -128 and case.a.max() == 127


@pytest.mark.parametrize(
    ("capability", "expected"),
    [(None, ()), ((7, 0), ()), ((8, 0), ("int8",)), ((8, 9), MMA_DTYPES), ((10, 0), MMA_DTYPES)],
)
def test_a_gpu_is_planned_the_tile_canaries_its_tensor_cores_have(
    capability: tuple[int, int] | None, expected: tuple[str, ...]
) -> None:
    suite = default_suite("cuda", 1, 1, 1 << 20, capability)
    assert tuple(s.dtype for s in suite if s.kind == "mma") == expected
    assert suite[-len(expected) or len(suite) :] == tuple(s for s in suite if s.kind == "mma")


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_the_cuda_kernels_agree_with_the_known_answer_through_the_fake(
    cuda: Any, dtype: str
) -> None:
    result = run_canary(cuda, CanarySpec("mma", dtype, SHAPE, 4), RunContext())
    assert result.result == "pass", result
    assert result.sm_coverage_ratio == pytest.approx(4 / 132)  # 32 warps: 4 blocks


def test_a_packing_that_misreads_the_ptx_table_is_caught_by_the_fake(
    cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, cols = mma.a_positions()
    # a4..a7 and a8..a11 swapped: rows g+8 and columns +16 exchanged.
    order = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    monkeypatch.setattr(mma, "a_positions", lambda: (rows[:, order], cols[:, order]))
    spec = CanarySpec("mma", "int8", SHAPE, 4)
    assert run_canary(CpuBackend(sm_count=132), spec, RunContext()).result == "pass"
    assert run_canary(cuda, spec, RunContext()).result == "mismatch"


def test_an_accumulator_packing_that_misreads_the_ptx_table_is_caught_by_the_fake(
    cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, cols = mma.c_positions()
    # c1 and c2 swapped: the host packs C (and reads D) off the ISA's table.
    order = [0, 2, 1, 3]
    monkeypatch.setattr(mma, "c_positions", lambda: (rows[:, order], cols[:, order]))
    spec = CanarySpec("mma", "int8", SHAPE, 4)
    assert run_canary(CpuBackend(sm_count=132), spec, RunContext()).result == "pass"
    assert run_canary(cuda, spec, RunContext()).result == "mismatch"


class OneWrongAccumulator(CpuBackend):
    """Thread 300's third accumulator off by one bit: block 1, lane 12."""

    def mma(self, inputs: mma.MmaInputs) -> ThreadRun:
        run = super().mma(inputs)
        values = run.values.fetch().copy()
        values.view(np.uint32)[300, 2] ^= 1 << 9
        return ThreadRun(values=HostOutput(values), units=run.units)


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_a_wrong_accumulator_is_a_mismatch_at_its_threads_sm_and_lane(dtype: str) -> None:
    spec = CanarySpec("mma", dtype, (128, 32, 128), 2)
    result = run_canary(OneWrongAccumulator(sm_count=132), spec, RunContext(gpu=0))
    assert (result.result, result.mismatch_count) == ("mismatch", 1)
    assert result.first_mismatch_index == 300 * 4 + 2
    assert (result.mismatch_units, result.mismatch_lanes) == ((1,), (300 % 32,))
    assert result.bit_histogram[9] == 1


def test_a_gpu_older_than_the_instruction_is_an_error_never_a_mismatch(
    cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cupy.cuda import runtime  # the fake's

    ampere = {**runtime.getDeviceProperties(0), "major": 8, "minor": 0}
    monkeypatch.setattr(runtime, "getDeviceProperties", lambda ordinal: ampere)
    with pytest.raises(runtime.CUDARuntimeError, match="illegal instruction"):
        run_canary(cuda, CanarySpec("mma", "fp8_e4m3", SHAPE, 4), RunContext())
    assert run_canary(cuda, CanarySpec("mma", "int8", SHAPE, 4), RunContext()).result == "pass"


@pytest.mark.parametrize(("model", "expected"), [("H100", MMA_DTYPES), ("V100", ())])
def test_the_daemon_plans_the_tile_canaries_from_the_capability_nvml_reads(
    model: str, expected: tuple[str, ...]
) -> None:
    requests: list[BurstRequest] = []

    def record(
        request: BurstRequest,
        *,
        timeout: float,
        clock: Clock,
        telemetry: Any = None,
        group: Any = None,
    ) -> BurstOutcome:
        requests.append(request)
        return BurstOutcome(request, (), clock.now(), clock.now())

    names = {"H100": "NVIDIA H100 80GB HBM3", "V100": "Tesla V100-SXM2-32GB"}
    with FakeNvml(SimulatedGpus(scenario(gpus=1, model=names[model]), start=0.0)):
        agent = CanaryAgent(
            CanaryConfig(host_cores=False, aligned_window=0.0),
            FakeClock(),
            gpu_backend="cuda",
            runner=record,
            executor=InlineExecutor(),
            modes=read_modes,
        )
        agent.poll([GpuSample(index=0, up=True, uuid="GPU-0", utilization_gpu_ratio=0.0)])
    [request] = requests
    assert tuple(s.dtype for s in request.specs if s.kind == "mma") == expected


def test_a_simulated_node_runs_the_tiles_its_model_has() -> None:
    # The CPU stand-in emulates every tile, but plans only those of the GPU
    # it stands in for once its capability is known (NVML's, simulated).
    assert [s.dtype for s in default_suite("cpu", 1, 1, 1 << 20, (7, 0)) if s.kind == "mma"] == []
    assert [s.dtype for s in default_suite("cpu", 1, 1, 1 << 20) if s.kind == "mma"] == list(
        MMA_DTYPES
    )
