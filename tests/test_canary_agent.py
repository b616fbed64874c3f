"""The daemon's canary agent, end to end on a simulated node: bursts on the
CPU backend standing in for each GPU, on the injected clock."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from daemon_support import InlineExecutor

from gpuwatchd.canary.agent import CanaryAgent
from gpuwatchd.canary.bursts import StandIn
from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.crosscheck import DigestBook
from gpuwatchd.canary.export import families
from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.spec import RANDOM_GEMM_DTYPES
from gpuwatchd.canary.worker import run_in_process
from gpuwatchd.clock import FakeClock
from gpuwatchd.model import GpuSample, Severity, XidEvent
from gpuwatchd.store import Store

T = TypeVar("T")
POLL = 10.0


def gpus(count: int, utilization: float = 0.0) -> list[GpuSample]:
    return [
        GpuSample(
            index=i,
            up=True,
            uuid=f"GPU-{i}",
            utilization_gpu_ratio=utilization,
            temperature_gpu_celsius=55.0,
            sm_clock_hertz=1.98e9,
        )
        for i in range(count)
    ]


def agent(
    clock: FakeClock,
    faults: Callable[[int], tuple[FaultSpec, ...]] = lambda gpu: (),
    config: CanaryConfig | None = None,
    **options: Any,
) -> CanaryAgent:
    return CanaryAgent(
        config or CanaryConfig(host_cores=False),
        clock,
        gpu_backend="cpu",
        stand_ins=(StandIn("NVIDIA H100 80GB HBM3", 132),),
        faults=faults,
        runner=run_in_process,
        executor=InlineExecutor(),
        **options,
    )


def on_gpu_1(mode: str) -> Callable[[int], tuple[FaultSpec, ...]]:
    return lambda gpu: (FaultSpec(mode, seed=3),) if gpu == 1 else ()


def test_a_gpu_with_a_consistent_wrong_answer_is_confirmed_within_three_polls() -> None:
    clock = FakeClock()
    canaries = agent(clock, on_gpu_1("consistent"))
    node = gpus(3)
    views = []
    for _ in range(3):
        views.append(canaries.poll(node))
        clock.advance(POLL)
    assert views[0].findings == () and views[1].findings == ()  # a lead, then its re-runs
    [finding] = views[2].findings
    assert (finding.subject, finding.code, finding.severity) == (
        "gpu:1",
        "sdc_confirmed",
        Severity.CRITICAL,
    )
    assert finding.definitive and finding.evidence["uuid"] == "GPU-1"
    stats = views[2].stats
    assert stats.runs[("gpu:1", "gemm_exact_fp16", "mismatch")] == 2  # the burst and the re-run
    # A confirmed GPU runs no more canaries.
    clock.advance(CanaryConfig().interval)
    canaries.poll(node)
    clock.advance(POLL)
    later = canaries.poll(node).stats
    assert later.runs[("gpu:1", "gemm_exact_fp16", "mismatch")] == 2
    assert later.runs[("gpu:0", "gemm_exact_fp16", "pass")] == 2
    assert stats.runs[("gpu:2", "gemm_exact_fp16", "pass")] == 2  # the burst and the sibling's
    assert ("gpu:0", "gemm_exact_fp16", "mismatch") not in stats.runs
    assert stats.latest[("gpu:0", "int_chain_u32")].temperature_celsius == 55.0
    names = {family.name for family in families(stats)}
    assert "gpuwatchd_canary_runs" in names and "gpuwatchd_canary_tflops" in names


def test_a_fault_in_many_canaries_of_one_burst_is_watched_and_kept_on_record() -> None:
    clock = FakeClock()
    bursts = {"gpu 1": 0}

    def first_burst_only(gpu: int) -> tuple[FaultSpec, ...]:
        if gpu != 1:
            return ()
        bursts["gpu 1"] += 1
        return (FaultSpec("lsb"),) if bursts["gpu 1"] == 1 else ()

    store = Store.in_memory()
    canaries = agent(clock, first_burst_only, CanaryConfig(host_cores=False))
    canaries.keep_history(store.canary)
    node = gpus(3)
    started = clock.now()
    for _ in range(3):
        view = canaries.poll(node)
        clock.advance(POLL)
    # Every canary with a known answer went wrong in the burst (five exact
    # GEMMs, three chains, the conversions, two tensor-core tiles), the
    # re-run on gpu:1 did not, and the sibling computed every one of them
    # right: eleven mismatches of gpu:1's own, and one observation of it.
    [finding] = view.findings
    assert (finding.subject, finding.code) == ("gpu:1", "sdc_suspected")
    # The history is in the state database, for the next daemon.
    records = store.canary.since(0.0)
    assert len(records) == 11 and {r["target"] for r in records} == {"gpu:1"}
    assert {(r["uuid"], r["burst_time"]) for r in records} == {("GPU-1", started + POLL)}
    restarted = agent(clock, config=CanaryConfig(host_cores=False))
    restarted.keep_history(store.canary)
    assert restarted._confirm.history == canaries._confirm.history


def test_the_history_of_a_gpu_gone_from_the_node_is_forgotten() -> None:
    # Rows as an earlier version kept them (no burst time): GPU-1 is on the
    # node, GPU-9 was replaced, cpu:0 is a host core.
    rows = [
        {"time": 100.0, "target": target, "canary": "int_chain_u32", "seed": 1}
        | {"sibling_clear": True, "reproduced": False, "uuid": uuid}
        for target, uuid in (("gpu:1", "GPU-1"), ("gpu:1", "GPU-9"), ("cpu:0", None))
    ]
    store = Store.in_memory()
    store.canary.append(rows)
    clock = FakeClock(1000.0)
    canaries = agent(clock, config=CanaryConfig(host_cores=False, when="idle"))
    canaries.keep_history(store.canary)
    assert [m.burst for m in canaries._confirm.history] == [100.0] * 3
    # A poll in which NVML enumerates nothing, or a GPU whose UUID it cannot
    # read, forgets nothing: it cannot tell which boards left.
    busy = gpus(3, utilization=0.9)
    canaries.poll([])
    canaries.poll([*busy[:2], replace(busy[2], uuid=None)])
    assert len(canaries._confirm.history) == 3
    canaries.poll(busy)
    kept = canaries._confirm.history
    assert [(m.target, m.uuid) for m in kept] == [("gpu:1", "GPU-1"), ("cpu:0", None)]


def test_a_mismatch_history_that_cannot_be_read_starts_afresh() -> None:
    class Broken:
        def since(self, since: float) -> list[dict[str, Any]]:
            raise OSError("disk I/O error")

        def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
            raise OSError("disk I/O error")

    clock = FakeClock()
    canaries = agent(clock, on_gpu_1("consistent"))
    canaries.keep_history(Broken())
    for _ in range(3):
        view = canaries.poll(gpus(3))
        clock.advance(POLL)
    assert [f.code for f in view.findings] == ["sdc_confirmed"]


def test_busy_gpus_are_left_alone_when_canaries_run_only_on_idle_ones() -> None:
    clock = FakeClock()
    canaries = agent(clock, config=CanaryConfig(host_cores=False, when="idle"))
    for _ in range(3):
        view = canaries.poll(gpus(2, utilization=0.9))
        clock.advance(POLL)
    assert view.stats.runs == {}


def test_every_canary_is_exported_at_zero_before_it_first_runs() -> None:
    # So that a first burst's mismatch is an increase from 0 that
    # increase() sees, not a series born at 1.
    clock = FakeClock()
    canaries = agent(clock, config=CanaryConfig(host_cores=False, when="idle"))
    view = canaries.poll(gpus(2, utilization=0.9))
    [runs] = [family for family in families(view.stats) if family.name == "gpuwatchd_canary_runs"]
    series = {
        (s.labels["gpu"], s.labels["canary"], s.labels["result"]): s.value for s in runs.samples
    }
    assert set(series.values()) == {0}
    assert ("1", "gemm_exact_fp16", "mismatch") in series
    assert ("0", "hbm_walking_ones_u64", "pass") in series
    assert {gpu for gpu, _, _ in series} == {"0", "1"}


def test_an_xid_during_a_burst_fails_it_instead_of_raising_a_lead() -> None:
    clock = FakeClock()
    canaries = agent(clock, on_gpu_1("consistent"))
    canaries.poll(gpus(3))
    xid = XidEvent(gpu=1, code=79, time=clock.now() + 1)
    clock.advance(POLL)
    view = canaries.poll(gpus(3), [xid])
    clock.advance(POLL)
    view = canaries.poll(gpus(3), [xid])
    assert view.findings == ()
    assert view.stats.runs[("gpu:1", "gemm_exact_fp16", "error")] == 1
    assert view.stats.latest[("gpu:1", "gemm_exact_fp16")].message == "XID 79 during the burst"


def test_the_host_cores_are_checked_without_gpus() -> None:
    clock = FakeClock()
    canaries = CanaryAgent(
        CanaryConfig(),
        clock,
        gpu_backend=None,
        host_cores=(0,),
        runner=run_in_process,
        executor=InlineExecutor(),
    )
    canaries.poll(gpus(2))
    clock.advance(POLL)
    view = canaries.poll(gpus(2))
    assert {target for target, _, _ in view.stats.runs} == {"cpu:0"}
    assert view.stats.last_pass["cpu:0"] == clock.now() - POLL  # it ran during the first poll


def test_agreed_digests_outlive_the_agent(tmp_path: Path) -> None:
    path = tmp_path / "state" / "canary-digests.json"
    clock = FakeClock()
    canaries = agent(clock, digest_path=str(path))
    canaries.poll(gpus(3))
    clock.advance(POLL)
    canaries.poll(gpus(3))
    book = DigestBook.from_json(path.read_text())
    assert len(book.reference) == len(RANDOM_GEMM_DTYPES)  # the full-mantissa GEMMs
    # A restarted agent judges a lone bad GPU against them at once.
    clock = FakeClock()
    restarted = agent(clock, on_gpu_1("lane"), digest_path=str(path))
    restarted.poll(gpus(3)[1:2])
    clock.advance(POLL)
    stats = restarted.poll(gpus(3)[1:2]).stats
    assert stats.runs[("gpu:1", "gemm_random_fp32", "mismatch")] == 1


def test_busy_gpus_get_their_bursts_within_the_duty_cycle_by_default() -> None:
    clock = FakeClock()
    canaries = agent(clock)
    canaries.poll(gpus(2, utilization=0.9))
    clock.advance(POLL)
    view = canaries.poll(gpus(2, utilization=0.9))
    assert view.stats.runs[("gpu:1", "gemm_exact_bf16", "pass")] == 1


def test_quarantined_gpus_run_no_canaries() -> None:
    clock = FakeClock()
    canaries = agent(clock)
    canaries.poll(gpus(3), quarantined={"gpu:2"})
    clock.advance(POLL)
    view = canaries.poll(gpus(3), quarantined={"gpu:2"})
    assert {target for target, _, _ in view.stats.runs} == {"gpu:0", "gpu:1"}


def test_a_disabled_agent_runs_nothing() -> None:
    clock = FakeClock()
    canaries = agent(clock, config=CanaryConfig(enabled=False))
    canaries.poll(gpus(2))
    clock.advance(POLL)
    assert canaries.poll(gpus(2)).stats.runs == {}


def test_the_daemon_side_does_not_import_numpy() -> None:
    # The suite's numerics run in the worker; the daemon stays lean.
    code = (
        "import sys, gpuwatchd.canary.agent, gpuwatchd.canary.export, gpuwatchd.canary.cli; "
        "print('numpy' in sys.modules)"
    )
    imported = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert imported.stdout.strip() == "False"


def test_no_canary_module_imports_the_simulator() -> None:
    # Production code never loads the simulated node: its faults reach the
    # canaries through the assembly (gpuwatchd/assemble.py).
    code = (
        "import importlib, pkgutil, sys, gpuwatchd.canary as c\n"
        "for m in pkgutil.iter_modules(c.__path__):\n"
        "    importlib.import_module('gpuwatchd.canary.' + m.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpuwatchd.sim')))"
    )
    imported = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert imported.stdout.strip() == "[]"
