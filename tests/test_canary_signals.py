"""Stopping is prompt, and no canary worker outlives the daemon.

A real `gpuwatchd run --simulate` whose GPUs' canary bursts hang (the `sdc`
mode `hang`: the worker's canary never returns) with a canary timeout far
longer than the unit's TimeoutStopSec (30 s): SIGTERM ends it within 5 s
with its workers killed; SIGKILL leaves no worker running either, outside
systemd's cgroup too (the workers ask for a parent-death signal).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from actions_support import REPO, free_port, wait_for

HUNG = "node: {gpus: 2, nvlinks: 2, hcas: 0}\nfaults:\n" + "".join(
    f"  - {{at: 0s, kind: sdc, gpu: {gpu}, mode: hang}}\n" for gpu in (0, 1)
)


def _workers(daemon: psutil.Process) -> list[psutil.Process]:
    return [child for child in daemon.children(recursive=True) if _is_worker(child)]


def _is_worker(child: psutil.Process) -> bool:
    # A child listed a moment ago may have ended since (under load, seen).
    try:
        return "gpuwatchd.canary.worker" in " ".join(child.cmdline())
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def hung_daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], list[psutil.Process]]]:
    scenario = tmp_path / "hung.yaml"
    scenario.write_text(HUNG)
    config = tmp_path / "gpuwatchd.yaml"
    document = {
        "daemon": {"listen": f"127.0.0.1:{free_port()}", "state_dir": str(tmp_path / "state")},
        "canary": {"timeout": "120s", "host_cores": False, "aligned_window": "0s"},
    }
    config.write_text(yaml.safe_dump(document))
    command = [sys.executable, "-m", "gpuwatchd", "run", "--config", str(config)]
    process = subprocess.Popen(
        [*command, "--simulate", str(scenario), "--interval", "200ms"],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    daemon = psutil.Process(process.pid)
    try:
        # Both GPUs' bursts are hung in their canary (asleep in it, past their
        # imports and first lines), and would be for two minutes.
        workers = wait_for(lambda: _hung(_workers(daemon)), "two hung canary workers", 60)
        yield process, workers
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        for worker in _workers(daemon) if daemon.is_running() else ():
            worker.kill()


def _hung(workers: list[psutil.Process]) -> list[psutil.Process] | None:
    if len(workers) != 2:
        return None
    try:
        asleep = all(w.status() == psutil.STATUS_SLEEPING for w in workers)
        # Asleep, and not spending: blocked, not between two imports.
        idle = asleep and all(w.cpu_percent(interval=0.2) == 0.0 for w in workers)
    except psutil.NoSuchProcess:  # a worker that ended is not hung
        return None
    return workers if idle else None


def _gone(workers: list[psutil.Process]) -> bool:
    return not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)


def test_sigterm_during_hung_bursts_kills_the_workers_and_exits_within_5_seconds(
    hung_daemon: tuple[subprocess.Popen[str], list[psutil.Process]],
) -> None:
    process, workers = hung_daemon
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert time.monotonic() - sent < 5.0
    assert _gone(workers)


def test_sigkill_of_the_daemon_takes_its_workers_with_it(
    hung_daemon: tuple[subprocess.Popen[str], list[psutil.Process]],
) -> None:
    process, workers = hung_daemon
    process.kill()
    process.wait(timeout=30)
    wait_for(lambda: _gone(workers), "the orphaned workers to die", timeout=10)
