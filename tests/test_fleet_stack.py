"""The fleet stack end to end (scripts/fleet-stack): 200 simulated nodes in two
clusters, scraped by two Prometheus agents sharded by hashmod, remote-written
to VictoriaMetrics, the recording and fleet rules evaluated by vmalert, and
Alertmanager notifying a receiver of the test's own.

Every fleet alert must fire on the GPUs (or the cluster) whose faults call for
it, and on no other: a rule's spread taken over one shard instead of the whole
cluster, a rule that MetricsQL reads differently from PromQL, or a model mixed
into another's spread would show as a missing or an extra alert. The rules'
durations are divided by TIME_SCALE so that the module takes minutes: 3 to 8 on
a shared 2-core machine.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from actions_support import free_port_range
from stack_support import WALL_SLACK, alert_latency, wait_until

from gpuwatchd.sim.gpu import THERMAL_RAMP_S

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import fleet_stack  # noqa: E402  (a script beside demo_stack, found through the path above)
from demo_stack import duration_seconds  # noqa: E402

NODES = 200
# The throttle ratio is a rate over a scaled 10-minute window, which must
# hold a few polls: on a loaded 2-core machine a round of 200 polls takes
# several times its 5 s interval (measured up to 30 s for whole nodes), and a
# window with no poll in it reads 0 and restarts the alert's `for:`. Scaled by
# 10 the window is a minute; by 20 (30 s) a run with both cores kept busy by
# two `yes` and another test worker missed the throttle alerts (rounds of
# 7-14 s, each window holding two polls at most).
TIME_SCALE = 10.0
INTERVAL_S = 5.0
# After the last expected alert, the stack runs one scaled `for:` longer: an
# alert that should not fire has had as long to as the expected ones had.
HOLD_S = 15 * 60 / TIME_SCALE
PORTS = 4 + fleet_stack.SHARDS + 1

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(
            shutil.which(name) is None
            for name in ("prometheus", "prometheus-alertmanager", "victoria-metrics", "vmalert")
        ),
        reason="needs the prometheus, prometheus-alertmanager and victoria-metrics packages",
    ),
]

# (alert, cluster, instance, gpu, reason) that fleet_stack.fleet(200) must
# raise; "" where the alert has no such label.
EXPECTED_ALERTS = {
    # clock_drift to 70 %, against the H100s of its cluster
    ("GpuwatchdGpuClockStraggler", "a", "a-001", "2", ""),
    ("GpuwatchdGpuClockStraggler", "b", "b-001", "6", ""),
    # HW slowdown halves an overheating GPU's clock: it is slow too
    ("GpuwatchdGpuClockStraggler", "a", "a-002", "5", ""),
    # the A100s of b have a spread of their own, at their own clock
    ("GpuwatchdGpuClockStraggler", "b", "b-080", "1", ""),
    ("GpuwatchdGpuClockStraggler", "b", "b-081", "3", ""),
    ("GpuwatchdGpuThrottleStraggler", "a", "a-002", "5", "thermal"),
    ("GpuwatchdGpuThrottleStraggler", "b", "b-080", "1", "thermal"),
    # 56 of a's 800 GPUs are lost (7 %); 4 of b's 800 (0.5 %)
    ("GpuwatchdFleetQuarantineHigh", "a", "", "", ""),
    # one GPU with ECC off where the rest of cluster a has it on
    ("GpuwatchdNodeConfigUnlikeCluster", "a", "a-003", "", ""),
}
# On simulated nodes no canary runs here: a CPU burst standing in for each of
# 1,600 GPUs would cost more than the whole stack, and its TFLOP/s would
# measure this machine's contention, not a GPU (test_stack_integration says
# the same of its five nodes). promtool's tests cover the rule
# (config/prometheus/tests/fleet.yml); here vmalert must evaluate it without
# an error, and it must not fire.
NOT_RAISED_HERE = {"GpuwatchdCanaryTflopsStraggler"}


def _alerts_need() -> float:
    """At most the seconds the last expected alert needs: its fault, a GPU
    heating up, a scrape and its remote write, and its rules' windows and
    waits evaluated by vmalert every interval."""
    rules = [REPO / "config/prometheus/rules" / name for name in fleet_stack.FLEET_RULE_FILES]
    alerts = {alert for alert, *_ in EXPECTED_ALERTS}
    onset = duration_seconds(fleet_stack.FAULT_AT) + THERMAL_RAMP_S + INTERVAL_S
    return onset + alert_latency(rules, alerts, TIME_SCALE, INTERVAL_S)


ALERTS_NEED_S = _alerts_need()


def _key(labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(
        labels.get(name, "") for name in ("alertname", "cluster", "instance", "gpu", "reason")
    )


def _fired(stack: Any) -> set[tuple[str, ...]]:
    return {
        _key(alert["labels"])
        for notification in stack.receiver.received()
        if notification.path == "/webhook"
        for alert in notification.document["alerts"]
        if alert["status"] == "firing"
    }


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("fleet")
    members = fleet_stack.fleet(NODES)
    running = fleet_stack.FleetStack(
        workdir,
        free_port_range(PORTS),
        members,
        time_scale=TIME_SCALE,
        interval=INTERVAL_S,
        duration=WALL_SLACK * ALERTS_NEED_S + HOLD_S + 60,
    )
    with running:
        running.polled_s = wait_until(
            running, lambda: EXPECTED_ALERTS.issubset(_fired(running)), ALERTS_NEED_S, INTERVAL_S
        )
        time.sleep(HOLD_S)
        yield running


def test_the_fleet_has_two_clusters_of_two_models_and_200_nodes() -> None:
    members = fleet_stack.fleet(NODES)
    assert len(members) == NODES
    assert {(m.cluster, m.model) for m in members} == {
        ("a", fleet_stack.H100),
        ("b", fleet_stack.H100),
        ("b", fleet_stack.A100),
    }


def test_every_fleet_alert_is_expected_somewhere_or_said_why_not() -> None:
    document = yaml.safe_load((REPO / "config/prometheus/rules/gpuwatchd-fleet.yml").read_text())
    alerts = {
        rule["alert"] for group in document["groups"] for rule in group["rules"] if "alert" in rule
    }
    assert alerts == {key[0] for key in EXPECTED_ALERTS} | NOT_RAISED_HERE


def test_each_scraper_takes_its_share_of_the_nodes_and_together_all(stack: Any) -> None:
    shards = []
    for url in stack.shard_urls:
        targets = _get(f"{url}/api/v1/targets")["data"]["activeTargets"]
        shards.append({target["labels"]["instance"] for target in targets})
    assert all(len(shard) >= NODES // 4 for shard in shards), [len(s) for s in shards]
    assert set.intersection(*shards) == set()
    assert set.union(*shards) == {member.name for member in stack.members}


def test_every_node_reaches_victoria_metrics(stack: Any) -> None:
    query = 'max_over_time(up{job="gpuwatchd"}[30s]) == 1'
    up = {result["metric"]["instance"] for result in stack.query(query)}
    assert up == {member.name for member in stack.members}


def test_vmalert_evaluates_every_rule_without_an_error(stack: Any) -> None:
    groups = _get(f"{stack.vmalert_url}/api/v1/rules")["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == sum(
        len(group["rules"])
        for name in fleet_stack.FLEET_RULE_FILES
        for group in yaml.safe_load((REPO / "config/prometheus/rules" / name).read_text())["groups"]
    )
    assert stack.failing_rules() == {}


def test_every_fleet_alert_fires_where_the_faults_are_and_nowhere_else(stack: Any) -> None:
    fired = _fired(stack)
    missing = sorted(EXPECTED_ALERTS - fired)
    rounds = (stack.workdir / "logs" / "nodes.log").read_text().split("round ")[-10:]
    assert not missing, (
        f"not received after {stack.polled_s:g}s of polls from the slowest node "
        f"(they need {ALERTS_NEED_S:g}s): {missing}; "
        f"the nodes' last rounds of polls took {' '.join(r.split()[-1] for r in rounds)}"
    )
    assert sorted(fired - EXPECTED_ALERTS) == []
