"""The conversion canary: exact answers, ties to even, and a wrong word
traced to its thread's SM and lane."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuwatchd.canary.backend import HostOutput, ThreadRun
from gpuwatchd.canary.convert import (
    ConvertInputs,
    convert,
    convert_inputs,
    convert_reference,
)
from gpuwatchd.canary.cpu import CpuBackend
from gpuwatchd.canary.spec import CanarySpec
from gpuwatchd.canary.suite import RunContext, run_canary


@pytest.mark.parametrize("seed", range(4))
def test_numpys_conversions_and_cpythons_agree_bit_for_bit(seed: int) -> None:
    inputs = convert_inputs(2048, seed)
    assert (np.abs(inputs.single) < 2**-14).any()  # fp16 subnormals
    assert np.array_equal(convert(inputs), convert_reference(inputs))


def test_halfway_cases_round_to_even() -> None:
    inputs = convert_inputs(64, 0)
    words = convert_reference(inputs)
    # fp16 of 1 + 2^-11 and 1 + 3 * 2^-11: 1.0 and 1 + 2^-9.
    assert [hex(w) for w in words[:2, 0]] == ["0x3c00", "0x3c02"]
    # bf16 of 1 + 2^-8 and -(1 + 3 * 2^-8).
    assert [hex(w) for w in words[2:4, 1]] == ["0x3f80", "0xbf82"]
    # int32 of 0.5, 1.5, 2.5 and -2.5.
    assert words[4:8, 2].view(np.int32).tolist() == [0, 2, 2, -2]
    # fp32 of 1 + 2^-24 and 1 + 3 * 2^-24.
    assert [hex(w) for w in words[:2, 3]] == ["0x3f800000", "0x3f800002"]


class OneWrongWord(CpuBackend):
    """A stand-in GPU whose conversion unit flips bit 3 of thread 37's bf16."""

    def convert(self, inputs: ConvertInputs) -> ThreadRun:
        run = super().convert(inputs)
        values: Any = run.values.fetch().copy()
        values[37, 1] ^= np.uint32(1 << 3)
        return ThreadRun(values=HostOutput(values), units=run.units)


def test_a_wrong_conversion_is_a_mismatch_at_its_threads_sm_and_lane() -> None:
    spec = CanarySpec("convert", "fp32", (1024,), 5)
    result = run_canary(OneWrongWord(sm_count=132), spec, RunContext(gpu=0))
    assert (result.result, result.mismatch_count) == ("mismatch", 1)
    assert result.first_mismatch_index == 37 * 4 + 1
    assert (result.mismatch_units, result.mismatch_lanes) == ((0,), (37 % 32,))
    assert run_canary(CpuBackend(sm_count=132), spec, RunContext(gpu=0)).result == "pass"
