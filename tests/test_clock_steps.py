"""Wall-clock steps (an NTP step, `date -s`) in either direction change
nothing but timestamps: the poll loop, /healthz, the watchdog and the
confirmation of faults run on the daemon's monotonic reckoning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from daemon_support import simulated_daemon

from gpuwatchd.clock import FakeClock, SystemClock
from gpuwatchd.config import Config, DaemonConfig
from gpuwatchd.daemon import Daemon
from gpuwatchd.model import GpuSample, Health, Reading
from gpuwatchd.server import StatusServer

HOUR = 3600.0


class SteppingWall:
    """A wall clock that an NTP step moves by hours and a monotonic one that does not."""

    def __init__(self) -> None:
        self.wall = 1_767_225_600.0
        self.monotonic = 50.0

    def pass_time(self, seconds: float) -> None:
        self.wall += seconds
        self.monotonic += seconds


def test_system_clock_keeps_its_reckoning_across_a_wall_clock_step() -> None:
    time = SteppingWall()
    clock = SystemClock(wall=lambda: time.wall, monotonic=lambda: time.monotonic)
    start = clock.now()
    time.pass_time(10)
    time.wall -= HOUR
    assert clock.now() - start == 10
    assert clock.wall() == start + 10 - HOUR
    time.wall += 2 * HOUR
    time.pass_time(5)
    assert clock.now() - start == 15


class CountingSource:
    name = "nvml"

    def __init__(self) -> None:
        self.times: list[float] = []

    def poll(self, now: float) -> Reading:
        self.times.append(now)
        return Reading(source=self.name, time=now, gpus=(GpuSample(index=0, up=True),))

    def close(self) -> None:
        pass


class Steps:
    """A notifier that steps the wall clock back an hour after the second poll
    and stops the daemon after the sixth."""

    watchdog_seconds = None

    def __init__(self, clock: FakeClock, source: CountingSource, daemon: Daemon) -> None:
        self.clock, self.source, self.daemon = clock, source, daemon
        self.stepped = False

    def ready(self, status: str) -> None:
        pass

    def watchdog(self) -> None:
        if len(self.source.times) == 2 and not self.stepped:
            self.clock.step_wall(-HOUR)
            self.stepped = True
        if len(self.source.times) == 6:
            self.daemon.stop()

    def stopping(self) -> None:
        pass


def test_a_backward_wall_step_does_not_pause_polling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    source = CountingSource()
    config = Config(daemon=DaemonConfig(poll_interval=10.0, state_dir=str(tmp_path)))
    daemon = Daemon(config, [source], clock)
    with caplog.at_level(logging.WARNING, logger="gpuwatchd.daemon"):
        daemon.run(Steps(clock, source, daemon))  # type: ignore[arg-type]
    gaps = [b - a for a, b in zip(source.times, source.times[1:], strict=False)]
    assert gaps == [10.0] * 5
    assert any("wall clock stepped by -3600.0s" in r.getMessage() for r in caplog.records)


def test_healthz_stays_truthful_when_the_wall_clock_steps_back(tmp_path: Path) -> None:
    clock = FakeClock()
    config = Config(daemon=DaemonConfig(poll_interval=10.0, state_dir=str(tmp_path)))
    daemon = Daemon(config, [CountingSource()], clock)
    server = StatusServer(("127.0.0.1", 0), daemon.metrics, lambda: daemon.snapshot, 60, clock.now)
    try:
        daemon.step()
        clock.step_wall(-HOUR)
        clock.advance(120)
        # The loop is stuck: two minutes without a poll, whatever the wall says.
        alive, why = server.liveness()
        assert not alive and why == "stale: last poll finished 120s ago"
    finally:
        server.server_close()


@pytest.mark.parametrize("step", [10 * 60.0, -10 * 60.0])
def test_a_wall_step_does_not_shorten_or_lengthen_confirmation(step: float, tmp_path: Path) -> None:
    scenario = (
        "node: {gpus: 2, nvlinks: 4, hcas: 1}\n"
        "faults: [{kind: nvlink_down, gpu: 1, link: 2, at: 20s}]\n"
    )
    with simulated_daemon(scenario, tmp_path) as sim:
        assert sim.daemon.config.policy.confirm_for == 300
        sim.run_until(50)
        sim.clock.step_wall(step)
        snapshot = sim.run_until(20 + 250)
        assert snapshot.health["nvlink:1/2"] is Health.UNHEALTHY
        assert snapshot.quarantines == ()
        snapshot = sim.run_until(20 + 340)
        assert snapshot.health["nvlink:1/2"] is Health.QUARANTINED
