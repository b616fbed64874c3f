"""The simulated fabric: the sysfs tree it writes, its traffic and faults,
counter widths, resets, determinism and atomic replacement of files."""

from __future__ import annotations

import errno
import re
import threading
from pathlib import Path

import pytest

from gpuwatchd.sim.infiniband import COUNTER_FILES, HW_COUNTER_FILES, SimulatedFabric
from gpuwatchd.sim.scenario import ScenarioError, parse

START = 1_767_225_600.0
LINE_RATE_BYTES = 50e9


def fabric(root: Path, *faults: str, seed: int = 5, hcas: int = 2) -> SimulatedFabric:
    listed = "".join(f"\n  - {fault}" for fault in faults)
    text = f"node: {{hcas: {hcas}}}\nseed: {seed}\nfaults:{listed or ' []'}"
    return SimulatedFabric(parse(text), root, START)


def port(root: Path, hca: str = "mlx5_0") -> Path:
    return root / "class" / "infiniband" / hca / "ports" / "1"


def counter(root: Path, name: str, hca: str = "mlx5_0", folder: str = "counters") -> int:
    return int((port(root, hca) / folder / name).read_text())


def tree(root: Path) -> dict[str, str]:
    base = root / "class" / "infiniband"
    return {str(p.relative_to(base)): p.read_text() for p in base.rglob("*") if p.is_file()}


def test_an_hgx_node_gets_eight_connectx7_ndr_ports(tmp_path: Path) -> None:
    SimulatedFabric(parse("node: {hcas: 8}"), tmp_path, START)
    devices = sorted(p.name for p in (tmp_path / "class" / "infiniband").iterdir())
    assert devices == [f"mlx5_{index}" for index in range(8)]
    device = tmp_path / "class" / "infiniband" / "mlx5_7"
    assert (device / "board_id").read_text() == "MT_0000000838\n"
    assert (device / "hca_type").read_text() == "MT4129\n"
    assert re.fullmatch(r"[0-9a-f]{4}(:[0-9a-f]{4}){3}\n", (device / "node_guid").read_text())
    files = port(tmp_path, "mlx5_7")
    assert (files / "state").read_text() == "4: ACTIVE\n"
    assert (files / "phys_state").read_text() == "5: LinkUp\n"
    assert (files / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    assert (files / "link_layer").read_text() == "InfiniBand\n"
    assert sorted(p.name for p in (files / "counters").iterdir()) == sorted(COUNTER_FILES)
    hw_counters = sorted(p.name for p in (files / "hw_counters").iterdir())
    assert hw_counters == sorted([*HW_COUNTER_FILES, "lifespan"])


def test_the_same_seed_writes_the_same_tree_and_another_seed_does_not(tmp_path: Path) -> None:
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        fabric(tmp_path / name, seed=seed).advance(START + 120)
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert tree(tmp_path / "a") != tree(tmp_path / "c")


def test_advancing_often_or_once_gives_the_same_tree(tmp_path: Path) -> None:
    fault = "{at: 20s, kind: ib_symbol_errors, hca: mlx5_0, port: 1, rate: 7/s}"
    often = fabric(tmp_path / "often", fault, hcas=1)
    for second in range(1, 61):
        often.advance(START + second)
    fabric(tmp_path / "once", fault, hcas=1).advance(START + 60)
    assert tree(tmp_path / "often") == tree(tmp_path / "once")


def test_data_counters_count_4_byte_words_at_a_training_like_rate(tmp_path: Path) -> None:
    sim = fabric(tmp_path)
    words = []
    for second in range(0, 61, 10):
        sim.advance(START + second)
        words.append(counter(tmp_path, "port_xmit_data"))
    assert words == sorted(words)
    bytes_per_second = (words[-1] - words[0]) * 4 / 60
    assert 0.2 * LINE_RATE_BYTES < bytes_per_second < 0.8 * LINE_RATE_BYTES
    packets = counter(tmp_path, "port_xmit_packets")
    assert 4000 < words[-1] * 4 / packets < 4200  # MTU-sized packets


def test_ib_port_down_takes_the_link_down_and_stops_traffic(tmp_path: Path) -> None:
    sim = fabric(tmp_path, "{at: 30s, kind: ib_port_down, hca: mlx5_0, port: 1, for: 60s}")
    sim.advance(START + 40)
    files = port(tmp_path)
    assert (files / "state").read_text() == "1: DOWN\n"
    assert (files / "phys_state").read_text() == "2: Polling\n"
    assert (files / "rate").read_text() == "10 Gb/sec (4X SDR)\n"
    assert counter(tmp_path, "link_downed") == 1
    received = counter(tmp_path, "port_rcv_data")
    sim.advance(START + 80)
    assert counter(tmp_path, "port_rcv_data") == received
    sim.advance(START + 100)
    assert (files / "state").read_text() == "4: ACTIVE\n"
    assert counter(tmp_path, "port_rcv_data") > received
    assert (port(tmp_path, "mlx5_1") / "state").read_text() == "4: ACTIVE\n"


def test_ib_link_flap_counts_each_flap_on_both_counters_while_it_lasts(tmp_path: Path) -> None:
    sim = fabric(
        tmp_path, "{at: 60s, kind: ib_link_flap, hca: mlx5_0, port: 1, rate: 1/min, for: 5m}"
    )
    sim.advance(START + 60)
    assert (port(tmp_path) / "state").read_text() == "1: DOWN\n"
    sim.advance(START + 70)
    assert (port(tmp_path) / "state").read_text() == "4: ACTIVE\n"
    sim.advance(START + 1000)
    assert counter(tmp_path, "link_downed") == counter(tmp_path, "link_error_recovery") == 5


def test_error_counters_saturate_at_their_ibta_widths(tmp_path: Path) -> None:
    sim = fabric(
        tmp_path,
        "{at: 0s, kind: ib_symbol_errors, hca: mlx5_0, port: 1, rate: 5000/s}",
        "{at: 0s, kind: ib_link_flap, hca: mlx5_0, port: 1, rate: 1/s}",
        "{at: 0s, kind: ib_congestion, hca: mlx5_0, port: 1, rate: 1000000000/s}",
    )
    sim.advance(START + 600)
    assert counter(tmp_path, "symbol_error") == 2**16 - 1
    assert counter(tmp_path, "port_rcv_errors") == 2**16 - 1
    assert counter(tmp_path, "link_downed") == 2**8 - 1
    assert counter(tmp_path, "link_error_recovery") == 2**8 - 1
    assert counter(tmp_path, "port_xmit_wait") == 2**32 - 1
    assert counter(tmp_path, "port_xmit_discards") == 60_000  # 16 bits are not reached yet
    assert counter(tmp_path, "port_xmit_data") > 2**32  # data counters are 64-bit


def test_a_pinned_counter_reads_its_maximum_until_cleared_then_counts_from_zero(
    tmp_path: Path,
) -> None:
    sim = fabric(
        tmp_path,
        "{at: 0s, kind: ib_counter_pinned, hca: mlx5_0, port: 1, counter: link_downed, for: 5m}",
        "{at: 0s, kind: ib_counter_pinned, hca: mlx5_0, port: 1, counter: port_xmit_wait}",
        "{at: 200s, kind: ib_link_flap, hca: mlx5_0, port: 1, rate: 1/min}",
    )
    assert counter(tmp_path, "link_downed") == 255
    assert counter(tmp_path, "port_xmit_wait") == 2**32 - 1
    assert counter(tmp_path, "link_downed", hca="mlx5_1") == 0
    sim.advance(START + 290)
    assert counter(tmp_path, "link_downed") == 255
    # Cleared at 300 s: the flaps since then (one a minute from 200 s: the one
    # at 320 s) count from 0.
    sim.advance(START + 370)
    assert counter(tmp_path, "link_downed") == 1
    assert counter(tmp_path, "port_xmit_wait") == 2**32 - 1


def test_an_einval_counter_is_a_link_to_a_file_whose_read_fails_with_einval(
    tmp_path: Path,
) -> None:
    sim = fabric(
        tmp_path,
        "{at: 60s, kind: ib_counter_einval, hca: mlx5_0, port: 1, counter: out_of_buffer, for: 1m}",
    )
    refusing = port(tmp_path) / "hw_counters" / "out_of_buffer"
    assert counter(tmp_path, "out_of_buffer", folder="hw_counters") == 0
    sim.advance(START + 60)
    assert refusing.is_symlink()
    with pytest.raises(OSError) as refused:
        refusing.read_text()
    assert refused.value.errno == errno.EINVAL
    sim.advance(START + 120)
    assert not refusing.is_symlink() and refusing.read_text() == "0\n"


def test_an_einval_fault_on_a_file_the_port_does_not_have_is_rejected(tmp_path: Path) -> None:
    fault = "{at: 0s, kind: ib_counter_einval, hca: mlx5_0, port: 1, counter: rx_icrc_encapsulated}"
    with pytest.raises(ScenarioError, match="'rx_icrc_encapsulated' is not a simulated counter"):
        fabric(tmp_path, fault)


def test_a_counter_reset_restarts_every_counter_of_that_hca_only(tmp_path: Path) -> None:
    sim = fabric(tmp_path, "{at: 0s, kind: ib_symbol_errors, hca: mlx5_0, port: 1, rate: 10/s}")
    sim.advance(START + 100)
    other = counter(tmp_path, "port_xmit_data", hca="mlx5_1")
    sim.reset_counters("mlx5_0", START + 100)
    assert counter(tmp_path, "symbol_error") == 0
    assert counter(tmp_path, "port_xmit_data") == 0
    assert counter(tmp_path, "rx_write_requests", folder="hw_counters") == 0
    assert counter(tmp_path, "port_xmit_data", hca="mlx5_1") == other
    sim.advance(START + 110)
    assert counter(tmp_path, "symbol_error") == 100
    assert 0 < counter(tmp_path, "port_xmit_data") * 4 < 10 * LINE_RATE_BYTES


def test_a_concurrent_reader_never_sees_half_a_file(tmp_path: Path) -> None:
    fault = "{at: 0s, kind: ib_symbol_errors, hca: mlx5_0, port: 1, rate: 33/s}"
    sim = fabric(tmp_path, fault, hcas=1)
    counters = port(tmp_path) / "counters"
    stop = threading.Event()
    seen: list[str] = []

    def read() -> None:
        for _ in range(100_000):  # bounded, in case the writer dies
            if stop.is_set():
                return
            for name in ("port_xmit_data", "symbol_error"):
                seen.append((counters / name).read_text())
            seen.extend(f"listed {entry.name}" for entry in counters.iterdir())

    reader = threading.Thread(target=read)
    reader.start()
    for second in range(1, 101):
        sim.advance(START + second)
    stop.set()
    reader.join(timeout=10)
    values = [text for text in seen if not text.startswith("listed ")]
    assert values and all(re.fullmatch(r"\d+\n", text) for text in values)
    listed = {text.removeprefix("listed ") for text in seen if text.startswith("listed ")}
    assert listed == set(COUNTER_FILES)
