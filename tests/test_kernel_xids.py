"""The NVIDIA drivers' kernel-log records (/dev/kmsg), merged with NVML's XID events.

The records are real ones (tests/fixtures/kmsg/, with their sources), in
/dev/kmsg's record format (Documentation/ABI/testing/dev-kmsg), written to a
file or FIFO the source is pointed at (`sources.nvml.kernel_log`). Where a
record must name a simulated GPU, its PCI address is replaced by that GPU's
and nothing else is changed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import tracemalloc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest
from daemon_support import simulated_daemon
from kmsg_support import FIXTURES, GPU0, GPU1, REAL, kernel_line, on_bus, real, record
from nvml_support import scenario
from prometheus_client import generate_latest

from gpuwatchd.clock import FakeClock
from gpuwatchd.model import Health, NvlinkXidDetail, Reading, Severity
from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.sim.gpu import SimulatedGpus
from gpuwatchd.sim.kmsg import BOOT_UPTIME, SimulatedKernelLog
from gpuwatchd.sources import NvmlSourceConfig
from gpuwatchd.sources.kernel_xids import GRACE_SECONDS
from gpuwatchd.sources.kmsg import (
    MAX_LINE_CHARS,
    KernelLog,
    KernelSxid,
    KernelXid,
    parse_record,
)
from gpuwatchd.sources.nvml import NvmlSource

BOOTED = 1000.0  # the kernel's time (seconds since boot) when the source starts


def parsed(message: str, sequence: int = 1, uptime: float = 5.0) -> Any:
    return parse_record(record(sequence, uptime, message).splitlines()[0])


def xid_line(address: str, code: int) -> str:
    return on_bus(REAL["xid_79"], address).replace(": 79,", f": {code},")


# --- the records' forms -------------------------------------------------------


def test_the_drivers_xid_line_forms_are_parsed_and_other_records_are_not() -> None:
    xid_79, xid_14 = parsed(REAL["xid_79"]), parsed(REAL["xid_14_old_form"], sequence=2)
    assert (xid_79.address, xid_79.code, xid_79.uptime, xid_79.sequence) == ("0000:05:00", 79, 5, 1)
    assert (xid_14.address, xid_14.code) == ("0000:03:00", 14)
    assert parse_record("6,9,1000000,-;NVRM: loading NVIDIA UNIX Kernel Module") is None
    assert parse_record(" SUBSYSTEM=pci") is None
    # Written to /dev/kmsg by a process: the kernel gives it facility LOG_USER (1).
    forged = record(7, 5.0, REAL["xid_79"], level=1 * 8 + 4).splitlines()[0]
    assert parse_record(forged) is None
    assert parse_record(REAL["xid_79"]) is None  # not a kmsg record


@pytest.mark.parametrize(
    ("name", "address"),
    [("xid_79", "0000:05:00"), ("fallen_off_bus", "0000:29:00"), ("fallen_off_bus_probe", GPU0)],
)
def test_every_fallen_off_the_bus_form_is_xid_79_on_its_bus(name: str, address: str) -> None:
    xid = parsed(REAL[name])
    assert isinstance(xid, KernelXid) and (xid.address, xid.code) == (address, 79)


@pytest.mark.parametrize(
    ("name", "code", "detail"),
    [
        ("gb200_149_fatal_link_01", 149, NvlinkXidDetail("NETIR_LINK_EVT", True, 1, 0x021425C6, 0)),
        ("gb200_149_fatal_no_link", 149, NvlinkXidDetail("NETIR", True, -1, 0x000FE406, 0)),
        (
            "gb200_145_nonfatal_link_03",
            145,
            NvlinkXidDetail("RLW_SRC_TRACK", False, 3, 0x040868E2, 0x8),
        ),
    ],
)
def test_an_nvlink5_xid_line_gives_its_unit_severity_link_and_decode_values(
    name: str, code: int, detail: NvlinkXidDetail
) -> None:
    xid = parsed(REAL[name])
    assert (xid.code, xid.nvlink, xid.recovery_action) == (code, detail, None)


def test_an_xid_154_line_gives_the_recovery_action_it_changed_to() -> None:
    assert parsed(REAL["gb200_154_to_drain_and_reset"]).recovery_action == 4
    assert parsed(REAL["gb200_154_to_gpu_reset"]).recovery_action == 1
    assert parsed(real("154_to_none")).recovery_action == 0
    # NVML's event of an XID has no line: neither has the other XIDs' record.
    assert parsed(REAL["xid_79"]).recovery_action is None


def test_an_sxid_record_heads_one_error_and_its_detail_records_are_none() -> None:
    fatal, nonfatal = parsed(REAL["sxid_fatal"]), parsed(REAL["sxid_nonfatal"])
    assert isinstance(fatal, KernelSxid) and isinstance(nonfatal, KernelSxid)
    assert (fatal.switch, fatal.address, fatal.code, fatal.severity) == (
        "nvidia-nvswitch1",
        "0000:06:00.0",
        20034,
        "Fatal",
    )
    assert fatal.description == "Link 48 LTSSM Fault Up"
    assert (nonfatal.code, nonfatal.severity) == (12028, "Non-fatal")
    assert parsed(REAL["sxid_detail_severity"]) is None
    assert parsed(REAL["sxid_detail_data"]) is None


def test_garbage_is_skipped_and_never_raises() -> None:
    nasty = [
        "9" * 5000 + ",1,1,-;" + REAL["xid_79"],
        "3," + "9" * 5000 + ",1,-;" + REAL["xid_79"],
        "3,1,1,-;" + "x" * (MAX_LINE_CHARS + 1),
        "3,1,1,-;NVRM: Xid (PCI:0018:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406",
        "3,1,1,-;NVRM: Xid (PCI:0018:01:00): 99999, unknown",
        "3,1,1,-;nvidia-nvswitch0: SXid (PCI:0000:00:00.0): xyz, Fatal error",
        "3,1,1,-;NVRM: The NVIDIA GPU invalid-bdf.0\\x0aNVRM: fallen off the bus and is not",
        "3,1,1,-;\\xff\\xfe\\x0" + "\\x",
    ]
    rng = random.Random(7)
    alphabet = "0123456789abcdefx,;:()\\ .-NVRMXidSPCIGUTLFatlnk"
    nasty += ["3,1,1,-;" + "".join(rng.choices(alphabet, k=200)) for _ in range(300)]
    results = [parse_record(line) for line in nasty]
    # The truncated NVLink5 tail is still XID 149 on its GPU, without the tail.
    truncated = results[3]
    assert isinstance(truncated, KernelXid) and truncated.nvlink is None
    assert results[0] is None and results[1] is None and results[2] is None


# --- reading the log ----------------------------------------------------------


def test_a_record_written_in_two_parts_is_read_once_whole(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    whole = record(1, 2.0, xid_line(GPU0, 79))
    path.write_text(whole[:20])
    log = KernelLog(str(path))
    assert log.read() == []
    with path.open("a") as file:
        file.write(whole[20:])
    assert [(x.address, x.code) for x in log.read() if isinstance(x, KernelXid)] == [(GPU0, 79)]
    assert log.read() == []


def test_a_line_longer_than_any_record_is_dropped_and_the_next_is_read(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("3,1,1,-;" + "x" * (2 * MAX_LINE_CHARS))
    log = KernelLog(str(path))
    assert log.read() == []
    with path.open("a") as file:
        file.write("\n" + record(2, 2.0, xid_line(GPU1, 48)))
    assert [x.code for x in log.read() if isinstance(x, KernelXid)] == [48]


def _xid_codes(log: KernelLog) -> list[int]:
    return [x.code for x in log.read() if isinstance(x, KernelXid)]


def test_a_record_with_a_5000_digit_field_is_skipped_and_the_valid_one_beside_it_read(
    tmp_path: Path,
) -> None:
    # Review adversarial-2, row 243: the absurd record failed the whole poll.
    path = tmp_path / "kmsg"
    absurd = "3,1," + "9" * 5000 + ",-;" + xid_line(GPU0, 79) + "\n"
    path.write_text(absurd + record(2, 2.0, xid_line(GPU1, 95)))
    assert _xid_codes(KernelLog(str(path))) == [95]


def test_an_unterminated_30_mb_line_holds_no_more_than_a_record_and_the_next_is_read(
    tmp_path: Path,
) -> None:
    # Row 244: the line was kept whole (30 MB, +60 MB resident).
    path = tmp_path / "kmsg"
    with path.open("w") as file:
        file.write("3,1,1,-;")
        for _ in range(30):
            file.write("x" * (1 << 20))
    log = KernelLog(str(path))
    tracemalloc.start()
    try:
        assert log.read() == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    with path.open("a") as file:
        file.write("\n" + record(2, 2.0, xid_line(GPU1, 79)))
    assert _xid_codes(log) == [79]


def test_a_record_with_a_huge_sequence_does_not_hide_the_records_after_it(
    tmp_path: Path,
) -> None:
    # Row 245: a record (for no GPU) with sequence 10^18 hid every later XID.
    path = tmp_path / "kmsg"
    path.write_text(record(10**18, 1.0, xid_line("0000:ee:00", 48)))
    log = KernelLog(str(path))
    assert _xid_codes(log) == [48]
    with path.open("a") as file:
        file.write(record(7, 2.0, xid_line(GPU0, 79)))
    assert _xid_codes(log) == [79]


def test_the_ring_read_again_after_a_reopen_is_not_counted_twice(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(record(1, 1.0, xid_line(GPU0, 79)))
    log = KernelLog(str(path))
    assert _xid_codes(log) == [79]
    log.close()  # as after a failed read: the next read opens it again
    with path.open("a") as file:
        file.write(record(2, 2.0, xid_line(GPU1, 48)))
    assert _xid_codes(log) == [48]


def test_a_fifo_is_read_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    os.mkfifo(path)
    log = KernelLog(str(path))
    assert log.read() == []  # no writer yet: no wait
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        assert log.read() == []  # nothing written yet: no wait
        os.write(writer, record(1, 2.0, xid_line(GPU1, 48)).encode())
        assert [(x.address, x.code) for x in log.read() if isinstance(x, KernelXid)] == [(GPU1, 48)]
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
    fake: FakeNvml
    source: NvmlSource
    log: Path
    uptime: list[float]

    def write(self, uptime: float, message: str) -> None:
        with self.log.open("a") as file:
            file.write(record(_next_sequence(self.log), uptime, message))

    def poll_after(self, seconds: float) -> Reading:
        self.clock.advance(seconds)
        self.uptime[0] += seconds
        self.hardware.advance(self.clock.now())
        return self.source.poll(self.clock.now())


def _next_sequence(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if not line.startswith(" ")) + 1


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with _node(tmp_path, "[]", xid_events=True) as made:
        yield made


@contextlib.contextmanager
def _node(
    tmp_path: Path,
    faults: str,
    xid_events: bool,
    logged_before: Sequence[tuple[float, str]] = (),
) -> Iterator[Node]:
    """A node whose kernel log holds, when the source starts, a boot record
    and `logged_before` (kernel time, message)."""
    clock = FakeClock()
    hardware = SimulatedGpus(scenario(faults), clock.now())
    log = tmp_path / "kmsg"
    log.write_text(record(1, 3.0, "NVRM: loading NVIDIA UNIX Open Kernel Module  570.172.08"))
    for uptime, message in logged_before:
        with log.open("a") as file:
            file.write(record(_next_sequence(log), uptime, message))
    uptime = [BOOTED]
    config = NvmlSourceConfig(xid_events=xid_events, kernel_log=str(log))
    with FakeNvml(hardware, max_wait_s=0.02) as fake:
        source = NvmlSource(clock, config, xid_thread=False, uptime=lambda: uptime[0])
        try:
            yield Node(clock, hardware, fake, source, log, uptime)
        finally:
            source.close()


def counts(reading: Reading, gpu: int) -> dict[int, int]:
    assert reading.gpus is not None
    return dict(reading.gpus[gpu].xid_counts)


def test_an_xid_logged_before_the_daemon_started_counts_with_its_own_time(tmp_path: Path) -> None:
    before = [(BOOTED - 120.0, xid_line(GPU1, 79))]
    with _node(tmp_path, "[]", xid_events=True, logged_before=before) as node:
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


def test_a_record_read_after_the_start_is_nvmls_whatever_its_kernel_time_says(
    tmp_path: Path,
) -> None:
    # printk's clock is not NTP-slewed: on a node up for months it runs
    # minutes behind CLOCK_MONOTONIC, so an XID raised after the start can
    # carry a kernel time from before it. Read after the start, it is one
    # NVML reports too, counted once.
    with _node(tmp_path, "[{at: 5s, kind: xid, gpu: 0, code: 13}]", xid_events=True) as node:
        node.write(BOOTED - 90.0, xid_line(GPU0, 13))
        first = node.poll_after(6.0)
        later = node.poll_after(GRACE_SECONDS + 10)
    assert [e.code for e in first.xid_events] == [13] and later.xid_events == ()
    assert counts(later, 0) == {13: 1}


def test_the_log_line_of_an_nvlink5_xid_nvml_reports_adds_its_link_and_severity(
    tmp_path: Path,
) -> None:
    with _node(tmp_path, "[{at: 5s, kind: xid, gpu: 0, code: 149}]", xid_events=True) as node:
        node.write(BOOTED + 5.0, on_bus(REAL["gb200_149_fatal_link_01"], GPU0))
        (event,) = node.poll_after(6.0).xid_events
        later = node.poll_after(GRACE_SECONDS + 10)
    assert event.nvlink == NvlinkXidDetail("NETIR_LINK_EVT", True, 1, 0x021425C6, 0)
    assert later.xid_events == () and counts(later, 0) == {149: 1}


def test_the_log_line_of_an_xid_154_nvml_reports_adds_the_action_it_changed_to(
    tmp_path: Path,
) -> None:
    with _node(tmp_path, "[{at: 5s, kind: xid, gpu: 1, code: 154}]", xid_events=True) as node:
        node.write(BOOTED + 5.0, on_bus(real("154_to_none"), GPU1))
        (event,) = node.poll_after(6.0).xid_events
    assert (event.gpu, event.code, event.recovery_action) == (1, 154, 0)


def test_an_xid_nvml_did_not_report_counts_from_the_log_after_the_grace(tmp_path: Path) -> None:
    with _node(tmp_path, "[]", xid_events=False) as node:
        node.write(BOOTED + 5.0, on_bus(REAL["gb200_145_nonfatal_link_03"], GPU0))
        assert counts(node.poll_after(10.0), 0) == {}
        reading = node.poll_after(GRACE_SECONDS)
        (event,) = reading.xid_events
        assert counts(reading, 0) == {145: 1} and event.nvlink and event.nvlink.link == 3
        assert counts(node.poll_after(GRACE_SECONDS), 0) == {145: 1}


def test_the_xid_79_line_and_its_fallen_off_the_bus_twin_are_one_xid_79(tmp_path: Path) -> None:
    # The pair osHandleGpuLost prints, 4 µs apart in a real log.
    pair = [
        (BOOTED - 60.0, on_bus(REAL["xid_79"], GPU1)),
        (BOOTED - 60.0, on_bus(REAL["fallen_off_bus"], GPU1)),
    ]
    with _node(tmp_path, "[]", xid_events=True, logged_before=pair) as node:
        reading = node.poll_after(10.0)
        assert counts(reading, 1) == {79: 1}
        node.write(BOOTED + 5.0, on_bus(REAL["fallen_off_bus_probe"], GPU1))
        assert counts(node.poll_after(GRACE_SECONDS + 10), 1) == {79: 1}


@pytest.mark.parametrize("form", ["fallen_off_bus", "fallen_off_bus_probe"])
def test_a_gpu_failing_every_call_after_a_fallen_off_line_without_xid_is_lost(
    tmp_path: Path, form: str
) -> None:
    before = [(BOOTED - 30.0, on_bus(REAL[form], GPU1))]
    with _node(tmp_path, "[]", xid_events=True, logged_before=before) as node:
        node.fake.fail(pynvml.NVML_ERROR_UNKNOWN, gpu=1)
        reading = node.poll_after(10.0)
    assert reading.gpus is not None
    lost = reading.gpus[1]
    assert lost.up is False and lost.xid_counts == {79: 1}
    assert reading.gpus[0].up


class _DMESG:
    """`[6781741.548768] message`, as dmesg prints a record."""

    LINE = re.compile(r"^\[\s*(\d+\.\d+)\] (.*)$")

    @classmethod
    def groups(cls, line: str) -> tuple[str, str]:
        match = cls.LINE.match(line)
        assert match is not None, line
        return match.group(1), match.group(2)


def test_the_nvswitch_sxids_of_a_real_log_are_read_once_each_per_error(tmp_path: Path) -> None:
    lines = (FIXTURES / "hgx-fallen-off-bus-with-sxids.log").read_text().splitlines()
    logged = [(float(time), message) for time, message in map(_DMESG.groups, lines)]
    # The log's kernel times are 78 days in; this node booted BOOTED ago.
    shift = BOOTED - 60.0 - logged[0][0]
    before = [(uptime + shift, message) for uptime, message in logged]
    with _node(tmp_path, "[]", xid_events=True, logged_before=before) as node:
        reading = node.poll_after(10.0)
        later = node.poll_after(10.0)
    assert [(e.switch, e.code, e.severity) for e in reading.sxid_events] == [
        ("nvidia-nvswitch1", 20034, "Fatal"),
        ("nvidia-nvswitch0", 20034, "Fatal"),
        ("nvidia-nvswitch2", 20034, "Fatal"),
        ("nvidia-nvswitch0", 20034, "Fatal"),
    ]
    # Stamped with its kernel time: 11.85 s after the log's first record.
    first = reading.time - 10.0 - 60.0 + 11.851816
    assert reading.sxid_events[0].time == pytest.approx(first, abs=1e-3)
    assert later.sxid_events == ()
    # The GPU of the log (0000:91:00) is none of this node's.
    assert all(counts(reading, gpu) == {} for gpu in (0, 1))


def test_an_xid_of_a_pci_address_nvml_does_not_list_is_said_once_not_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = "0000:99:00"
    before = [(BOOTED - 5.0, xid_line(unknown, 79)), (BOOTED - 4.0, xid_line(unknown, 13))]
    with (
        _node(tmp_path, "[]", xid_events=True, logged_before=before) as node,
        caplog.at_level(logging.WARNING),
    ):
        reading = node.poll_after(10.0)
        node.poll_after(10.0)
    assert reading.xid_events == ()
    said = [r.getMessage() for r in caplog.records if unknown in r.getMessage()]
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


def test_a_kernel_line_is_written_as_one_kernel_record_at_its_time(tmp_path: Path) -> None:
    probe = on_bus(REAL["fallen_off_bus_probe"], GPU1)
    faults = f"[{kernel_line(probe, ago='1m')}, {kernel_line('<6>' + REAL['sxid_nonfatal'])}]"
    hardware = SimulatedGpus(scenario(faults), 0.0)
    kernel = SimulatedKernelLog(scenario(faults), hardware, tmp_path / "kmsg")
    log = KernelLog(str(kernel.path))
    (fallen,) = log.read()
    assert isinstance(fallen, KernelXid) and (fallen.address, fallen.code) == (GPU1, 79)
    assert fallen.uptime == pytest.approx(BOOT_UPTIME - 60)
    kernel.advance(9.0)
    assert log.read() == []
    kernel.advance(10.0)
    (sxid,) = log.read()
    assert isinstance(sxid, KernelSxid) and sxid.uptime == pytest.approx(BOOT_UPTIME + 10)
    records = [line for line in kernel.path.read_text().splitlines() if not line.startswith(" ")]
    # One record each, the probe's three lines in one; the level from the text.
    assert "\\x0aNVRM: (PCI ID: 10de:2901)" in records[-2] and records[-2].startswith("3,")
    assert records[-1].startswith("6,") and records[-1].endswith(REAL["sxid_nonfatal"])


# Each real form on a simulated GPU's bus (GPU 1: 0000:2a:00), logged a minute
# before the daemon started: (finding's subject, code, severity).
FORMS = {
    "fallen_off_bus": ("gpu:1", "xid_hardware", Severity.CRITICAL),
    "fallen_off_bus_probe": ("gpu:1", "xid_hardware", Severity.CRITICAL),
    "gb200_149_fatal_link_01": ("nvlink:1/1", "xid_nvlink", Severity.CRITICAL),
    "gb200_149_ber_nonfatal_link_03": ("nvlink:1/3", "xid_nvlink", Severity.WARN),
    "gb200_145_nonfatal_link_03": ("nvlink:1/3", "xid_nvlink", Severity.WARN),
    "gb200_149_fatal_no_link": ("gpu:1", "xid_hardware", Severity.WARN),
    "gb200_154_to_drain_and_reset": ("gpu:1", "xid_recovery_action", Severity.WARN),
    "154_to_none": ("gpu:1", "xid_recovery_action", Severity.OK),
    "sxid_fatal": ("node", "nvswitch_sxid", Severity.CRITICAL),
    "sxid_nonfatal": ("node", "nvswitch_sxid", Severity.WARN),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_kernel_log_form_of_a_real_driver_decides_as_written(
    form: str, tmp_path: Path
) -> None:
    message = on_bus(real(form), GPU1)
    text = NODE + f"faults: [{kernel_line(message, ago='1m')}]\n"
    with simulated_daemon(text, tmp_path) as sim:
        snapshot = sim.run_until(0)
    subject, code, severity = FORMS[form]
    # The checks' findings (policy's own, the node's share of quarantined
    # GPUs, follows from them).
    found = [f for f in snapshot.findings if f.check != "policy"]
    assert [(f.subject, f.code, f.severity) for f in found] == [(subject, code, severity)]
    assert not found[0].definitive
