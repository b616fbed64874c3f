"""XIDs from the kernel log (/dev/kmsg), merged with NVML's XID events.

The lines are the driver's own forms as gpud's kmsg.go quotes them from
NVIDIA's XID documentation, in /dev/kmsg's record format
(Documentation/ABI/testing/dev-kmsg), written to a file or FIFO the source is
pointed at (`sources.nvml.kernel_log`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from daemon_support import simulated_daemon
from nvml_support import scenario
from prometheus_client import generate_latest

from gpuwatchd.clock import FakeClock
from gpuwatchd.model import Health, Reading
from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.sim.gpu import SimulatedGpus
from gpuwatchd.sources import NvmlSourceConfig
from gpuwatchd.sources.kmsg import GRACE_SECONDS, KernelLog, parse_xid_record
from gpuwatchd.sources.nvml import NvmlSource

# gpud components/accelerator/nvidia/xid/kmsg.go, quoting NVIDIA's XID documentation.
GPUD_LINES = (
    "NVRM: Xid (0000:03:00): 14, Channel 00000001",
    "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
)
BOOTED = 1000.0  # the kernel's time (seconds since boot) when the source starts
# The simulator's GPU 0 and 1 (NVML bus ids 00000000:18:00.0 and 00000000:2A:00.0).
GPU0, GPU1 = "0000:18:00", "0000:2a:00"


def record(sequence: int, uptime: float, message: str, level: int = 4) -> str:
    """One /dev/kmsg record, with a continuation line as device messages have."""
    return f"{level},{sequence},{int(uptime * 1e6)},-;{message}\n SUBSYSTEM=pci\n"


def xid_line(address: str, code: int) -> str:
    return f"NVRM: Xid (PCI:{address}): {code}, pid='<unknown>', name=<unknown>, test"


def test_the_drivers_xid_line_forms_are_parsed_and_other_records_are_not() -> None:
    lines = [record(n, 5.0, line).splitlines()[0] for n, line in enumerate(GPUD_LINES)]
    parsed = [parse_xid_record(line) for line in lines]
    assert [(x.address, x.code) for x in parsed if x] == [
        ("0000:03:00", 14),
        ("0000:05:00", 79),
        ("0000:01:00", 79),
    ]
    assert parsed[1] is not None and parsed[1].uptime == 5.0 and parsed[1].sequence == 1
    assert parse_xid_record("6,9,1000000,-;NVRM: loading NVIDIA UNIX Kernel Module") is None
    assert parse_xid_record(" SUBSYSTEM=pci") is None
    # Written to /dev/kmsg by a process: the kernel gives it facility LOG_USER (1).
    forged = record(7, 5.0, xid_line(GPU0, 79), level=1 * 8 + 4).splitlines()[0]
    assert parse_xid_record(forged) is None
    assert parse_xid_record("NVRM: Xid (PCI:0000:05:00): 79, not a kmsg record") is None


def test_a_record_written_in_two_parts_is_read_once_whole(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    whole = record(1, 2.0, xid_line(GPU0, 79))
    path.write_text(whole[:20])
    log = KernelLog(str(path))
    assert log.read() == []
    with path.open("a") as file:
        file.write(whole[20:])
    assert [(x.address, x.code) for x in log.read()] == [(GPU0, 79)]
    assert log.read() == []


def test_a_fifo_is_read_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    os.mkfifo(path)
    log = KernelLog(str(path))
    assert log.read() == []  # no writer yet: no wait
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        assert log.read() == []  # nothing written yet: no wait
        os.write(writer, record(1, 2.0, xid_line(GPU1, 48)).encode())
        assert [(x.address, x.code) for x in log.read()] == [(GPU1, 48)]
    finally:
        os.close(writer)
        log.close()


def test_an_unreadable_kernel_log_is_said_once_and_nvml_counts_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = KernelLog(str(tmp_path / "no-such-kmsg"))
    with caplog.at_level(logging.WARNING):
        assert log.read() == [] and log.read() == []
    said = [r.getMessage() for r in caplog.records if "kernel log" in r.getMessage()]
    assert len(said) == 1 and "from NVML's events only" in said[0]


# --- merged with NVML, through the NVML source over the fake library ----------


@dataclass
class Node:
    clock: FakeClock
    hardware: SimulatedGpus
    source: NvmlSource
    log: Path
    uptime: list[float]

    def write(self, uptime: float, message: str) -> None:
        with self.log.open("a") as file:
            file.write(record(int(uptime * 1000), uptime, message))

    def poll_after(self, seconds: float) -> Reading:
        self.clock.advance(seconds)
        self.uptime[0] += seconds
        self.hardware.advance(self.clock.now())
        return self.source.poll(self.clock.now())


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with _node(tmp_path, "[]", xid_events=True) as made:
        yield made


@contextlib.contextmanager
def _node(tmp_path: Path, faults: str, xid_events: bool) -> Iterator[Node]:
    clock = FakeClock()
    hardware = SimulatedGpus(scenario(faults), clock.now())
    log = tmp_path / "kmsg"
    log.write_text(record(1, 3.0, "NVRM: loading NVIDIA UNIX Open Kernel Module  570.172.08"))
    uptime = [BOOTED]
    config = NvmlSourceConfig(xid_events=xid_events, kernel_log=str(log))
    with FakeNvml(hardware, max_wait_s=0.02):
        source = NvmlSource(clock, config, xid_thread=False, uptime=lambda: uptime[0])
        try:
            yield Node(clock, hardware, source, log, uptime)
        finally:
            source.close()


def counts(reading: Reading, gpu: int) -> dict[int, int]:
    assert reading.gpus is not None
    return dict(reading.gpus[gpu].xid_counts)


def test_an_xid_logged_before_the_daemon_started_counts_with_its_own_time(node: Node) -> None:
    node.write(BOOTED - 120.0, xid_line(GPU1, 79))
    reading = node.poll_after(10.0)
    assert counts(reading, 1) == {79: 1} and counts(reading, 0) == {}
    (event,) = reading.xid_events
    # Logged two minutes before the start, ten seconds ago.
    assert event.time == pytest.approx(node.clock.now() - 130.0)
    assert event.uuid and event.gpu == 1
    assert counts(node.poll_after(60.0), 1) == {79: 1}


def test_an_xid_both_nvml_and_the_log_report_counts_once(tmp_path: Path) -> None:
    with _node(tmp_path, "[{at: 5s, kind: xid, gpu: 0, code: 13}]", xid_events=True) as node:
        reading = node.poll_after(6.0)
        node.write(BOOTED + 5.0, xid_line(GPU0, 13))
        assert [e.code for e in reading.xid_events] == [13]
        later = node.poll_after(GRACE_SECONDS + 10)
    assert later.xid_events == () and counts(later, 0) == {13: 1}


def test_an_xid_nvml_did_not_report_counts_from_the_log_after_the_grace(tmp_path: Path) -> None:
    with _node(tmp_path, "[]", xid_events=False) as node:
        node.write(BOOTED + 5.0, xid_line(GPU0, 48))
        assert counts(node.poll_after(10.0), 0) == {}
        reading = node.poll_after(GRACE_SECONDS)
        assert counts(reading, 0) == {48: 1} and [e.code for e in reading.xid_events] == [48]
        assert counts(node.poll_after(GRACE_SECONDS), 0) == {48: 1}


def test_an_xid_of_a_pci_address_nvml_does_not_list_is_said_once_not_counted(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.write(BOOTED - 5.0, xid_line("0000:99:00", 79))
    node.write(BOOTED - 4.0, xid_line("0000:99:00", 79))
    with caplog.at_level(logging.WARNING):
        reading = node.poll_after(10.0)
        node.poll_after(10.0)
    assert reading.xid_events == ()
    said = [r.getMessage() for r in caplog.records if "0000:99:00" in r.getMessage()]
    assert len(said) == 1


# --- the whole daemon on a simulated node -------------------------------------

NODE = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"


def test_a_kernel_xid_from_before_the_start_quarantines_at_the_first_poll(tmp_path: Path) -> None:
    text = NODE + "faults: [{at: 0s, kind: kernel_xid, gpu: 2, code: 79, ago: 2m}]\n"
    with simulated_daemon(text, tmp_path) as sim:
        snapshot = sim.run_until(0)
        metrics = generate_latest(sim.daemon.registry).decode()
    assert snapshot.health["gpu:2"] is Health.QUARANTINED
    assert any(f.subject == "gpu:2" and f.code == "xid_hardware" for f in snapshot.findings)
    prefix = 'gpuwatchd_gpu_xid_errors_total{gpu="2"'
    (line,) = [m for m in metrics.splitlines() if m.startswith(prefix)]
    assert 'xid="79"' in line and line.endswith(" 1.0")


def test_a_kernel_xid_older_than_the_window_counts_but_condemns_nothing(tmp_path: Path) -> None:
    text = NODE + "faults: [{at: 0s, kind: kernel_xid, gpu: 2, code: 13, ago: 40m}]\n"
    with simulated_daemon(text, tmp_path) as sim:
        snapshot = sim.run_until(20)
    assert snapshot.gpus[2].xid_counts == {13: 1}
    assert snapshot.findings == () and snapshot.node_health is Health.HEALTHY


def test_an_xid_raised_while_watched_is_counted_once_through_nvml_and_the_log(
    tmp_path: Path,
) -> None:
    text = NODE + "faults: [{at: 10s, kind: xid, gpu: 1, code: 13}]\n"
    with simulated_daemon(text, tmp_path) as sim:
        snapshot = sim.run_until(10 + GRACE_SECONDS + 30)
        logged = sim.node.kernel_log.path.read_text()
    assert "NVRM: Xid (PCI:0000:2a:00): 13," in logged
    assert snapshot.gpus[1].xid_counts == {13: 1}
