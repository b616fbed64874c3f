"""Waiting on a monitoring stack by what it has done, not by the clock.

On a quiet machine the stack's alerts arrive within a minute or two; on a busy
2-core one the daemons poll late and scrapes miss their timeout, and a fixed
deadline tuned on the quiet machine runs out before the alerts can fire
(review first-day-2, M3). Here the time the alerts need is derived from the
rules they come from (their `for:`, the windows and offsets they and the
recorded series they read reach back, the evaluations and Alertmanager's
waits), and the wait is counted in the polls the stack has actually received
from its slowest daemon: a machine that runs at a third of its speed waits
three times as long. A bound in wall time, a multiple of what is needed, ends
the wait on a stack that makes no progress at all.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from demo_stack import duration_seconds, lookback, scale_rules  # noqa: E402  (a script, found through the path above)

# The alerts get half as many polls again as they need at most...
POLL_SLACK = 1.5
# ...and stop waiting after this many times that, polls or not.
WALL_SLACK = 4.0
# Recorded series a rule reads: the names of recording rules.
_RECORDED = re.compile(r"\b[a-z_]+:[a-z0-9_:]+\b")


def alert_latency(
    rule_files: Iterable[Path], alerts: Iterable[str], scale: float, evaluation_s: float
) -> float:
    """At most the seconds from a fault to the notification of the slowest of
    `alerts` under rules scaled by `scale`: its `for:`, the longest its
    expression and the recorded series it reads (and they read) reach back (a
    rate over a window crosses its threshold within the window; an increase
    may cross it at once), and on top an evaluation to go pending, one to
    fire, one for each recorded series on the way, and a second each for
    Alertmanager's group_wait and resend delay."""
    rules: dict[str, dict[str, Any]] = {}
    for path in rule_files:
        document = scale_rules(yaml.safe_load(path.read_text()), scale)
        for group in document["groups"]:
            for rule in group["rules"]:
                rules.setdefault(rule.get("alert") or rule["record"], rule)

    def reach(name: str, seen: frozenset[str]) -> tuple[float, int]:
        rule = rules[name]
        behind = [
            reach(read, seen | {read})
            for read in set(_RECORDED.findall(rule["expr"])) - seen
            if read in rules and "record" in rules[read]
        ]
        deepest = max(behind, default=(0.0, 0))
        return lookback(rule["expr"]) + deepest[0], deepest[1] + (1 if "record" in rule else 0)

    def latency(alert: str) -> float:
        seconds, recorded = reach(alert, frozenset({alert}))
        held = duration_seconds(rules[alert].get("for", "0s"))
        return seconds + held + (2 + recorded) * evaluation_s + 2.0

    return max(latency(alert) for alert in alerts)


def polls_seen(stack: Any, poll_interval_s: float) -> float:
    """Seconds of polling the stack has received from its slowest daemon since
    it started: the changes of its last-poll timestamp, each an interval."""
    elapsed = max(1, math.ceil(time.time() - stack.started))
    changes = stack.query(
        f'min(changes(gpuwatchd_last_poll_timestamp_seconds{{job="gpuwatchd"}}[{elapsed}s]))'
    )
    return float(changes[0]["value"][1]) * poll_interval_s if changes else 0.0


def wait_until(
    stack: Any, done: Callable[[], bool], needed_s: float, poll_interval_s: float
) -> float:
    """Wait until `done()`, or until the stack has received POLL_SLACK times
    `needed_s` of polls from its slowest daemon, or WALL_SLACK times `needed_s`
    of wall time has passed. The seconds of polling it waited."""
    wall_deadline = time.monotonic() + WALL_SLACK * needed_s
    seen = 0.0
    while not done() and time.monotonic() < wall_deadline:
        seen = polls_seen(stack, poll_interval_s)
        if seen >= POLL_SLACK * needed_s:
            break
        time.sleep(1.0)
    return seen
