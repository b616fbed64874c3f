"""The poll loop, the HTTP server and sd_notify, with sources of the test's own
(the simulated node's end-to-end tests are in test_simulated_node.py)."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import simulated_daemon

from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.daemon import Daemon
from gpuwatchd.logs import JournalFormatter
from gpuwatchd.model import GpuSample, Reading
from gpuwatchd.notify import Notifier
from gpuwatchd.server import StatusServer


class CountingSource:
    name = "nvml"

    def __init__(self) -> None:
        self.polls = 0

    def poll(self, now: float) -> Reading:
        self.polls += 1
        return Reading(
            source=self.name, time=now, gpus=(GpuSample(index=0, up=True, uuid="GPU-0"),)
        )

    def close(self) -> None:
        pass


class BrokenSource:
    name = "infiniband"

    def poll(self, now: float) -> Reading:
        raise OSError("sysfs went away")

    def close(self) -> None:
        pass


def _config(tmp_path: Path, interval: float = 10.0) -> Config:
    return Config(daemon=DaemonConfig(poll_interval=interval, state_dir=str(tmp_path / "state")))


def test_a_failing_source_is_reported_down_and_the_others_keep_reporting(tmp_path: Path) -> None:
    daemon = Daemon(_config(tmp_path), [CountingSource(), BrokenSource()], FakeClock())
    snapshot = daemon.step()
    assert snapshot.source_up == {"nvml": True, "infiniband": False}
    assert "sysfs went away" in snapshot.source_errors["infiniband"]
    assert [gpu.uuid for gpu in snapshot.gpus] == ["GPU-0"]


def test_the_loop_polls_once_per_interval_on_the_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    source = CountingSource()
    daemon = Daemon(_config(tmp_path, interval=10.0), [source], clock)
    start = clock.now()

    class StopAfter:
        """A notifier that stops the daemon after the fifth poll's watchdog ping."""

        watchdog_seconds = None

        def ready(self, status: str) -> None:
            pass

        def watchdog(self) -> None:
            if source.polls == 5:
                daemon.stop()

        def stopping(self) -> None:
            pass

    daemon.run(StopAfter())  # type: ignore[arg-type]
    assert source.polls == 5
    assert clock.now() - start == pytest.approx(40.0)
    assert daemon.snapshot.polls == 5


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(5)
    yield sock
    sock.close()


def test_sd_notify_sends_ready_then_watchdog_pings_while_waiting(
    notify_socket: socket.socket, tmp_path: Path
) -> None:
    clock = FakeClock()
    source = CountingSource()
    address = notify_socket.getsockname()
    notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "8000000"})
    assert notifier.watchdog_seconds == 8.0
    daemon = Daemon(_config(tmp_path, interval=10.0), [source], clock)
    messages: list[str] = []

    def receive() -> None:
        while len(messages) < 4:
            messages.append(notify_socket.recv(4096).decode())
        daemon.stop()

    receiver = threading.Thread(target=receive)
    receiver.start()
    daemon.run(notifier)
    receiver.join(timeout=10)
    # READY after the first poll, a ping per poll, and pings every 4 s
    # (half the watchdog interval) while the 10 s interval passes.
    assert messages[0].startswith("READY=1")
    assert messages[1:4] == ["WATCHDOG=1"] * 3


def test_abstract_notify_socket_address_is_translated() -> None:
    assert Notifier({"NOTIFY_SOCKET": "@/org/freedesktop/systemd1/notify"}).address.startswith("\0")
    assert not Notifier({}).enabled


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_http_server_serves_metrics_status_and_healthz(tmp_path: Path) -> None:
    clock = FakeClock()
    daemon = Daemon(_config(tmp_path), [CountingSource()], clock)
    server = StatusServer(
        ("127.0.0.1", 0), daemon.metrics, lambda: daemon.snapshot, 60.0, clock.now
    )
    server.start()
    try:
        code, body = _get(f"{server.url}/healthz")
        assert code == 503 and b"no poll finished yet" in body
        daemon.step()
        assert _get(f"{server.url}/healthz") == (200, b"ok\n")
        code, metrics = _get(f"{server.url}/metrics")
        assert code == 200
        assert b'gpuwatchd_gpu_up{gpu="0",model="",uuid="GPU-0"} 1.0' in metrics
        assert b"gpuwatchd_poll_duration_seconds_count 1.0" in metrics
        code, status = _get(f"{server.url}/api/v1/status")
        assert code == 200 and json.loads(status)["gpus"][0]["uuid"] == "GPU-0"
        clock.advance(120)
        code, body = _get(f"{server.url}/healthz")
        assert code == 503 and b"stale" in body
        assert _get(f"{server.url}/nope")[0] == 404
    finally:
        server.stop()


def test_manual_quarantines_and_releases_are_logged_with_their_operator(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with simulated_daemon("faults: []", tmp_path) as sim:
        sim.run_until(10)
        sim.daemon.quarantine("gpu:3", "fans at 100%", "alice")
        sim.daemon.release("gpu:3", "fan replaced", "bob")
    logged = [r.getMessage() for r in caplog.records if r.name == "gpuwatchd.daemon"]
    assert "gpu:3: quarantine (manual, by alice): fans at 100%" in logged
    assert "gpu:3: release (manual, by bob): fan replaced" in logged


def test_an_ok_finding_is_logged_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuwatchd.daemon")
    with simulated_daemon("faults: [{at: 5s, kind: xid, gpu: 4, code: 13}]", tmp_path) as sim:
        sim.run_until(30)
    [record] = [r for r in caplog.records if "xid_application" in r.getMessage()]
    assert record.levelno == logging.INFO and record.getMessage().startswith("gpu:4: ok ")


def test_a_critical_finding_is_logged_at_error_and_a_warning_at_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # First-day review N20: `journalctl -p err` missed the critical ones.
    scenario = (
        "faults: [{at: 5s, kind: ecc_uncorrectable, gpu: 1},"
        " {at: 5s, kind: thermal_throttle, gpu: 2}]"
    )
    with simulated_daemon(scenario, tmp_path) as sim:
        sim.run_until(90)
    raised = {
        found[1]: r
        for r in caplog.records
        if (found := re.match(r"gpu:\d: (?:ok|warn|critical) (\w+): ", r.getMessage()))
    }
    critical, warning = raised["ecc_uncorrectable"], raised["thermal_throttling"]
    assert critical.levelno == logging.ERROR and warning.levelno == logging.WARNING
    # journald reads the priority from the line's prefix: err (3), warning (4).
    assert JournalFormatter(syslog_prefix=True).format(critical).startswith("<3>")
    assert JournalFormatter(syslog_prefix=True).format(warning).startswith("<4>")
