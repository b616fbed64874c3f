"""Test support for the confirmation rules: canary results and re-run
answers as a burst's worker would give them, on an 8-GPU node of one model."""

from __future__ import annotations

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.confirm import ConfirmState, Peers, Rerun, observe, observe_rerun
from gpuwatchd.canary.result import CanaryResult, Outcome

CONFIG = CanaryConfig(interval=600.0, watch_for=3600.0, software_ratio=0.5)
GPUS = tuple(f"gpu:{i}" for i in range(8))
H100 = "NVIDIA H100 80GB HBM3, 132 SMs"
NODE: Peers = dict.fromkeys(GPUS, H100)
T0 = 1_000_000.0


def result(
    target: str,
    outcome: Outcome = "mismatch",
    canary: str = "gemm_exact_fp16",
    seed: int = 7,
    uuid: str | None = None,
) -> CanaryResult:
    """`uuid`: the board's; `GPU-<index>` for a GPU by default."""
    kind, index = target.split(":")
    kind_name, dtype = canary.rsplit("_", 1)
    return CanaryResult(
        canary=canary,
        kind=kind_name,  # type: ignore[arg-type]
        dtype=dtype,
        seed=seed,
        shape=(128, 128, 128),
        result=outcome,
        duration_seconds=0.01,
        gpu=int(index) if kind == "gpu" else None,
        uuid=uuid or (f"GPU-{index}" if kind == "gpu" else None),
        cpu_core=int(index) if kind == "cpu" else None,
        mismatch_count=1 if outcome == "mismatch" else 0,
        first_mismatch_index=15 if outcome == "mismatch" else None,
        bit_histogram=(1, 0, 1) if outcome == "mismatch" else (),
    )


def answer(
    state: ConfirmState,
    reruns: tuple[Rerun, ...],
    outcomes: dict[str, Outcome],
    now: float,
    targets: Peers = NODE,
) -> ConfirmState:
    """Play back the re-runs with the given outcome per target (a target not
    named never answers), for every canary each re-run asks for."""
    for rerun in (r for r in reruns if r.target in outcomes):
        results = [
            result(rerun.target, outcomes[rerun.target], spec.name, spec.seed)
            for spec in rerun.specs
        ]
        state, more = observe_rerun(state, rerun, results, now, CONFIG, targets)
        assert more == ()
    return state


def lead_on(
    target: str, now: float = T0, state: ConfirmState | None = None, canary: str = "gemm_exact_fp16"
) -> tuple[ConfirmState, tuple[Rerun, ...]]:
    """A burst in which `target` mismatches on `canary`."""
    burst = [result(target, canary=canary), result("gpu:0", "pass")]
    return observe(state or ConfirmState(), burst, now, CONFIG, NODE)
