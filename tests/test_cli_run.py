"""`gpuwatchd run` as a user runs it: a real process on loopback, read with
`gpuwatchd status`, stopped with SIGTERM."""

from __future__ import annotations

import json
import re
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
from gpuwatchd.cli.run import TELL_WHERE


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
    # In a terminal (no journald to stamp them) every log line starts with its UTC time.
    logged = [line for line in stderr.splitlines() if "level=" in line]
    assert logged and all(re.match(r"time=\d{4}-\d\d-\d\dT[\d:.]+Z level=", x) for x in logged)


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
    config.write_text("daemon:\n  poll_interval: 10s\n  listen: nowhere\n")
    result = CliRunner().invoke(main, ["run", "--config", str(config), "--simulate"])
    assert result.exit_code == 1
    assert f"{config}:3: daemon.listen: listen must be HOST:PORT" in result.output


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--interval", "0s", "the poll interval must be at least 0.1s"),
        ("--listen", "9477", "listen must be HOST:PORT such as 127.0.0.1:9477"),
    ],
)
def test_a_bad_flag_is_named_as_the_flag_not_the_config_key(
    flag: str, value: str, said: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        main, ["run", "--simulate", "--state-dir", str(tmp_path), flag, value]
    )
    assert result.exit_code == 2
    assert f"Error: Invalid value for '{flag}': {said}" in result.output
    assert list(tmp_path.iterdir()) == []


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuwatchd", "run", "--interval", "200ms", *args],
        stderr=subprocess.PIPE,
        text=True,
    )


def _exported(process: subprocess.Popen[str]) -> dict[str, str]:
    """The variables of the `export ...` line a simulated daemon prints."""
    assert process.stderr is not None
    for _ in range(200):  # the line comes after the first poll's few
        line = process.stderr.readline()
        if line.startswith("export "):
            words = line.split()[1:]
            return dict(word.split("=", 1) for word in words)
        if not line:
            break
    raise AssertionError("the simulated daemon printed no export line")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    process.communicate(timeout=10)
    assert process.returncode == 0


def test_the_export_line_comes_once_the_first_poll_is_done_below_its_comment() -> None:
    port = _free_port()
    process = _start("--simulate", "calm", "--listen", f"127.0.0.1:{port}")
    try:
        assert process.stderr is not None
        before = []
        for line in iter(process.stderr.readline, ""):
            if line.startswith("export "):
                break
            before.append(line.rstrip("\n"))
        assert before and before[-1] == TELL_WHERE
        # READY came first: the daemon has polled and serves without a wait.
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/api/v1/status", timeout=5) as response:
            assert json.load(response)["polls"] >= 1
    finally:
        _stop(process)


def test_the_quick_start_daemon_tells_the_cli_where_its_state_and_token_are(
    tmp_path: Path,
) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = _start("--simulate", "--listen", f"127.0.0.1:{port}")
    try:
        env = _exported(process)
        assert env["GPUWATCHD_NODE"] == url
        state_dir = Path(env["GPUWATCHD_STATE_DIR"])
        _wait_for_poll(url, process)
        cli = CliRunner(env=env)
        added = cli.invoke(main, ["quarantine", "add", "gpu:3", "--reason", "fans at 100%"])
        assert added.output == "quarantined gpu:3: fans at 100%\n"
        journal = cli.invoke(main, ["journal", "--subject", "gpu:3"])
        assert journal.exit_code == 0 and "quarantine gpu:3 (manual" in journal.output
        # Without the URL the CLI finds the database held by the daemon, which
        # does not listen where the config says: one message.
        elsewhere = _free_port()
        config = tmp_path / "gpuwatchd.yaml"
        config.write_text(f"daemon: {{listen: '127.0.0.1:{elsewhere}'}}\n")
        local = cli.invoke(
            main,
            ["journal", "--subject", "gpu:3", "--config", str(config)],
            env={"GPUWATCHD_NODE": None},
        )
        assert local.exit_code == 2
        assert local.output == (
            f"Error: the state database {state_dir / 'state.db'} is held by a running "
            f"gpuwatchd, which does not answer at http://127.0.0.1:{elsewhere}: is it starting, or "
            "listening elsewhere? (--node URL, or --config with its api.listen or "
            "daemon.listen)\n"
        )
        assert (state_dir / "state.db").exists()
    finally:
        _stop(process)
    assert not state_dir.exists()  # a scratch directory: the run's own


def test_a_simulated_daemon_keeps_the_config_state_dir_and_its_journal(tmp_path: Path) -> None:
    port = _free_port()
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(f"daemon: {{listen: '127.0.0.1:{port}', state_dir: '{tmp_path / 'st8'}'}}\n")
    process = _start("--simulate", "--config", str(config))
    try:
        _wait_for_poll(f"http://127.0.0.1:{port}", process)
        added = CliRunner().invoke(
            main, ["quarantine", "add", "node", "--reason", "drill", "--config", str(config)]
        )
        assert added.output == "quarantined node: drill\n"
    finally:
        _stop(process)
    journal = CliRunner().invoke(main, ["journal", "--config", str(config), "--subject", "node"])
    assert journal.exit_code == 0 and "quarantine node (manual" in journal.output


def test_log_level_on_the_command_line_overrides_the_config(tmp_path: Path) -> None:
    port = _free_port()
    process = _start(
        "--simulate", "calm", "--listen", f"127.0.0.1:{port}", "--log-level", "warning"
    )
    try:
        _wait_for_poll(f"http://127.0.0.1:{port}", process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    assert "export GPUWATCHD_STATE_DIR=" in stderr  # not a log line: always shown
    assert "level=info" not in stderr
    verbose = CliRunner().invoke(main, ["run", "-v", "--log-level", "loud"])
    assert verbose.exit_code == 2 and "'loud' is not one of" in verbose.output


def test_gpuwatchd_alone_prints_its_help_and_succeeds() -> None:
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 0
    assert "Commands:" in result.output and "quarantine" in result.output


def test_a_taken_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main,
            ["run", "--simulate", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path)],
        )
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.output
    assert list(tmp_path.iterdir()) == []  # no token file, no database


def test_a_second_daemon_on_a_running_daemons_state_directory_is_refused(
    running_daemon: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    state = ["--state-dir", str(tmp_path / "state")]
    listen = ["--listen", f"127.0.0.1:{_free_port()}"]
    second = subprocess.run(
        [sys.executable, "-m", "gpuwatchd", "run", "--simulate", "calm", *listen, *state],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert (
        f"Error: the state database {tmp_path / 'state' / 'state.db'} is held by another "
        f"process: another gpuwatchd runs with the state directory {tmp_path / 'state'}"
    ) in second.stderr
    assert "Traceback" not in second.stderr
    assert running_daemon[1].poll() is None


def test_a_missing_scenario_file_names_the_built_in_scenarios(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "run",
            "--simulate",
            str(tmp_path / "nosuch.yaml"),
            "--listen",
            f"127.0.0.1:{_free_port()}",
        ],
    )
    assert result.exit_code == 1
    assert "nosuch.yaml: cannot read: No such file or directory" in result.output
    assert "(built-in scenarios: calm, default)" in result.output


def test_the_daemon_warns_of_a_token_file_others_can_write(tmp_path: Path) -> None:
    port = _free_port()
    token = tmp_path / "api-token"
    token.write_text("s3cret\n")
    token.chmod(0o666)
    process = _start(
        "--simulate", "calm", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path)
    )
    try:
        _wait_for_poll(f"http://127.0.0.1:{port}", process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    assert f"the API token file {token} is open to other users (mode 0666); chmod 600" in stderr


def test_a_fatal_signal_in_the_daemon_is_said_with_its_stack() -> None:
    # As sqlite's SIGBUS on an unwritable -shm file would end it (review F4,
    # row 186): not survivable in place, but not silent either.
    port = _free_port()
    process = _start("--simulate", "calm", "--listen", f"127.0.0.1:{port}")
    _wait_for_poll(f"http://127.0.0.1:{port}", process)
    process.send_signal(signal.SIGBUS)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGBUS
    assert "Fatal Python error: Bus error" in stderr
