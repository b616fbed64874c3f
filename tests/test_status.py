"""`gpuwatchd status` and /metrics say what an operator needs at 3 a.m.: the
canaries' last passes, what is failing now and which GPUs are under doubt,
evidence a person can read, and the agent's own cost."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

import click
from api_support import api_on
from daemon_support import SimulatedDaemon, simulated_daemon
from prometheus_client import generate_latest

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.stats import CanaryStats
from gpuwatchd.config import Config
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.status import render_table, to_json
from gpuwatchd.terminal import colour_wanted

SDC = "node: {gpus: 2, nvlinks: 2, hcas: 1}\nfaults: []\n"
# A burst a minute, so that a lead opens within the first polls.
MINUTE_BURSTS = Config(canary=CanaryConfig(interval=60.0))


def _poll_until_canary(sim: SimulatedDaemon, key: str, polls: int = 12) -> dict[str, Any]:
    """Poll until a canary target's `key` (suspect, watch) is set; its status entry."""
    for _ in range(polls):
        document = to_json(sim.daemon.step())
        sim.clock.advance(sim.daemon.config.daemon.poll_interval)
        doubtful = [c for c in document["canaries"] if c[key] is not None]
        if doubtful:
            [canary] = doubtful
            canary["table"] = render_table(document)
            return canary
    raise AssertionError(f"no canary target got a {key} in {polls} polls")


def test_status_shows_each_gpus_last_canary_pass_and_its_runs(tmp_path: Path) -> None:
    with simulated_daemon(SDC, tmp_path, canary=True) as sim:
        snapshot = sim.run_until(660)
    document = to_json(snapshot)
    canaries = {c["target"]: c for c in document["canaries"]}
    assert set(canaries) >= {"gpu:0", "gpu:1"}
    for target in ("gpu:0", "gpu:1"):
        assert canaries[target]["last_pass"] is not None
        assert canaries[target]["runs"]["pass"] > 0 and canaries[target]["not_passing"] == {}
    table = render_table(document)
    assert "CANARY TARGET" in table
    assert any(line.startswith("gpu:0 ") and " pass " in line for line in table.splitlines())


def test_status_without_canaries_says_nothing_of_them(tmp_path: Path) -> None:
    with simulated_daemon(SDC, tmp_path) as sim:
        snapshot = sim.run_until(20)
    document = to_json(snapshot)
    assert document["canaries"] is None
    assert "CANARY" not in render_table(document)


def test_evidence_is_printed_to_four_significant_digits(tmp_path: Path) -> None:
    faults = "faults: [{at: 0s, kind: ib_symbol_errors, hca: mlx5_0, port: 1, rate: 50/s}]"
    with simulated_daemon(SDC.replace("faults: []", faults), tmp_path) as sim:
        document = to_json(sim.run_until(120))
    [finding] = [
        f for s in document["subjects"] for f in s["findings"] if f["code"] == "ib_symbol_errors"
    ]
    # As a real clock leaves them (the review's daemon printed these).
    finding["evidence"].update(window_seconds=400.0086441040039, ratio=5.31301018446848e-11)
    [line] = [x for x in render_table(document).splitlines() if "/ib_symbol_errors:" in x]
    assert "window_seconds=400 " in line and "ratio=5.313e-11 " in line
    assert "errors=6000 " in line


def test_metrics_carry_the_agents_own_cpu_and_memory(tmp_path: Path) -> None:
    with simulated_daemon(SDC, tmp_path) as sim:
        sim.run_until(10)
        metrics = generate_latest(sim.daemon.registry).decode()
    assert "\nprocess_cpu_seconds_total " in metrics
    assert "\nprocess_resident_memory_bytes " in metrics


def test_status_names_a_suspect_gpu_its_sibling_and_the_reruns_it_waits_for(
    tmp_path: Path,
) -> None:
    scenario = "node: {gpus: 3, nvlinks: 2, hcas: 1}\nfaults: [{at: 0s, kind: sdc, gpu: 1}]\n"
    with simulated_daemon(scenario, tmp_path, MINUTE_BURSTS, canary=True) as sim:
        canary = _poll_until_canary(sim, "suspect")
        settled = to_json(sim.daemon.step())
    assert canary["target"] == "gpu:1" and canary["watch"] is None
    suspect = canary["suspect"]
    assert suspect["sibling"] == "gpu:2" and suspect["reruns_pending"] == ["gpu:1", "gpu:2"]
    assert "gemm_exact_fp16" in suspect["canaries"]
    [line] = [x for x in canary["table"].splitlines() if x.startswith("  gpu:1: suspect since ")]
    assert "sibling gpu:2; re-runs pending on gpu:1, gpu:2" in line
    # The re-runs came back: confirmed, so no longer a suspect.
    gpu1 = next(c for c in settled["canaries"] if c["target"] == "gpu:1")
    assert gpu1["suspect"] is None and gpu1["watch"] is None
    assert "canaries under doubt" not in render_table(settled)


def test_status_names_a_watched_gpu_and_the_offline_diagnostic_it_needs(tmp_path: Path) -> None:
    # One GPU: no sibling can tell its fault from a software one, so it is
    # watched, never confirmed.
    scenario = "node: {gpus: 1, nvlinks: 2, hcas: 1}\nfaults: [{at: 0s, kind: sdc, gpu: 0}]\n"
    with simulated_daemon(scenario, tmp_path, MINUTE_BURSTS, canary=True) as sim:
        canary = _poll_until_canary(sim, "watch")
        now = sim.clock.now()
    watch = canary["watch"]
    assert watch["offline_diagnostic"] == "gpuwatchd canary --dcgm 3" and watch["until"] > now
    assert watch["canary"] in canary["not_passing"]
    [line] = [x for x in canary["table"].splitlines() if x.startswith("  gpu:0: watched until ")]
    assert line.endswith("; run gpuwatchd canary --dcgm 3")


def test_status_lists_the_canaries_among_the_sources(tmp_path: Path) -> None:
    with simulated_daemon(SDC, tmp_path, canary=True) as sim:
        document = to_json(sim.run_until(10))
    assert document["sources"]["canary"] == {"up": True, "error": None}
    assert "sources: canary up, infiniband up, nvml up" in render_table(document)


def test_status_says_the_canaries_are_down_when_gpus_have_no_backend() -> None:
    # What the agent reports on a node whose GPUs CUDA cannot use.
    unchecked = MappingProxyType({0: ("no_backend", 5.0), 1: ("no_backend", 5.0)})
    document = to_json(Snapshot(time=10.0, canary=CanaryStats(unchecked=unchecked)))
    assert document["sources"]["canary"] == {
        "up": False,
        "error": "no GPU backend: GPU(s) 0, 1 unchecked",
    }
    assert "canary DOWN (no GPU backend: GPU(s) 0, 1 unchecked)" in render_table(document)


def test_a_board_condemned_for_its_row_remap_shows_its_fault_code_in_status(
    tmp_path: Path,
) -> None:
    faults = "faults: [{at: 0s, kind: row_remap_failure, gpu: 1}]"
    with simulated_daemon(SDC.replace("faults: []", faults), tmp_path) as sim:
        document = to_json(sim.run_until(20))
    [finding] = [
        f for s in document["subjects"] for f in s["findings"] if f["code"] == "row_remap_failure"
    ]
    assert finding["fault_code"] == "GW-1103"
    held = {q["subject"]: q["fault_code"] for q in document["quarantines"]}
    assert held["gpu:1"] == "GW-1103"
    table = render_table(document).splitlines()
    assert any(
        line.startswith("    [critical] GW-1103 memory/row_remap_failure: ") for line in table
    )
    assert any(
        line.startswith("  gpu:1 [") and ": GW-1103 row_remap_failure (auto" in line
        for line in table
    )


def _status_on(stdout_is_a_terminal: bool, url: str, **environ: str) -> str:
    """`gpuwatchd status --node URL` as a person runs it: its stdout a
    terminal (a pseudo-terminal) or a pipe."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    command = [sys.executable, "-m", "gpuwatchd", "status", "--node", url]
    if not stdout_is_a_terminal:
        result = subprocess.run(command, env={**env, **environ}, capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.decode()
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(command, env={**env, **environ}, stdout=terminal)
        os.close(terminal)
        output = b""
        while chunk := _read_pty(controller):
            output += chunk
        assert process.wait(timeout=60) == 0
    finally:
        os.close(controller)
    return output.decode().replace("\r\n", "\n")


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the command closed the terminal
        return b""


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_status_on_a_terminal_colours_what_is_wrong_and_piped_or_no_color_stays_plain(
    tmp_path: Path,
) -> None:
    with api_on(tmp_path) as api:
        status, _ = api.request("POST", "/api/v1/quarantines", {"subject": "gpu:1", "reason": "x"})
        assert status == 201
        coloured = _status_on(True, api.url)
        piped = _status_on(False, api.url)
        no_color = _status_on(True, api.url, NO_COLOR="1")
        dumb = _status_on(True, api.url, TERM="dumb")
    assert "\x1b[" not in piped and "\x1b[" not in no_color and "\x1b[" not in dumb
    assert ANSI.sub("", coloured) == piped  # the same table, columns aligned alike
    quarantined = click.style("quarantined", fg="magenta", bold=True)
    assert f"node health: {quarantined}" in coloured
    gpu_row = next(line for line in coloured.splitlines() if line.startswith("1 "))
    assert quarantined in gpu_row


def test_colour_is_for_a_terminal_unless_no_color_is_set_and_not_empty() -> None:
    controller, terminal = pty.openpty()
    with os.fdopen(terminal, "w") as tty, tempfile.TemporaryFile("w") as file:
        assert colour_wanted(tty, {}) and colour_wanted(tty, {"NO_COLOR": ""})
        assert not colour_wanted(tty, {"NO_COLOR": "1"})
        assert not colour_wanted(tty, {"TERM": "dumb"})
        assert not colour_wanted(file, {})
    os.close(controller)
