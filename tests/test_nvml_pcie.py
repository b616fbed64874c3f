"""The PCIe link through the real nvidia-ml-py over the fake libnvidia-ml, as
the simulator's faults shape it and as the exporter renders it."""

from __future__ import annotations

import metrics_support
import pynvml
from nvml_support import A100, H100, simulated_node
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.export.gpu import families
from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.snapshot import Snapshot


def test_h100_reads_its_gen5_x16_link_and_no_replays() -> None:
    with simulated_node(model=H100) as node:
        sample = node.gpu_at(60)
    assert (sample.pcie_link_generation, sample.pcie_link_max_generation) == (5, 5)
    assert (sample.pcie_link_width, sample.pcie_link_max_width) == (16, 16)
    assert sample.pcie_replays == 0


def test_a100_maximum_is_gen4() -> None:
    with simulated_node(model=A100) as node:
        assert node.gpu_at(60).pcie_link_max_generation == 4


def test_downtrained_fault_lowers_the_current_link_and_leaves_the_maximum() -> None:
    faults = (
        "[{kind: pcie_downtrained, gpu: 1, at: 30s},"
        " {kind: pcie_downtrained, gpu: 0, at: 30s, generation: 3}]"
    )
    with simulated_node(faults) as node:
        before = node.gpu_at(20, index=1)
        halved = node.gpu_at(40, index=1)
        slower = node.gpu_at(40, index=0)
    assert before.pcie_link_width == 16
    assert (halved.pcie_link_width, halved.pcie_link_max_width) == (8, 16)
    assert halved.pcie_link_generation == 5
    assert (slower.pcie_link_generation, slower.pcie_link_width) == (3, 16)


def test_replay_storm_grows_the_replay_counter_at_its_rate() -> None:
    with simulated_node("[{kind: pcie_replay_storm, gpu: 0, at: 10s, rate: 5/s}]") as node:
        assert node.gpu_at(10).pcie_replays == 0
        assert node.gpu_at(70).pcie_replays == 300
        assert node.gpu_at(70, index=1).pcie_replays == 0


def without_the_replay_counter(fake: FakeNvml) -> None:
    """A driver that has the replay counter neither as a field nor as a call."""
    fake.fail_field(pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.remove_function("nvmlDeviceGetPcieReplayCounter")


def test_driver_without_the_replay_counter_leaves_it_absent() -> None:
    with simulated_node(before_start=without_the_replay_counter) as node:
        sample = node.gpu_at(30)
    assert sample.pcie_replays is None and sample.pcie_link_width == 16


def test_a_driver_refusing_the_replay_field_is_read_by_the_call() -> None:
    def refusing_the_field(fake: FakeNvml) -> None:
        fake.fail_field(pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pynvml.NVML_ERROR_NOT_SUPPORTED)

    faults = "[{kind: pcie_replay_storm, gpu: 0, at: 10s, rate: 5/s}]"
    with simulated_node(faults, before_start=refusing_the_field) as node:
        assert node.gpu_at(10).pcie_replays == 0
        assert node.gpu_at(70).pcie_replays == 300


def test_exporter_renders_link_gauges_and_the_replay_counter() -> None:
    with simulated_node("[{kind: pcie_replay_storm, gpu: 0, at: 0s, rate: 1/s}]", gpus=1) as node:
        sample = node.gpu_at(30)
    text = metrics_support.render(lambda: families(Snapshot(time=30.0, gpus=(sample,))))
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "pcie" in s.name
    }
    assert values == {
        "gpuwatchd_gpu_pcie_link_generation": 5,
        "gpuwatchd_gpu_pcie_link_max_generation": 5,
        "gpuwatchd_gpu_pcie_link_width": 16,
        "gpuwatchd_gpu_pcie_link_max_width": 16,
        "gpuwatchd_gpu_pcie_replays_total": 30,
    }
    assert metrics_support.promtool_check(text)[0] == 0
