"""`gpuwatchd quarantine add|release|list` as an operator runs it: against a
real daemon process on loopback (the token from the file the daemon created),
and on the state database when the local daemon is not running, which a
daemon started afterwards picks up."""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from actions_support import (
    DaemonProcess,
    daemon_process,
    free_port,
    receiver,
    wait_for,
    write_config,
)
from click.testing import CliRunner, Result

from gpuwatchd.cli import main
from gpuwatchd.config import ApiConfig

OPERATOR = getpass.getuser()


def _quarantined(daemon: DaemonProcess) -> str:
    """The gpuwatchd_quarantined series on the daemon's /metrics."""
    lines = daemon.metrics().splitlines()
    return "\n".join(line for line in lines if line.startswith("gpuwatchd_quarantined{"))


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _journal(config: Path, *args: str) -> list[dict[str, Any]]:
    """The running daemon's journal, as `gpuwatchd journal` reads it: through
    the daemon's API, since the daemon holds its database."""
    result = cli("journal", "--config", str(config), "--since", "1h", "--json", *args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "gpuwatchd.yaml", tmp_path / "state", free_port(), {})


@pytest.fixture
def daemon(config: Path) -> Iterator[DaemonProcess]:
    with daemon_process(config) as running:
        yield running


def test_add_list_and_release_through_a_running_daemon(daemon: DaemonProcess, config: Path) -> None:
    added = cli("quarantine", "add", "gpu:5", "--reason", "fan at 100%", "--config", str(config))
    assert added.exit_code == 0, added.output
    assert added.output == "quarantined gpu:5: fan at 100%\n"
    assert (
        'gpuwatchd_quarantined{fault_code="",reason="operator",source="manual",'
        'subject="gpu:5"} 1.0' in daemon.metrics()
    )

    listed = cli("quarantine", "list", "--config", str(config))
    assert listed.exit_code == 0 and listed.output.startswith("SUBJECT")
    as_json = json.loads(cli("quarantine", "list", "--json", "--node", daemon.url).output)
    assert {q["subject"] for q in as_json} == {"gpu:5", "node"}
    # The board, not only its index: the UUID is in both forms.
    board = next(q["uuid"] for q in as_json if q["subject"] == "gpu:5")
    assert board.startswith("GPU-") and f"gpu:5    {board}  manual  " in listed.output
    assert OPERATOR in listed.output

    released = cli("quarantine", "release", "gpu:5", "--config", str(config))
    assert released.output == f"released gpu:5: released by {OPERATOR}\n"
    again = cli("quarantine", "release", "gpu:5", "--config", str(config))
    assert again.exit_code == 1 and "gpu:5 is not quarantined" in again.output

    manual = [e for e in _journal(config) if e["source"] == "manual"]
    assert [(e["kind"], e["subject"], e["operator"], e["message"]) for e in manual] == [
        ("quarantine", "gpu:5", OPERATOR, "fan at 100%"),
        ("health_changed", "gpu:5", OPERATOR, "healthy -> quarantined"),
        ("release", "gpu:5", OPERATOR, f"released by {OPERATOR}"),
        ("health_changed", "gpu:5", OPERATOR, "quarantined -> degraded"),
    ]


def test_a_wrong_token_is_refused_and_journaled(
    daemon: DaemonProcess, config: Path, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong-token"
    wrong.write_text("mallory:guess\n")
    result = cli(
        "quarantine", "add", "node", "--reason", "x", "--config", str(config),
        "--token-file", str(wrong),
    )  # fmt: skip
    assert result.exit_code == 1
    assert f"the bearer token is not valid (the daemon refused the token from {wrong})" in (
        result.output
    )
    assert "gpuwatchd_quarantined{" not in daemon.metrics()
    refused = [e["message"] for e in _journal(config) if e["kind"] == "api_refused"]
    assert refused == [
        "POST /api/v1/quarantines from 127.0.0.1 refused: the bearer token is not valid"
    ]


def test_a_change_without_a_readable_token_is_not_sent_and_says_why(
    daemon: DaemonProcess, config: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-token"
    for command in (["add", "gpu:1", "--reason", "x"], ["release", "gpu:1"]):
        result = cli("quarantine", *command, "--config", str(config), "--token-file", str(missing))
        assert result.exit_code == 1, result.output
        assert result.output == (
            f"Error: nothing was sent to {daemon.url}, which takes changes only with a token: "
            f"cannot read the API token file {missing}: No such file or directory "
            "(--token-file, or $GPUWATCHD_STATE_DIR as a simulated daemon prints it)\n"
        )
    # No request doomed to a 401: none refused, none journaled.
    assert "gpuwatchd_api_refused_requests_total 0.0" in daemon.metrics()
    assert [e for e in _journal(config) if e["kind"] == "api_refused"] == []


def test_with_the_daemon_down_changes_go_to_the_state_database_and_a_daemon_started_later_has_them(
    tmp_path: Path,
) -> None:
    with receiver() as hook:
        webhooks = [{"name": "ops", "url": hook.url, "retry_initial": "100ms"}]
        config = write_config(
            tmp_path / "gpuwatchd.yaml",
            tmp_path / "state",
            free_port(),
            {"actions": {"webhooks": webhooks}},
        )
        added = cli("quarantine", "add", "node", "--reason", "RMA", "--config", str(config))
        assert added.exit_code == 0, added.output
        assert "gpuwatchd is not running here: using the state database" in added.output
        assert added.output.endswith("quarantined node: RMA\n")
        listed = cli("quarantine", "list", "--json", "--config", str(config))
        assert [q["subject"] for q in json.loads(listed.output.split("\n", 1)[1])] == ["node"]

        with daemon_process(config) as daemon:
            assert (
                'gpuwatchd_quarantined{fault_code="",reason="operator",source="manual",'
                'subject="node"} 1.0' in daemon.metrics()
            )
            # The event written with the offline change is delivered by the daemon.
            (event, *_) = wait_for(hook.payloads, "the offline quarantine's webhook event")
            assert (event["kind"], event["subject"], event["operator"]) == (
                "quarantine",
                "node",
                OPERATOR,
            )
            # ...and the daemon takes the release from there on.
            released = cli("quarantine", "release", "node", "--config", str(config))
            assert released.exit_code == 0 and "state database" not in released.output
            assert 'subject="node"' not in _quarantined(daemon)


def test_offline_subjects_are_checked_against_the_last_known_samples(
    config: Path, tmp_path: Path
) -> None:
    with daemon_process(config) as daemon:
        uuid = json.loads(cli("status", "--json", "--node", daemon.url).output)["gpus"][6]["uuid"]
    by_uuid = cli("quarantine", "add", f"gpu:{uuid}", "--reason", "x", "--config", str(config))
    assert by_uuid.exit_code == 0 and by_uuid.output.endswith("quarantined gpu:6: x\n")
    missing = cli("quarantine", "add", "gpu:8", "--reason", "x", "--config", str(config))
    assert missing.exit_code == 1 and "gpu:8 is not on this node" in missing.output


def test_an_explicit_node_that_does_not_answer_is_an_error_not_the_local_database(
    config: Path,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = cli(
        "quarantine", "add", "node", "--reason", "x", "--node", url, "--config", str(config)
    )
    assert result.exit_code == 1
    assert f"cannot reach the gpuwatchd daemon at {url}" in result.output
    assert not (config.parent / "state" / "state.db").exists()


def test_a_gpu_quarantined_offline_on_a_node_never_seen_is_refused_and_nothing_is_written(
    config: Path,
) -> None:
    result = cli(
        "quarantine", "add", "gpu:99", "--reason", "offline bogus", "--config", str(config)
    )
    assert result.exit_code == 1
    assert "gpu:99: gpuwatchd is not running and there is no" in result.output
    assert not (config.parent / "state").exists()


def test_a_gpu_the_saved_readings_lack_is_refused_offline_as_online(config: Path) -> None:
    node = cli("quarantine", "add", "node", "--reason", "drill", "--config", str(config))
    assert node.exit_code == 0, node.output
    # A database with no readings yet (the daemon never ran) cannot vouch for a GPU.
    phantom = cli("quarantine", "add", "gpu:99", "--reason", "x", "--config", str(config))
    assert phantom.exit_code == 1 and "holds no readings of this node yet" in phantom.output
    assert [q["subject"] for q in _listed(config)] == ["node"]


def _listed(config: Path) -> list[dict[str, object]]:
    listed = CliRunner().invoke(main, ["quarantine", "list", "--json", "--config", str(config)])
    assert listed.exit_code == 0, listed.output
    quarantines: list[dict[str, object]] = json.loads(listed.stdout)
    return quarantines


def test_listing_quarantines_creates_no_database_and_slurm_still_has_no_verdict(
    config: Path,
) -> None:
    listed = cli("quarantine", "list", "--config", str(config))
    assert listed.exit_code == 0
    assert listed.stdout == "no quarantines\n"
    assert "there is no" in listed.stderr and "applies the change" not in listed.stderr
    assert not (config.parent / "state").exists()
    verdict = cli("slurm-healthcheck", "--config", str(config))
    assert verdict.exit_code == 0 and verdict.output.startswith("gpuwatchd: no verdict")
    assert not (config.parent / "state").exists()


def test_quarantining_an_already_quarantined_gpu_keeps_the_original(
    daemon: DaemonProcess, config: Path
) -> None:
    first = cli("quarantine", "add", "gpu:2", "--reason", "bad fan", "--config", str(config))
    assert first.output == "quarantined gpu:2: bad fan\n"
    again = cli("quarantine", "add", "gpu:2", "--reason", "dup", "--config", str(config))
    assert again.exit_code == 0
    assert again.output.startswith("gpu:2 was already quarantined (manual, since ")
    assert again.output.endswith("): bad fan; left as it was\n")
    [held] = [q for q in _listed(config) if q["subject"] == "gpu:2"]
    assert (held["reason"], held["source"]) == ("bad fan", "manual")
    assert [
        e["kind"] for e in _journal(config, "--subject", "gpu:2") if e["source"] == "manual"
    ] == [
        "quarantine",
        "health_changed",
    ]


def test_a_token_file_others_can_read_is_warned_of(tmp_path: Path) -> None:
    token = tmp_path / "api-token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    url = f"http://127.0.0.1:{free_port()}"
    result = cli(
        "quarantine", "add", "node", "--reason", "x", "--node", url, "--token-file", str(token)
    )
    assert f"warning: the API token file {token} is open to other users (mode 0644)" in (
        result.stderr
    )
    token.chmod(0o600)
    again = cli(
        "quarantine", "add", "node", "--reason", "x", "--node", url, "--token-file", str(token)
    )
    assert "warning" not in again.stderr


def test_with_the_api_apart_metrics_serve_no_control_and_the_cli_finds_the_api(
    tmp_path: Path,
) -> None:
    api_port = free_port()
    config = write_config(
        tmp_path / "gpuwatchd.yaml",
        tmp_path / "state",
        free_port(),
        {"api": {"listen": f"127.0.0.1:{api_port}"}},
    )
    with daemon_process(config) as running:
        assert "gpuwatchd_source_up" in running.metrics()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{running.url}/api/v1/quarantines", timeout=5)
        assert refused.value.code == 404
        added = cli("quarantine", "add", "gpu:5", "--reason", "fan", "--config", str(config))
        assert added.exit_code == 0, added.output
        with urllib.request.urlopen(
            f"http://127.0.0.1:{api_port}/api/v1/quarantines", timeout=5
        ) as response:
            assert "gpu:5" in [q["subject"] for q in json.load(response)["quarantines"]]
        assert 'subject="gpu:5"' in _quarantined(running)


def test_the_api_on_a_unix_socket_is_group_only_and_the_cli_uses_it(tmp_path: Path) -> None:
    # A short directory: a Unix socket's path is at most 107 bytes.
    run = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    socket_path = run / "api.sock"
    # A socket file left by a daemon that died is replaced.
    with closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as dead:
        dead.bind(str(socket_path))
    config = write_config(
        tmp_path / "gpuwatchd.yaml",
        tmp_path / "state",
        free_port(),
        {"api": {"listen": f"unix:{socket_path}"}},
    )
    try:
        with daemon_process(config) as running:
            mode = socket_path.stat().st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{running.url}/api/v1/quarantines", timeout=5)
            assert refused.value.code == 404
            added = cli("quarantine", "add", "gpu:5", "--reason", "fan", "--config", str(config))
            assert added.exit_code == 0, added.output
            assert 'subject="gpu:5"' in _quarantined(running)
            listed = cli("quarantine", "list", "--node", f"unix:{socket_path}")
            assert listed.exit_code == 0, listed.output
            assert "gpu:5" in listed.output
            # A second daemon cannot take the socket of a live one.
            second = write_config(
                tmp_path / "second.yaml",
                tmp_path / "state2",
                free_port(),
                {"api": {"listen": f"unix:{socket_path}"}},
            )
            taken = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gpuwatchd",
                    "run",
                    "--config",
                    str(second),
                    "--simulate",
                    "calm",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert taken.returncode == 1
            assert f"another process listens on {socket_path}" in taken.stderr
            # ...and the first keeps it (review adversarial-2, row 271).
            listed = cli("quarantine", "list", "--node", f"unix:{socket_path}")
            assert listed.exit_code == 0, listed.output
            # SIGTERM: the daemon removes its socket as it stops.
            running.stop()
            assert not socket_path.exists()
    finally:
        shutil.rmtree(run)


def test_a_unix_socket_api_must_be_a_short_absolute_path_without_tls() -> None:
    with pytest.raises(ValueError, match="absolute path"):
        ApiConfig(listen="unix:api.sock")
    # Review adversarial-2, row 279: bind's own refusal said "None".
    with pytest.raises(ValueError, match="at most 107 bytes"):
        ApiConfig(listen=f"unix:/run/{'d' * 100}/api.sock")
    with pytest.raises(ValueError, match="plain HTTP"):
        ApiConfig(listen="unix:/run/x.sock", tls_cert_file="c.pem", tls_key_file="k.pem")
