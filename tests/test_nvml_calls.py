"""What the NVML source asks the driver for: the calls a poll makes, counted
by the fake libnvidia-ml. Each call costs driver time on a real node (tens
of microseconds, more on a busy GPU), so values that do not change are read
every `static_refresh`, link states and counters are field values where the
driver has them, and the per-link counter calls of Hopper and older are made
when the DL fields say a count moved."""

from __future__ import annotations

import logging
from collections import Counter

import pynvml
import pytest
from nvml_support import A100, SimulatedNode, simulated_node

from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.sources import NvmlSourceConfig

POLL = 10
REFRESH = NvmlSourceConfig().static_refresh
INTERVAL = NvmlSourceConfig().link_counter_interval
COUNTER_CALL = "nvmlDeviceGetNvLinkErrorCounter"
# An H100 reports 3 counters on each of its 18 links.
COUNTER_CALLS = 18 * 3
DL_FIELDS = (
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
)


def calls_at(node: SimulatedNode, seconds: float) -> Counter[str]:
    """The calls the poll at `seconds` made."""
    before = Counter(node.fake.calls)
    node.poll_at(seconds)
    return node.fake.calls - before


def test_an_hour_of_an_8_h100_node_averages_at_most_25_calls_a_gpu_a_poll() -> None:
    polls = int(3600 / POLL)
    with simulated_node(gpus=8) as node:
        before = sum(node.fake.calls.values())
        for second in range(POLL, POLL * polls + 1, POLL):
            node.poll_at(second)
        made = sum(node.fake.calls.values()) - before
    # Start-up (link discovery, the counter probe) and six static refreshes included.
    assert made / polls / 8 <= 25


def test_values_that_do_not_change_are_read_at_start_and_every_static_refresh() -> None:
    with simulated_node(gpus=1) as node:
        first = calls_at(node, POLL)
        between = [calls_at(node, second) for second in range(2 * POLL, int(REFRESH), POLL)]
        refreshed = calls_at(node, POLL + REFRESH)
        sample = node.gpu_at(POLL + REFRESH + POLL)
    static = ("nvmlDeviceGetVbiosVersion", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetEccMode")
    for function in static:
        assert first[function] >= 1 and refreshed[function] >= 1
        assert all(calls[function] == 0 for calls in between)
    assert sample.vbios_version is not None and sample.sm_max_clock_hertz is not None
    assert sample.temperature_slowdown_celsius is not None


def test_a_gpu_that_answers_again_has_its_static_values_read_again() -> None:
    with simulated_node("[{at: 30s, kind: gpu_lost, gpu: 0, for: 30s}]", gpus=1) as node:
        node.poll_at(10)
        assert node.gpu_at(40).up is False
        back = calls_at(node, 70)
    assert back["nvmlDeviceGetVbiosVersion"] == 1


def test_hopper_reads_its_link_states_in_the_field_batch() -> None:
    with simulated_node(gpus=1) as node:
        node.poll_at(POLL)
        later = calls_at(node, 2 * POLL)
        links = node.gpu_at(3 * POLL).nvlinks
    assert later["nvmlDeviceGetNvLinkState"] == 0
    assert len(links) == 18 and all(link.up for link in links)


def test_ampere_reads_its_link_states_by_call() -> None:
    with simulated_node(model=A100, gpus=1) as node:
        node.poll_at(POLL)
        later = calls_at(node, 2 * POLL)
    assert later["nvmlDeviceGetNvLinkState"] == 12


def test_quiet_links_counters_are_read_only_at_the_static_refresh() -> None:
    with simulated_node(gpus=1) as node:
        node.poll_at(POLL)
        between = [calls_at(node, s)[COUNTER_CALL] for s in range(2 * POLL, int(REFRESH), POLL)]
        refreshed = calls_at(node, POLL + REFRESH)[COUNTER_CALL]
    assert between == [0] * len(between)
    assert refreshed == COUNTER_CALLS


def test_a_storm_has_the_counters_read_at_every_poll_it_lasts() -> None:
    storm = "[{at: 95s, kind: nvlink_crc_storm, gpu: 0, link: 7, rate: 100/s, for: 60s}]"
    with simulated_node(storm, gpus=1) as node:
        before = [calls_at(node, s)[COUNTER_CALL] for s in range(POLL, 100, POLL)]
        during = [calls_at(node, s)[COUNTER_CALL] for s in range(100, 160, POLL)]
        after = [calls_at(node, s)[COUNTER_CALL] for s in range(160, 220, POLL)]
        crc = node.gpu_at(220).nvlinks[7].errors["crc_flit"]
    assert before[1:] == [0] * (len(before) - 1)
    assert during == [COUNTER_CALLS] * len(during)
    # The poll after the storm ends reads the last counts; then the links are quiet.
    assert after[1:] == [0] * (len(after) - 1)
    assert crc == 6000


def dl_fields_answering_zero(fake: FakeNvml) -> None:
    """A driver whose DL fields answer SUCCESS with 0, whatever the counters do
    (as Hopper answers the legacy `_TOTAL` fields: DataDog PR #55966)."""
    for field_id in DL_FIELDS:
        fake.fail_field(field_id, pynvml.NVML_SUCCESS)


def test_dl_fields_that_do_not_follow_the_counters_are_dropped_for_the_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gpuwatchd.sources.nvml")
    storm = "[{at: 100s, kind: nvlink_crc_storm, gpu: 0, link: 7, rate: 100/s}]"
    with simulated_node(storm, gpus=1, before_start=dl_fields_answering_zero) as node:
        node.poll_at(POLL)
        quiet = [calls_at(node, s)[COUNTER_CALL] for s in range(2 * POLL, int(REFRESH), POLL)]
        found_at = POLL + int(REFRESH)
        found = node.gpu_at(found_at).nvlinks[7].errors["crc_flit"]
        later = [
            calls_at(node, s)[COUNTER_CALL]
            for s in range(found_at + POLL, found_at + 2 * int(INTERVAL) + POLL, POLL)
        ]
    assert quiet == [0] * len(quiet)
    assert found == 100 * (found_at - 100)
    assert "moved while the DL fields did not" in caplog.text
    assert later.count(COUNTER_CALLS) == 2 and set(later) == {0, COUNTER_CALLS}


def test_without_dl_fields_the_counters_are_read_every_link_counter_interval() -> None:
    def refusing_the_dl_fields(fake: FakeNvml) -> None:
        for field_id in DL_FIELDS:
            fake.fail_field(field_id, pynvml.NVML_ERROR_NOT_SUPPORTED)

    with simulated_node(gpus=1, before_start=refusing_the_dl_fields) as node:
        node.poll_at(POLL)
        reads = [calls_at(node, s)[COUNTER_CALL] for s in range(2 * POLL, 8 * POLL + 1, POLL)]
    every = int(INTERVAL / POLL)
    assert reads == [COUNTER_CALLS if n % every == 0 else 0 for n in range(1, len(reads) + 1)]
