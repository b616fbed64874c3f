"""What a burst costs the GPU and the host, through the fake CuPy: the GPU
makes the full-mantissa operands the host would (bit for bit), outputs stay
on it unless their digest is not the known answer's, every device call of a
canary is inside the CUDA events that time it (copies included), and a
CUDA-sized burst holds at most 512 MiB of the GPU's memory, each canary's
given back as it ends."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuwatchd.canary import hashing
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.formats import FORMATS
from gpuwatchd.canary.runner import BurstRequest
from gpuwatchd.canary.spec import (
    CUDA_SIZE,
    EXACT_GEMM_DTYPES,
    HBM_KINDS,
    MMA_DTYPES,
    RANDOM_GEMM_DTYPES,
    CanarySpec,
)
from gpuwatchd.canary.suite import ReferenceCache, RunContext, cache_key, run_canary
from gpuwatchd.canary.worker import execute, run_in_process
from gpuwatchd.clock import FakeClock

FAKE_CUPY = Path(__file__).parent / "fake_cupy"
UUID = "GPU-3f2c9a10-007b-4e2d-9c1a-5b6e7f809112"
RANDOM_SHAPE = (256, 256, 256)
# Every kind once, with GEMM operands and outputs (256 KiB and more) larger
# than anything else a canary copies (a few KiB of SM placements).
SUITE = (
    *(CanarySpec("gemm_exact", dtype, (256, 16, 256), 2) for dtype in EXACT_GEMM_DTYPES),
    CanarySpec("int_chain", "u32", (1024, 64), 2),
    CanarySpec("fma_chain", "fp64", (1024, 64), 2),
    CanarySpec("convert", "fp32", (1024,), 2),
    CanarySpec("sfu", "fp32", (1024,), 2),
    *(CanarySpec("gemm_random", dtype, RANDOM_SHAPE, 1) for dtype in RANDOM_GEMM_DTYPES),
    *(CanarySpec(kind, "u64", (4096,), 2) for kind in HBM_KINDS),
    *(CanarySpec("mma", dtype, (64, 32, 64), 2) for dtype in MMA_DTYPES),
)
MIB = 2**20


@pytest.fixture
def cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(FAKE_CUPY))
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    import cupy  # type: ignore[import-not-found]

    yield cupy
    for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupy_backends")]:
        del sys.modules[name]


@pytest.mark.parametrize("fmt", RANDOM_GEMM_DTYPES)
def test_the_gpu_makes_the_full_mantissa_operands_the_host_makes(cupy: Any, fmt: str) -> None:
    from gpuwatchd.canary.cuda import CudaBackend

    backend = CudaBackend(0)
    for operand in (0, 1):
        made = backend.device_operand(FORMATS[fmt], RANDOM_SHAPE, 7, operand)
        on_host = hashing.host_operand(fmt, RANDOM_SHAPE, 7, operand)
        assert made.shape == on_host.shape
        words = cupy.asnumpy(made).view(f"u{made.dtype.itemsize}")
        expected = on_host.view(f"u{on_host.dtype.itemsize}")
        if fmt == "bf16":  # raw 16-bit words on the GPU, their float32 values on the host
            expected = expected >> np.uint32(16)
        assert np.array_equal(words, expected.astype(words.dtype))


@pytest.mark.parametrize("fmt", RANDOM_GEMM_DTYPES)
def test_the_gpus_product_of_its_own_operands_is_within_the_hosts_fp64_bound(
    cupy: Any, fmt: str
) -> None:
    from gpuwatchd.canary.cuda import CudaBackend

    backend = CudaBackend(0)
    digest = run_canary(backend, CanarySpec("gemm_random", fmt, RANDOM_SHAPE, 3), RunContext())
    bounded = run_canary(backend, CanarySpec("gemm_bounded", fmt, RANDOM_SHAPE, 3), RunContext())
    assert bounded.result == "pass", bounded.message
    assert bounded.digest == digest.digest  # the same product, digested alike


def test_no_gemm_operand_or_output_crosses_pcie_when_every_digest_is_right(
    cupy: Any, tmp_path: Path
) -> None:
    from cupy._memory import TRANSFERS  # type: ignore[import-not-found]

    request = BurstRequest("cuda", SUITE, gpu=0, uuid=UUID, reference_cache=str(tmp_path))
    first = run_in_process(request, timeout=60, clock=FakeClock())
    assert [r.result for r in first.results] == ["pass"] * len(SUITE)
    TRANSFERS.clear()
    run_in_process(request, timeout=60, clock=FakeClock())
    # The exact GEMMs' host inputs (256 x 16) go up; nothing the size of a
    # GEMM output or a full-mantissa operand (an fp16 one: 128 KiB) moves.
    smallest_gemm = 256 * 256 * 2
    assert TRANSFERS and max(size for _, size in TRANSFERS) < smallest_gemm


def test_an_output_comes_back_only_when_its_digest_is_not_the_known_answers(
    cupy: Any, tmp_path: Path
) -> None:
    from cupy._memory import TRANSFERS

    from gpuwatchd.canary.cuda import CudaBackend

    spec = CanarySpec("gemm_exact", "fp32", (256, 16, 256), 2)
    cache = ReferenceCache(str(tmp_path))
    cache.put(cache_key(spec), "0" * hashing.DIGEST_HEX_DIGITS)  # stale, or damaged
    TRANSFERS.clear()
    result = run_canary(CudaBackend(0), spec, RunContext(cache))
    assert result.result == "pass"  # compared with a reference computed afresh
    assert ("d2h", 256 * 256 * 4) in TRANSFERS
    assert cache.get(cache_key(spec)) != "0" * hashing.DIGEST_HEX_DIGITS


def test_every_device_call_of_a_burst_is_inside_events_that_time_it(cupy: Any) -> None:
    from cupy._memory import ELAPSED, TIMELINE

    TIMELINE.clear()
    ELAPSED.clear()
    request = BurstRequest("cuda", SUITE, gpu=0, uuid=UUID)
    outcome = run_in_process(request, timeout=60, clock=FakeClock())
    position = {number: i for i, (kind, number) in enumerate(TIMELINE) if kind == "event"}
    brackets = [(position[start], position[stop]) for start, stop in ELAPSED]
    calls = [i for i, (kind, _) in enumerate(TIMELINE) if kind != "event"]
    assert calls and all(any(s < i < t for s, t in brackets) for i in calls)
    charged = [r.device_seconds for r in outcome.results]
    assert all(seconds is not None and seconds > 0 for seconds in charged)
    assert outcome.device_seconds == pytest.approx(sum(s for s in charged if s is not None))


def test_a_cuda_sized_burst_holds_at_most_512_mib_each_canary_giving_its_back(
    cupy: Any,
) -> None:
    # The canaries that take the most: the fp64 full-mantissa GEMM (A, B
    # and C of 128 MiB) and the HBM slice (256 MiB, and its temporaries).
    from cupy._memory import POOL

    config = CanaryConfig()
    suite = (
        CanarySpec("gemm_random", "fp64", CUDA_SIZE.gemm_random, 1),
        CanarySpec("hbm_walking_ones", "u64", (config.hbm_bytes // 8,), 1),
        CanarySpec("hbm_own_address", "u64", (config.hbm_bytes // 8,), 1),
    )
    held_between: list[int] = []

    def emit(message: dict[str, Any]) -> None:
        held_between.append(POOL.total_bytes())

    POOL.peak = 0
    execute(BurstRequest("cuda", suite, gpu=0, uuid=UUID), emit)
    assert 256 * MIB <= POOL.peak <= 512 * MIB
    assert held_between == [0] * (2 * len(suite))  # nothing held between canaries
    assert POOL.total_bytes() == 0
