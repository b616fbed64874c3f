"""The shipped systemd unit: it verifies, its sandbox scores well, and the
daemon speaks the notify protocol that its Type=notify and WatchdogSec rely on."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "gpuwatchd.service"
SHIPPED_EXEC = "/usr/bin/gpuwatchd"
# systemd-analyze's scale: 0 is fully sandboxed, 10 not at all; 3.5 and less is "OK".
MAX_EXPOSURE = 3.5

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def _directives() -> list[tuple[str, str, str]]:
    """(section, key, value) for every line of the unit; keys may repeat."""
    section = ""
    found: list[tuple[str, str, str]] = []
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key, value))
    return found


def _values(key: str, section: str = "Service") -> list[str]:
    return [value for where, name, value in _directives() if where == section and name == key]


def _one(key: str, section: str = "Service") -> str:
    values = _values(key, section)
    assert len(values) == 1, f"{key}= should be set once in [{section}], found {values}"
    return values[0]


def test_unit_runs_the_packaged_command_with_the_system_config() -> None:
    assert _one("ExecStart") == f"{SHIPPED_EXEC} run --config /etc/gpuwatchd/gpuwatchd.yaml"
    assert _one("StateDirectory") == "gpuwatchd"
    assert _one("WantedBy", "Install") == "multi-user.target"


def test_unit_loads_nvidia_uvm_before_the_daemon_with_privileges_only_for_that() -> None:
    # "-+": a failure does not stop the start; full privileges for this command
    # only (the daemon itself has no capability to load a module).
    assert _one("ExecStartPre") == "-+/usr/bin/nvidia-modprobe -u -c=0"
    assert _one("CapabilityBoundingSet") == ""


def test_unit_is_notify_type_with_a_watchdog_and_restarts_on_failure() -> None:
    assert _one("Type") == "notify"
    # Only the daemon itself may report readiness, never a canary child.
    assert _one("NotifyAccess") == "main"
    assert _one("Restart") == "on-failure"
    watchdog = _one("WatchdogSec")
    assert re.fullmatch(r"\d+s", watchdog), watchdog
    assert 10 <= int(watchdog[:-1]) <= 300


def test_unit_writes_only_its_state_directory() -> None:
    assert _one("ProtectSystem") == "strict"
    assert _one("ProtectHome") == "yes"
    assert _one("PrivateTmp") == "yes"
    assert _one("NoNewPrivileges") == "yes"
    # StateDirectory= is writable under ProtectSystem=strict; nothing else is.
    assert _values("ReadWritePaths") == []


def test_unit_reaches_the_gpus_and_no_other_device() -> None:
    assert _one("DevicePolicy") == "closed"
    allowed = _values("DeviceAllow")
    # /dev/nvidiactl and /dev/nvidia0..N, from the open and the proprietary kernel module.
    assert "char-nvidia rw" in allowed
    assert "char-nvidia-frontend rw" in allowed
    assert "char-nvidia-uvm rw" in allowed
    assert not [rule for rule in allowed if "infiniband" in rule]
    # The kernel log, read only: the boot's XID lines.
    assert "/dev/kmsg r" in allowed


def test_unit_lets_the_daemon_read_the_kernel_log_and_nothing_more_of_it() -> None:
    assert _one("ProtectKernelLogs") == "no"
    # CAP_SYSLOG only through the drop-in for dmesg_restrict=1 nodes.
    assert _one("CapabilityBoundingSet") == "" and _one("PrivateUsers") == "yes"
    drop_in = (REPO / "systemd" / "kernel-log-restricted.conf").read_text()
    assert "CapabilityBoundingSet=CAP_SYSLOG" in drop_in and "PrivateUsers=no" in drop_in


def test_unit_allows_only_unix_and_ip_sockets() -> None:
    assert _one("RestrictAddressFamilies").split() == ["AF_UNIX", "AF_INET", "AF_INET6"]


@needs_systemd_analyze
def test_unit_verifies(tmp_path: Path) -> None:
    # verify insists that ExecStart exists: check a copy that runs this checkout's command.
    command = shutil.which("gpuwatchd", path=str(Path(sys.executable).parent))
    assert command is not None, "the gpuwatchd command is not installed beside this Python"
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(f"ExecStart={SHIPPED_EXEC}", f"ExecStart={command}"))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@needs_systemd_analyze
def test_unit_sandbox_exposure_is_at_most_3_5() -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    match = re.search(r"Overall exposure level for gpuwatchd\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-500:]
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


# The daemon under a notify socket of the test's own, as systemd would start it.


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class NotifySocket:
    """A unix datagram socket that records what was sent to it, and by which pid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        # The sender's pid, as systemd checks it for NotifyAccess=main.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages: list[tuple[int, str]] = []

    def wait_for(self, line: str, timeout: float) -> int:
        """The pid that sent a message with `line`; fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid, message in self.messages:
                if line in message.splitlines():
                    return pid
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except TimeoutError:
                break
            self.messages.append((_sender_pid(ancillary), data.decode()))
        pytest.fail(f"no {line} within {timeout}s; got {[m for _, m in self.messages]}")

    def close(self) -> None:
        self.sock.close()


def _sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid: int = struct.unpack("3i", data[:12])[0]
            return pid
    return -1


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    recorder = NotifySocket(tmp_path / "notify.sock")
    yield recorder
    recorder.close()


def test_daemon_sends_ready_and_watchdog_from_its_own_pid_and_stops_on_sigterm(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_socket.path), WATCHDOG_USEC="2000000")
    env.pop("WATCHDOG_PID", None)
    command = [sys.executable, "-m", "gpuwatchd", "run", "--simulate", "calm"]
    command += ["--listen", f"127.0.0.1:{_free_port()}", "--state-dir", str(tmp_path / "state")]
    command += ["--interval", "200ms"]
    daemon = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert notify_socket.wait_for("READY=1", timeout=60) == daemon.pid
        assert notify_socket.wait_for("WATCHDOG=1", timeout=10) == daemon.pid
        daemon.send_signal(signal.SIGTERM)
        assert notify_socket.wait_for("STOPPING=1", timeout=15) == daemon.pid
        assert daemon.wait(timeout=15) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
        _, stderr = daemon.communicate(timeout=15)
    assert "Traceback" not in stderr, stderr
