"""Canary metric families, rendered from CanaryStats and checked by promtool."""

from __future__ import annotations

import metrics_support
import pytest
from metrics_support import promtool_check

from gpuwatchd.canary.export import families
from gpuwatchd.canary.result import CanaryResult, Outcome
from gpuwatchd.canary.stats import CanaryStats
from gpuwatchd.export.detail import ExportConfig

T0 = 1_767_225_600.0


def result(
    canary: str,
    outcome: Outcome,
    *,
    gpu: int | None = 0,
    core: int | None = None,
    time: float = T0,
    tflops: float | None = None,
    coverage: float | None = None,
    histogram: tuple[int, ...] = (),
) -> CanaryResult:
    kind, dtype = canary.rsplit("_", 1)
    return CanaryResult(
        canary=canary,
        kind=kind,  # type: ignore[arg-type]
        dtype=dtype,
        seed=1,
        shape=(128, 128, 128),
        result=outcome,
        duration_seconds=0.25,
        gpu=None if core is not None else gpu,
        cpu_core=core,
        time=time,
        tflops=tflops,
        sm_coverage_ratio=coverage,
        mismatch_count=1 if histogram else 0,
        bit_histogram=histogram,
    )


STATS = (
    CanaryStats()
    .add(
        [
            result("gemm_exact_fp16", "pass", tflops=12.5),
            result("int_chain_u32", "pass"),
            result("gemm_exact_fp16", "pass", gpu=1, tflops=12.0),
        ]
    )
    .add(
        [
            result("gemm_exact_fp16", "mismatch", time=T0 + 600, tflops=12.4, histogram=(1, 0, 1)),
            result("int_chain_u32", "pass", time=T0 + 600, coverage=0.75),
        ]
    )
    .add([result("gemm_exact_fp16", "timeout", gpu=1, time=T0 + 600)])
    .add([result("int_chain_u32", "pass", core=3, time=T0 + 700)])
    .add([result("int_chain_u32", "pass", core=5, time=T0 + 700)])
    .add([result("int_chain_u32", "error", core=5, time=T0 + 3700)])
)


FULL = ExportConfig()


def render(
    stats: CanaryStats, export: ExportConfig = FULL, flagged: frozenset[str] = frozenset()
) -> str:
    return metrics_support.render(lambda: families(stats, export, flagged))


def lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_runs_are_counted_by_outcome_with_every_outcome_present() -> None:
    text = render(STATS)
    assert lines(text, "gpuwatchd_canary_runs_total") == [
        'gpuwatchd_canary_runs_total{canary="gemm_exact_fp16",gpu="0",result="pass"} 1.0',
        'gpuwatchd_canary_runs_total{canary="gemm_exact_fp16",gpu="0",result="mismatch"} 1.0',
        'gpuwatchd_canary_runs_total{canary="gemm_exact_fp16",gpu="0",result="error"} 0.0',
        'gpuwatchd_canary_runs_total{canary="gemm_exact_fp16",gpu="0",result="timeout"} 0.0',
        'gpuwatchd_canary_runs_total{canary="int_chain_u32",gpu="0",result="pass"} 2.0',
        'gpuwatchd_canary_runs_total{canary="int_chain_u32",gpu="0",result="mismatch"} 0.0',
        'gpuwatchd_canary_runs_total{canary="int_chain_u32",gpu="0",result="error"} 0.0',
        'gpuwatchd_canary_runs_total{canary="int_chain_u32",gpu="0",result="timeout"} 0.0',
        'gpuwatchd_canary_runs_total{canary="gemm_exact_fp16",gpu="1",result="pass"} 1.0',
        'gpuwatchd_canary_runs_total{canary="gemm_exact_fp16",gpu="1",result="mismatch"} 0.0',
        'gpuwatchd_canary_runs_total{canary="gemm_exact_fp16",gpu="1",result="error"} 0.0',
        'gpuwatchd_canary_runs_total{canary="gemm_exact_fp16",gpu="1",result="timeout"} 1.0',
    ]


def test_the_last_pass_is_the_last_burst_in_which_everything_passed() -> None:
    found = lines(render(STATS), "gpuwatchd_canary_last_pass_timestamp_seconds")
    assert [line.split(" ")[0] for line in found] == [
        'gpuwatchd_canary_last_pass_timestamp_seconds{gpu="0"}',
        'gpuwatchd_canary_last_pass_timestamp_seconds{gpu="1"}',
    ]
    assert [float(line.split(" ")[1]) for line in found] == [T0, T0]


def test_duration_throughput_and_flipped_bits_of_the_latest_runs() -> None:
    text = render(STATS)
    assert 'gpuwatchd_canary_duration_seconds{canary="int_chain_u32",gpu="0"} 0.25' in text
    assert lines(text, "gpuwatchd_canary_tflops") == [
        'gpuwatchd_canary_tflops{canary="gemm_exact_fp16",gpu="0"} 12.4',
    ]
    # Chains only: a GEMM's placement is cuBLAS's.
    assert lines(text, "gpuwatchd_canary_sm_coverage_ratio") == [
        'gpuwatchd_canary_sm_coverage_ratio{canary="int_chain_u32",gpu="0"} 0.75',
    ]
    assert lines(text, "gpuwatchd_canary_bit_flips_total") == [
        'gpuwatchd_canary_bit_flips_total{canary="gemm_exact_fp16",gpu="0"} 2.0',
        'gpuwatchd_canary_bit_flips_total{canary="int_chain_u32",gpu="0"} 0.0',
        'gpuwatchd_canary_bit_flips_total{canary="gemm_exact_fp16",gpu="1"} 0.0',
    ]


def test_host_cores_are_summarised_with_per_core_series_only_for_a_core_that_failed() -> None:
    text = render(STATS)
    assert lines(text, "gpuwatchd_canary_host_runs_total") == [
        'gpuwatchd_canary_host_runs_total{canary="int_chain_u32",result="pass"} 2.0',
        'gpuwatchd_canary_host_runs_total{canary="int_chain_u32",result="mismatch"} 0.0',
        'gpuwatchd_canary_host_runs_total{canary="int_chain_u32",result="error"} 1.0',
        'gpuwatchd_canary_host_runs_total{canary="int_chain_u32",result="timeout"} 0.0',
    ]
    cores = lines(text, "gpuwatchd_canary_cpu_runs_total")
    assert [line for line in cores if 'core="3"' in line] == []
    assert (
        'gpuwatchd_canary_cpu_runs_total{canary="int_chain_u32",core="5",result="error"} 1.0'
        in (cores)
    )
    assert 'gpu="3"' not in text and 'gpu="5"' not in text


def test_every_core_has_its_series_when_asked_for() -> None:
    text = render(STATS, ExportConfig(canary_cores="all"))
    assert (
        'gpuwatchd_canary_cpu_runs_total{canary="int_chain_u32",core="3",result="pass"} 1.0' in text
    )


def test_each_gpu_s_runs_are_summed_over_its_canaries_in_both_modes() -> None:
    for export in (ExportConfig(), ExportConfig(detail="compact")):
        assert lines(render(STATS, export), "gpuwatchd_canary_gpu_runs_total") == [
            'gpuwatchd_canary_gpu_runs_total{gpu="0",result="pass"} 3.0',
            'gpuwatchd_canary_gpu_runs_total{gpu="0",result="mismatch"} 1.0',
            'gpuwatchd_canary_gpu_runs_total{gpu="0",result="error"} 0.0',
            'gpuwatchd_canary_gpu_runs_total{gpu="0",result="timeout"} 0.0',
            'gpuwatchd_canary_gpu_runs_total{gpu="1",result="pass"} 1.0',
            'gpuwatchd_canary_gpu_runs_total{gpu="1",result="mismatch"} 0.0',
            'gpuwatchd_canary_gpu_runs_total{gpu="1",result="error"} 0.0',
            'gpuwatchd_canary_gpu_runs_total{gpu="1",result="timeout"} 1.0',
        ]


def test_compact_mode_keeps_per_canary_detail_for_gpus_that_failed_or_are_not_healthy() -> None:
    passing = CanaryStats().add(
        [
            result("gemm_exact_fp16", "pass", gpu=0, tflops=12.5),
            result("gemm_exact_fp16", "pass", gpu=1, tflops=12.0),
            result("gemm_exact_fp16", "pass", gpu=2, tflops=12.1),
        ]
    )
    stats = passing.add([result("gemm_exact_fp16", "mismatch", gpu=0, time=T0 + 600, tflops=9.0)])
    text = render(stats, ExportConfig(detail="compact"), frozenset({"gpu:2"}))
    detailed = {
        line.split('gpu="')[1][0]
        for name in ("runs_total", "bit_flips_total", "duration_seconds")
        for line in lines(text, f"gpuwatchd_canary_{name}")
    }
    assert detailed == {"0", "2"}
    # What the fleet compares stays for every GPU.
    assert len(lines(text, "gpuwatchd_canary_tflops")) == 3
    assert len(lines(text, "gpuwatchd_canary_last_pass_timestamp_seconds")) == 3


def test_no_runs_no_series() -> None:
    text = render(CanaryStats())
    assert [line for line in text.splitlines() if not line.startswith("#")] == []


@pytest.mark.parametrize("stats", [STATS, CanaryStats()], ids=["runs", "empty"])
def test_the_rendered_families_pass_promtool(stats: CanaryStats) -> None:
    assert promtool_check(render(stats)) == (0, "")
