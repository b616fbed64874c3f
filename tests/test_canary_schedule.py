"""The burst schedule: pure, on the time the caller passes in."""

from __future__ import annotations

import pytest

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.canary.schedule import (
    HOST,
    ScheduleState,
    due,
    finished,
    rerun_started,
    schedule_key,
    started,
)
from gpuwatchd.settings import SettingsError, load

T0 = 1_000_000.0
IDLE = {"gpu:0": True, "gpu:1": True}


def run(
    config: CanaryConfig,
    state: ScheduleState,
    key: str,
    now: float,
    idle: bool,
    seconds: float = 1.0,
) -> ScheduleState:
    return finished(config, started(state, key, now, idle), key, now + seconds, seconds)


def test_every_gpu_is_due_at_once_and_again_one_interval_later() -> None:
    config = CanaryConfig()
    state = ScheduleState()
    assert due(config, state, T0, IDLE, ()) == ("gpu:0", "gpu:1")
    state = run(config, state, "gpu:0", T0, idle=True)
    assert due(config, state, T0 + 599, IDLE, ()) == ("gpu:1",)
    assert due(config, state, T0 + 600, IDLE, ()) == ("gpu:0", "gpu:1")


def test_never_two_bursts_on_one_gpu_at_once() -> None:
    config = CanaryConfig()
    state = started(ScheduleState(), "gpu:0", T0, idle=True)
    assert due(config, state, T0 + 3600, IDLE, ()) == ("gpu:1",)
    with pytest.raises(ValueError):
        started(state, "gpu:0", T0 + 1, idle=True)
    with pytest.raises(ValueError):
        rerun_started(state, "gpu:0", T0 + 1, idle=True)


def test_a_rerun_holds_the_gpu_without_moving_its_next_burst() -> None:
    config = CanaryConfig()
    state = run(config, ScheduleState(), "gpu:0", T0, idle=True)
    state = rerun_started(state, "gpu:0", T0 + 100, idle=True)
    assert due(config, state, T0 + 600, IDLE, ()) == ("gpu:1",)
    state = finished(config, state, "gpu:0", T0 + 101, 0.01)
    assert due(config, state, T0 + 600, IDLE, ()) == ("gpu:0", "gpu:1")


def test_when_idle_a_busy_gpu_waits() -> None:
    config = CanaryConfig(when="idle")
    assert due(config, ScheduleState(), T0, {"gpu:0": False, "gpu:1": True}, ()) == ("gpu:1",)


def test_when_always_a_busy_gpu_runs_within_the_duty_cycle() -> None:
    # 0.5 % of an hour is 18 s: eighteen one-second bursts, then no more until
    # the oldest leave the window.
    config = CanaryConfig(
        when="always", interval=60.0, duty_cycle=0.005, duty_window=3600.0, aligned_window=0.0
    )
    busy = {"gpu:0": False}
    state = ScheduleState()
    now = T0
    for _ in range(18):
        assert due(config, state, now, busy, ()) == ("gpu:0",)
        state = run(config, state, "gpu:0", now, idle=False)
        now += 60
    assert due(config, state, now, busy, ()) == ()
    assert due(config, state, now, {"gpu:0": True}, ()) == ("gpu:0",)  # idle time is free
    assert due(config, state, T0 + 3600 + 2, busy, ()) == ("gpu:0",)


def test_idle_bursts_are_not_charged_to_the_duty_cycle() -> None:
    config = CanaryConfig(when="always", interval=60.0, duty_cycle=0.005, aligned_window=0.0)
    state = ScheduleState()
    for step in range(30):
        state = run(config, state, "gpu:0", T0 + 60 * step, idle=True)
    assert due(config, state, T0 + 1800, {"gpu:0": False}, ()) == ("gpu:0",)


def test_busy_bursts_start_in_the_first_seconds_of_a_wall_clock_slot() -> None:
    config = CanaryConfig(interval=600.0, aligned_window=30.0)
    busy = {"gpu:0": False}
    slot = 1_000_200.0  # a multiple of 600
    assert due(config, ScheduleState(), slot - 100, busy, ()) == ()
    assert due(config, ScheduleState(), slot - 100, {"gpu:0": True}, ()) == ("gpu:0",)
    assert due(config, ScheduleState(), slot + 29, busy, ()) == ("gpu:0",)
    assert due(config, ScheduleState(), slot + 30, busy, ()) == ()
    state = run(config, ScheduleState(), "gpu:0", slot + 2, idle=False)
    assert due(config, state, slot + 10, busy, ()) == ()  # once a slot
    # The next slot, even a little earlier in it than the last burst.
    assert due(config, state, slot + 600, busy, ()) == ("gpu:0",)


def test_nodes_that_started_apart_burst_in_the_same_slot() -> None:
    # Two daemons started at different times, i.e. two nodes of one job:
    # their busy bursts fall into the same 30 s of every interval.
    config = CanaryConfig(interval=600.0, aligned_window=30.0)
    busy = {"gpu:0": False}
    starts = []
    for offset in (0.0, 17.0):
        state = ScheduleState()
        now = 1_000_000.0 + offset
        while not due(config, state, now, busy, ()):
            now += 5.0
        starts.append(now)
    assert all(start % 600 < 30 for start in starts)
    assert abs(starts[0] - starts[1]) < 30


def test_a_watched_gpu_runs_at_the_watch_interval() -> None:
    config = CanaryConfig(interval=600.0, watch_interval=60.0)
    state = run(config, ScheduleState(), "gpu:0", T0, idle=True)
    assert due(config, state, T0 + 60, {"gpu:0": True}, ()) == ()
    assert due(config, state, T0 + 60, {"gpu:0": True}, {"gpu:0"}) == ("gpu:0",)


def test_the_host_cores_run_at_their_own_interval() -> None:
    config = CanaryConfig(interval=600.0, host_interval=3600.0)
    state = run(config, ScheduleState(), HOST, T0, idle=True)
    assert due(config, state, T0 + 600, {HOST: True}, ()) == ()
    assert due(config, state, T0 + 3600, {HOST: True}, ()) == (HOST,)
    assert schedule_key("cpu:7") == HOST and schedule_key("gpu:7") == "gpu:7"


def test_the_canary_settings_load_from_yaml_with_units() -> None:
    text = (
        "interval: 5m\nwhen: always\nduty_cycle: 0.01\nwatch_for: 1d\n"
        "reference_cache: /var/cache/x\n"
    )
    config = load(CanaryConfig, text, "gpuwatchd.yaml")
    assert (config.interval, config.when, config.watch_for) == (300.0, "always", 86400.0)
    assert config.reference_cache == "/var/cache/x"
    with pytest.raises(SettingsError, match="when"):
        load(CanaryConfig, "when: sometimes\n", "gpuwatchd.yaml")
    with pytest.raises(SettingsError, match="duty_cycle"):
        load(CanaryConfig, "duty_cycle: 2\n", "gpuwatchd.yaml")
