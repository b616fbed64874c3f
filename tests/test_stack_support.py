"""What the stack tests wait for, derived from the rules (tests/stack_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import stack_support
from stack_support import alert_latency, wait_until

RULES = """
groups:
  - name: recorded
    rules:
      - record: job:x:rate10m
        expr: rate(x[10m])
      - record: job:x:rate10m_max
        expr: max(job:x:rate10m)
  - name: alerts
    rules:
      - alert: Slow
        expr: job:x:rate10m_max > 1 and on() (y offset 5m) > 0
        for: 15m
      - alert: Quick
        expr: z > 0
"""


def test_an_alert_needs_its_for_its_reach_and_its_evaluations(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    # A 60th of: 5 minutes' offset, 10 minutes' window two recorded series
    # back, 15 minutes held; four evaluations of 1 s; Alertmanager's 2 s.
    assert alert_latency([rules], ["Slow"], 60.0, 1.0) == 5 + 10 + 15 + 4 + 2
    assert alert_latency([rules], ["Quick"], 60.0, 1.0) == 2 + 2
    assert alert_latency([rules], ["Quick", "Slow"], 60.0, 5.0) == 5 + 10 + 15 + 20 + 2


class Clock:
    """stack_support's time, injected: sleeping advances it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Stack:
    """A stack whose slowest daemon polls every 1 s at `pace` of its speed."""

    def __init__(self, clock: Clock, pace: float) -> None:
        self.started = clock.now
        self.clock, self.pace = clock, pace

    def query(self, expr: str) -> list[dict[str, object]]:
        assert "min(changes(gpuwatchd_last_poll_timestamp_seconds" in expr
        return [{"value": [self.clock.now, str(self.clock.now * self.pace)]}]


def test_the_wait_ends_when_done_or_after_its_polls_or_by_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(stack_support, "time", clock)
    # Done at once: no poll counted.
    assert wait_until(Stack(clock, 1.0), lambda: True, 10.0, 1.0) == 0.0
    # Never done, polling at half its pace: 15 s of polls take 30 s.
    assert wait_until(Stack(clock, 0.5), lambda: False, 10.0, 1.0) == 15.0
    assert clock.now == 30.0
    # Never polling: the clock ends it after four times what is needed.
    clock.now = 0.0
    assert wait_until(Stack(clock, 0.0), lambda: False, 10.0, 1.0) == 0.0
    assert clock.now == 40.0
    # Done once the alerts arrive, whatever is left of the wait.
    clock.now = 0.0
    assert wait_until(Stack(clock, 1.0), lambda: clock.now >= 5, 10.0, 1.0) == 4.0
