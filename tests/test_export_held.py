"""The families kept from one render to the next (gpuwatchd.export.held):
an unchanged reading re-uses them, and any change to what they are made of
shows at once, on the page the daemon encodes."""

from __future__ import annotations

import dataclasses

from gpuwatchd.encoding import encode
from gpuwatchd.export import gpu, health
from gpuwatchd.export.detail import ExportConfig
from gpuwatchd.model import GpuSample, Health, LinkSample, Measurement
from gpuwatchd.snapshot import Snapshot


def node(*links: LinkSample, states: dict[str, Health] | None = None) -> Snapshot:
    board = GpuSample(index=0, up=True, uuid="GPU-0", name="H100", nvlinks=links)
    return Snapshot(time=10.0, gpus=(board,), health=states or {"node": Health.HEALTHY})


def page(snapshot: Snapshot, openmetrics_format: bool = False) -> str:
    families = [*gpu.families(snapshot), *health.families(snapshot)]
    return encode((f for f in families if f.samples), openmetrics_format).decode()


def link(crc: int = 0, ber: float | None = None) -> LinkSample:
    rates = {} if ber is None else {"effective": ber}
    return LinkSample(gpu=0, link=3, up=True, errors={"crc_flit": crc}, ber=rates)


def test_an_unchanged_link_reading_made_afresh_reuses_its_families() -> None:
    first = [f for f in gpu.families(node(link(crc=5))) if f.name.startswith("gpuwatchd_nvlink")]
    again = [f for f in gpu.families(node(link(crc=5))) if f.name.startswith("gpuwatchd_nvlink")]
    assert first and all(a is b for a, b in zip(first, again, strict=True))


def test_a_link_counter_that_moved_is_on_the_next_page_in_either_format() -> None:
    for openmetrics_format in (False, True):
        page(node(link(crc=5)), openmetrics_format)
        moved = page(node(link(crc=6)), openmetrics_format)
        assert 'gpuwatchd_nvlink_errors_total{gpu="0",link="3",type="crc_flit"} 6.0' in moved


def test_a_bit_error_rate_of_minus_zero_is_not_served_as_zero() -> None:
    assert 'type="effective"} 0.0' in page(node(link(ber=0.0)))
    assert 'type="effective"} -0.0' in page(node(link(ber=-0.0)))


def test_a_subject_whose_health_changed_is_on_the_next_page() -> None:
    page(node(link(), states={"node": Health.HEALTHY, "gpu:0": Health.HEALTHY}))
    changed = page(node(link(), states={"node": Health.HEALTHY, "gpu:0": Health.DEGRADED}))
    assert 'gpuwatchd_health_state{state="degraded",subject="gpu:0"} 1.0' in changed
    assert 'gpuwatchd_health_state{state="healthy",subject="gpu:0"} 0.0' in changed


def test_a_compact_render_leaves_the_held_full_families_whole() -> None:
    board = GpuSample(index=0, up=True, uuid="GPU-0", name="H100", power_limit_watts=700.0)
    full = Snapshot(time=10.0, gpus=(board,))
    compact = dataclasses.replace(full, export=ExportConfig(detail="compact"))
    limit = 'gpuwatchd_gpu_power_limit_watts{gpu="0",model="H100",uuid="GPU-0"} 700.0'
    assert limit in page(full)
    assert limit not in page(compact)  # a healthy GPU's detail
    assert limit in page(full)


def test_a_family_rebuilt_for_one_moved_series_shows_it_and_keeps_the_others() -> None:
    def two(first: float, second: float) -> Snapshot:
        boards = tuple(
            GpuSample(index=i, up=True, uuid=f"GPU-{i}", name="H100", power_watts=watts)
            for i, watts in enumerate((first, second))
        )
        return Snapshot(time=10.0, gpus=boards)

    for openmetrics_format in (False, True):
        page(two(300.0, 0.0), openmetrics_format)
        moved = page(two(310.0, -0.0), openmetrics_format)
        power = [line for line in moved.splitlines() if line.startswith("gpuwatchd_gpu_power_")]
        assert power == [
            'gpuwatchd_gpu_power_watts{gpu="0",model="H100",uuid="GPU-0"} 310.0',
            'gpuwatchd_gpu_power_watts{gpu="1",model="H100",uuid="GPU-1"} -0.0',
        ]


def test_a_link_handed_back_unchanged_keeps_its_series_beside_one_that_moved() -> None:
    steady = LinkSample(gpu=0, link=1, up=True, errors={"crc_flit": 2}, ber={})
    for openmetrics_format in (False, True):
        page(node(steady, link(crc=5)), openmetrics_format)
        moved = page(node(steady, link(crc=6)), openmetrics_format)
        assert 'gpuwatchd_nvlink_errors_total{gpu="0",link="1",type="crc_flit"} 2.0' in moved
        assert 'gpuwatchd_nvlink_errors_total{gpu="0",link="3",type="crc_flit"} 6.0' in moved
        total = (
            'gpuwatchd_gpu_nvlink_errors_total{gpu="0",model="H100",type="crc_flit",uuid="GPU-0"}'
        )
        assert f"{total} 8.0" in moved


def test_a_derived_value_that_moved_is_on_the_next_page_and_one_that_did_not_stays() -> None:
    def throttled(ratio: float) -> Snapshot:
        measurements = tuple(
            Measurement("gpu_throttle_ratio", {"gpu": str(index), "reason": "hw_slowdown"}, value)
            for index, value in ((0, 0.25), (1, ratio))
        )
        return Snapshot(time=10.0, measurements=measurements)

    for openmetrics_format in (False, True):
        page(throttled(0.5), openmetrics_format)
        moved = page(throttled(-0.0), openmetrics_format)
        ratios = [line for line in moved.splitlines() if line.startswith("gpuwatchd_gpu_throttle")]
        assert ratios == [
            'gpuwatchd_gpu_throttle_ratio{gpu="0",reason="hw_slowdown"} 0.25',
            'gpuwatchd_gpu_throttle_ratio{gpu="1",reason="hw_slowdown"} -0.0',
        ]


def test_a_derived_value_under_other_label_names_is_not_served_under_the_old_ones() -> None:
    def ratio(label: str) -> Snapshot:
        return Snapshot(time=10.0, measurements=(Measurement("test_ratio", {label: "0"}, 0.5),))

    for openmetrics_format in (False, True):
        page(ratio("gpu"), openmetrics_format)
        assert 'gpuwatchd_test_ratio{port="0"} 0.5' in page(ratio("port"), openmetrics_format)
