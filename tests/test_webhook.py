"""Webhook payloads (alertmanager, slack, pagerduty, json), signatures, which
webhook is told what, backoff, and the events policy's results make."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from pathlib import Path

import pytest

from gpuwatchd.actions.events import (
    CRITICAL,
    NODE_HEALTH,
    QUARANTINED,
    UNHEALTHY,
    WARNING,
    Event,
    decision_event,
    poll_events,
)
from gpuwatchd.actions.webhook import (
    FIRING,
    RESOLVED,
    ZERO_TIME,
    Context,
    WebhookConfig,
    backoff,
    fingerprint,
    render,
    route,
    sign,
)
from gpuwatchd.model import Action, Decision, Finding, Health, Severity
from gpuwatchd.policy import HealthChange, PolicyResult, PolicyState
from gpuwatchd.store import OpenAlert

T0 = 1_767_225_600.0
ECC = Finding(
    "gpu:1",
    "memory",
    "ecc_uncorrectable",
    Severity.CRITICAL,
    "uncorrectable ECC error (DBE) on GPU 1",
    action=Action.RESET_GPU,
    evidence={"uncorrected_volatile": 1},
    definitive=True,
)
QUARANTINE = Decision("quarantine", "gpu:1", ECC.message, "auto", T0, code="ecc_uncorrectable")
RELEASE = Decision("release", "gpu:1", "fan replaced", "manual", T0 + 600, code="ecc_uncorrectable")
CONTEXT = Context("ops", "k1", "http://node-7:9477")


def test_a_quarantine_and_its_release_are_one_alert_firing_then_resolved() -> None:
    firing = decision_event(QUARANTINE, "node-7", finding=ECC)
    resolved = decision_event(RELEASE, "node-7", operator="alice")
    assert firing.identity == resolved.identity == "quarantine:gpu:1"
    assert (firing.severity, resolved.severity) == (CRITICAL, None)
    assert firing.action.startswith("drain the node and reset the GPU")
    assert firing.evidence == {"uncorrected_volatile": 1}
    assert "alice" in resolved.summary


def test_alertmanager_payload_is_version_4_and_its_resolve_matches_its_firing() -> None:
    event = decision_event(QUARANTINE, "node-7", finding=ECC)
    opened = route(event, WARNING, None)
    assert opened is not None and opened.status == FIRING
    firing = json.loads(render("alertmanager", event, opened, CONTEXT))
    assert firing["version"] == "4" and firing["status"] == "firing"
    assert firing["receiver"] == "ops" and firing["truncatedAlerts"] == 0
    assert firing["externalURL"] == "http://node-7:9477"
    assert set(firing) >= {"groupKey", "groupLabels", "commonLabels", "commonAnnotations"}
    (alert,) = firing["alerts"]
    assert alert["labels"] == {
        "alertname": "GpuwatchdQuarantined",
        "node": "node-7",
        "subject": "gpu:1",
        "severity": "critical",
    }
    assert alert["annotations"]["summary"].startswith("gpu:1 on node-7 quarantined (auto)")
    assert alert["annotations"]["evidence"] == "uncorrected_volatile=1"
    # An annotation, not a label (above): the labels are the alert's identity.
    assert alert["annotations"]["fault_code"] == "GW-1101"
    assert alert["startsAt"] == "2026-01-01T00:00:00.000Z" and alert["endsAt"] == ZERO_TIME
    assert alert["generatorURL"] == "http://node-7:9477/api/v1/status"

    release = decision_event(RELEASE, "node-7", operator="alice")
    closed = route(release, WARNING, opened.opened)
    assert closed is not None and closed.status == RESOLVED
    resolved = json.loads(render("alertmanager", release, closed, CONTEXT))
    (end,) = resolved["alerts"]
    assert resolved["status"] == end["status"] == "resolved"
    assert end["fingerprint"] == alert["fingerprint"] and len(end["fingerprint"]) == 16
    assert end["labels"]["severity"] == "critical"  # as it fired
    assert end["startsAt"] == alert["startsAt"] and end["endsAt"] == "2026-01-01T00:10:00.000Z"


def test_fingerprint_is_prometheus_fnv1a_over_sorted_labels() -> None:
    # FNV-1a 64 of b"a\xffb\xff" worked out by hand from the offset basis and prime.
    value = 14695981039346656037
    for byte in b"a\xffb\xff":
        value = ((value ^ byte) * 1099511628211) % 2**64
    assert fingerprint({"a": "b"}) == f"{value:016x}"
    assert fingerprint({"x": "1", "y": "2"}) == fingerprint({"y": "2", "x": "1"})


def test_slack_text_says_subject_reason_evidence_and_suggested_action() -> None:
    event = decision_event(QUARANTINE, "node-7", finding=ECC)
    chosen = route(event, WARNING, None)
    assert chosen is not None
    text = json.loads(render("slack", event, chosen, CONTEXT))["text"]
    assert text.startswith(":rotating_light: *[CRITICAL] gpu:1 on node-7 quarantined (auto)")
    assert "*Fault code:* GW-1101 (ecc_uncorrectable)" in text
    assert "*Evidence:* uncorrected_volatile=1" in text
    assert "*Suggested action:* drain the node and reset the GPU" in text
    assert "<http://node-7:9477/api/v1/status|node-7 status>" in text


def test_pagerduty_release_resolves_the_incident_its_quarantine_opened() -> None:
    context = Context("pd", "k1", "http://node-7:9477", routing_key="R0UT1NG")
    event = decision_event(QUARANTINE, "node-7", finding=ECC)
    opened = route(event, WARNING, None)
    assert opened is not None
    trigger = json.loads(render("pagerduty", event, opened, context))
    assert trigger["event_action"] == "trigger" and trigger["routing_key"] == "R0UT1NG"
    assert trigger["payload"]["severity"] == "critical"
    assert trigger["payload"]["source"] == "node-7" and trigger["payload"]["component"] == "gpu:1"
    assert trigger["payload"]["custom_details"]["evidence"] == {"uncorrected_volatile": 1}
    assert trigger["payload"]["custom_details"]["fault_code"] == "GW-1101"
    release = decision_event(RELEASE, "node-7", operator="alice")
    closed = route(release, WARNING, opened.opened)
    assert closed is not None
    resolve = json.loads(render("pagerduty", release, closed, context))
    assert resolve == {
        "routing_key": "R0UT1NG",
        "event_action": "resolve",
        "dedup_key": trigger["dedup_key"],
    }
    assert trigger["dedup_key"] == "gpuwatchd/node-7/quarantine/gpu:1"


def test_json_payload_follows_the_documented_schema() -> None:
    event = decision_event(QUARANTINE, "node-7", finding=ECC)
    chosen = route(event, WARNING, None)
    assert chosen is not None
    document = json.loads(render("json", event, chosen, CONTEXT))
    documented = (Path(__file__).parent.parent / "docs" / "webhooks.md").read_text()
    for key in document:
        assert f"`{key}`" in documented, f"{key} is not documented in docs/webhooks.md"
    assert document["schema"] == "gpuwatchd.event.v1" and document["id"] == "k1"
    assert document["status"] == "firing" and document["ends_at"] is None
    assert document["time"] == "2026-01-01T00:00:00.000Z"
    assert (document["code"], document["fault_code"]) == ("ecc_uncorrectable", "GW-1101")


def test_an_event_read_back_from_the_outbox_derives_its_fault_code_again() -> None:
    event = decision_event(QUARANTINE, "node-7", finding=ECC)
    stored = event.to_json()
    assert stored["fault_code"] == "GW-1101"
    assert Event.from_json(stored) == event
    # One queued by a version before the catalog has no fault_code key: it gets one.
    older = {key: value for key, value in stored.items() if key != "fault_code"}
    assert Event.from_json(older).to_json() == stored


def test_signature_is_hmac_sha256_over_timestamp_and_body() -> None:
    body = b'{"a": 1}'
    expected = hmac.new(b"s3cret", b"1767225600." + body, hashlib.sha256).hexdigest()
    assert sign(b"s3cret", 1767225600, body) == f"sha256={expected}"


def test_a_critical_only_webhook_gets_neither_warnings_nor_their_resolution() -> None:
    degraded = Event(NODE_HEALTH, "node", WARNING, "health_changed", T0, "n", "degraded")
    unhealthy = Event(NODE_HEALTH, "node", CRITICAL, "health_changed", T0 + 1, "n", "unhealthy")
    healthy = Event(NODE_HEALTH, "node", None, "health_changed", T0 + 2, "n", "healthy")
    assert route(degraded, CRITICAL, None) is None
    opened = route(unhealthy, CRITICAL, None)
    assert opened is not None and opened.opened == OpenAlert(T0 + 1, CRITICAL)
    # Back to degraded is below the webhook's minimum: the alert it had ends.
    closed = route(degraded, CRITICAL, opened.opened)
    assert closed is not None and closed.status == RESOLVED and closed.severity == CRITICAL
    assert route(healthy, CRITICAL, None) is None


def test_a_rising_severity_keeps_the_alert_and_its_start() -> None:
    degraded = Event(NODE_HEALTH, "node", WARNING, "health_changed", T0, "n", "degraded")
    worse = Event(NODE_HEALTH, "node", CRITICAL, "health_changed", T0 + 60, "n", "unhealthy")
    first = route(degraded, WARNING, None)
    assert first is not None
    second = route(worse, WARNING, first.opened)
    assert second is not None and second.starts_at == T0 and second.severity == CRITICAL


def test_poll_events_skip_dry_runs_and_leave_unhealthy_open_into_quarantine() -> None:
    result = PolicyResult(
        state=PolicyState(),
        health={},
        health_since={},
        node_health=Health.QUARANTINED,
        findings=(ECC,),
        decisions=(QUARANTINE, Decision("quarantine", "gpu:2", "x", "auto", T0, dry_run=True)),
        changes=(
            HealthChange("gpu:1", Health.HEALTHY, Health.QUARANTINED, T0),
            HealthChange("gpu:3", Health.DEGRADED, Health.UNHEALTHY, T0),
            HealthChange("gpu:4", Health.UNHEALTHY, Health.DEGRADED, T0),
            HealthChange("node", Health.HEALTHY, Health.QUARANTINED, T0),
        ),
    )
    events = poll_events(result, "node-7")
    assert [(e.identity, e.severity) for e in events] == [
        ("quarantine:gpu:1", CRITICAL),
        ("unhealthy:gpu:3", WARNING),
        ("unhealthy:gpu:4", None),
        ("node_health:node", CRITICAL),
    ]
    assert {e.alert for e in events} == {QUARANTINED, UNHEALTHY, NODE_HEALTH}


def test_backoff_doubles_with_jitter_up_to_retry_max() -> None:
    config = WebhookConfig("x", "http://127.0.0.1:1/", retry_initial=1.0, retry_max=60.0)
    rng = random.Random(7)
    delays = [backoff(attempts, config, rng) for attempts in range(10)]
    for attempts, delay in enumerate(delays):
        ceiling = min(60.0, 2.0**attempts)
        assert ceiling / 2 <= delay <= ceiling
    assert delays[-1] >= 30.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "a b", "url": "http://x/"}, "webhook name"),
        ({"name": "a", "url": "ftp://x/"}, "http:// or https://"),
        ({"name": "a", "url": "http://x/", "format": "pagerduty"}, "routing_key_file"),
        ({"name": "a", "url": "http://x/", "retry_max": 0.5}, "retry_max"),
    ],
)
def test_a_webhook_config_that_cannot_work_is_refused(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        WebhookConfig(**fields)  # type: ignore[arg-type]
