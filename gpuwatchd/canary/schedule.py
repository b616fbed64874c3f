"""When each GPU (and the host's cores) gets its next burst: pure functions of
the settings, the schedule's state and the time the caller passes in.

A target is `gpu:<index>`, or `cpu` for the host's cores. A target is due
once its interval has passed since its last burst started (the watch
interval while it is watched), never while a burst of its own is running,
and only when it may take the device's time: always when idle; when busy,
only with `when: always` and while the bursts charged to it over the duty
window, plus this one, fit in the duty cycle. Idle time is not charged.

A busy GPU's burst is aligned to wall-clock slots of its interval: due once
per slot, in the slot's first `aligned_window` seconds. Every node's clock
(NTP) puts the slots in the same seconds, so a synchronous job across many
nodes is stalled by all their bursts at once, once per slot.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpuwatchd.canary.config import CanaryConfig

HOST = "cpu"


def schedule_key(target: str) -> str:
    """The schedule entry a target's work counts against: a core's re-run is
    the host's burst (one worker pins one core at a time)."""
    return HOST if target.startswith("cpu:") else target


@dataclass(frozen=True)
class TargetSchedule:
    last_start: float | None = None
    running: bool = False
    # Whether the running burst started on a busy device (its time is charged).
    charged: bool = False
    # (start, device seconds) of the charged bursts within the duty window.
    charges: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class ScheduleState:
    targets: Mapping[str, TargetSchedule] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, key: str) -> TargetSchedule:
        return self.targets.get(key, TargetSchedule())

    def running(self, key: str) -> bool:
        return self.of(key).running

    def _with(self, key: str, entry: TargetSchedule) -> ScheduleState:
        return ScheduleState(MappingProxyType({**self.targets, key: entry}))


def charged_seconds(config: CanaryConfig, entry: TargetSchedule, now: float) -> float:
    return sum(seconds for start, seconds in entry.charges if start > now - config.duty_window)


def may_use(config: CanaryConfig, entry: TargetSchedule, now: float, idle: bool) -> bool:
    if idle:
        return True
    if config.when == "idle":
        return False
    budget = config.duty_cycle * config.duty_window
    return charged_seconds(config, entry, now) + config.burst <= budget


def interval_of(config: CanaryConfig, key: str, watched: bool) -> float:
    if key == HOST:
        return config.host_interval
    return config.watch_interval if watched else config.interval


def due(
    config: CanaryConfig,
    state: ScheduleState,
    now: float,
    idle: Mapping[str, bool],
    watching: Collection[str],
) -> tuple[str, ...]:
    """The targets to start a burst on now. `idle` names every target that
    exists this poll (True when idle); `watching` the watched ones."""
    ready = []
    for key in sorted(idle):
        entry = state.of(key)
        if entry.running:
            continue
        interval = interval_of(config, key, key in watching)
        if _aligned(config, key, idle[key]):
            slot = now - now % interval
            late = now - slot >= min(config.aligned_window, interval / 2)
            if late or (entry.last_start is not None and entry.last_start >= slot):
                continue
        elif entry.last_start is not None and now - entry.last_start < interval:
            continue
        if may_use(config, entry, now, idle[key]):
            ready.append(key)
    return tuple(ready)


def _aligned(config: CanaryConfig, key: str, idle: bool) -> bool:
    return not idle and key != HOST and config.aligned_window > 0


def started(state: ScheduleState, key: str, now: float, idle: bool) -> ScheduleState:
    entry = state.of(key)
    if entry.running:
        raise ValueError(f"{key} already has a burst running")
    return state._with(key, replace(entry, last_start=now, running=True, charged=not idle))


def rerun_started(state: ScheduleState, key: str, now: float, idle: bool) -> ScheduleState:
    """A confirmation re-run holds the target like a burst, without moving
    its next scheduled burst."""
    entry = state.of(key)
    if entry.running:
        raise ValueError(f"{key} already has a burst running")
    return state._with(key, replace(entry, running=True, charged=not idle))


def finished(
    config: CanaryConfig, state: ScheduleState, key: str, now: float, device_seconds: float
) -> ScheduleState:
    entry = state.of(key)
    charges = tuple(c for c in entry.charges if c[0] > now - config.duty_window)
    if entry.charged:
        charges += ((now, device_seconds),)
    return state._with(key, replace(entry, running=False, charged=False, charges=charges))
