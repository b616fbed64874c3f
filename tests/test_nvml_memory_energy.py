"""Framebuffer and energy through the real nvidia-ml-py over the fake libnvidia-ml,
and as the exporter renders them."""

from __future__ import annotations

import logging

import metrics_support
import pynvml
import pytest
from nvml_support import A100, H100, scenario, simulated_node
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.export.gpu import families
from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.sim.gpu import ENERGY_STEP_S, SimulatedGpus
from gpuwatchd.snapshot import Snapshot

MIB = 1 << 20


def test_framebuffer_v2_reports_used_free_and_reserved_adding_up_to_the_total() -> None:
    with simulated_node(model=H100) as node:
        sample = node.gpu_at(300)
        spec, state = node.hardware.gpus[0].spec, node.hardware.state(0)
        assert sample.memory_used_bytes == state.memory_used_bytes
        assert sample.memory_reserved_bytes == spec.memory_reserved_mib * MIB
        assert sample.memory_free_bytes is not None and sample.memory_free_bytes > 0
        total = sample.memory_used_bytes + sample.memory_free_bytes + sample.memory_reserved_bytes
        assert total == 81559 * MIB
        # A training job holds most of the framebuffer.
        assert 0.5 < sample.memory_used_bytes / total < 0.97


def test_driver_without_memory_info_v2_reads_v1_with_reservation_in_used_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gpuwatchd.sources.nvml")
    with simulated_node(
        model=A100, before_start=lambda fake: fake.remove_function("nvmlDeviceGetMemoryInfo_v2")
    ) as node:
        first = node.gpu_at(10)
        second = node.gpu_at(20)
        spec, state = node.hardware.gpus[0].spec, node.hardware.state(0)
        assert second.memory_reserved_bytes is None
        assert second.memory_used_bytes == state.memory_used_bytes + spec.memory_reserved_mib * MIB
        assert second.memory_used_bytes + (second.memory_free_bytes or 0) == 81920 * MIB
        assert first.memory_reserved_bytes is None
    refusals = [r.getMessage() for r in caplog.records if "framebuffer (v2)" in r.getMessage()]
    assert len(refusals) == 1 and "trying nvmlDeviceGetMemoryInfo (v1)" in refusals[0]


def test_framebuffer_refused_by_the_gpu_is_absent_not_zero() -> None:
    def refuse(fake: FakeNvml) -> None:
        for function in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"):
            fake.fail(pynvml.NVML_ERROR_NOT_SUPPORTED, function)

    with simulated_node(before_start=refuse) as node:
        sample = node.gpu_at(10)
        assert sample.responsive
        assert (sample.memory_used_bytes, sample.memory_free_bytes) == (None, None)
        assert sample.memory_reserved_bytes is None


def test_energy_counter_is_joules_and_grows_with_the_power_drawn() -> None:
    with simulated_node(model=H100) as node:
        early = node.gpu_at(100)
        late = node.gpu_at(700)
        assert early.energy_joules is not None and late.energy_joules is not None
        assert late.energy_joules == pytest.approx(node.hardware.state(0).energy_millijoules / 1e3)
        # A busy H100 draws 500-690 W: 600 s of it is 300-414 kJ.
        assert 500 * 600 <= late.energy_joules - early.energy_joules <= 690 * 600


def test_energy_reads_the_same_however_often_the_model_is_advanced() -> None:
    often = SimulatedGpus(scenario(), start=0.0)
    for second in range(0, 1001, 7):
        often.advance(float(second))
    often.advance(1003.5)
    once = SimulatedGpus(scenario(), start=0.0)
    once.advance(1003.5)
    assert often.state(0).energy_millijoules == once.state(0).energy_millijoules
    assert once.state(0).energy_millijoules > 0
    # Within a step the counter keeps growing.
    once.advance(1003.5 + ENERGY_STEP_S / 4)
    assert once.state(0).energy_millijoules > often.state(0).energy_millijoules


def test_power_cap_slows_the_energy_counter_to_the_limit() -> None:
    capped = SimulatedGpus(scenario("[{kind: power_cap, gpu: 0, at: 0s, for: 1h}]"), 0.0)
    capped.advance(600.0)
    # Held just under its 700 W limit the whole time.
    assert capped.state(0).energy_millijoules == pytest.approx(698.5 * 600 * 1000, rel=1e-3)


def test_exporter_renders_framebuffer_by_state_and_energy_as_a_counter_in_base_units() -> None:
    with simulated_node(model=H100, gpus=1) as node:
        sample = node.gpu_at(300)
    text = metrics_support.render(lambda: families(Snapshot(time=300.0, gpus=(sample,))))
    exported = {family.name: family.samples for family in text_string_to_metric_families(text)}
    states = {s.labels["state"]: s.value for s in exported["gpuwatchd_gpu_framebuffer_bytes"]}
    assert states == {
        "used": sample.memory_used_bytes,
        "free": sample.memory_free_bytes,
        "reserved": sample.memory_reserved_bytes,
    }
    (energy,) = exported["gpuwatchd_gpu_energy_joules"]
    assert energy.name == "gpuwatchd_gpu_energy_joules_total"
    assert energy.value == sample.energy_joules
    assert energy.labels["uuid"] == sample.uuid
    assert metrics_support.promtool_check(text)[0] == 0


def test_v1_framebuffer_exports_no_reserved_series() -> None:
    with simulated_node(
        gpus=1, before_start=lambda fake: fake.remove_function("nvmlDeviceGetMemoryInfo_v2")
    ) as node:
        sample = node.gpu_at(30)
    text = metrics_support.render(lambda: families(Snapshot(time=30.0, gpus=(sample,))))
    states = [
        s.labels["state"]
        for family in text_string_to_metric_families(text)
        if family.name == "gpuwatchd_gpu_framebuffer_bytes"
        for s in family.samples
    ]
    assert sorted(states) == ["free", "used"]
