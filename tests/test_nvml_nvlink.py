"""NVLink through the NVML source, as shipped drivers answer: per-link
refusals, probes that fail and are retried, Hopper's error-counter call, the
scoped DL fields' device total on drivers before R575, and NVLink5's counters
and BER. Every test drives the fake libnvidia-ml, never our reader."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import pynvml
import pytest
from daemon_support import simulated_daemon
from metrics_support import promtool_check
from nvml_support import B200, SimulatedNode, simulated_node
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.model import Severity
from gpuwatchd.sim.fake_nvml import R580_DRIVER_VERSION, FakeNvml, encode_ber
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.sources.nvml import LINK_REPROBE_POLLS

R550 = "550.54.15"
R575 = "575.51.03"
HOPPER_KINDS = {"crc_flit", "replay", "recovery"}
STORM_ON_LINK_7 = "[{at: 0s, kind: nvlink_crc_storm, gpu: 0, link: 7, rate: 100/s}]"


def test_one_link_refusing_a_counter_call_leaves_the_other_17_links_read() -> None:
    with simulated_node() as node:
        node.fake.fail_link(
            pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetNvLinkErrorCounter", link=5
        )
        for seconds in (10, 20, 30):
            links = node.gpu_at(seconds).nvlinks
            assert links[5].errors == {}
            assert all(set(link.errors) == HOPPER_KINDS for link in links if link.link != 5)


def test_one_link_refusing_a_field_leaves_the_other_17_links_read() -> None:
    with simulated_node(model=B200, driver_version=R580_DRIVER_VERSION) as node:
        node.fake.fail_field(
            pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            scope=5,
        )
        for seconds in (10, 20, 30):
            links = node.gpu_at(seconds).nvlinks
            assert "effective_errors" not in links[5].errors
            assert all("effective_errors" in link.errors for link in links if link.link != 5)


def test_one_link_refusing_its_state_leaves_the_others_up() -> None:
    with simulated_node() as node:
        node.gpu_at(10)
        node.fake.fail_link(pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetNvLinkState", link=3)
        for seconds in (20, 30):
            links = node.gpu_at(seconds).nvlinks
            assert [link.link for link in links if link.up is None] == [3]
            assert sum(1 for link in links if link.up) == 17


def test_a_timeout_during_the_first_poll_does_not_blind_nvlink_for_good() -> None:
    with simulated_node(STORM_ON_LINK_7) as node:
        node.fake.fail(pynvml.NVML_ERROR_TIMEOUT, "nvmlDeviceGetNvLinkState")
        assert node.gpu_at(10).nvlinks == ()
        node.fake.clear_failures()
        links = node.gpu_at(20).nvlinks
        assert [link.link for link in links] == list(range(18)) and all(link.up for link in links)
        assert links[7].errors["crc_flit"] >= 2000


def test_a_timeout_of_the_counter_probe_is_asked_again_at_the_next_poll() -> None:
    with simulated_node() as node:
        node.fake.fail(pynvml.NVML_ERROR_TIMEOUT, "nvmlDeviceGetNvLinkErrorCounter")
        assert all(link.errors == {} for link in node.gpu_at(10).nvlinks)
        node.fake.clear_failures()
        assert all(set(link.errors) == HOPPER_KINDS for link in node.gpu_at(20).nvlinks)


def test_a_link_missing_at_the_first_poll_is_found_later() -> None:
    with simulated_node() as node:
        node.fake.fail_link(pynvml.NVML_ERROR_TIMEOUT, "nvmlDeviceGetNvLinkState", link=4)
        assert 4 not in [link.link for link in node.gpu_at(10).nvlinks]
        node.fake.clear_failures()
        assert [link.link for link in node.gpu_at(20).nvlinks] == list(range(18))


def test_link_0_refusing_the_counters_does_not_decide_for_the_other_links() -> None:
    with simulated_node() as node:
        node.fake.fail_link(
            pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetNvLinkErrorCounter", link=0
        )
        links = node.gpu_at(10).nvlinks
        assert links[0].errors == {}
        assert all(set(link.errors) == HOPPER_KINDS for link in links[1:])


def test_h100_on_r550_reads_per_link_counters_through_the_error_counter_call() -> None:
    with simulated_node(STORM_ON_LINK_7, driver_version=R550) as node:
        links = node.gpu_at(60).nvlinks
        assert links[7].errors["crc_flit"] >= 5000
        assert all(link.errors["crc_flit"] == 0 for link in links if link.link != 7)


def without_the_error_counter(driver_version: str) -> AbstractContextManager[SimulatedNode]:
    """An H100 node storming on link 7 whose driver lacks nvmlDeviceGetNvLinkErrorCounter."""
    return simulated_node(
        STORM_ON_LINK_7,
        driver_version=driver_version,
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetNvLinkErrorCounter"),
    )


def test_h100_on_r550_never_puts_the_scoped_fields_device_total_on_every_link() -> None:
    with without_the_error_counter(R550) as node:
        links = node.gpu_at(60).nvlinks
        # The driver answers the scoped field of link 3 with the whole device's count...
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        (total,) = pynvml.nvmlDeviceGetFieldValues(
            handle, [(pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 3)]
        )
        assert total.nvmlReturn == pynvml.NVML_SUCCESS and total.value.ullVal >= 5000
        # ...so no link reads it: the counters are absent, not 18 copies of a total.
        assert [link.errors for link in links] == [{}] * 18
        assert all(link.up for link in links)


def test_h100_on_r575_without_the_error_counter_reads_the_scoped_fields_per_link() -> None:
    with without_the_error_counter(R575) as node:
        links = node.gpu_at(60).nvlinks
        assert links[7].errors["crc_flit"] >= 5000
        assert all(
            link.errors == dict.fromkeys(HOPPER_KINDS, 0) for link in links if link.link != 7
        )


def test_a_gpu_with_no_counter_interface_is_probed_again_later() -> None:
    with simulated_node(
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetNvLinkErrorCounter")
    ) as node:
        assert all(link.errors == {} for link in node.gpu_at(10).nvlinks)
        node.fake.restore_function("nvmlDeviceGetNvLinkErrorCounter")
        seconds = 10 + 10 * LINK_REPROBE_POLLS
        for second in range(20, seconds, 10):
            assert all(link.errors == {} for link in node.gpu_at(second).nvlinks)
        assert all(set(link.errors) == HOPPER_KINDS for link in node.gpu_at(seconds).nvlinks)


def test_b200_reads_effective_ber_decoded_from_mantissa_and_exponent() -> None:
    with simulated_node(
        "[{at: 0s, kind: nvlink_crc_storm, gpu: 0, link: 2, rate: 2/s}]",
        model=B200,
        driver_version=R580_DRIVER_VERSION,
    ) as node:
        links = node.gpu_at(30).nvlinks
        # 2 errors/s on a 400 Gb/s link: 5 x 10^-12.
        assert links[2].ber["effective"] == pytest.approx(5e-12)
        assert links[0].ber == {"effective": 0.0, "symbol": 0.0}


@pytest.mark.parametrize(
    ("ber", "encoded"), [(0.0, 0xFFF), (5e-12, 0x50C), (1e-9, 0x109), (9.4e-15, 0x90F)]
)
def test_ber_encoding_follows_nvml_h(ber: float, encoded: int) -> None:
    assert encode_ber(ber) == encoded


def test_hopper_answers_the_legacy_fields_with_zero_and_refuses_nvlink5_fields() -> None:
    # DataDog PR #55966 (legacy fields: success with zero on Hopper) and
    # DataDog's NVLink collector (EFFECTIVE_ERRORS: INVALID_ARGUMENT before Blackwell).
    with simulated_node(STORM_ON_LINK_7) as node:
        node.gpu_at(60)
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        legacy, nvlink5 = pynvml.nvmlDeviceGetFieldValues(
            handle,
            [
                (pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0),
                (pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS, 7),
            ],
        )
        assert (legacy.nvmlReturn, legacy.value.ullVal) == (pynvml.NVML_SUCCESS, 0)
        assert nvlink5.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT


def answer_link_recovery_on_every_gpu(fake: FakeNvml) -> None:
    """A Hopper driver answering one NVLink5 COUNT field with SUCCESS and 0,
    as the review supposes one might (nvml.h documents the fields "in
    NVLink5"; which codes Hopper answers for each is not known)."""
    recovery = pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS
    fake.fail_field(recovery, pynvml.NVML_SUCCESS)


@pytest.mark.parametrize("architecture_known", [True, False])
def test_hopper_takes_the_error_counter_call_by_its_architecture_not_the_first_answer(
    architecture_known: bool,
) -> None:
    def driver(fake: FakeNvml) -> None:
        answer_link_recovery_on_every_gpu(fake)
        if not architecture_known:
            fake.remove_function("nvmlDeviceGetArchitecture")

    with simulated_node(STORM_ON_LINK_7, before_start=driver) as node:
        links = node.gpu_at(60).nvlinks
    if architecture_known:
        assert all(set(link.errors) == HOPPER_KINDS for link in links)
        assert links[7].errors["crc_flit"] >= 5000
    else:
        # Unknown, the first interface that answers is kept: here NVLink5's,
        # which blinds the GPU to its CRC errors. Why the architecture decides.
        assert all(set(link.errors) == {"recovery"} for link in links)


def test_b200_whose_architecture_is_not_known_still_finds_nvlink5_counters() -> None:
    with simulated_node(
        "[{at: 0s, kind: nvlink_crc_storm, gpu: 0, link: 2, rate: 2/s}]",
        model=B200,
        driver_version=R580_DRIVER_VERSION,
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetArchitecture"),
    ) as node:
        links = node.gpu_at(30).nvlinks
    assert links[2].errors["effective_errors"] > 0


def test_the_architecture_is_read_once_not_at_every_probe() -> None:
    # No counter interface answers (R570 Hopper without the error-counter
    # call), so the GPU is probed again after LINK_REPROBE_POLLS; were the
    # architecture asked again there, GPU_IS_LOST would make the GPU lost.
    with simulated_node(
        before_start=lambda fake: fake.remove_function("nvmlDeviceGetNvLinkErrorCounter")
    ) as node:
        node.gpu_at(10)
        node.fake.fail(pynvml.NVML_ERROR_GPU_IS_LOST, "nvmlDeviceGetArchitecture")
        node.fake.restore_function("nvmlDeviceGetNvLinkErrorCounter")
        seconds = 10 + 10 * LINK_REPROBE_POLLS
        for second in range(20, seconds, 10):
            assert node.gpu_at(second).up
        probed_again = node.gpu_at(seconds)
    assert probed_again.up
    assert all(set(link.errors) == HOPPER_KINDS for link in probed_again.nvlinks)


def test_a_link_refusing_its_state_at_discovery_hides_none_of_the_links_after_it() -> None:
    with simulated_node() as node:
        node.fake.fail_link(pynvml.NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetNvLinkState", link=2)
        links = node.gpu_at(10).nvlinks
        assert [link.link for link in links] == [0, 1, *range(3, 18)]
        assert all(set(link.errors) == HOPPER_KINDS for link in links)


def test_b200_exports_nvlink5_error_types_and_ber(tmp_path: Path) -> None:
    scenario = (
        'node: {gpus: 1, model: "NVIDIA B200", hcas: 0}\n'
        "faults: [{at: 0s, kind: nvlink_crc_storm, gpu: 0, link: 4, rate: 2/s}]\n"
    )
    with simulated_daemon(scenario, tmp_path) as sim:
        sim.run_until(30)
        text = generate_latest(sim.daemon.registry).decode()
    assert promtool_check(text)[0] == 0
    families = {family.name: family.samples for family in text_string_to_metric_families(text)}
    types = {sample.labels["type"] for sample in families["gpuwatchd_nvlink_errors"]}
    assert types == {
        "effective_errors",
        "recovery",
        "recovery_failed",
        "malformed_packets",
        "link_integrity",
    }
    ber = {(s.labels["link"], s.labels["type"]): s.value for s in families["gpuwatchd_nvlink_ber"]}
    assert len(ber) == 18 * 2
    assert ber["4", "effective"] == pytest.approx(5e-12) and ber["0", "effective"] == 0.0


def test_b200_effective_errors_1_per_second_for_3_minutes_are_critical(tmp_path: Path) -> None:
    scenario = (
        'node: {gpus: 2, model: "NVIDIA B200", hcas: 0}\n'
        "faults: [{at: 10s, kind: nvlink_crc_storm, gpu: 1, link: 3, rate: 1/s}]\n"
    )
    with simulated_daemon(scenario, tmp_path) as sim:
        early = sim.run_until(20)
        late = sim.run_until(200)
        quarantined = sim.run_until(320)

    def codes(snapshot: Snapshot) -> set[tuple[str, str, Severity]]:
        return {(f.subject, f.code, f.severity) for f in snapshot.findings}

    # 2.5e-12 post-FEC: over DCGM's 1e-12 BER at once, and a storm after 3 windows.
    assert codes(early) == {
        ("nvlink:1/3", "nvlink_effective_ber", Severity.CRITICAL),
        ("nvlink:1/3", "nvlink_effective_errors", Severity.WARN),
    }
    assert ("nvlink:1/3", "nvlink_effective_storm", Severity.CRITICAL) in codes(late)
    assert {q.subject for q in quarantined.quarantines} == {"nvlink:1/3", "node"}
