"""The webhook examples of docs/webhooks.md and config/gpuwatchd.yaml against
the real Alertmanager (Debian's prometheus-alertmanager, which ./scripts/test
installs): a quarantine's alert is active there, its release resolves it, and
the `alertmanager` payload, which is Alertmanager's outgoing format, is
refused (why `alertmanager_api` exists)."""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from actions_support import REPO, free_port, wait_for

from gpuwatchd.actions.dispatch import manual_events
from gpuwatchd.actions.events import CRITICAL, NODE_HEALTH, WARNING, Event
from gpuwatchd.actions.webhook import Context, WebhookConfig, WebhookSender, render, route
from gpuwatchd.clock import FakeClock
from gpuwatchd.store import Store

EXAMPLE_HOST = "alertmanager:9093"


def _binary() -> str:
    found = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert found, "Alertmanager is not installed: ./scripts/test installs prometheus-alertmanager"
    return found


def _ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"alertmanager exited: {process.communicate()[1].decode()}")
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def alertmanager(directory: Path) -> Iterator[str]:
    """A real Alertmanager on loopback, routing everything to a receiver
    that sends nothing, without its cluster listener; yields its URL."""
    config = directory / "alertmanager.yml"
    config.write_text("route: {receiver: nowhere}\nreceivers: [{name: nowhere}]\n")
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [
            _binary(),
            f"--config.file={config}",
            f"--storage.path={directory / 'data'}",
            f"--web.listen-address={address}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://{address}"
    try:
        wait_for(lambda: _ready(url, process), "Alertmanager to be ready")
        yield url
    finally:
        process.terminate()
        process.communicate(timeout=15)


def _docs_example() -> dict[str, Any]:
    text = (REPO / "docs" / "webhooks.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert block is not None
    webhooks = yaml.safe_load(block.group(1))["actions"]["webhooks"]
    example: dict[str, Any] = next(w for w in webhooks if w["name"] == "am")
    return example


def _config_example() -> dict[str, Any]:
    """The commented webhook example of the shipped config, uncommented."""
    lines = (REPO / "config" / "gpuwatchd.yaml").read_text().splitlines()
    start = lines.index("  #   webhooks:")
    commented = []
    for line in lines[start:]:
        if not line.startswith("  #"):
            break
        commented.append(line[3:])
    example: dict[str, Any] = yaml.safe_load("\n".join(commented))["webhooks"][0]
    return example


def _webhook(example: dict[str, Any], url: str) -> WebhookConfig:
    settings = {**example, "url": example["url"].replace(f"http://{EXAMPLE_HOST}", url)}
    assert settings["url"] != example["url"], f"the example is not at {EXAMPLE_HOST}"
    return WebhookConfig(
        name=settings["name"],
        url=settings["url"],
        format=settings["format"],
        timeout=2.0,
        retry_initial=1.0,
        retry_max=1.0,
        give_up_after=60.0,
    )


def _active(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts?active=true", timeout=5) as response:
        alerts: list[dict[str, Any]] = json.load(response)
    return [a for a in alerts if a["labels"].get("node") == "node-7"]


def _deliver(config: WebhookConfig, store: Store, clock: FakeClock) -> WebhookSender:
    sender = WebhookSender(config, store, clock, random.Random(1), "http://node-7:9477")
    assert sender.run_once(clock.now()) is None, sender.last_error
    return sender


@pytest.mark.parametrize("example", [_docs_example, _config_example], ids=["docs", "config"])
def test_the_example_webhook_reaches_a_real_alertmanager_and_resolves(
    tmp_path: Path, example: Any
) -> None:
    clock = FakeClock()
    with alertmanager(tmp_path) as url, contextlib.closing(Store.open(str(tmp_path))) as store:
        config = _webhook(example(), url)
        events = manual_events("node-7", "alice", [config.name])
        store.quarantine("gpu:3", "fans at 100%", "alice", clock.now(), events)
        _deliver(config, store, clock)
        [alert] = _active(url)
        assert alert["labels"] == {
            "alertname": "GpuwatchdQuarantined",
            "node": "node-7",
            "subject": "gpu:3",
            "severity": "critical",
        }
        assert alert["annotations"]["description"] == "fans at 100%"
        assert alert["status"]["state"] == "active"

        clock.advance(60)
        store.release("gpu:3", "bob", clock.now(), "fan replaced", events)
        _deliver(config, store, clock)
        assert _active(url) == []


def test_alertmanagers_outgoing_webhook_payload_is_refused_by_alertmanager(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    with alertmanager(tmp_path) as url, contextlib.closing(Store.open(str(tmp_path))) as store:
        config = WebhookConfig(name="am", url=f"{url}/api/v2/alerts", format="alertmanager")
        store.quarantine("gpu:3", "x", "alice", clock.now(), manual_events("node-7", "a", ["am"]))
        sender = WebhookSender(config, store, clock, random.Random(1), "http://node-7:9477")
        assert sender.run_once(clock.now()) is None
        assert sender.counts.dead_letter == 1
        assert sender.last_error is not None and sender.last_error.startswith("HTTP 4")


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(
        f"{url}/api/v2/alerts", body, {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def test_a_node_alert_that_rises_to_critical_and_resolves_leaves_nothing_standing(
    tmp_path: Path,
) -> None:
    # Alertmanager knows an alert by its labels, severity among them: the
    # warning must end when the critical that replaces it is posted, or its
    # year-long endsAt keeps it active after the node is healthy again.
    context = Context("am", "key", "http://node-7:9477")
    # Alertmanager judges endsAt by its own clock.
    now = float(int(time.time()))
    degraded = Event(NODE_HEALTH, "node", WARNING, "health_changed", now - 2, "node-7", "degraded")
    worse = Event(NODE_HEALTH, "node", CRITICAL, "health_changed", now - 1, "node-7", "unhealthy")
    healthy = Event(NODE_HEALTH, "node", None, "health_changed", now, "node-7", "healthy")
    with alertmanager(tmp_path) as url:
        first = route(degraded, WARNING, None)
        assert first is not None
        _post(url, render("alertmanager_api", degraded, first, context))
        second = route(worse, WARNING, first.opened)
        assert second is not None
        _post(url, render("alertmanager_api", worse, second, context))
        assert [a["labels"]["severity"] for a in _active(url)] == [CRITICAL]
        third = route(healthy, WARNING, second.opened)
        assert third is not None
        _post(url, render("alertmanager_api", healthy, third, context))
        assert _active(url) == []
