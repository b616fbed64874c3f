"""The NVML source's field-value batch: a request array kept per GPU and
reused while the poll asks the same fields, called by its function pointer
and read from its memory, must read what nvidia-ml-py's own wrapper reads."""

from __future__ import annotations

import logging

import pynvml
import pytest
from nvml_support import simulated_node

from gpuwatchd.sim.fake_nvml import FakeNvml

MEMORY_TEMP: int = pynvml.NVML_FI_DEV_MEMORY_TEMP
ENERGY: int = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
LINK_STATE: int = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
UINT: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT


def _by_the_binding(gpu: int, ids: list[tuple[int, int]]) -> list[float | int]:
    """The fields' values as nvidia-ml-py's wrapper reads them, by member."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    values = pynvml.nvmlDeviceGetFieldValues(handle, ids)
    assert all(value.nvmlReturn == pynvml.NVML_SUCCESS for value in values)
    return [
        value.value.uiVal if value.valueType == UINT else value.value.ullVal for value in values
    ]


def test_the_reused_batch_reads_poll_after_poll_what_the_bindings_wrapper_reads() -> None:
    with simulated_node() as node:
        for seconds in (10, 20, 30):
            sample = node.gpu_at(seconds, index=1)
            ids = [(MEMORY_TEMP, 0), (ENERGY, 0), (LINK_STATE, 17)]
            temperature, energy_mj, link_17_up = _by_the_binding(1, ids)
            assert sample.temperature_memory_celsius == float(temperature)
            assert sample.energy_joules == pytest.approx(energy_mj * 1e-3)
            assert sample.nvlinks[17].up is bool(link_17_up)


def test_a_field_that_answers_an_error_after_a_value_is_absent_not_its_last_value() -> None:
    with simulated_node() as node:
        assert node.gpu_at(10).temperature_memory_celsius is not None
        # Unknown is asked again every poll: the same fields, the same array.
        node.fake.fail_field(MEMORY_TEMP, pynvml.NVML_ERROR_UNKNOWN, gpu=0)
        refused = node.gpu_at(20)
        assert refused.temperature_memory_celsius is None
        assert refused.energy_joules is not None
        node.fake.clear_failures()
        assert node.gpu_at(30).temperature_memory_celsius is not None


def test_a_driver_without_the_field_values_call_reads_energy_and_replays_by_their_calls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gpuwatchd.sources.nvml")

    def predating(fake: FakeNvml) -> None:
        fake.remove_function("nvmlDeviceGetFieldValues")

    with simulated_node(before_start=predating) as node:
        sample = node.gpu_at(10)
        state = node.hardware.state(0)
        assert sample.responsive
        assert sample.energy_joules == pytest.approx(state.energy_millijoules * 1e-3)
        assert sample.pcie_replays == state.pcie_replays
        # Only a field gives the HBM temperature.
        assert sample.temperature_memory_celsius is None
        assert node.gpu_at(20).energy_joules is not None
    refusals = [r.getMessage() for r in caplog.records if "field values on GPU" in r.getMessage()]
    assert len(refusals) == 1 and "Function Not Found" in refusals[0]
