"""Known answers are computed once per seed and remembered by digest; a
remembered digest can save work but never fake a verdict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuwatchd.canary import suite
from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.faults import FaultSpec
from gpuwatchd.canary.inject import FaultyBackend
from gpuwatchd.canary.spec import CanarySpec
from gpuwatchd.canary.suite import ReferenceCache, RunContext, cache_key, run_canary

SPEC = CanarySpec("gemm_exact", "fp32", (32, 32, 32), 5)


def no_reference(*args: object) -> np.ndarray:
    raise AssertionError("the reference was computed again")


def test_a_reference_is_remembered_across_bursts_in_the_cache_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "references"
    first = run_canary(CpuBackend(), SPEC, RunContext(ReferenceCache(str(directory))))
    assert first.result == "pass"
    assert [entry.name for entry in directory.iterdir()] == [cache_key(SPEC)]
    monkeypatch.setattr(suite, "exact_reference", no_reference)
    later = run_canary(CpuBackend(), SPEC, RunContext(ReferenceCache(str(directory))))
    assert later.result == "pass"


def test_a_wrong_output_is_always_checked_against_a_fresh_reference(tmp_path: Path) -> None:
    cache = ReferenceCache(str(tmp_path))
    run_canary(CpuBackend(), SPEC, RunContext(cache))
    faulty = FaultyBackend(CpuBackend(), FaultSpec("lsb"))
    result = run_canary(faulty, SPEC, RunContext(cache))
    assert (result.result, result.mismatch_count) == ("mismatch", 1)


def test_a_damaged_cache_entry_never_makes_a_false_mismatch(tmp_path: Path) -> None:
    (tmp_path / cache_key(SPEC)).write_text("0" * 64)
    result = run_canary(CpuBackend(), SPEC, RunContext(ReferenceCache(str(tmp_path))))
    assert result.result == "pass"
    assert (tmp_path / cache_key(SPEC)).read_text() != "0" * 64


def test_an_unwritable_cache_costs_only_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    result = run_canary(CpuBackend(), SPEC, RunContext(ReferenceCache(str(blocked))))
    assert result.result == "pass"
    assert "cannot cache a canary reference" in caplog.text


def test_a_cold_reference_is_computed_while_preparing_before_the_device_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first burst of a seed: its references are the host's work of
    # preparing, done before the worker opens the GPU, never while the
    # GPU's memory (and a busy GPU's time) is held.
    context = RunContext(ReferenceCache())
    prepared = suite.prepare_canary(SPEC, context)
    monkeypatch.setattr(suite, "exact_reference", no_reference)
    assert suite.run_prepared(CpuBackend(), prepared, context).result == "pass"
    assert context.cache.get(cache_key(SPEC)) is not None
