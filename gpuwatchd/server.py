"""The HTTP listener: /metrics (Prometheus), /healthz and the JSON API under
/api/v1/. It only reads the daemon's current Snapshot; it never polls
hardware itself, so a scrape costs a render and nothing more."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpuwatchd.snapshot import Snapshot
from gpuwatchd.status import to_json

log = logging.getLogger(__name__)


class _Handler(BaseHTTPRequestHandler):
    server: StatusServer
    server_version = "gpuwatchd"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, document: object) -> None:
        body = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
        self._send(status, body, "application/json")

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(self.server.registry), content_type)
        elif path == "/healthz":
            healthy, why = self.server.liveness()
            self._send(200 if healthy else 503, (why + "\n").encode(), "text/plain")
        elif path == "/api/v1/status":
            self.send_json(200, to_json(self.server.current()))
        elif path == "/":
            links = b'<a href="/metrics">/metrics</a> <a href="/api/v1/status">/api/v1/status</a>'
            self._send(200, b"<html><body>gpuwatchd " + links + b"</body></html>", "text/html")
        else:
            self.send_json(404, {"error": f"no such path: {path}"})

    do_HEAD = do_GET


class StatusServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        current: Callable[[], Snapshot],
        max_poll_age_seconds: float,
        clock_now: Callable[[], float],
    ) -> None:
        super().__init__(address, _Handler)
        self.registry = registry
        self.current = current
        self.max_poll_age_seconds = max_poll_age_seconds
        self.clock_now = clock_now
        self._thread: threading.Thread | None = None

    def liveness(self) -> tuple[bool, str]:
        """Alive while polls keep coming: a stuck poll loop fails /healthz."""
        snapshot = self.current()
        if snapshot.polls == 0:
            return False, "starting: no poll finished yet"
        age = self.clock_now() - snapshot.time
        if age > self.max_poll_age_seconds:
            return False, f"stale: last poll finished {age:.0f}s ago"
        return True, "ok"

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = str(host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
