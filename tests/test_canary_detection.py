"""The detection matrix: every canary against every injected fault class on
the CPU backend. Each fault class lists the canaries meant to catch it; a
test fails when one of them stops catching it.

Why each canary is (or is not) meant to catch each class:
- compute faults (lane, sm, consistent, intermittent, lsb) corrupt results:
  every exact GEMM and chain catches them against its known answer, and the
  full-mantissa GEMMs catch them by disagreeing with their sibling GPUs;
  a flip of the last bit in the full-mantissa GEMMs alone (random_gemm_lsb:
  the production path's own datapath, which no exact canary takes) only
  they catch, bit for bit against their siblings;
- data-triggered faults fire on negative values of magnitude 2 or more (the
  sign and top exponent bit set): the exact GEMMs produce such values only
  because of their sign patterns and power-of-two scales, the integer chain
  and the random GEMMs produce them by chance; the FMA chains never do (their
  state is non-negative), so they are not meant to catch it;
- the tensor-core tiles (mma) are exact like the exact GEMMs: signed int8
  products and signed, scaled fp8 ones give negative outputs with the
  trigger's bits;
- the transcendentals (sfu) are judged against their documented error
  bounds: a flip of the last mantissa bit (lsb) is within them and goes
  unseen, the multi-bit flip reaches an exponent bit and is caught; the
  quotients x / y reach -6 and give the data trigger its negative values;
- the HBM faults live in memory cells the compute canaries never store to:
  walking ones and moving inversions catch a stuck bit, own-address catches
  it too (a word and its complement set every bit once), and only
  own-address catches two aliased addresses (uniform patterns cannot).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from daemon_support import simulated_daemon

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.crosscheck import DigestBook, crosscheck
from gpuwatchd.canary.faults import COMPUTE_MODES, MEMORY_MODES, FaultSpec
from gpuwatchd.canary.formats import FORMATS
from gpuwatchd.canary.gemm import exact_gemm
from gpuwatchd.canary.inject import FAULTY_LANE, FAULTY_SM, FaultyBackend, flip_mask
from gpuwatchd.canary.result import CanaryResult
from gpuwatchd.canary.spec import (
    CPU_SIZE,
    EXACT_GEMM_DTYPES,
    MMA_DTYPES,
    RANDOM_GEMM_DTYPES,
    CanarySpec,
    default_suite,
)
from gpuwatchd.canary.suite import RunContext, run_canary
from gpuwatchd.config import Config

SUITE = default_suite("cpu", seed=3, random_seed=1, hbm_bytes=1 << 20)
EXACT_GEMMS = frozenset(f"gemm_exact_{dtype}" for dtype in EXACT_GEMM_DTYPES)
RANDOM_GEMMS = frozenset(f"gemm_random_{dtype}" for dtype in RANDOM_GEMM_DTYPES)
CHAINS = frozenset({"int_chain_u32", "fma_chain_fp32", "fma_chain_fp64"})
CONVERSIONS = frozenset({"convert_fp32"})
TRANSCENDENTALS = frozenset({"sfu_fp32"})
TENSOR_TILES = frozenset(f"mma_{dtype}" for dtype in MMA_DTYPES)
COMPUTE = EXACT_GEMMS | RANDOM_GEMMS | CHAINS | CONVERSIONS | TENSOR_TILES | TRANSCENDENTALS
WALKING_ONES, OWN_ADDRESS, MOVING_INVERSIONS = (
    "hbm_walking_ones_u64",
    "hbm_own_address_u64",
    "hbm_moving_inversions_u64",
)

MEANT_TO_CATCH: Mapping[str, frozenset[str]] = {
    "lane": COMPUTE,
    "sm": COMPUTE,
    "consistent": COMPUTE,
    "intermittent": COMPUTE,  # on a hot GPU, where the fault fires on every call
    "lsb": COMPUTE - TRANSCENDENTALS,  # within the bound of an approximation
    "random_gemm_lsb": RANDOM_GEMMS,
    # Negative integers have the trigger's top bits.
    "data": EXACT_GEMMS
    | RANDOM_GEMMS
    | {"int_chain_u32"}
    | CONVERSIONS
    | TENSOR_TILES
    | TRANSCENDENTALS,
    "stuck_bit": frozenset({WALKING_ONES, OWN_ADDRESS, MOVING_INVERSIONS}),
    "address_alias": frozenset({OWN_ADDRESS}),
}
HOT_CELSIUS = 95.0
SIBLINGS = ("gpu:0", "gpu:2")


def stand_in() -> CpuBackend:
    return CpuBackend(sm_count=132, name="simulated H100")


def run_suite(backend: object, gpu: int) -> list[CanaryResult]:
    context = RunContext(gpu=gpu)
    return [run_canary(backend, spec, context) for spec in SUITE]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sibling_results() -> list[CanaryResult]:
    return [result for gpu in (0, 2) for result in run_suite(stand_in(), gpu)]


def detected(mode: str, sibling_results: list[CanaryResult]) -> frozenset[str]:
    faulty = FaultyBackend(stand_in(), FaultSpec(mode, seed=11), temperature_celsius=HOT_CELSIUS)
    results = run_suite(faulty, gpu=1)
    # The full-mantissa GEMMs are judged against the node's other GPUs.
    _, judged = crosscheck(DigestBook(), [*sibling_results, *results], quorum=2)
    return frozenset(r.canary for r in judged if r.gpu == 1 and r.result == "mismatch")


def test_the_matrix_covers_every_fault_class_and_every_canary() -> None:
    assert set(MEANT_TO_CATCH) == set(COMPUTE_MODES) | set(MEMORY_MODES)
    names = {spec.name for spec in SUITE}
    assert set().union(*MEANT_TO_CATCH.values()) == names
    assert all(MEANT_TO_CATCH.values())


@pytest.mark.parametrize("mode", sorted(MEANT_TO_CATCH))
def test_each_fault_class_is_caught_by_the_canaries_meant_to_catch_it(
    mode: str, sibling_results: list[CanaryResult]
) -> None:
    missed = MEANT_TO_CATCH[mode] - detected(mode, sibling_results)
    assert not missed, f"{mode} faults went unnoticed by {sorted(missed)}"


def test_a_last_bit_wrong_in_the_full_mantissa_gemms_alone_only_their_digests_see(
    sibling_results: list[CanaryResult],
) -> None:
    assert detected("random_gemm_lsb", sibling_results) == RANDOM_GEMMS


# The re-run of a full-mantissa GEMM's digest mismatch (confirm.rerun_spec),
# against its fp64 error bound alone: a flip within rounding error (lsb)
# passes the bound, and only the re-run's digest, judged against the agreed
# one (crosscheck), sees it (the daemon test at the end of this file).
BOUNDED_CATCHES: Mapping[str, bool] = {
    "lane": True,
    "sm": True,
    "consistent": True,
    "intermittent": True,
    "data": True,
    "lsb": False,
}


@pytest.mark.parametrize("mode", sorted(BOUNDED_CATCHES))
@pytest.mark.parametrize("dtype", RANDOM_GEMM_DTYPES)
def test_the_bounded_rerun_catches_flips_beyond_rounding(mode: str, dtype: str) -> None:
    faulty = FaultyBackend(stand_in(), FaultSpec(mode, seed=11), temperature_celsius=HOT_CELSIUS)
    spec = CanarySpec("gemm_bounded", dtype, CPU_SIZE.gemm_random, 1)
    caught = run_canary(faulty, spec, RunContext(gpu=1)).result == "mismatch"
    assert caught == BOUNDED_CATCHES[mode]
    assert run_canary(stand_in(), spec, RunContext(gpu=0)).result == "pass"


def test_sustained_gemms_catch_a_fault_that_comes_and_goes_between_products() -> None:
    spec = CanarySpec("gemm_burn", "bf16", (*CPU_SIZE.gemm_random, 4), 1)
    assert run_canary(stand_in(), spec, RunContext(gpu=0)).result == "pass"
    hot = FaultyBackend(stand_in(), FaultSpec("intermittent", seed=2), HOT_CELSIUS)
    result = run_canary(hot, spec, RunContext(gpu=1))
    assert result.result == "mismatch"
    assert "repeated products differed from the first" in (result.message or "")


def test_a_fault_free_backend_passes_every_canary(sibling_results: list[CanaryResult]) -> None:
    assert [r.canary for r in sibling_results if r.result != "pass"] == []


def test_fma_chains_are_blind_to_sign_triggered_faults(sibling_results: list[CanaryResult]) -> None:
    # Documents why the FMA chains are not in the data-triggered row: the
    # exact GEMMs' sign patterns are what catches this class.
    assert not {"fma_chain_fp32", "fma_chain_fp64"} & detected("data", sibling_results)


def test_intermittent_faults_are_rare_on_a_cool_gpu() -> None:
    faulty = FaultyBackend(stand_in(), FaultSpec("intermittent", seed=5), temperature_celsius=40.0)
    spec = CanarySpec("int_chain", "u32", (256, 16), seed=1)
    results = [run_canary(faulty, spec, RunContext(gpu=0)) for _ in range(100)]
    assert sum(r.result == "mismatch" for r in results) <= 3


def test_an_intermittent_fault_comes_and_goes_from_burst_to_burst() -> None:
    spec = CanarySpec("int_chain", "u32", (256, 16), seed=1)
    outcomes = []
    for burst in range(40):
        faulty = FaultyBackend(stand_in(), FaultSpec("intermittent", 5), 88.0, draw=burst)
        outcomes.append(run_canary(faulty, spec, RunContext(gpu=0)).result)
    assert 5 < outcomes.count("mismatch") < 35
    again = FaultyBackend(stand_in(), FaultSpec("intermittent", 5), 88.0, draw=7)
    assert run_canary(again, spec, RunContext(gpu=0)).result == outcomes[7]  # deterministic


def test_a_lane_fault_is_localised_to_its_lane() -> None:
    faulty = FaultyBackend(stand_in(), FaultSpec("lane"))
    for spec in SUITE:
        if spec.kind in ("int_chain", "fma_chain"):
            result = run_canary(faulty, spec, RunContext(gpu=1))
            assert result.mismatch_lanes == (FAULTY_LANE,)
            assert len(result.mismatch_units) > 1
            flipped = bin(flip_mask(len(result.bit_histogram))).count("1")
            assert flipped > 1  # a multi-bit flip, every time
            assert sum(result.bit_histogram) == flipped * result.mismatch_count


def test_an_sm_fault_is_localised_to_its_sm() -> None:
    faulty = FaultyBackend(stand_in(), FaultSpec("sm"))
    for spec in SUITE:
        if spec.kind in ("int_chain", "fma_chain"):
            result = run_canary(faulty, spec, RunContext(gpu=1))
            assert result.mismatch_units == (FAULTY_SM,)
            assert len(result.mismatch_lanes) == 32


def test_a_lowest_bit_flip_shows_in_the_histogram_alone() -> None:
    faulty = FaultyBackend(stand_in(), FaultSpec("lsb", seed=2))
    spec = CanarySpec("gemm_exact", "fp32", (32, 32, 32), seed=4)
    result = run_canary(faulty, spec, RunContext(gpu=1))
    assert result.mismatch_count == 1
    assert result.bit_histogram[0] == 1 and sum(result.bit_histogram) == 1
    expected, actual = (
        int(result.first_expected_bits or "", 16),
        int(result.first_actual_bits or "", 16),
    )
    assert expected ^ actual == 1


def gpu_burn_style_check(backend: FaultyBackend, spec: CanarySpec) -> bool:
    """What a self-comparison burn-in does: run the same GEMM again and
    again, and pass when every run equals the GPU's own first result."""
    fmt = FORMATS[spec.dtype]
    m, k, n = spec.shape
    inputs = exact_gemm(fmt, (m, k, n), spec.seed)
    first = backend.gemm(fmt, inputs.a, inputs.b).output.fetch()
    return all(
        np.array_equal(backend.gemm(fmt, inputs.a, inputs.b).output.fetch(), first)
        for _ in range(5)
    )


def test_a_self_comparison_misses_the_consistent_wrong_answer(
    sibling_results: list[CanaryResult],
) -> None:
    faulty = FaultyBackend(stand_in(), FaultSpec("consistent", seed=11))
    spec = next(spec for spec in SUITE if spec.name == "gemm_exact_fp16")
    assert gpu_burn_style_check(faulty, spec)  # the same wrong answer every time
    assert run_canary(faulty, spec, RunContext(gpu=1)).result == "mismatch"
    assert detected("consistent", sibling_results) >= RANDOM_GEMMS


def test_a_gpu_whose_full_mantissa_gemms_are_wrong_in_the_last_bit_is_quarantined(
    tmp_path: Path,
) -> None:
    # The fault no exact canary sees: its digests differ from the ones its
    # siblings agree on, its re-run's again while the sibling's is the
    # agreed one, bit for bit: confirmed, though within the fp64 bound.
    scenario = (
        "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"
        "faults: [{at: 10s, kind: sdc, gpu: 2, mode: random_gemm_lsb}]\n"
    )
    config = Config(canary=CanaryConfig(interval=60.0))
    with simulated_daemon(scenario, tmp_path, config, canary=True) as sim:
        snapshot = sim.run_until(300)
    finding = next(f for f in snapshot.findings if f.code == "sdc_confirmed")
    assert finding.subject == "gpu:2" and finding.definitive
    assert str(finding.evidence["canary"]).startswith(("gemm_random_", "gemm_bounded_"))
    assert {q.subject for q in snapshot.quarantines} == {"gpu:2", "node"}
    assert snapshot.canary is not None
    wrong = {c for target, c, outcome in snapshot.canary.runs if outcome == "mismatch"}
    assert wrong and all(c.startswith(("gemm_random_", "gemm_bounded_")) for c in wrong)
