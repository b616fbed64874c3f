"""Webhook delivery from the outbox to a receiver of the test's own: down,
slow, failing, then up; restarts in between; dead letters; and the daemon
writing events with its decisions and showing deliveries on /metrics."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from actions_support import Receiver, free_port, receiver
from click.testing import CliRunner
from daemon_support import simulated_daemon
from prometheus_client import generate_latest

from gpuwatchd.actions.dispatch import manual_events
from gpuwatchd.actions.webhook import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookConfig,
    WebhookSender,
)
from gpuwatchd.cli import main
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import ActionsConfig, Config
from gpuwatchd.status import render_table, to_json
from gpuwatchd.store import Store

SECRET = b"s3cret-for-tests"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "webhook-secret"
    path.write_bytes(SECRET + b"\n")
    return path


def _config(url: str, secret_file: Path | None = None, **fields: object) -> WebhookConfig:
    settings: dict[str, object] = {
        "name": "ops",
        "url": url,
        "format": "json",
        "timeout": 0.5,
        "retry_initial": 1.0,
        "retry_max": 60.0,
        "secret_file": str(secret_file) if secret_file else None,
        **fields,
    }
    return WebhookConfig(**settings)  # type: ignore[arg-type]


def _sender(config: WebhookConfig, store: Store, clock: FakeClock) -> WebhookSender:
    return WebhookSender(config, store, clock, random.Random(1), "http://node-7:9477")


def _quarantine_and_release(store: Store, clock: FakeClock, gpus: range) -> list[str]:
    """Manual quarantines and releases, each with its event for webhook `ops`;
    the subjects in the order of their events."""
    events = manual_events("node-7", "alice", ["ops"])
    order = []
    for gpu in gpus:
        store.quarantine(f"gpu:{gpu}", f"suspect {gpu}", "alice", clock.now(), events)
        order.append(f"quarantine gpu:{gpu}")
        clock.advance(1)
    for gpu in gpus:
        store.release(f"gpu:{gpu}", "alice", clock.now(), "checked", events)
        order.append(f"release gpu:{gpu}")
        clock.advance(1)
    return order


def _drain(sender: WebhookSender, clock: FakeClock, rounds: int = 50) -> None:
    """Run the sender, jumping the clock to each retry, until its queue is empty."""
    for _ in range(rounds):
        due = sender.run_once(clock.now())
        if due is None:
            return
        clock.advance(max(0.0, due - clock.now()))
    raise AssertionError("the outbox did not drain")


def _dead_letters(state_dir: Path) -> list[tuple[str, str]]:
    """(error, event kind) of every dead letter, read as an operator would."""
    with closing(sqlite3.connect(state_dir / "state.db")) as db:
        rows = db.execute(
            "SELECT o.last_error, e.data FROM outbox o JOIN events e ON e.id = o.event_id"
            " WHERE o.state = 'dead_letter'"
        ).fetchall()
    return [(error, json.loads(data)["kind"]) for error, data in rows]


def _kinds(received: Receiver) -> list[str]:
    return [f"{p['kind']} {p['subject']}" for p in received.payloads()]


def _verify(request_headers: dict[str, str], body: bytes) -> bool:
    timestamp = request_headers[TIMESTAMP_HEADER]
    digest = hmac.new(SECRET, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(request_headers[SIGNATURE_HEADER], f"sha256={digest}")


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "state"


def test_a_receiver_down_slow_failing_then_up_gets_every_event_once_in_order_signed(
    state_dir: Path, clock: FakeClock, secret_file: Path
) -> None:
    port = free_port()
    config = _config(f"http://127.0.0.1:{port}/hook", secret_file)
    store = Store.open(str(state_dir))
    order = _quarantine_and_release(store, clock, range(3))

    # Down: nothing listens. The head is retried later; nothing is lost.
    sender = _sender(config, store, clock)
    due = sender.run_once(clock.now())
    assert due is not None and due > clock.now()
    assert sender.counts.retry == 1 and store.outbox.counts()["ops"].pending == 6

    # The daemon restarts: the outbox, with the head's attempts, survives.
    store.close()
    store = Store.open(str(state_dir))
    head = store.outbox.head("ops")
    assert head is not None and head.attempts == 1 and head.last_error
    sender = _sender(config, store, clock)

    with receiver(port) as hook:
        # Slow: the request times out and is retried.
        hook.mode = "slow"
        clock.advance(60)
        sender.run_once(clock.now())
        hook.release.set()
        assert sender.counts.retry == 1 and not hook.received

        # Failing with 500, and another restart in between.
        hook.mode = "fail"
        clock.advance(60)
        sender.run_once(clock.now())
        store.close()
        store = Store.open(str(state_dir))
        sender = _sender(config, store, clock)
        clock.advance(60)
        sender.run_once(clock.now())
        assert len(hook.attempts) == 3 and not hook.received
        # Every try of one event carries its one idempotency key.
        assert len({a.headers["Idempotency-Key"] for a in hook.attempts}) == 1

        hook.mode = "ok"
        _drain(sender, clock)

    assert _kinds(hook) == order
    assert len({r.headers["Idempotency-Key"] for r in hook.received}) == len(order)
    assert all(_verify(r.headers, r.body) for r in hook.received)
    releases = [p for p in hook.payloads() if p["kind"] == "release"]
    assert {p["status"] for p in releases} == {"resolved"}
    assert store.outbox.counts() == {}
    store.close()


def test_a_4xx_is_dead_lettered_and_the_queue_moves_on(state_dir: Path, clock: FakeClock) -> None:
    store = Store.open(str(state_dir))
    _quarantine_and_release(store, clock, range(1))
    with receiver() as hook:
        sender = _sender(_config(hook.url), store, clock)
        hook.mode = "reject"
        sender.run_once(clock.now())
        assert sender.counts.dead_letter == 1
        hook.mode = "ok"
        sender.run_once(clock.now())
    # The release resolves an alert this webhook was never sent: not sent either.
    assert hook.received == []
    counts = store.outbox.counts()["ops"]
    assert (counts.pending, counts.dead_letters) == (0, 1)
    ((error, kind),) = _dead_letters(state_dir)
    assert error == "HTTP 400 Bad Request" and kind == "quarantine"
    store.close()


@pytest.mark.parametrize("status", [408, 429, 503])
def test_timeouts_rate_limits_and_5xx_are_retried_not_dead_lettered(
    state_dir: Path, clock: FakeClock, status: int
) -> None:
    store = Store.open(str(state_dir))
    _quarantine_and_release(store, clock, range(1))
    with receiver() as hook:
        sender = _sender(_config(hook.url), store, clock)
        hook.mode = status
        sender.run_once(clock.now())
        assert (sender.counts.retry, sender.counts.dead_letter) == (1, 0)
        hook.mode = "ok"
        _drain(sender, clock)
    assert _kinds(hook) == ["quarantine gpu:0", "release gpu:0"]
    store.close()


def test_an_event_failing_past_give_up_after_is_dead_lettered(
    state_dir: Path, clock: FakeClock
) -> None:
    store = Store.open(str(state_dir))
    _quarantine_and_release(store, clock, range(1))
    with receiver() as hook:
        hook.mode = "fail"
        sender = _sender(_config(hook.url, give_up_after=300.0), store, clock)
        for _ in range(20):
            due = sender.run_once(clock.now())
            if sender.counts.dead_letter:
                break
            assert due is not None
            clock.advance(due - clock.now())
    ((error, _),) = _dead_letters(state_dir)
    assert error.startswith("still failing after 5m")
    store.close()


def test_queues_of_webhooks_no_longer_configured_are_dropped(
    state_dir: Path, clock: FakeClock
) -> None:
    store = Store.open(str(state_dir))
    _quarantine_and_release(store, clock, range(2))
    assert store.outbox.prune(["slack"], clock.now(), keep_dead_letters=86400) == 4
    assert store.outbox.counts() == {}
    store.close()


SCENARIO = (
    "node: {gpus: 4, nvlinks: 4, hcas: 2}\nfaults: [{at: 10s, kind: ecc_uncorrectable, gpu: 1}]\n"
)


def test_the_daemon_sends_its_decisions_and_shows_deliveries_on_metrics_and_status(
    tmp_path: Path,
) -> None:
    with receiver() as hook:
        webhook = _config(hook.url, format="alertmanager")
        config = Config(actions=ActionsConfig(node_name="node-7", webhooks=(webhook,)))
        with simulated_daemon(SCENARIO, tmp_path, config) as sim:
            snapshot = sim.run_until(30)
            assert snapshot.webhooks[0].pending > 0
            sim.daemon.actions.run_due(sim.clock.now())
            snapshot = sim.daemon.step()
            metrics = generate_latest(sim.daemon.registry).decode()
    alerts = [alert for payload in hook.payloads() for alert in payload["alerts"]]
    fired = {(a["labels"]["alertname"], a["labels"]["subject"]) for a in alerts}
    assert ("GpuwatchdQuarantined", "gpu:1") in fired
    assert ("GpuwatchdNodeHealth", "node") in fired
    delivered = len(hook.received)
    assert (
        f'gpuwatchd_webhook_deliveries_total{{result="delivered",webhook="ops"}} {delivered}.0'
        in metrics
    )
    assert 'gpuwatchd_webhook_outbox_pending{webhook="ops"} 0.0' in metrics
    status = snapshot.webhooks[0]
    assert (status.delivered, status.pending, status.dead_letters) == (delivered, 0, 0)


def test_dead_letters_show_on_metrics_and_in_status(tmp_path: Path) -> None:
    with receiver() as hook:
        hook.mode = "reject"
        config = Config(actions=ActionsConfig(webhooks=(_config(hook.url),)))
        with simulated_daemon(SCENARIO, tmp_path, config) as sim:
            sim.run_until(30)
            sim.daemon.actions.run_due(sim.clock.now())
            snapshot = sim.daemon.step()
            metrics = generate_latest(sim.daemon.registry).decode()
    dead = snapshot.webhooks[0].dead_letters
    assert dead > 0 and snapshot.webhooks[0].last_error == "HTTP 400 Bad Request"
    assert f'gpuwatchd_webhook_dead_letters{{webhook="ops"}} {dead}.0' in metrics
    assert 'gpuwatchd_webhook_deliveries_total{result="dead_letter",webhook="ops"}' in metrics
    table = render_table(json.loads(json.dumps(to_json(snapshot))))
    assert f"ops: 0 pending, {dead} dead letters" in table


def test_a_webhook_key_file_missing_at_the_start_is_logged_and_shown_before_any_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "pagerduty-key"
    webhook = _config(
        "https://events.pagerduty.com/v2/enqueue",
        format="pagerduty",
        routing_key_file=str(missing),
    )
    config = Config(actions=ActionsConfig(webhooks=(webhook,)))
    with caplog.at_level(logging.ERROR), simulated_daemon(SCENARIO, tmp_path, config) as sim:
        snapshot = sim.daemon.step()
    problem = (
        f"webhook ops: its routing_key_file {missing} cannot be read (No such file or directory)"
    )
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"{problem}: its events wait in the outbox until it can"
    ]
    assert snapshot.webhooks[0].last_error == problem


def test_check_config_warns_of_a_webhook_file_this_host_cannot_read(tmp_path: Path) -> None:
    readable = tmp_path / "secret"
    readable.write_text("s3cret\n")
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(
        "actions:\n  webhooks:\n"
        "    - {name: oncall, url: 'https://events.pagerduty.com/v2/enqueue', "
        f"format: pagerduty, routing_key_file: {tmp_path / 'nope'}, secret_file: {readable}}}\n"
    )
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 0  # checked away from its nodes, a config names files they hold
    assert result.stderr == (
        f"warning: webhook oncall: its routing_key_file {tmp_path / 'nope'} cannot be read "
        "(No such file or directory) here\n"
    )
    assert result.stdout == f"{config}: ok\n"
