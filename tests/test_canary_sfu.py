"""The transcendentals canary (sfu.py): judged against the documented error
bound of each fast intrinsic, widened by MARGIN, around an exact value."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwatchd.canary import sfu
from gpuwatchd.canary.backend import HostOutput, ThreadRun
from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.spec import CanarySpec
from gpuwatchd.canary.suite import RunContext, run_canary

SPEC = CanarySpec("sfu", "fp32", (4096,), 3)


@pytest.mark.parametrize("seed", range(4))
def test_float32_functions_stay_far_inside_the_widened_bounds(seed: int) -> None:
    # A GPU's approximations err up to the documented bound, 1/MARGIN of the
    # tolerance; the CPU stand-in's float32 NumPy about as much (its
    # vectorised expf is off by up to 2.2 ulp where the bound is 2).
    inputs = sfu.sfu_inputs(65536, seed)
    exact = sfu.sfu_reference(inputs)
    error = np.abs(sfu.sfu(inputs) - exact)
    assert (error <= sfu.tolerance(inputs, exact) / 4).all()


def test_the_inputs_stay_inside_the_documented_ranges_and_clear_of_denormals() -> None:
    inputs = sfu.sfu_inputs(65536, 1)
    assert (np.abs(inputs.angle) >= 2.0**-8).all() and (np.abs(inputs.angle) < np.pi).all()
    assert (inputs.scale >= 0.5).all() and (inputs.scale < 2).all()
    assert (np.abs(inputs.power) <= sfu.EXP_RANGE).all()


def test_the_bounds_are_the_cuda_guides() -> None:
    inputs = sfu.SfuInputs(
        np.array([1.0], np.float32), np.array([1.0], np.float32), np.array([8.0], np.float32)
    )
    exact = sfu.sfu_reference(inputs)
    bound = sfu.tolerance(inputs, exact)[0] / sfu.MARGIN
    assert bound[:3].tolist() == [2.0**-21.41, 2.0**-21.19, 2.0**-22]
    # __expf(8) = 2981: 2 + floor(1.173 * 8) = 11 ulp of 2^11.
    assert bound[3] == 11 * 2.0 ** (11 - 23)
    assert bound[4] == 2 * 2.0**-23 and bound[5] == 2 * 2.0**-23


class Moved(CpuBackend):
    """One result of thread 700 (block 2, lane 28) moved by `delta` ulps."""

    def __init__(self, word: int, ulps: int) -> None:
        super().__init__(sm_count=132)
        self._word, self._ulps = word, ulps

    def sfu(self, inputs: sfu.SfuInputs) -> ThreadRun:
        run = super().sfu(inputs)
        values = run.values.fetch().copy()
        values.view(np.int32)[700, self._word] += self._ulps
        return ThreadRun(values=HostOutput(values), units=run.units)


@pytest.mark.parametrize("word", range(sfu.WORDS_PER_THREAD))
def test_a_result_outside_its_bound_is_a_mismatch_at_its_sm_and_lane(word: int) -> None:
    result = run_canary(Moved(word, 1 << 20), SPEC, RunContext(gpu=0))
    assert (result.result, result.mismatch_count) == ("mismatch", 1)
    assert result.first_mismatch_index == 700 * sfu.WORDS_PER_THREAD + word
    assert (result.mismatch_units, result.mismatch_lanes) == ((2,), (700 % 32,))
    assert "outside the documented error bound" in (result.message or "")


@pytest.mark.parametrize("word", range(sfu.WORDS_PER_THREAD))
def test_a_result_moved_within_its_bound_is_not_a_mismatch(word: int) -> None:
    # What an approximation may do is never called a fault: the limit of
    # this canary (a flip in the last bits goes unseen).
    assert run_canary(Moved(word, 2), SPEC, RunContext(gpu=0)).result == "pass"


def test_a_nan_is_outside_every_bound() -> None:
    inputs = sfu.sfu_inputs(8, 1)
    values = sfu.sfu(inputs)
    values[3, 2] = np.nan
    assert sfu.outside(values, sfu.sfu_reference(inputs), inputs).sum() == 1
