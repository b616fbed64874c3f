"""Alert webhooks: the payload formats, signing, and delivery from the outbox.

Reads events (gpuwatchd.actions.events) from the store's outbox, where the
daemon wrote them in the transaction of the decisions they report, and posts
them to each configured webhook in its format: `alertmanager_api` (to
Alertmanager itself: its API v2 `POST /api/v2/alerts`), `alertmanager` (the
payload Alertmanager's own webhooks send, version 4, for receivers built for
those), `slack` (an incoming webhook), `pagerduty` (Events API v2) or `json`
(docs/webhooks.md).

Delivery is at least once and, per webhook, strictly in order: the oldest
pending event is the only one tried, so a receiver that is down holds back its
own queue and no other, and gets everything once it is back. Failures are
retried with exponential backoff and jitter; a 4xx other than 408 and 429 (the
receiver refuses this payload and always will), or an event still failing
after `give_up_after`, is dead-lettered: kept out of the queue, counted in
metrics and shown in `gpuwatchd status`. Every request carries an
`Idempotency-Key` (the event's, the same on every retry) and, with a secret,
an HMAC-SHA256 signature.

Which events a webhook is sent: an alert firing at its `min_severity` or
above, and the end of every alert it was sent firing (so a resolve reaches
exactly the receivers that got the trigger).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import http.client
import json
import logging
import random
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any, Literal

from gpuwatchd import __version__
from gpuwatchd.actions.events import CRITICAL, NODE_HEALTH, QUARANTINED, Event, severity_at_least
from gpuwatchd.clock import Clock
from gpuwatchd.settings import Seconds
from gpuwatchd.store import OpenAlert, OutboxItem, Store
from gpuwatchd.units import format_duration

log = logging.getLogger(__name__)

Format = Literal["alertmanager_api", "alertmanager", "slack", "pagerduty", "json"]
FIRING = "firing"
RESOLVED = "resolved"
DELIVERED = "delivered"
RETRY = "retry"
DEAD_LETTER = "dead_letter"

# Of a receiver's answer only this much is read: its status says it all.
MAX_RESPONSE_BYTES = 65536
SIGNATURE_HEADER = "X-Gpuwatchd-Signature"
TIMESTAMP_HEADER = "X-Gpuwatchd-Timestamp"
JSON_SCHEMA = "gpuwatchd.event.v1"

# Alertmanager's zero time: endsAt of an alert that is still firing.
ZERO_TIME = "0001-01-01T00:00:00Z"
# How long Alertmanager keeps a firing alert posted to its API. Prometheus
# posts every alert again each evaluation, and Alertmanager resolves one not
# seen for resolve_timeout (5m); gpuwatchd posts each change once, so the alert
# must stand until its resolve is posted. A year bounds one that never comes.
ALERTMANAGER_HOLD_SECONDS = 365 * 86400.0
# Names distinct from the Prometheus rules' alerts, which a receiver may get too.
ALERTNAMES: Mapping[str, str] = {
    QUARANTINED: "GpuwatchdQuarantined",
    "unhealthy": "GpuwatchdUnhealthy",
    NODE_HEALTH: "GpuwatchdNodeHealth",
}
# Statuses that mean "not now" rather than "never": request timeout, rate limit.
RETRYABLE_4XX = (408, 429)


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"webhook name must be letters, digits, - _ or ., got {name!r}")


def _check_url(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"webhook url must be http:// or https://, got {url!r}")


@dataclass(frozen=True)
class WebhookConfig:
    # Names the webhook in metrics, status and the outbox.
    name: str
    url: str
    format: Format = "json"
    # Alerts below this severity are not sent (their resolution neither).
    min_severity: Literal["warning", "critical"] = "warning"
    # A file holding the HMAC-SHA256 secret that signs every request.
    secret_file: str | None = None
    # pagerduty: a file holding the Events API v2 integration (routing) key.
    routing_key_file: str | None = None
    # CA bundle for an https receiver with a private CA; null: the system's.
    ca_file: str | None = None
    # Every request gives up after this long (and is retried).
    timeout: Seconds = 10.0
    # The first retry waits about this long; each further one twice as long...
    retry_initial: Seconds = 1.0
    # ...up to this.
    retry_max: Seconds = 300.0
    # An event still failing this long after it happened is dead-lettered.
    give_up_after: Seconds = 86400.0

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_url(self.url)
        if self.format == "pagerduty" and not self.routing_key_file:
            raise ValueError("a pagerduty webhook needs routing_key_file")
        if self.timeout <= 0 or self.retry_initial <= 0:
            raise ValueError("timeout and retry_initial must be more than 0s")
        if self.retry_max < self.retry_initial:
            raise ValueError("retry_max must be at least retry_initial")


@dataclass(frozen=True)
class Route:
    """How one webhook is told of one event: the alert's status, when it
    started, its severity, and the alert as the webhook then holds it."""

    status: str
    starts_at: float
    severity: str
    opened: OpenAlert | None  # None: closed
    # The severity the webhook holds the alert firing at, where this firing
    # changes it (a warning become critical); None where it does not.
    replaced: str | None = None


def route(event: Event, minimum: str, held: OpenAlert | None) -> Route | None:
    """Whether a webhook with `minimum` severity, holding `held`, is told of
    `event`; None: it is not."""
    if event.severity is not None and severity_at_least(event.severity, minimum):
        since = held.since if held is not None else event.time
        replaced = held.severity if held is not None and held.severity != event.severity else None
        return Route(FIRING, since, event.severity, OpenAlert(since, event.severity), replaced)
    if held is not None:
        return Route(RESOLVED, held.since, held.severity, None)
    return None


@dataclass(frozen=True)
class Context:
    """What a payload says besides the event."""

    webhook: str
    key: str  # the event's idempotency key
    external_url: str  # where people can look at the node's daemon
    routing_key: str | None = None


def _iso(timestamp: float) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _evidence_text(event: Event) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(event.evidence.items()))


def fingerprint(labels: Mapping[str, str]) -> str:
    """Prometheus' label-set fingerprint (FNV-1a 64 over sorted names and values)."""
    value = 14695981039346656037
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode() + b"\xff":
                value = ((value ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def _alertmanager_api(event: Event, route: Route, context: Context) -> list[dict[str, Any]]:
    """Alertmanager's postableAlerts: the alert of the webhook payload without
    the fields only Alertmanager itself sets, and an end in the future while
    it fires."""
    alert = _alertmanager_alert(event, route, context)
    ends = event.time if route.status == RESOLVED else event.time + ALERTMANAGER_HOLD_SECONDS
    posted = {
        "labels": alert["labels"],
        "annotations": alert["annotations"],
        "startsAt": alert["startsAt"],
        "endsAt": _iso(ends),
        "generatorURL": alert["generatorURL"],
    }
    if route.replaced is None:
        return [posted]
    # Alertmanager knows an alert by its labels, severity among them: the
    # alert at the severity it had ends now, or it would stand for a year.
    ended = {"severity": route.replaced}
    return [
        posted | {"labels": alert["labels"] | ended, "endsAt": _iso(event.time)},
        posted,
    ]


def _alertmanager_identity(event: Event) -> dict[str, str]:
    return {"alertname": ALERTNAMES[event.alert], "node": event.node, "subject": event.subject}


def _alertmanager_alert(event: Event, route: Route, context: Context) -> dict[str, Any]:
    identity = _alertmanager_identity(event)
    # The fault code is an annotation, not a label: labels are the alert to
    # Alertmanager, and a health alert's finding changes while it fires (its
    # resolution names none), so a label would part a firing from its end.
    labels = {**identity, "severity": route.severity}
    annotations = {
        name: text
        for name, text in (
            ("summary", event.summary),
            ("description", event.reason),
            ("action", event.action),
            ("evidence", _evidence_text(event)),
            ("code", event.code or ""),
            ("fault_code", event.fault_code or ""),
            ("source", event.source or ""),
            ("operator", event.operator or ""),
        )
        if text
    }
    return {
        "status": route.status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(route.starts_at),
        "endsAt": _iso(event.time) if route.status == RESOLVED else ZERO_TIME,
        "generatorURL": f"{context.external_url}/api/v1/status",
        # Of the identity, not the severity: a resolve matches its firing even
        # when the node's health changed severity in between.
        "fingerprint": fingerprint(identity),
    }


def _alertmanager(event: Event, route: Route, context: Context) -> dict[str, Any]:
    identity = _alertmanager_identity(event)
    alert = _alertmanager_alert(event, route, context)
    group = ", ".join(f'{name}="{value}"' for name, value in identity.items())
    return {
        "version": "4",
        "groupKey": f"{{}}:{{{group}}}",
        "truncatedAlerts": 0,
        "status": route.status,
        "receiver": context.webhook,
        "groupLabels": identity,
        "commonLabels": alert["labels"],
        "commonAnnotations": alert["annotations"],
        "externalURL": context.external_url,
        "alerts": [alert],
    }


def _slack(event: Event, route: Route, context: Context) -> dict[str, Any]:
    if route.status == RESOLVED:
        head = f":white_check_mark: *[RESOLVED] {event.summary}*"
    else:
        icon = ":rotating_light:" if route.severity == CRITICAL else ":warning:"
        head = f"{icon} *[{route.severity.upper()}] {event.summary}*"
    lines = [head]
    if event.reason and event.reason not in event.summary:
        lines.append(f"*Reason:* {event.reason}")
    if event.fault_code:
        lines.append(f"*Fault code:* {event.fault_code} ({event.code})")
    if event.evidence:
        lines.append(f"*Evidence:* {_evidence_text(event)}")
    if event.action and route.status == FIRING:
        lines.append(f"*Suggested action:* {event.action}")
    lines.append(f"<{context.external_url}/api/v1/status|{event.node} status>")
    return {"text": "\n".join(lines)}


def _pagerduty(event: Event, route: Route, context: Context) -> dict[str, Any]:
    # One incident per node and alert: the release resolves what the quarantine opened.
    document: dict[str, Any] = {
        "routing_key": context.routing_key,
        "event_action": "trigger" if route.status == FIRING else "resolve",
        "dedup_key": f"gpuwatchd/{event.node}/{event.alert}/{event.subject}",
    }
    if route.status == FIRING:
        document["client"] = "gpuwatchd"
        document["client_url"] = f"{context.external_url}/api/v1/status"
        document["payload"] = {
            # PagerDuty truncates a summary at 1024 characters.
            "summary": event.summary[:1024],
            "source": event.node,
            "severity": route.severity,
            "timestamp": _iso(event.time),
            "component": event.subject,
            "group": event.check or event.alert,
            "class": event.code or event.alert,
            "custom_details": {
                "fault_code": event.fault_code,
                "reason": event.reason,
                "evidence": dict(event.evidence),
                "suggested_action": event.action,
                "source": event.source,
                "operator": event.operator,
            },
        }
    return document


def _json(event: Event, route: Route, context: Context) -> dict[str, Any]:
    document = event.to_json()
    return {
        **document,
        "schema": JSON_SCHEMA,
        "id": context.key,
        "webhook": context.webhook,
        "status": route.status,
        "severity": route.severity,
        "time": _iso(event.time),
        "starts_at": _iso(route.starts_at),
        "ends_at": _iso(event.time) if route.status == RESOLVED else None,
        "url": f"{context.external_url}/api/v1/status",
    }


RENDERERS: Mapping[str, Callable[[Event, Route, Context], object]] = {
    "alertmanager_api": _alertmanager_api,
    "alertmanager": _alertmanager,
    "slack": _slack,
    "pagerduty": _pagerduty,
    "json": _json,
}


def render(format: str, event: Event, route: Route, context: Context) -> bytes:
    return json.dumps(RENDERERS[format](event, route, context), sort_keys=True).encode()


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The signature header's value: HMAC-SHA256 over `<timestamp>.<body>`, so
    that a captured request cannot be replayed later with a new timestamp."""
    digest = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


@dataclass(frozen=True)
class Attempt:
    """What one request came to: delivered, retry (with the receiver's
    Retry-After, if any) or dead_letter."""

    result: str
    error: str | None = None
    retry_after: float | None = None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # urllib would re-send a redirected POST as a GET without its body.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _retry_after(headers: Message | None) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: the backoff decides instead
        return None


class _Deadline:
    """Ends a request at a deadline, whatever the receiver trickles: urllib's
    timeout bounds each socket operation, not the whole request, so a
    receiver sending a byte a second would hold the queue for ever."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._timers: list[threading.Timer] = []

    def watch(self, connection: http.client.HTTPConnection) -> None:
        timer = threading.Timer(self.seconds, self._expire, args=(connection,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _expire(self, connection: http.client.HTTPConnection) -> None:
        self.expired = True
        sock = connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()


def _watched(base: type[http.client.HTTPConnection], deadline: _Deadline) -> Any:
    """A connection class of `base` that `deadline` ends once connected."""

    class Watched(base):  # type: ignore[valid-type, misc]
        def connect(self) -> None:
            super().connect()
            deadline.watch(self)

    return Watched


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._class = _watched(http.client.HTTPConnection, deadline)

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._class, req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._https_context = context
        self._class = _watched(http.client.HTTPSConnection, deadline)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._class, req, context=self._https_context)


def _late(timeout: float) -> str:
    return f"no complete answer within {format_duration(timeout)}"


def post(
    url: str, body: bytes, headers: Mapping[str, str], timeout: float, ca_file: str | None
) -> Attempt:
    """One request, over within `timeout` in all; of the answer's body at
    most MAX_RESPONSE_BYTES is read (a receiver may send gigabytes)."""
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None
    deadline = _Deadline(timeout)
    opener = urllib.request.build_opener(
        _NoRedirects(), _DeadlineHTTPHandler(deadline), _DeadlineHTTPSHandler(deadline, context)
    )
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with opener.open(request, timeout=timeout) as response:
            response.read(MAX_RESPONSE_BYTES)
        # A cut-off answer can parse as a whole one: only a timely one counts.
        return Attempt(RETRY, _late(timeout)) if deadline.expired else Attempt(DELIVERED)
    except urllib.error.HTTPError as error:
        text = f"HTTP {error.code} {error.reason}"
        if error.code >= 500 or error.code in RETRYABLE_4XX:
            return Attempt(RETRY, text, _retry_after(error.headers))
        # Any other 4xx, and redirects, which are not followed: sending the
        # same request again would get the same answer.
        return Attempt(DEAD_LETTER, text)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        if deadline.expired:
            return Attempt(RETRY, _late(timeout))
        return Attempt(RETRY, str(getattr(error, "reason", error)) or type(error).__name__)
    finally:
        deadline.cancel()


def backoff(attempts: int, config: WebhookConfig, rng: random.Random) -> float:
    """Seconds before the next try after `attempts` failed ones: doubling from
    retry_initial up to retry_max, each drawn from its upper half so that the
    nodes of a fleet do not all retry a recovered receiver at once."""
    delay = min(config.retry_max, config.retry_initial * 2.0 ** min(attempts, 30))
    return delay * (0.5 + rng.random() / 2)


@dataclass(frozen=True)
class Counts:
    """Deliveries since the daemon started, by result."""

    delivered: int = 0
    retry: int = 0
    dead_letter: int = 0


def _read_secret(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read().strip()


def unreadable_files(config: WebhookConfig) -> list[str]:
    """The files `config` names that cannot be read here, one line each: the
    webhook's every event would wait for them (retried, then dead-lettered)."""
    named = (
        ("secret_file", config.secret_file),
        ("routing_key_file", config.routing_key_file),
        ("ca_file", config.ca_file),
    )
    problems = []
    for key, path in named:
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            problems.append(
                f"webhook {config.name}: its {key} {path} cannot be read "
                f"({error.strerror or error})"
            )
    return problems


class WebhookSender:
    """Delivers one webhook's queue. `run_once(now)` sends what is due, in
    order, and returns when the head is due next (None: the queue is empty)."""

    def __init__(
        self,
        config: WebhookConfig,
        store: Store,
        clock: Clock,
        rng: random.Random,
        external_url: str,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.config = config
        self._store = store
        self._clock = clock
        self._rng = rng
        self._external_url = external_url
        self._should_stop = should_stop
        self._counts = Counts()
        self.last_error: str | None = None
        # Said at the start, not first at the first event, which may come months later.
        for problem in unreadable_files(config):
            log.error("%s: its events wait in the outbox until it can", problem)
            self.last_error = problem

    @property
    def counts(self) -> Counts:
        return self._counts

    def run_once(self, now: float) -> float | None:
        while not self._should_stop():
            item = self._store.outbox.head(self.config.name)
            if item is None:
                return None
            if item.next_attempt > now:
                return item.next_attempt
            retry_at = self._deliver(item, now)
            if retry_at is not None:
                return retry_at
            now = self._clock.now()
        return None

    def _deliver(self, item: OutboxItem, now: float) -> float | None:
        """Try the head once; None when the queue moved on, else when to retry."""
        event = Event.from_json(item.data)
        held = self._store.outbox.open_alert(self.config.name, event.identity)
        chosen = route(event, self.config.min_severity, held)
        if chosen is None:
            self._store.outbox.remove(item)
            return None
        try:
            body, headers = self._request(item, event, chosen, now)
        except OSError as error:
            attempt = Attempt(RETRY, f"cannot read a secret file: {error}")
        else:
            attempt = post(self.config.url, body, headers, self.config.timeout, self.config.ca_file)
        give_up = self.config.give_up_after
        if attempt.result == RETRY and self._clock.now() - item.time >= give_up:
            why = f"still failing after {format_duration(give_up)}: {attempt.error}"
            attempt = Attempt(DEAD_LETTER, why)
        return self._record(item, event, chosen, attempt)

    def _request(
        self, item: OutboxItem, event: Event, chosen: Route, now: float
    ) -> tuple[bytes, dict[str, str]]:
        routing_key = None
        if self.config.routing_key_file:
            routing_key = _read_secret(self.config.routing_key_file).decode()
        context = Context(self.config.name, item.key, self._external_url, routing_key)
        body = render(self.config.format, event, chosen, context)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"gpuwatchd/{__version__}",
            "Idempotency-Key": item.key,
        }
        if self.config.secret_file:
            timestamp = int(now)
            headers[TIMESTAMP_HEADER] = str(timestamp)
            headers[SIGNATURE_HEADER] = sign(_read_secret(self.config.secret_file), timestamp, body)
        return body, headers

    def _record(
        self, item: OutboxItem, event: Event, chosen: Route, attempt: Attempt
    ) -> float | None:
        now = self._clock.now()
        name = self.config.name
        self._count(attempt.result)
        if attempt.result == DELIVERED:
            self._store.outbox.remove(item, event.identity, chosen.opened)
            return None
        self.last_error = attempt.error
        if attempt.result == DEAD_LETTER:
            log.error("webhook %s: giving up on event %s: %s", name, item.key, attempt.error)
            self._store.outbox.dead_letter(item, now, attempt.error or "")
            return None
        delay = backoff(item.attempts, self.config, self._rng)
        if attempt.retry_after is not None:
            delay = max(delay, min(attempt.retry_after, self.config.retry_max))
        log.warning(
            "webhook %s: %s; attempt %d of event %s, retrying in %.1fs",
            name,
            attempt.error,
            item.attempts + 1,
            item.key,
            delay,
        )
        self._store.outbox.retry(item, now + delay, attempt.error or "")
        return now + delay

    def _count(self, result: str) -> None:
        counts = self._counts
        self._counts = Counts(
            delivered=counts.delivered + (result == DELIVERED),
            retry=counts.retry + (result == RETRY),
            dead_letter=counts.dead_letter + (result == DEAD_LETTER),
        )
