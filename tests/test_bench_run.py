"""bench/run.py cannot rot: its quick mode runs to the end and writes every
figure the full run writes (timings are the benchmark's to report, never a
test's to assert)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.sim.scenario import FAULT_FIELDS

REPO = Path(__file__).resolve().parent.parent
SPREAD = ("median_ms", "p99_ms")


def measured(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


@pytest.mark.slow
def test_the_quick_benchmark_writes_every_figure(tmp_path: Path) -> None:
    output = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--json", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())
    assert set(results["shapes"]) == {"1", "4", "8", "16"}
    for gpus, shape in results["shapes"].items():
        for name in ("poll_process_cpu", "poll_thread_cpu", "poll_wall", "fake_nvml_cpu"):
            assert all(measured(shape[name][key]) for key in SPREAD)
        assert shape["nvml_calls_per_poll"] > int(gpus)
        assert shape["nvml_driver_ms_per_poll"] > 0
        assert shape["series"] > 0 and shape["bytes"] > 0
    main = results["shapes"]["8"]
    for name in ("render_uncached", "scrape_cached", "http_scrape_cached"):
        assert all(measured(main[name][key]) for key in SPREAD)
    # The memory figures of a run that filled the history, the quick one too.
    rss = results["rss"]
    assert rss["polls"] >= rss["history_full_at"]
    assert 0 < rss["start_mib"] <= rss["full_history_mib"] + 1
    assert measured(rss["growth_after_fill_mib"]) and measured(rss["simulator_share_mib"])
    assert {"default", "1s"} == set(results["cpu_share"])
    for share in results["cpu_share"].values():
        assert share["total_percent"] == pytest.approx(
            share["daemon_percent"] + share["canaries_percent"], abs=0.002
        )
        assert share["canaries_percent"] > 0
    canary = results["canary"]
    assert measured(canary["cuda_host_cpu_s_per_burst"])
    assert measured(canary["gpu_memory_peak_mib"]) and canary["gpu_memory_peak_mib"] > 0
    ib = results["infiniband"]
    for ratio in (
        "ratio_read_render_vs_collector",
        "ratio_read_families_vs_collector",
        "ratio_http_cached_vs_node_exporter",
        "ratio_http_read_render_vs_node_exporter",
    ):
        assert measured(ib[ratio]) and ib[ratio] > 0
    assert ib["series"] > 0 and ib["node_exporter_series"] > 0
    # Every fault kind the scenario machinery knows has its row.
    assert set(results["kinds"]) == set(FAULT_FIELDS)
    for kind in results["kinds"].values():
        assert {"finding_s", "decision_s", "horizon_s"} <= set(kind)
    # A kind that condemns at its first poll does so within the quick horizon too.
    assert results["kinds"]["ecc_uncorrectable"]["decision_s"] is not None
    assert "| figure | measured | target |" in done.stdout
