"""The InfiniBand reader and exporter: a real captured sysfs tree against
node_exporter's own output, and every sysfs oddity the reader must survive."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import metrics_support
import pytest
from metrics_support import promtool_check
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.export.infiniband import families
from gpuwatchd.model import PortSample, Reading
from gpuwatchd.sim.infiniband import SimulatedFabric, einval_target
from gpuwatchd.sim.scenario import parse
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.sources import InfinibandSourceConfig, infiniband
from gpuwatchd.sources.infiniband import InfinibandSource, parse_counter, parse_rate, parse_state

FIXTURE = Path("/work/shared/external/procfs-sysfs")
GOLDEN = Path(__file__).parent / "golden" / "node_exporter_1.5.0_infiniband.prom"
NODE_EXPORTER = Path("/usr/bin/prometheus-node-exporter")

# Families we export that node_exporter 1.5 does not (names as the parser gives
# them, without `_total`):
# - gpuwatchd_infiniband_hw_counters: every file under hw_counters/ (mlx5).
ADDED_FAMILIES = {"gpuwatchd_infiniband_hw_counters"}

Sample = tuple[str, frozenset[tuple[str, str]], float]


def read(root: Path, *exclude: str) -> Reading:
    config = InfinibandSourceConfig(sysfs_root=str(root), exclude_devices=exclude)
    return InfinibandSource(config).poll(1000.0)


def render(reading: Reading) -> str:
    snapshot = Snapshot(
        time=reading.time,
        infiniband_devices=reading.infiniband_devices or (),
        ports=reading.ports or (),
    )
    return metrics_support.render(lambda: families(snapshot))


def parsed(text: str, prefix: str = "") -> tuple[set[tuple[str, str, str]], set[Sample]]:
    """(name, type, help) of every family and (name, labels, value) of every
    sample, with `prefix` replaced by `gpuwatchd_`."""

    def renamed(name: str) -> str:
        return "gpuwatchd_" + name.removeprefix(prefix) if prefix else name

    metas: set[tuple[str, str, str]] = set()
    samples: set[Sample] = set()
    for family in text_string_to_metric_families(text):
        metas.add((renamed(family.name), family.type, family.documentation))
        for sample in family.samples:
            labels = frozenset(sample.labels.items())
            samples.add((renamed(sample.name), labels, float(sample.value)))
    return metas, samples


def assert_same_as_node_exporter(ours: str, node_exporter: str) -> None:
    """Our families equal node_exporter's with the prefix swapped: names, types,
    help texts, labels and values; ADDED_FAMILIES come on top."""
    their_metas, their_samples = parsed(node_exporter, prefix="node_")
    our_metas, our_samples = parsed(ours)
    added = {meta for meta in our_metas if meta[0] in ADDED_FAMILIES}
    assert {meta[0] for meta in added} == ADDED_FAMILIES
    assert our_metas - added == their_metas
    kept = {s for s in our_samples if s[0].removesuffix("_total") not in ADDED_FAMILIES}
    assert kept == their_samples


def test_the_procfs_fixture_tree_exports_exactly_what_node_exporter_1_5_reports() -> None:
    assert_same_as_node_exporter(render(read(FIXTURE)), GOLDEN.read_text())


def scrape_node_exporter(sysfs_root: Path) -> str:
    """node_exporter's infiniband output for a tree, served on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{probe.getsockname()[1]}"
    command = [
        str(NODE_EXPORTER),
        "--collector.disable-defaults",
        "--collector.infiniband",
        f"--path.sysfs={sysfs_root}",
        "--web.disable-exporter-metrics",
        f"--web.listen-address={listen}",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # up to ~10 s for it to listen
            try:
                with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as response:
                    text: str = response.read().decode()
                    return text
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"node_exporter did not answer on {listen}")
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.skipif(not NODE_EXPORTER.exists(), reason="node_exporter is not installed")
def test_node_exporter_reads_a_simulated_hgx_node_exactly_as_we_do(tmp_path: Path) -> None:
    fault = "{at: 0s, kind: ib_symbol_errors, hca: mlx5_3, port: 1, rate: 50/s}"
    scenario = parse(f"node: {{hcas: 8}}\nfaults:\n  - {fault}")
    SimulatedFabric(scenario, tmp_path, 0.0).advance(600.0)
    node_exporter = scrape_node_exporter(tmp_path)
    infiniband_only = "\n".join(
        line for line in node_exporter.splitlines() if "node_infiniband_" in line
    )
    assert "node_infiniband_symbol_error_total" in infiniband_only
    assert_same_as_node_exporter(render(read(tmp_path)), infiniband_only + "\n")


def test_promtool_finds_nothing_to_complain_about_in_our_output() -> None:
    assert promtool_check(render(read(FIXTURE))) == (0, "")


def test_the_fixture_tree_gives_devices_ports_and_counters_in_bytes() -> None:
    reading = read(FIXTURE)
    assert reading.error is None
    devices = {device.device: device for device in reading.infiniband_devices or ()}
    assert set(devices) == {"hfi1_0", "mlx4_0", "mlx5_0"}
    assert devices["hfi1_0"].hca_type is None  # hfi1 has no hca_type file
    assert devices["mlx5_0"].firmware_version == "14.28.2006"
    assert devices["mlx5_0"].node_guid == "0a7f:bc12:45ef:d23bEOF"
    ports = {(port.device, port.port): port for port in reading.ports or ()}
    assert sorted(ports) == [("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)]
    mlx5 = ports[("mlx5_0", 1)]
    assert (mlx5.state_id, mlx5.state) == (4, "ACTIVE")
    assert mlx5.link_layer == "InfiniBand"
    assert mlx5.rate_bytes_per_second == 25 * 125_000_000
    assert mlx5.counters["port_rcv_data"] == 4 * 18126345378
    assert mlx5.counters["port_xmit_packets"] == 10907922116  # packets are not words
    assert mlx5.hw_counters["req_cqe_error"] == 3481
    assert ports[("mlx4_0", 2)].hw_counters == {}


# A minimal writable tree for the oddities.


def make_port(root: Path, device: str = "mlx5_0", port: int = 1) -> Path:
    device_dir = root / "class" / "infiniband" / device
    port_dir = device_dir / "ports" / str(port)
    (port_dir / "counters").mkdir(parents=True)
    (port_dir / "hw_counters").mkdir()
    files = {
        device_dir / "fw_ver": "28.39.1002",
        device_dir / "board_id": "MT_0000000838",
        device_dir / "hca_type": "MT4129",
        device_dir / "node_guid": "a088:c203:0042:1a2b",
        port_dir / "state": "4: ACTIVE",
        port_dir / "phys_state": "5: LinkUp",
        port_dir / "rate": "400 Gb/sec (4X NDR)",
        port_dir / "link_layer": "InfiniBand",
        port_dir / "counters" / "symbol_error": "3",
        port_dir / "counters" / "port_rcv_data": "1000",
        port_dir / "counters" / "link_downed": "1",
        port_dir / "hw_counters" / "out_of_buffer": "7",
    }
    for path, text in files.items():
        path.write_text(text + "\n")
    return port_dir


def only_port(reading: Reading) -> PortSample:
    assert reading.ports is not None and len(reading.ports) == 1
    return reading.ports[0]


def logged(caplog: pytest.LogCaptureFixture, fragment: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if fragment in record.getMessage()]


def test_a_healthy_port_reads_every_file(tmp_path: Path) -> None:
    make_port(tmp_path)
    port = only_port(read(tmp_path))
    assert port.counters == {"symbol_error": 3, "port_rcv_data": 4000, "link_downed": 1}
    assert port.hw_counters == {"out_of_buffer": 7}
    assert port.rate_bytes_per_second == 50e9
    assert (port.physical_state_id, port.physical_state) == (5, "LinkUp")


def test_a_missing_counters_directory_leaves_the_rest_of_the_port(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.rmtree(make_port(tmp_path) / "counters")
    with caplog.at_level(logging.INFO):
        port = only_port(read(tmp_path))
    assert port.counters == {}
    assert port.state_id == 4 and port.hw_counters == {"out_of_buffer": 7}
    assert logged(caplog, "ib:mlx5_0/1") and logged(caplog, "counters: missing")


def test_an_empty_counter_file_is_absent_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (make_port(tmp_path) / "counters" / "symbol_error").write_text("")
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path)))
    with caplog.at_level(logging.INFO):
        first, second = source.poll(1.0), source.poll(2.0)
    assert "symbol_error" not in only_port(first).counters
    assert only_port(second).counters["link_downed"] == 1
    assert len(logged(caplog, "symbol_error: empty")) == 1


def test_a_counter_saying_no_pma_is_absent_and_logged_once_with_its_subject(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (make_port(tmp_path) / "counters" / "symbol_error").write_text("N/A (no PMA)\n")
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path)))
    with caplog.at_level(logging.INFO):
        ports = [only_port(source.poll(float(t))) for t in range(3)]
    assert all("symbol_error" not in port.counters for port in ports)
    assert all(port.counters["port_rcv_data"] == 4000 for port in ports)
    records = logged(caplog, "N/A (no PMA)")
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert records[0].getMessage().startswith("ib:mlx5_0/1: ")


def test_a_permission_denied_counter_is_absent_and_the_port_still_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, opens: Opens
) -> None:
    # Tests run as root, which chmod 000 does not stop: refuse at the open boundary.
    denied = make_port(tmp_path) / "counters" / "symbol_error"
    opens.watch(denied, PermissionError(errno.EACCES, "Permission denied", str(denied)))
    with caplog.at_level(logging.INFO):
        port = only_port(read(tmp_path))
    assert port.counters == {"port_rcv_data": 4000, "link_downed": 1}
    assert [r.levelno for r in logged(caplog, "Permission denied")] == [logging.WARNING]


def test_a_directory_where_the_state_file_should_be_leaves_the_state_absent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = make_port(tmp_path) / "state"
    state.unlink()
    state.mkdir()
    with caplog.at_level(logging.INFO):
        port = only_port(read(tmp_path))
    assert port.state_id is None and port.state is None
    assert port.physical_state_id == 5
    assert logged(caplog, "state: Is a directory")


def test_a_malformed_state_and_rate_are_absent(tmp_path: Path) -> None:
    port_dir = make_port(tmp_path)
    (port_dir / "phys_state").write_text("LinkUp\n")
    (port_dir / "rate").write_text("fast\n")
    port = only_port(read(tmp_path))
    assert port.physical_state_id is None and port.rate_bytes_per_second is None
    assert port.state_id == 4


def test_a_64_bit_counter_value_is_kept_exactly(tmp_path: Path) -> None:
    port_dir = make_port(tmp_path)
    (port_dir / "hw_counters" / "rx_write_requests").write_text(f"{2**64 - 1}\n")
    (port_dir / "counters" / "port_xmit_data").write_text(f"{2**63}\n")
    port = only_port(read(tmp_path))
    assert port.hw_counters["rx_write_requests"] == 2**64 - 1
    assert port.counters["port_xmit_data"] == 4 * 2**63


def test_a_device_that_vanishes_mid_read_is_left_out_without_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    make_port(tmp_path, device="mlx5_0")
    make_port(tmp_path, device="mlx5_1")
    unplugged = tmp_path / "class" / "infiniband" / "mlx5_1"
    real_read = infiniband.read_attribute

    def read_attribute(path: str) -> str:
        # Hot unplug after the listing, while the device's files are being read.
        if path.endswith("mlx5_1/ports/1/rate") and unplugged.exists():
            shutil.rmtree(unplugged)
        return real_read(path)

    monkeypatch.setattr(infiniband, "read_attribute", read_attribute)
    with caplog.at_level(logging.INFO):
        reading = read(tmp_path)
    assert reading.error is None
    assert [device.device for device in reading.infiniband_devices or ()] == ["mlx5_0"]
    assert [port.device for port in reading.ports or ()] == ["mlx5_0"]
    assert not logged(caplog, "mlx5_1")


def test_a_port_that_vanishes_mid_read_is_left_out_and_its_device_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_port(tmp_path, port=1)
    second = make_port_in_existing_device(tmp_path, port=2)
    real_read = infiniband.read_attribute

    def read_attribute(path: str) -> str:
        if path.endswith("ports/2/rate") and second.exists():
            shutil.rmtree(second)
        return real_read(path)

    monkeypatch.setattr(infiniband, "read_attribute", read_attribute)
    reading = read(tmp_path)
    assert [(port.device, port.port) for port in reading.ports or ()] == [("mlx5_0", 1)]
    assert [device.device for device in reading.infiniband_devices or ()] == ["mlx5_0"]


def make_port_in_existing_device(root: Path, port: int) -> Path:
    port_dir = root / "class" / "infiniband" / "mlx5_0" / "ports" / str(port)
    port_dir.mkdir(parents=True)
    (port_dir / "state").write_text("4: ACTIVE\n")
    (port_dir / "rate").write_text("400 Gb/sec (4X NDR)\n")
    return port_dir


def test_excluded_devices_are_not_read(tmp_path: Path) -> None:
    make_port(tmp_path, device="mlx5_0")
    make_port(tmp_path, device="mlx5_9")
    reading = read(tmp_path, "mlx5_9")
    assert [device.device for device in reading.infiniband_devices or ()] == ["mlx5_0"]


def test_a_node_without_class_infiniband_is_read_as_no_ports_but_not_up(tmp_path: Path) -> None:
    reading = read(tmp_path)
    assert reading.infiniband_devices == () and reading.ports == ()
    assert reading.error is not None and "no RDMA driver loaded" in reading.error


@pytest.mark.parametrize("excluded", [(), ("mlx5_0",)])
def test_a_class_directory_with_no_device_to_read_is_not_up(
    tmp_path: Path, excluded: tuple[str, ...]
) -> None:
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    if excluded:
        make_port(tmp_path)
    reading = read(tmp_path, *excluded)
    assert reading.ports == ()
    assert reading.error is not None and "no InfiniBand device" in reading.error


def test_an_unlistable_class_directory_fails_the_poll_not_the_daemon(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "infiniband").write_text("not a directory\n")
    reading = read(tmp_path)
    assert reading.error is not None and "class/infiniband" in reading.error


@pytest.mark.parametrize(
    ("text", "bytes_per_second"),
    [
        ("2.5 Gb/sec (1X SDR)", 312_500_000),
        ("5 Gb/sec (1X DDR)", 625_000_000),
        ("10 Gb/sec (4X SDR)", 1_250_000_000),
        ("10 Gb/sec (1X QDR)", 1_250_000_000),
        ("14 Gb/sec (1X FDR)", 1_750_000_000),
        ("20 Gb/sec (4X DDR)", 2_500_000_000),
        ("25 Gb/sec (1X EDR)", 3_125_000_000),
        ("40 Gb/sec (4X QDR)", 5_000_000_000),
        ("56 Gb/sec (4X FDR)", 7_000_000_000),
        ("100 Gb/sec (4X EDR)", 12_500_000_000),
        ("100 Gb/sec (2X HDR)", 12_500_000_000),
        ("200 Gb/sec (4X HDR)", 25_000_000_000),
        ("400 Gb/sec (4X NDR)", 50_000_000_000),
        ("800 Gb/sec (4X XDR)", 100_000_000_000),
        ("1200 Gb/sec (12X NDR)", 150_000_000_000),
        ("0 GB/sec", 0),
    ],
)
def test_every_link_speed_parses_to_bytes_per_second(text: str, bytes_per_second: int) -> None:
    assert parse_rate(text + "\n") == bytes_per_second


@pytest.mark.parametrize(
    "text", ["", "fast", "Gb/sec", "400 Mb/sec", "-1 Gb/sec", "9" * 400 + " Gb/sec (4X NDR)"]
)
def test_a_rate_that_is_not_a_rate_is_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_states_parse_into_number_and_name() -> None:
    assert parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state("2: Polling") == (2, "Polling")
    assert parse_state("6: LinkErrorRecovery") == (6, "LinkErrorRecovery")
    with pytest.raises(ValueError):
        parse_state("ACTIVE")


@pytest.mark.parametrize(
    "text", ["N/A (no PMA)", "", "-1", "12a", "0x10", "\u0663", str(2**64), "9" * 400]
)
def test_a_counter_that_is_not_a_decimal_count_is_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_counter(text)


def test_a_counter_parses_with_its_newline() -> None:
    assert parse_counter("18446744073709551615\n") == 2**64 - 1


class Opens:
    """Watches the open(2) calls of the reader, at the file-open boundary (the
    reader itself untouched): counts those of one file, however the reader
    names it (a path, or a name under an open directory), and can refuse them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.watched: str | None = None
        self.refused: OSError | None = None
        self.count = 0
        self._open = os.open
        monkeypatch.setattr(os, "open", self._opening)

    def watch(self, path: Path, refuse: OSError | None = None) -> None:
        self.watched, self.refused, self.count = str(path), refuse, 0

    def _opening(
        self, path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None
    ) -> int:
        folder = "" if dir_fd is None else os.readlink(f"/proc/self/fd/{dir_fd}")
        if os.path.join(folder, path) == self.watched:
            self.count += 1
            if self.refused is not None:
                raise self.refused
        return self._open(path, flags, mode, dir_fd=dir_fd)


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> Opens:
    return Opens(monkeypatch)


def refusing_fabric(root: Path) -> SimulatedFabric:
    fault = "{at: 0s, kind: ib_counter_einval, hca: mlx5_0, port: 1, counter: port_xmit_wait}"
    return SimulatedFabric(parse(f"node: {{hcas: 2}}\nfaults:\n  - {fault}"), root, 0.0)


def test_a_counter_failing_with_einval_is_read_once_and_skipped_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, opens: Opens
) -> None:
    fabric = refusing_fabric(tmp_path)
    refusing = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait"
    opens.watch(refusing)
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path)))
    with caplog.at_level(logging.INFO):
        for t in range(0, 60, 10):
            fabric.advance(float(t))
            ports = {port.device: port for port in source.poll(float(t)).ports or ()}
            assert "port_xmit_wait" not in ports["mlx5_0"].counters
            assert ports["mlx5_0"].counters["port_rcv_data"] > 0
            assert ports["mlx5_1"].counters["port_xmit_wait"] > 0
    assert opens.count == 1
    records = logged(caplog, "port_xmit_wait: Invalid argument")
    assert len(records) == 1 and "not read again" in records[0].getMessage()


def test_a_device_recreated_by_a_driver_reload_has_its_refused_files_tried_again(
    tmp_path: Path, opens: Opens
) -> None:
    refusing = make_port(tmp_path) / "counters" / "port_xmit_wait"
    refusing.symlink_to(einval_target())
    opens.watch(refusing)
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path)))
    source.poll(1.0)
    source.poll(2.0)
    assert opens.count == 1
    # The reload: the device's directory goes and a new one comes, now readable.
    # (Moved aside rather than deleted while the new one is made, so that the
    # file system cannot hand the new directory the old inode: sysfs never
    # reuses one soon, kernfs numbers its nodes cyclically.)
    (tmp_path / "class" / "infiniband" / "mlx5_0").rename(tmp_path / "unloaded")
    make_port(tmp_path)
    refusing.write_text("42\n")
    opens.watch(refusing)
    assert only_port(source.poll(3.0)).counters["port_xmit_wait"] == 42
    assert opens.count == 1


def test_a_400_digit_counter_is_absent_logged_once_and_metrics_still_render(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port_dir = make_port(tmp_path)
    (port_dir / "counters" / "port_rcv_data").write_text("9" * 400 + "\n")
    (port_dir / "counters" / "symbol_error").write_text(f"{2**64}\n")
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path)))
    with caplog.at_level(logging.INFO):
        readings = [source.poll(float(t)) for t in range(3)]
    port = only_port(readings[-1])
    assert port.counters == {"link_downed": 1}
    assert len(logged(caplog, "not a u64")) == 2
    assert all(len(record.getMessage()) < 300 for record in logged(caplog, "not a u64"))
    assert "gpuwatchd_infiniband_link_downed_total" in render(readings[-1])


def test_a_ports_entry_that_is_no_ascii_number_is_skipped_and_the_rest_read(
    tmp_path: Path,
) -> None:
    make_port(tmp_path)
    (tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "\u00b2").mkdir()
    reading = read(tmp_path)
    assert reading.error is None
    assert [(port.device, port.port) for port in reading.ports or ()] == [("mlx5_0", 1)]


def test_a_device_of_any_printable_name_is_read_and_its_port_a_subject_of_its_own(
    tmp_path: Path,
) -> None:
    # Review adversarial-2, row 101: 'mlx5 x' was skipped so that no subject
    # had to carry it; port_subject escapes it (ib:mlx5%20x/1), so it is read.
    make_port(tmp_path, device="mlx5_0")
    make_port(tmp_path, device="mlx5 x")
    reading = read(tmp_path)
    assert [port.device for port in reading.ports or ()] == ["mlx5 x", "mlx5_0"]
    assert [port.subject for port in reading.ports or ()] == ["ib:mlx5%20x/1", "ib:mlx5_0/1"]
    assert 'device="mlx5 x"' in render(reading)


def test_a_device_whose_name_is_no_printable_utf8_is_skipped_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Such a name cannot be a Prometheus label value (the exposition is UTF-8).
    make_port(tmp_path, device="mlx5_0")
    make_port(tmp_path, device=os.fsdecode(b"mlx5\xff"))
    make_port(tmp_path, device="mlx5\tx")
    source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(tmp_path)))
    with caplog.at_level(logging.INFO):
        readings = [source.poll(float(t)) for t in range(3)]
    assert all([p.device for p in r.ports or ()] == ["mlx5_0"] for r in readings)
    assert len(logged(caplog, "'mlx5\\udcff' is not read")) == 1
    assert len(logged(caplog, "'mlx5\\tx' is not read")) == 1
    render(readings[-1]).encode("utf-8")
