"""The out-of-process runner: whatever a burst does, the caller gets results
and keeps going."""

from __future__ import annotations

import importlib.util
import time

import psutil
import pytest

from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.result import CanaryResult, Telemetry
from gpuwatchd.canary.runner import (
    BurstOutcome,
    BurstRequest,
    choose_gpu_backend,
    fail_on_xids,
    probe_cuda,
    run_burst,
)
from gpuwatchd.canary.spec import CanarySpec, host_suite
from gpuwatchd.canary.wire import WireError, from_wire, to_wire
from gpuwatchd.clock import FakeClock
from gpuwatchd.model import XidEvent

SMALL = (
    CanarySpec("gemm_exact", "fp16", (16, 16, 16), 1),
    CanarySpec("int_chain", "u32", (64, 8), 1),
    CanarySpec("hbm_own_address", "u64", (4096,), 1),
)


def request(*faults: str) -> BurstRequest:
    return BurstRequest(
        "cpu",
        SMALL,
        gpu=3,
        uuid="GPU-3",
        stand_in_model="simulated H100",
        stand_in_sm_count=132,
        faults=tuple(FaultSpec(mode) for mode in faults),
    )


def workers_left() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def hot(gpu: int) -> Telemetry:
    return Telemetry(temperature_celsius=71.0, sm_clock_hertz=1.98e9, memory_clock_hertz=2.6e9)


def test_a_clean_burst_passes_and_is_stamped_with_clock_and_telemetry() -> None:
    clock = FakeClock()
    seen: list[CanaryResult] = []
    outcome = run_burst(request(), timeout=30, clock=clock, telemetry=hot, on_result=seen.append)
    assert [r.canary for r in outcome.results] == [spec.name for spec in SMALL]
    assert {r.result for r in outcome.results} == {"pass"}
    assert seen == list(outcome.results)
    first = outcome.results[0]
    assert (first.gpu, first.uuid, first.time) == (3, "GPU-3", clock.now())
    assert (first.temperature_celsius, first.sm_clock_hertz) == (71.0, 1.98e9)
    # An exact GEMM reports no rate (launch-bound); its device time counts.
    assert first.tflops is None
    assert first.device_seconds is not None and first.device_seconds > 0
    assert outcome.device_seconds > 0


def test_a_hanging_canary_is_killed_at_the_timeout() -> None:
    start = time.monotonic()
    outcome = run_burst(request("hang"), timeout=1.5, clock=FakeClock())
    assert time.monotonic() - start < 5
    [result] = outcome.results
    assert (result.canary, result.result, result.gpu) == ("gemm_exact_fp16", "timeout", 3)
    assert "killed" in (result.message or "")
    assert workers_left() == []


def test_a_crashing_worker_is_an_error_and_the_caller_keeps_going() -> None:
    [result] = run_burst(request("crash"), timeout=30, clock=FakeClock()).results
    assert (result.canary, result.result) == ("gemm_exact_fp16", "error")
    assert "SIGKILL" in (result.message or "")
    assert run_burst(request(), timeout=30, clock=FakeClock()).results[0].result == "pass"


def test_a_device_error_fails_the_canary_and_ends_the_burst() -> None:
    [result] = run_burst(request("error"), timeout=30, clock=FakeClock()).results
    assert result.result == "error"
    assert "illegal memory access" in (result.message or "")


def test_a_corrupting_fault_is_a_mismatch_with_evidence() -> None:
    results = run_burst(request("lane"), timeout=30, clock=FakeClock()).results
    by_name = {r.canary: r for r in results}
    assert by_name["gemm_exact_fp16"].result == "mismatch"
    assert by_name["int_chain_u32"].mismatch_lanes == (5,)
    assert by_name["hbm_own_address_u64"].result == "pass"


def test_the_host_cores_are_checked_each_in_turn() -> None:
    cores = (0,)
    outcome = run_burst(
        BurstRequest("cpu", host_suite(1), cpu_cores=cores), timeout=60, clock=FakeClock()
    )
    assert {r.cpu_core for r in outcome.results} == {0}
    assert {r.target for r in outcome.results} == {"cpu:0"}
    assert {r.result for r in outcome.results} == {"pass"}
    assert all(r.temperature_celsius is None for r in outcome.results)


def test_a_missing_cuda_backend_is_an_error_result() -> None:
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    outcome = run_burst(BurstRequest("cuda", SMALL, gpu=0), timeout=60, clock=FakeClock())
    [result] = outcome.results
    assert result.result == "error" and "CuPy" in (result.message or "")
    with pytest.raises(RuntimeError, match="CuPy"):
        probe_cuda(60)
    assert choose_gpu_backend("auto", simulated=False, probe_timeout=60)[0] is None


def test_the_backend_choice_never_puts_the_cpu_in_place_of_a_real_gpu() -> None:
    assert choose_gpu_backend("cpu", simulated=False, probe_timeout=1)[0] is None
    assert choose_gpu_backend("cuda", simulated=False, probe_timeout=1)[0] == "cuda"
    assert choose_gpu_backend("auto", simulated=True, probe_timeout=1)[0] == "cpu"


def outcome_on(gpu: int, started: float) -> BurstOutcome:
    result = CanaryResult(
        canary="int_chain_u32",
        kind="int_chain",
        dtype="u32",
        seed=1,
        shape=(64, 8),
        result="pass",
        duration_seconds=0.1,
        gpu=gpu,
    )
    burst = BurstRequest("cpu", (result.spec,), gpu=gpu)
    return BurstOutcome(burst, (result,), started, started + 1)


def test_an_xid_during_the_burst_fails_it() -> None:
    outcome = outcome_on(2, started=100.0)
    events = [XidEvent(gpu=2, code=79, time=100.5), XidEvent(gpu=1, code=13, time=100.5)]
    [result] = fail_on_xids(outcome, events).results
    assert result.result == "error" and result.message == "XID 79 during the burst"


def test_xids_before_the_burst_or_on_other_gpus_do_not_fail_it() -> None:
    outcome = outcome_on(2, started=100.0)
    events = [XidEvent(gpu=2, code=79, time=99.0), XidEvent(gpu=1, code=13, time=100.5)]
    assert fail_on_xids(outcome, events) == outcome


def test_requests_and_results_survive_the_wire() -> None:
    burst = request("lane")
    assert from_wire(BurstRequest, to_wire(burst)) == burst
    result = outcome_on(1, 0.0).results[0]
    assert from_wire(CanaryResult, to_wire(result)) == result
    with pytest.raises(WireError):
        from_wire(CanaryResult, {**to_wire(result), "result": "maybe"})
    with pytest.raises(WireError):
        from_wire(BurstRequest, {**to_wire(burst), "specs": []})
