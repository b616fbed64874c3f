"""Fleet safety: before an automatic drain, ask the central Prometheus how much
of the fleet is already drained.

A fleet-wide cause (a bad driver rollout, a threshold too tight, a flaky
switch) quarantines many nodes at once; draining them all would take the
cluster down with it. So an automatic drain is enforced only while fewer than
`max_share` of the fleet's nodes are drained by gpuwatchd, and fewer than
`max_new_share` were drained within the new-drains window. Otherwise the
decision stands (exported, journaled, alerted) but the node stays in service.
When Prometheus cannot answer, `fail_open` decides. Manual quarantines are
always enforced: this check is never asked for them.

The counts come from `gpuwatchd_scheduler_drained`, which each daemon exports
as 1 while its drain is in place: a node deciding now is not yet counted, and
a quarantine that fleet safety held back does not count as a drain.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from gpuwatchd.settings import Seconds
from gpuwatchd.text import redacted

DRAINED_QUERY = "count(max by (instance) (gpuwatchd_scheduler_drained == 1))"
NEW_DRAINS_QUERY = (
    "count(max by (instance) (gpuwatchd_scheduler_drained == 1)"
    " unless max by (instance) (gpuwatchd_scheduler_drained offset 10m == 1))"
)
NODES_QUERY = 'count(up{job="gpuwatchd"})'


def _check_share(value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"a share must be more than 0 and at most 1, got {value}")


@dataclass(frozen=True)
class FleetSafetyConfig:
    # Ask Prometheus before every automatic drain; false enforces them all.
    enabled: bool = True
    # The central Prometheus, e.g. http://prometheus:9090; null cannot be
    # asked, so fail_open decides.
    prometheus_url: str | None = None
    timeout: Seconds = 5.0
    # No automatic drain while this share of the fleet is drained already.
    max_share: float = 0.1
    # No automatic drain while this share of the fleet was drained within the
    # window of new_drains_query (10 minutes by default).
    max_new_share: float = 0.05
    # PromQL giving the number of nodes drained by gpuwatchd now.
    drained_query: str = DRAINED_QUERY
    # PromQL giving the number of nodes drained within the window.
    new_drains_query: str = NEW_DRAINS_QUERY
    # PromQL giving the number of nodes in the fleet.
    nodes_query: str = NODES_QUERY
    # When Prometheus cannot answer: false holds automatic drains back.
    fail_open: bool = False

    def __post_init__(self) -> None:
        _check_share(self.max_share)
        _check_share(self.max_new_share)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


class QueryError(RuntimeError):
    """Prometheus cannot give fleet safety the count it asked for: unreachable,
    not configured, an error, or an answer that is not one number."""


class FleetSafety:
    def __init__(self, config: FleetSafetyConfig) -> None:
        self.config = config

    def check(self) -> Verdict:
        """May an automatic drain go ahead now?"""
        config = self.config
        if not config.enabled:
            return Verdict(True, "fleet safety is off")
        try:
            nodes = self._query(config.nodes_query)
            if nodes < 1:
                raise QueryError(f"{config.nodes_query} counts no nodes")
            drained = self._query(config.drained_query)
            new = self._query(config.new_drains_query)
        except QueryError as error:
            if config.fail_open:
                return Verdict(True, f"Prometheus cannot tell ({error}); failing open")
            return Verdict(False, f"Prometheus cannot tell ({error}); failing closed")
        fleet = f"{drained:g} of {nodes:g} nodes drained, {new:g} recently"
        if drained / nodes >= config.max_share:
            return Verdict(False, f"{fleet}: at or over the limit of {config.max_share:.0%}")
        if new / nodes >= config.max_new_share:
            return Verdict(
                False, f"{fleet}: at or over the limit of {config.max_new_share:.0%} recently"
            )
        return Verdict(True, fleet)

    def _query(self, expression: str) -> float:
        """One number from an instant query; an empty result is 0 (count() of nothing)."""
        if not self.config.prometheus_url:
            raise QueryError("no prometheus_url configured")
        url = (
            f"{self.config.prometheus_url.rstrip('/')}/api/v1/query?"
            f"{urllib.parse.urlencode({'query': expression})}"
        )
        try:
            with urllib.request.urlopen(url, timeout=self.config.timeout) as response:
                document = json.load(response)
        except (urllib.error.URLError, OSError, ValueError) as error:
            why = getattr(error, "reason", error)
            raise QueryError(f"{redacted(url)}: {why}") from error
        return _number(document, expression)


def _number(document: Any, expression: str) -> float:
    """The one finite, non-negative number of an answer: NaN or infinity
    (a division by zero in a recording rule, say) cannot answer "how many"."""
    number = _answer(document, expression)
    if not math.isfinite(number) or number < 0:
        raise QueryError(f"{expression} answers {number:g}, not a count")
    return number


def _answer(document: Any, expression: str) -> float:
    try:
        if document["status"] != "success":
            raise QueryError(f"{expression}: {document.get('error', document['status'])}")
        data = document["data"]
        if data["resultType"] == "scalar":
            return float(data["result"][1])
        samples = data["result"]
        if len(samples) > 1:
            raise QueryError(f"{expression} returns {len(samples)} series, not one number")
        return float(samples[0]["value"][1]) if samples else 0.0
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise QueryError(f"{expression}: unexpected answer {document!r:.200}") from error
