"""No false alarms: a fault-free backend gives zero mismatches over 10^5
seeded runs of the known-answer canaries, every input format and chain."""

from __future__ import annotations

import pytest

from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.spec import EXACT_GEMM_DTYPES, FMA_CHAIN_DTYPES, CanarySpec
from gpuwatchd.canary.suite import RunContext, run_canary

RUNS = 100_000
# Small shapes keep each run to a fraction of a millisecond; the seed, and so
# every value, sign and scale, changes from run to run.
KINDS = (
    *(CanarySpec("gemm_exact", dtype, (4, 8, 4), 0) for dtype in EXACT_GEMM_DTYPES),
    CanarySpec("int_chain", "u32", (32, 8), 0),
    *(CanarySpec("fma_chain", dtype, (32, 8), 0) for dtype in FMA_CHAIN_DTYPES),
)


@pytest.mark.slow
def test_no_mismatch_in_a_hundred_thousand_seeded_runs() -> None:
    backend = CpuBackend(sm_count=132)
    context = RunContext(gpu=0)
    outcomes: dict[str, int] = {}
    for run in range(RUNS):
        template = KINDS[run % len(KINDS)]
        spec = CanarySpec(template.kind, template.dtype, template.shape, seed=run)
        result = run_canary(backend, spec, context)
        outcomes[result.result] = outcomes.get(result.result, 0) + 1
    assert outcomes == {"pass": RUNS}
