"""A check that raises does not end the poll loop: the other checks run, its
last findings stand, and the failure is on /metrics and in the log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from daemon_support import simulated_daemon
from prometheus_client import generate_latest

from gpuwatchd.checks import CheckOutput, registry
from gpuwatchd.checks.registry import CheckInputs, ChecksConfig
from gpuwatchd.model import Health

SCENARIO = (
    "node: {gpus: 2, nvlinks: 4, hcas: 1}\n"
    "faults: [{kind: nvlink_down, gpu: 1, link: 2, at: 10s}]\n"
)


def test_a_raising_check_is_isolated_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = {"on": False}
    nvlink = dict(registry.CHECKS)["nvlink"]

    def sometimes(inputs: CheckInputs, config: ChecksConfig) -> CheckOutput:
        if broken["on"]:
            raise OverflowError("int too large to convert to float")
        return nvlink(inputs, config)

    checks = tuple((n, sometimes if n == "nvlink" else c) for n, c in registry.CHECKS)
    monkeypatch.setattr(registry, "CHECKS", checks)
    with simulated_daemon(SCENARIO, tmp_path) as sim:
        before = sim.run_until(60)
        assert before.health["nvlink:1/2"] is Health.UNHEALTHY
        broken["on"] = True
        with caplog.at_level(logging.ERROR, logger="gpuwatchd.daemon"):
            during = sim.run_until(120)
        assert during.check_errors == {"nvlink": "OverflowError: int too large to convert to float"}
        # The nvlink check's last finding stands; the thermal check still ran.
        assert during.health["nvlink:1/2"] is Health.UNHEALTHY
        assert during.polls > before.polls
        # Critical findings are logged at error too: the check's own lines here.
        errors = [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.ERROR and r.getMessage().startswith("check ")
        ]
        assert errors == [
            "check nvlink failed: OverflowError: int too large to convert to float; "
            "its last findings stand"
        ]
        metrics = generate_latest(sim.daemon.registry).decode()
        assert 'gpuwatchd_check_failed{check="nvlink"} 1.0' in metrics
        assert 'gpuwatchd_check_failed{check="thermal"} 0.0' in metrics
        broken["on"] = False
        after = sim.run_until(130)
        assert after.check_errors == {}
