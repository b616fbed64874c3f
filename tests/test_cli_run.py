"""`gpuwatchd run` as a user runs it: a real process on loopback, read with
`gpuwatchd status`, stopped with SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwatchd.cli import main


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_poll(url: str, process: subprocess.Popen[str]) -> None:
    for _ in range(200):  # at most ~20 s
        if process.poll() is not None:
            raise AssertionError(f"daemon exited: {process.communicate()[1]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("daemon did not finish a poll in time")


@pytest.fixture
def running_daemon(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwatchd",
            "run",
            "--simulate",
            "--interval",
            "200ms",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_poll(url, process)
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_run_simulate_serves_metrics_and_status_then_stops_on_sigterm(
    running_daemon: tuple[str, subprocess.Popen[str]],
) -> None:
    url, process = running_daemon
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    assert metrics.count("gpuwatchd_gpu_up{") == 8
    assert metrics.count("gpuwatchd_nvlink_up{") == 8 * 18

    table = CliRunner().invoke(main, ["status", "--node", url])
    assert table.exit_code == 0, table.output
    assert "node health:" in table.output and "NVIDIA H100 80GB HBM3" in table.output
    as_json = CliRunner().invoke(main, ["status", "--json", "--node", url])
    document = json.loads(as_json.output)
    assert len(document["gpus"]) == 8 and document["sources"]["nvml"]["up"] is True

    # How fast it stops is a benchmark's business, not a timed assertion's: here
    # it must stop cleanly, by itself, with exit status 0.
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0
    assert 'msg="received SIGTERM, stopping"' in stderr


def test_run_without_nvml_says_so_and_suggests_simulate(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwatchd",
            "run",
            "--source",
            "nvml",
            "--listen",
            f"127.0.0.1:{_free_port()}",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert "NVML could not be loaded" in result.stderr
    assert "--simulate" in result.stderr and "--source" in result.stderr


def test_status_when_no_daemon_runs_names_the_address() -> None:
    port = _free_port()
    result = CliRunner().invoke(main, ["status", "--node", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert f"cannot reach the gpuwatchd daemon at http://127.0.0.1:{port}" in result.output


def test_run_rejects_a_broken_config_naming_the_line(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("daemon:\n  poll_interval: 10\n  listen: nowhere\n")
    result = CliRunner().invoke(main, ["run", "--config", str(config), "--simulate"])
    assert result.exit_code == 1
    assert f"{config}:3: daemon.listen: listen must be HOST:PORT" in result.output
