"""Samples kept as columns read back as they were recorded, and cost a run
per change: a field that never changes is one run however long it is kept,
counter names are held once, and what was put for a replaced sample is
taken back."""

from __future__ import annotations

from pathlib import Path

from nvml_support import simulated_node

from gpuwatchd.clock import FakeClock
from gpuwatchd.columns import Runs, SampleColumns
from gpuwatchd.model import GpuSample, LinkSample, PortSample
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.node import SimulatedNode
from gpuwatchd.sources import InfinibandSourceConfig
from gpuwatchd.sources.infiniband import InfinibandSource

STORMY = (
    "[{at: 30s, kind: nvlink_crc_storm, gpu: 0, link: 3, rate: 100/s},"
    " {at: 60s, kind: gpu_lost, gpu: 1, for: 30s},"
    " {at: 50s, kind: ecc_sbe_storm, gpu: 0, rate: 1/s}]"
)


def gpu_columns() -> SampleColumns[GpuSample]:
    return SampleColumns(GpuSample, {"nvlinks": ("link", LinkSample)})


def test_gpu_samples_read_back_as_recorded_through_storms_and_a_lost_gpu() -> None:
    columns = [gpu_columns(), gpu_columns()]
    recorded: list[tuple[GpuSample, ...]] = []
    with simulated_node(STORMY, gpus=2) as node:
        for seq, seconds in enumerate(range(10, 200, 10)):
            reading = node.poll_at(seconds)
            assert reading.gpus is not None
            recorded.append(reading.gpus)
            for gpu, kept in zip(reading.gpus, columns, strict=True):
                kept.put(seq, gpu)
    for seq, gpus in enumerate(recorded):
        assert tuple(kept.at(seq) for kept in columns) == gpus
    assert any(not gpu.up for gpus in recorded for gpu in gpus)
    assert recorded[-1][0].nvlinks[3].errors["crc_flit"] > 0


def test_port_samples_read_back_as_recorded_with_their_names_held_once(tmp_path: Path) -> None:
    scenario = scenarios.parse(
        "node: {gpus: 1, hcas: 2}\n"
        "faults: [{at: 20s, kind: ib_symbol_errors, hca: mlx5_1, port: 1, rate: 50/s}]\n"
    )
    clock = FakeClock()
    node = SimulatedNode(scenario, tmp_path, clock.now())
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path)))
    kept: dict[tuple[str, int], SampleColumns[PortSample]] = {}
    recorded = []
    for seq in range(12):
        node.advance(clock.now())
        ports = source.poll(clock.now()).ports or ()
        recorded.append(ports)
        for port in ports:
            kept.setdefault((port.device, port.port), SampleColumns(PortSample)).put(seq, port)
        clock.advance(10)
    for seq, ports in enumerate(recorded):
        assert tuple(kept[p.device, p.port].at(seq) for p in ports) == ports
    first, last = (kept["mlx5_1", 1].at(seq) for seq in (0, 11))
    assert last.counters["symbol_error"] > first.counters["symbol_error"]
    assert all(a is b for a, b in zip(first.counters, last.counters, strict=True))


def test_a_value_that_never_changes_is_one_run_however_long() -> None:
    runs = Runs()
    for seq in range(360):
        runs.put(seq, 700.0)
    assert len(runs._starts) == 1 and runs.at(359) == 700.0


def test_runs_keep_each_kind_of_value_as_it_was_put() -> None:
    values: list[object] = [None, True, False, 3, 2**64 - 1, 1.5, "ACTIVE", None, 0, False]
    runs = Runs()
    for seq, value in enumerate(values):
        runs.put(seq, value)
    read = [runs.at(seq) for seq in range(len(values))]
    assert read == values
    assert [type(value) for value in read] == [type(value) for value in values]


def test_a_replaced_sample_is_taken_back_and_what_is_dropped_is_forgotten() -> None:
    runs = Runs()
    for seq, value in enumerate((1, 1, 2, 3)):
        runs.put(seq, value)
    runs.forget_from(3)
    runs.put(3, 2)
    assert [runs.at(seq) for seq in range(4)] == [1, 1, 2, 2]
    runs.forget_before(3)
    assert runs.at(3) == 2 and len(runs._starts) == 1


def test_equal_values_of_another_type_are_kept_as_put_in_fields_and_mappings() -> None:
    # 1, 1.0 and True compare equal; a sample read back must hold what was put.
    values: list[object] = [1, 1.0, True, 1, 1, 1.0]
    recorded = [
        PortSample(device="mlx5_0", port=1, state_id=v, counters={"a": v, "b": 7}) for v in values
    ]
    columns = SampleColumns(PortSample)
    for seq, sample in enumerate(recorded):
        columns.put(seq, sample)
    columns.forget_from(5)
    columns.put(5, recorded[5])
    read = [columns.at(seq) for seq in range(len(values))]
    assert read == recorded
    assert [type(sample.state_id) for sample in read] == [type(v) for v in values]
    assert [type(sample.counters["a"]) for sample in read] == [type(v) for v in values]
