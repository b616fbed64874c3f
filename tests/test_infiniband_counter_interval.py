"""What the InfiniBand source reads at every poll and what every
`counter_interval`: the files the infiniband check judges are fresh at each
poll, the rest keep their last read value until the interval or a change of
the port reads it whole, and an unchanged port is the same sample object."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatchd.checks import infiniband as check
from gpuwatchd.config import parse_config
from gpuwatchd.model import COUNTER_BITS, PortSample
from gpuwatchd.sim.infiniband import SimulatedFabric
from gpuwatchd.sim.scenario import parse
from gpuwatchd.sources import InfinibandSourceConfig
from gpuwatchd.sources.infiniband import PROMPT_COUNTERS, InfinibandSource

INTERVAL = InfinibandSourceConfig().counter_interval
POLL = 10.0


def port_tree(root: Path) -> Path:
    """One ACTIVE port of mlx5_0 with a counter of each kind."""
    device = root / "class" / "infiniband" / "mlx5_0"
    port = device / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters").mkdir()
    files = {
        device / "fw_ver": "28.39.1002",
        port / "state": "4: ACTIVE",
        port / "phys_state": "5: LinkUp",
        port / "rate": "400 Gb/sec (4X NDR)",
        port / "link_layer": "InfiniBand",
        port / "counters" / "symbol_error": "3",
        port / "counters" / "link_downed": "1",
        port / "counters" / "port_rcv_data": "1000",
        port / "counters" / "port_xmit_packets": "250",
        port / "hw_counters" / "out_of_buffer": "7",
    }
    for path, text in files.items():
        path.write_text(text + "\n")
    return port


def source(root: Path) -> InfinibandSource:
    return InfinibandSource(InfinibandSourceConfig(sysfs_root=str(root)))


def only_port(source: InfinibandSource, now: float) -> PortSample:
    (port,) = source.poll(now).ports or ()
    return port


def test_the_check_judges_no_counter_that_a_poll_does_not_read() -> None:
    judged = {
        *COUNTER_BITS,
        *check.FLAP_COUNTERS,
        *check.SYMBOL_COUNTERS,
        *check.RECEIVE_ERROR_COUNTERS,
        check.RECEIVED_PACKETS,
        "port_xmit_wait",
        "port_xmit_discards",
    }
    assert judged <= PROMPT_COUNTERS


def test_between_whole_reads_the_judged_counters_are_fresh_and_the_rest_held(
    tmp_path: Path,
) -> None:
    """On the simulated fabric every counter moves at every poll (training
    traffic): the packet counters the check does not judge and hw_counters
    keep the values of the last whole read until `counter_interval` has
    passed, then read anew; the data counters, which dashboards graph, are
    fresh."""
    fabric = SimulatedFabric(parse("node: {hcas: 1}\nseed: 3\n"), tmp_path, 0.0)
    reader = source(tmp_path)
    counters = tmp_path / "class/infiniband/mlx5_0/ports/1/counters"

    def poll(now: float) -> PortSample:
        fabric.advance(now)
        return only_port(reader, now)

    first = poll(0.0)
    for now in (POLL, 2 * POLL):
        port = poll(now)
        assert port.counters["port_rcv_packets"] == int((counters / "port_rcv_packets").read_text())
        assert port.counters["port_rcv_packets"] > first.counters["port_rcv_packets"]
        assert port.counters["port_rcv_data"] == 4 * int((counters / "port_rcv_data").read_text())
        assert port.counters["port_xmit_packets"] == first.counters["port_xmit_packets"]
        assert port.hw_counters is first.hw_counters
    due = poll(INTERVAL)
    assert due.counters["port_xmit_packets"] == int((counters / "port_xmit_packets").read_text())
    assert due.hw_counters["rx_write_requests"] > first.hw_counters["rx_write_requests"]


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("state", "1: DOWN"),
        ("phys_state", "3: Disabled"),
        ("rate", "200 Gb/sec (4X HDR)"),
        ("counters/link_downed", "2"),  # went down and back between two polls
        ("counters/symbol_error", "0"),  # cleared (perfquery -R) or a driver reload
    ],
)
def test_a_port_whose_judged_files_say_it_changed_is_read_whole_at_once(
    tmp_path: Path, file: str, text: str
) -> None:
    port_dir = port_tree(tmp_path)
    reader = source(tmp_path)
    only_port(reader, 0.0)
    (port_dir / file).write_text(text + "\n")
    (port_dir / "hw_counters" / "out_of_buffer").write_text("8\n")
    (port_dir / "link_layer").write_text("Ethernet\n")
    port = only_port(reader, POLL)
    assert (port.hw_counters["out_of_buffer"], port.link_layer) == (8, "Ethernet")


def test_a_port_whose_judged_files_did_not_change_keeps_the_rest(tmp_path: Path) -> None:
    port_dir = port_tree(tmp_path)
    reader = source(tmp_path)
    first = only_port(reader, 0.0)
    (port_dir / "hw_counters" / "out_of_buffer").write_text("8\n")
    (port_dir / "counters" / "symbol_error").write_text("4\n")
    port = only_port(reader, POLL)
    assert port.counters == {
        "link_downed": 1,
        "port_rcv_data": 4000,
        "port_xmit_packets": 250,
        "symbol_error": 4,
    }
    assert port.hw_counters is first.hw_counters
    assert only_port(reader, INTERVAL).hw_counters == {"out_of_buffer": 8}


def test_an_unchanged_port_is_the_same_sample_and_a_moved_counter_a_new_one(
    tmp_path: Path,
) -> None:
    port_dir = port_tree(tmp_path)
    reader = source(tmp_path)
    first = only_port(reader, 0.0)
    assert only_port(reader, POLL) is first
    (port_dir / "counters" / "symbol_error").write_text("5\n")
    moved = only_port(reader, 2 * POLL)
    assert moved is not first and moved.counters["symbol_error"] == 5
    assert only_port(reader, 3 * POLL - 1) is moved  # before the interval is up


def test_a_device_recreated_by_a_driver_reload_is_read_whole_at_once(tmp_path: Path) -> None:
    port_tree(tmp_path)
    reader = source(tmp_path)
    only_port(reader, 0.0)
    # Moved aside while the new one is made: the new directory cannot reuse the inode.
    (tmp_path / "class" / "infiniband" / "mlx5_0").rename(tmp_path / "unloaded")
    port_dir = port_tree(tmp_path)
    (port_dir / "hw_counters" / "out_of_buffer").write_text("0\n")
    (tmp_path / "class" / "infiniband" / "mlx5_0" / "fw_ver").write_text("28.41.1000\n")
    reading = reader.poll(POLL)
    (device,) = reading.infiniband_devices or ()
    assert device.firmware_version == "28.41.1000"
    assert (reading.ports or ())[0].hw_counters == {"out_of_buffer": 0}


def test_counter_interval_is_a_duration_above_zero() -> None:
    config = parse_config("sources:\n  infiniband:\n    counter_interval: 1m\n")
    assert config.sources.infiniband.counter_interval == 60.0
    with pytest.raises(ValueError, match="counter_interval must be more than 0s"):
        InfinibandSourceConfig(counter_interval=0.0)
