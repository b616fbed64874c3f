"""The device check (scripts/sdc-gpu-check.py) cannot rot where no GPU is:
its probes run through the fake CuPy, whose mma.sync reads the PTX tables
on its own, so the one-hot decode of the fragment layouts must agree with
them and the FP8 sweep must be exact (the fake sums in float64); and its
driver keeps to its budget and writes only JSON where it is told to."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from gpuwatchd.canary import sfu

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "sdc-gpu-check.py"
FAKE_CUPY = Path(__file__).parent / "fake_cupy"
HOPPER = (9, 0)


def load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sdc_gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def check(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, Any]]:
    monkeypatch.syspath_prepend(str(FAKE_CUPY))
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    module = load_check()
    yield module, module.backend()
    for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupy_backends")]:
        del sys.modules[name]


def test_the_one_hot_decode_finds_the_ptx_tables_in_the_fakes_tensor_cores(
    check: tuple[ModuleType, Any],
) -> None:
    module, backend = check
    decoded = module.layout_decode(backend, HOPPER)
    assert {dtype: d["agrees_with_ptx_tables"] for dtype, d in decoded.items()} == {
        "int8": True,
        "fp8_e4m3": True,
    }


def test_the_fp8_sweep_is_exact_in_every_case_where_the_accumulator_is_wide(
    check: tuple[ModuleType, Any],
) -> None:
    module, backend = check
    sweep = module.fp8_sweep(backend, HOPPER)
    widest = max(bits for _, bits, _, _ in module._sweep_cases())
    for name in ("fp8_e4m3", "fp8_e5m2"):
        assert sweep[name]["first_wrong"] == []
        assert sweep[name]["exact_up_to_bits"] == widest
    assert module.fp8_sweep(backend, (8, 0)) == {"skipped": "compute capability (8, 0)"}


def test_the_sfu_probe_states_each_functions_worst_error_and_where(
    check: tuple[ModuleType, Any],
) -> None:
    module, backend = check
    worst = module._sfu_worst(backend, sfu.sfu_inputs(4096, 1))
    assert set(worst) == set(sfu.FUNCTIONS)
    assert all(0 <= w["worst_over_documented_bound"] < sfu.MARGIN for w in worst.values())
    assert all(np.isfinite(w["at"]) for w in worst.values())


def test_out_of_budget_every_section_is_skipped_and_only_json_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--budget", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert [p.name for p in out.iterdir()] == ["report.json"]
    report = json.loads((out / "report.json").read_text())
    names = [name for name, _, _ in load_check().SECTIONS]
    assert names[0] == "truth" and names[-1] == "sandbox"
    assert all("skipped" in report[name] for name in names)
