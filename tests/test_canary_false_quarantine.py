"""What must never make a healthy GPU look wrong: a host core that computes a
wrong reference, the sign of an exact zero, a full-mantissa GEMM whose
digest changed with the configuration, one transient that spoils several
canaries of a burst, another board's mismatches at the same NVML index, and
a problem of one model on a node that mixes models."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confirm_support import CONFIG, GPUS, H100, NODE, T0, answer, result
from daemon_support import simulated_daemon
from numpy.typing import NDArray

from gpuwatchd.canary.backend import GemmRun, HostOutput
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.confirm import ConfirmState, Mismatch, Peers, findings, observe
from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.crosscheck import DigestBook, crosscheck
from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.formats import FORMATS, NumberFormat
from gpuwatchd.canary.gemm import exact_gemm, exact_reference, random_gemm
from gpuwatchd.canary.inject import FaultyBackend
from gpuwatchd.canary.result import Outcome
from gpuwatchd.canary.runner import BurstRequest
from gpuwatchd.canary.spec import CanarySpec
from gpuwatchd.canary.suite import (
    HostReferenceError,
    ReferenceCache,
    RunContext,
    _known_answer,
    cache_key,
    error_bound,
    prepare_reference,
    read_back,
    run_canary,
)
from gpuwatchd.canary.worker import run_in_process
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config
from gpuwatchd.snapshot import Snapshot

CORES = tuple(sorted(os.sched_getaffinity(0)))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two host cores")


def mercurial(good: NDArray[Any], bad_core: int) -> NDArray[Any]:
    """A reference as a host whose core `bad_core` flips a bit computes it."""
    if os.sched_getaffinity(0) != {bad_core}:
        return good
    wrong = good.copy()
    wrong.reshape(-1).view(np.uint32)[0] ^= np.uint32(1 << 20)
    return wrong


@two_cores
def test_a_wrong_reference_from_a_bad_host_core_is_an_error_not_a_mismatch() -> None:
    spec = CanarySpec("gemm_exact", "fp32", (32, 32, 32), 1)
    fmt = FORMATS["fp32"]
    right = exact_reference(fmt, exact_gemm(fmt, spec.shape, spec.seed))
    context = RunContext(ReferenceCache(), reference_cores=CORES)
    known = prepare_reference(context, spec, lambda: mercurial(right, CORES[0]))
    with pytest.raises(HostReferenceError, match="host CPU fault"):
        _known_answer(context, spec, read_back(HostOutput(right), known), known)
    # The GPU's output (right) matched nothing on record; nothing was cached.
    assert context.cache.get(cache_key(spec)) is None


@two_cores
def test_a_device_mismatch_names_the_cores_its_reference_was_checked_on() -> None:
    spec = CanarySpec("gemm_exact", "fp32", (32, 32, 32), 1)
    fmt = FORMATS["fp32"]
    right = exact_reference(fmt, exact_gemm(fmt, spec.shape, spec.seed))
    wrong = right.copy()
    wrong.reshape(-1).view(np.uint32)[5] ^= np.uint32(1)
    context = RunContext(reference_cores=CORES)
    expected = prepare_reference(context, spec, lambda: right)
    known = _known_answer(context, spec, read_back(HostOutput(wrong), expected), expected)
    assert known.comparison.count == 1
    assert known.note == f"reference checked on cores {CORES[0]}, {CORES[-1]}"


@two_cores
def test_the_host_core_under_test_never_computes_its_own_reference() -> None:
    spec = CanarySpec("gemm_exact", "fp32", (32, 32, 32), 1)
    fmt = FORMATS["fp32"]
    right = exact_reference(fmt, exact_gemm(fmt, spec.shape, spec.seed))
    under_test = CORES[0]
    # The core computes wrong, its own output and a reference alike: the
    # reference comes from the other cores, so its output mismatches.
    output = right.copy()
    output.reshape(-1).view(np.uint32)[0] ^= np.uint32(1 << 20)
    context = RunContext(cpu_core=under_test, reference_cores=CORES)
    expected = prepare_reference(context, spec, lambda: mercurial(right, under_test))
    known = _known_answer(context, spec, read_back(HostOutput(output), expected), expected)
    assert known.comparison.count == 1


class SignedZeros:
    """A GPU whose adder signs exact cancellations negative (allowed: the
    sign of such a zero is not documented for tensor cores)."""

    def __init__(self) -> None:
        self._inner = CpuBackend()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def gemm(self, fmt: NumberFormat, a: NDArray[Any], b: NDArray[Any]) -> GemmRun:
        run = self._inner.gemm(fmt, a, b)
        values = run.output.fetch()
        output = np.where(values == 0, -values.dtype.type(0), values).astype(values.dtype)
        return GemmRun(output=HostOutput(output), seconds=run.seconds)


def test_a_negative_zero_from_an_exact_cancellation_is_the_right_answer() -> None:
    # bf16 seed 6 at 128^3 has an exact-zero output.
    spec = CanarySpec("gemm_exact", "bf16", (128, 128, 128), 6)
    fmt = FORMATS["bf16"]
    reference = exact_reference(fmt, exact_gemm(fmt, spec.shape, spec.seed))
    assert (reference == 0).any()
    backend: Any = SignedZeros()
    output = backend.gemm(fmt, *_operands(fmt, spec)).output.fetch()
    assert np.signbit(output[reference == 0]).all()
    assert run_canary(backend, spec, RunContext()).result == "pass"


def _operands(fmt: NumberFormat, spec: CanarySpec) -> tuple[NDArray[Any], NDArray[Any]]:
    inputs = exact_gemm(fmt, (spec.shape[0], spec.shape[1], spec.shape[2]), spec.seed)
    return inputs.a, inputs.b


def test_the_error_bound_holds_for_every_summation_order() -> None:
    # fp32 sums of the same random products in different orders differ in
    # their last bits; all stay within the bound of the fp64 reference.
    fmt = FORMATS["fp32"]
    a, b = random_gemm(fmt, (8, 4096, 8), 3)
    exact = a @ b
    scale = np.abs(a) @ np.abs(b)
    products = (a[:, :, None] * b[None, :, :]).astype(np.float32)
    rng = np.random.default_rng(0)
    for _ in range(4):
        order = rng.permutation(a.shape[1])
        total = np.zeros((8, 8), np.float32)
        for index in order:
            total = total + products[:, index, :]
        assert (np.abs(total - exact) <= error_bound(fmt, a.shape[1]) * scale).all()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_bounded_gemm_passes_a_healthy_gpu_and_catches_a_wrong_element(dtype: str) -> None:
    spec = CanarySpec("gemm_bounded", dtype, (192, 192, 192), 1)
    assert run_canary(CpuBackend(), spec, RunContext()).result == "pass"
    faulty = FaultyBackend(CpuBackend(), FaultSpec("consistent", seed=3))
    result = run_canary(faulty, spec, RunContext())
    assert result.result == "mismatch" and result.mismatch_count == 1


def test_a_bounded_gemm_cannot_see_a_last_bit_flip() -> None:
    # The price of judging without a known answer: a flip within the
    # rounding error of some summation order is invisible (docs/sdc.md).
    spec = CanarySpec("gemm_bounded", "fp32", (192, 192, 192), 1)
    faulty = FaultyBackend(CpuBackend(), FaultSpec("lsb", seed=3))
    assert run_canary(faulty, spec, RunContext()).result == "pass"


def test_a_digest_from_another_configuration_is_not_comparable() -> None:
    # The same model and libraries with fewer SMs (an MPS thread limit, a
    # green context) is another scope: never judged against the other.
    request = BurstRequest("cpu", (CanarySpec("gemm_random", "fp32", (64, 64, 64), 1),), gpu=0)
    whole = run_in_process(
        replace(request, stand_in_sm_count=132), timeout=60, clock=FakeClock()
    ).results
    part = run_in_process(
        replace(request, gpu=1, stand_in_sm_count=66), timeout=60, clock=FakeClock()
    ).results
    assert whole[0].environment != part[0].environment
    book, _ = crosscheck(DigestBook(), whole, quorum=1)
    _, judged = crosscheck(book, part, quorum=1)
    assert judged[0].result == "pass"


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "tf32", "fp32", "fp64"])
def test_full_mantissa_operands_use_every_bit_sign_and_exponent(dtype: str) -> None:
    fmt = FORMATS[dtype]
    a, _ = random_gemm(fmt, (64, 64, 64), 5)
    bits = a.view(np.dtype(f"<u{a.dtype.itemsize}")).reshape(-1)
    explicit = fmt.significand_bits - 1
    native = {2: 10, 4: 23, 8: 52}[a.dtype.itemsize]
    # OR of the bits of the format's explicit mantissa (the top `explicit`
    # bits of the host type's mantissa field): every one is used.
    field = bits & type(bits[0])((1 << native) - 1)
    used = int(np.bitwise_or.reduce(field)) >> (native - explicit)
    assert used == (1 << explicit) - 1
    assert (a < 0).any() and (a > 0).any()
    # Eight binades, and a ninth where rounding to nearest carries into 1.
    assert len(np.unique(np.floor(np.log2(np.abs(a))))) in (8, 9)


# -- confirmation: two observations of one board ------------------------------

A100 = "NVIDIA A100-SXM4-80GB, 108 SMs"
# Four H100s and four A100s: each GPU's peers are those of its own model.
MIXED: Peers = {gpu: H100 if index < 4 else A100 for index, gpu in enumerate(GPUS)}
CLEAN: dict[str, Outcome] = {"gpu:3": "pass", "gpu:4": "pass"}


def codes(state: ConfirmState, now: float) -> list[str]:
    return [finding.code for finding in findings(state, now)]


def test_one_burst_with_two_canaries_wrong_once_confirms_nothing() -> None:
    # A host or worker transient spoils two canaries of one burst; neither
    # reproduces and the sibling computes both right: one event, so the GPU
    # is only watched.
    burst = [result("gpu:3"), result("gpu:3", canary="int_chain_u32"), result("gpu:0", "pass")]
    state, reruns = observe(ConfirmState(), burst, T0, CONFIG, NODE)
    state = answer(state, reruns, {"gpu:3": "pass", "gpu:4": "pass"}, T0 + 5)
    assert codes(state, T0 + 5) == ["sdc_suspected"]
    assert len(state.history) == 2 and all(m.sibling_clear for m in state.history)


@pytest.mark.parametrize("sibling_answers", [True, False], ids=["sibling_passes", "sibling_lost"])
def test_a_replaced_gpu_does_not_inherit_the_mismatches_of_the_board_before_it(
    sibling_answers: bool,
) -> None:
    # gpu:3 was board GPU-OLD, confirmed by two mismatches an interval apart
    # and sent back; GPU-NEW now sits at gpu:3. Its first mismatch (the
    # sibling passing, or its re-run never returning) is its first.
    old = tuple(
        Mismatch(T0 + CONFIG.interval * i, "gpu:3", canary, 7, True, False, uuid="GPU-OLD")
        for i, canary in enumerate(("gemm_exact_fp16", "int_chain_u32"))
    )
    later = T0 + 86400.0
    lead = result("gpu:3", canary="fma_chain_fp32", seed=8, uuid="GPU-NEW")
    state, reruns = observe(ConfirmState(history=old), [lead], later, CONFIG, NODE)
    outcomes: dict[str, Outcome] = CLEAN if sibling_answers else {"gpu:3": "pass"}
    state = answer(state, reruns, outcomes, later + 5)
    settled = later + CONFIG.interval + 1
    state, _ = observe(state, [], settled, CONFIG, NODE)
    assert codes(state, settled) == ["sdc_suspected"]


def test_a_renumbered_gpu_takes_its_mismatches_to_its_new_index() -> None:
    # Board GPU-B showed one mismatch as gpu:3; after a reboot it is gpu:5
    # and GPU-A is gpu:3. A mismatch of gpu:3 is GPU-A's first; one of
    # gpu:5 is GPU-B's second.
    kept = Mismatch(T0, "gpu:3", "gemm_exact_fp16", 7, True, False, uuid="GPU-B")
    state = ConfirmState(history=(kept,))
    later = T0 + 86400.0
    on_a = result("gpu:3", canary="int_chain_u32", uuid="GPU-A")
    state, reruns = observe(state, [on_a], later, CONFIG, NODE)
    state = answer(state, reruns, CLEAN, later + 5)
    assert codes(state, later + 5) == ["sdc_suspected"]
    on_b = result("gpu:5", canary="int_chain_u32", uuid="GPU-B")
    state, reruns = observe(state, [on_b], later + 10, CONFIG, NODE)
    assert [r.target for r in reruns] == ["gpu:5", "gpu:6"]
    state = answer(state, reruns, {"gpu:5": "pass", "gpu:6": "pass"}, later + 15)
    confirmed = [f for f in findings(state, later + 15) if f.code == "sdc_confirmed"]
    assert [(f.subject, f.evidence["uuid"]) for f in confirmed] == [("gpu:5", "GPU-B")]
    assert confirmed[0].evidence["mismatches_on_record"] == 2


def test_on_a_mixed_node_a_canary_wrong_on_one_model_is_no_gpu_fault() -> None:
    # A canary every H100 computes wrong (an accumulator narrower on that
    # generation, a driver bug of its architecture) and every A100 right.
    # gpu:3 shows it first: its sibling is gpu:0, an H100 as well, never
    # gpu:4, an A100 that would pass and condemn it.
    state, reruns = observe(ConfirmState(), [result("gpu:3")], T0, CONFIG, MIXED)
    assert [r.target for r in reruns] == ["gpu:3", "gpu:0"]
    state = answer(state, reruns, {"gpu:3": "mismatch", "gpu:0": "mismatch"}, T0 + 5, MIXED)
    assert codes(state, T0 + 5) == ["canary_software_fault"]


def test_a_canary_wrong_on_every_gpu_of_one_model_is_a_software_fault() -> None:
    # Four of eight GPUs is not more than half the node, but it is all of
    # their model: a software fault, and not four leads.
    burst = [result(t, "mismatch" if MIXED[t] == H100 else "pass") for t in GPUS]
    state, reruns = observe(ConfirmState(), burst, T0, CONFIG, MIXED)
    assert reruns == () and codes(state, T0) == ["canary_software_fault"]
    [finding] = findings(state, T0)
    assert finding.evidence["devices"] == "gpu:0,gpu:1,gpu:2,gpu:3"


# -- the same, end to end on a simulated node ---------------------------------

NODE_4 = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"
MINUTE_BURSTS = Config(canary=CanaryConfig(interval=60.0))


def sdc_codes(snapshot: Snapshot) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for finding in snapshot.findings:
        if finding.check == "sdc":
            found.setdefault(finding.code, set()).add(finding.subject)
    return found


def test_a_transient_that_spoils_one_burst_is_watched_never_quarantined(tmp_path: Path) -> None:
    scenario = NODE_4 + "faults: [{at: 10s, kind: sdc, gpu: 2, mode: once}]\n"
    with simulated_daemon(scenario, tmp_path, MINUTE_BURSTS, canary=True) as sim:
        snapshot = sim.run_until(300)
    assert snapshot.canary is not None
    runs = snapshot.canary.runs
    wrong = {
        canary for target, canary, outcome in runs if (target, outcome) == ("gpu:2", "mismatch")
    }
    assert len(wrong) == 3 and all(runs[("gpu:2", c, "mismatch")] == 1 for c in wrong)
    assert sdc_codes(snapshot) == {"sdc_suspected": {"gpu:2"}}
    assert snapshot.quarantines == ()


H100_MODEL, A100_MODEL = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize(
    "models",
    [
        [H100_MODEL] * 4 + [A100_MODEL] * 4,
        # The first A100 to show it has an H100 after it: the sibling that
        # the next GPU of the node would be (review sdc-canaries-2, F3).
        [H100_MODEL, A100_MODEL] * 4,
    ],
    ids=["in_blocks", "alternating"],
)
def test_a_canary_wrong_on_one_model_of_a_mixed_node_quarantines_nothing(
    models: list[str], tmp_path: Path
) -> None:
    a100s = [gpu for gpu, model in enumerate(models) if model == A100_MODEL]
    faults = ", ".join(f"{{at: 10s, kind: sdc, gpu: {gpu}}}" for gpu in a100s)
    names = ", ".join(f'"{model}"' for model in models)
    scenario = f"node: {{models: [{names}], nvlinks: 4, hcas: 2}}\nfaults: [{faults}]\n"
    with simulated_daemon(scenario, tmp_path, MINUTE_BURSTS, canary=True) as sim:
        snapshot = sim.run_until(300)
    found = sdc_codes(snapshot)
    assert found.keys() == {"canary_software_fault"}, found
    assert snapshot.quarantines == ()
