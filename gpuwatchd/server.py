"""The HTTP listener: /metrics (Prometheus), /healthz and the JSON API under
/api/v1/. Reads serve the daemon's current Snapshot (and the journal); a
scrape sends the Snapshot's page as encoded once per Snapshot
(exporter.MetricsPage), plus the live process and daemon figures.

The control API:

| request | what it does |
| --- | --- |
| `GET /api/v1/status` | the node as `gpuwatchd status --json` shows it |
| `GET /api/v1/quarantines` | the quarantines in the state database |
| `POST /api/v1/quarantines` | quarantine: `{"subject", "reason", "operator"}` |
| `DELETE /api/v1/quarantines/<subject>` | release; optional `{"reason", "operator"}` |
| `GET /api/v1/journal?since=&until=&subject=&limit=` | journal entries, oldest first |

Reads are open to whoever reaches the listener (loopback by default). Writes
need `Authorization: Bearer <secret>` with a secret from the token file: one
token a line, `name:secret` (the name is the operator journaled for every
change made with it) or a bare `secret` (the request's `operator`, else
"api"); blank lines and `#` comments are ignored, and the file is read at
every write, so tokens change without a restart. A refused write is 401 and
journaled. With a certificate and key configured the listener speaks TLS.
Every error answer, the listener's own included (a method a path does not
serve, a malformed request line, headers too long), is JSON `{"error": ...}`.
"""

from __future__ import annotations

import dataclasses
import errno
import hmac
import json
import logging
import os
import secrets
import socket
import ssl
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from gpuwatchd import unix_socket
from gpuwatchd.actions.manual import (
    check_on_node,
    check_text,
    node_subjects,
    resolve_subject,
)
from gpuwatchd.config import UNIX_PREFIX, ApiConfig
from gpuwatchd.connections import Connection, Connections
from gpuwatchd.dcgm import DcgmRun, run_of
from gpuwatchd.exporter import MetricsPage
from gpuwatchd.model import Decision, Quarantine
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.status import quarantine_json, to_json
from gpuwatchd.store import JournalEntry, StoreError
from gpuwatchd.text import shown
from gpuwatchd.units import parse_moment

log = logging.getLogger(__name__)

QUARANTINES = "/api/v1/quarantines"
# A board's records for `gpuwatchd report`, and where `canary --dcgm` records its runs.
EVIDENCE = "/api/v1/evidence"
DCGM_RUNS = "/api/v1/dcgm-runs"
JOURNAL_DAYS_DEFAULT = 1.0
MAX_JOURNAL_ENTRIES = 10000
MAX_OPERATOR_CHARS = 64
# A request body or an answer that stalls this long ends its connection (the
# request line and headers have their own deadline: api.header_timeout).
REQUEST_TIMEOUT_SECONDS = 30.0
SHUTDOWN_POLL_SECONDS = 0.1
MAX_TOKEN_FILE_BYTES = 1 << 16
# Connections the kernel queues before the listener accepts them: a fleet's
# scrapers and a burst of API clients (socketserver's default is 5).
LISTEN_BACKLOG = 1024
# A Unix socket's mode: only the daemon's user and group may connect.
UNIX_SOCKET_MODE = 0o660
WRITE_FIELDS = frozenset({"subject", "reason", "operator"})


@dataclass(frozen=True)
class Token:
    operator: str | None  # None: the request says who it is
    secret: str


class TokenFileError(OSError):
    """A token file that must not be trusted: a symlink, not a regular file,
    or open to its group or others."""


def read_tokens(path: str) -> tuple[Token, ...]:
    """The tokens of `path`, which must be a regular file (not followed
    through a symlink) that only its owner can read or write."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise TokenFileError(f"{path} is a symbolic link: refused") from error
        raise
    with os.fdopen(descriptor, "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise TokenFileError(f"{path} is not a regular file: refused")
        if status.st_mode & 0o077:
            raise TokenFileError(
                f"{path} has mode {stat.S_IMODE(status.st_mode):04o}, open to its group or "
                f"others: refused until `chmod 600 {path}`"
            )
        data = handle.read(MAX_TOKEN_FILE_BYTES)
    return _parse_tokens(data.decode("utf-8", "replace"))


def _parse_tokens(text: str) -> tuple[Token, ...]:
    lines = [line.strip() for line in text.splitlines()]
    tokens = []
    for line in lines:
        if not line or line.startswith("#"):
            continue
        name, sep, secret = line.partition(":")
        tokens.append(Token(name, secret) if sep else Token(None, line))
    return tuple(token for token in tokens if token.secret)


def client_secret(path: str) -> str:
    """The secret a client sends: the file's first token."""
    with open(path, encoding="utf-8") as handle:
        tokens = _parse_tokens(handle.read(MAX_TOKEN_FILE_BYTES))
    if not tokens:
        raise ValueError(f"{path} holds no token")
    return tokens[0].secret


def token_secrets(path: str) -> tuple[str, ...]:
    """Every secret of a token file, whatever its mode: what the CLI leaves
    out of a bundle it writes (gpuwatchd report). OSError when unreadable."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return tuple(token.secret for token in _parse_tokens(handle.read(MAX_TOKEN_FILE_BYTES)))


def ensure_token_file(path: str) -> bool:
    """Create the token file with one random secret when missing; True when created."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(
            "# gpuwatchd API tokens, one a line: name:secret (writes are journaled\n"
            "# as name) or a bare secret (the client names the operator).\n"
            f"{secrets.token_urlsafe(32)}\n"
        )
    return True


class Control(Protocol):
    """What the control API asks of the daemon."""

    def now(self) -> float: ...

    def quarantine(
        self, subject: str, reason: str, operator: str
    ) -> tuple[Decision | None, Quarantine]: ...

    def release(self, subject: str, reason: str, operator: str) -> Decision | None: ...

    def quarantines(self) -> tuple[Quarantine, ...]: ...

    def journal(
        self, since: float | None, subject: str | None, limit: int, until: float | None = None
    ) -> tuple[JournalEntry, ...]: ...

    def refused(self, message: str) -> None:
        """Journal a refused write."""
        ...

    def evidence(self, board: str) -> dict[str, Any]:
        """The state database's records of a board (evidence.py)."""
        ...

    def record_dcgm(self, run: DcgmRun) -> int:
        """Keep a DCGM run `canary --dcgm` made; its id."""
        ...


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    server: StatusServer
    server_version = "gpuwatchd"
    timeout = REQUEST_TIMEOUT_SECONDS
    token: Token  # the write request's, once authenticated

    def __init__(self, connection: Connection, client_address: Any, server: StatusServer) -> None:
        self.slot = connection
        super().__init__(connection.sock, client_address, server)

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if not self.server.connections.answering(self.slot):
            # Cut off while its headers came (too slowly, or for a newer
            # connection): what was read may be cut short too.
            self.close_connection = True
            return False
        return parsed

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The errors http.server sends itself (a malformed request line, a
        line or headers too long, a method with no do_), as JSON like the
        API's own, instead of its HTML page."""
        headers = {"Connection": "close"}
        # http.server answers a method it has no do_ for with 501, a server
        # error; it is the client's: 405, with the methods the path serves.
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed here"
            headers["Allow"] = self._allowed()
        self.log_error("code %d, message %s", code, message)
        self.close_connection = True
        text = message or HTTPStatus(code).phrase
        if explain:
            text = f"{text}: {explain}"
        if self.request_version == "HTTP/0.9" and not self.command:
            # A request line that did not parse is no HTTP/0.9 request: the
            # status and headers go out as HTTP/1.0 would send them.
            self.request_version = "HTTP/1.0"
        self.send_json(code, {"error": shown(text)}, headers)

    def _allowed(self) -> str:
        """The methods the request's path serves, for a 405's Allow header."""
        if self.server.control is not None:
            if self._path == QUARANTINES:
                return "GET, HEAD, POST"
            if self._path.startswith(QUARANTINES + "/"):
                return "DELETE"
            if self._path == DCGM_RUNS:
                return "POST"
        return "GET, HEAD"

    def version_string(self) -> str:
        # The Server header names no Python version.
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), shown(format % args))

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(
        self, status: int, document: object, headers: Mapping[str, str] | None = None
    ) -> None:
        body = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
        self._send(status, body, "application/json", headers)

    @property
    def _path(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def do_GET(self) -> None:
        path = self._path
        control = self.server.control
        if path == "/metrics":
            body, content_type = self.server.metrics.render(self.headers.get("Accept", ""))
            self._send(200, body, content_type)
        elif path == "/healthz":
            healthy, why = self.server.liveness()
            self._send(200 if healthy else 503, (why + "\n").encode(), "text/plain")
        elif path == "/api/v1/status":
            self.send_json(200, self.server.status())
        elif path == QUARANTINES and control is not None:
            self._answer(lambda: (200, {"quarantines": _quarantines_json(control)}))
        elif path == "/api/v1/journal" and control is not None:
            self._answer(lambda: self._journal(control))
        elif path.startswith(EVIDENCE + "/") and control is not None:
            board = unquote(path[len(EVIDENCE) + 1 :])
            self._answer(lambda: (200, control.evidence(board)))
        elif path == "/":
            links = b'<a href="/metrics">/metrics</a> <a href="/api/v1/status">/api/v1/status</a>'
            self._send(200, b"<html><body>gpuwatchd " + links + b"</body></html>", "text/html")
        else:
            self.send_json(404, {"error": f"no such path: {path}"})

    do_HEAD = do_GET

    def do_POST(self) -> None:
        control = self.server.control
        if self._path == DCGM_RUNS and control is not None:
            self._answer(lambda: self._dcgm_run(control), write=True)
        elif self._path == QUARANTINES and control is not None:
            self._answer(lambda: self._quarantine(control), write=True)
        else:
            self.send_json(404, {"error": f"no such path: {self._path}"})

    def do_DELETE(self) -> None:
        control = self.server.control
        if not self._path.startswith(QUARANTINES + "/") or control is None:
            self.send_json(404, {"error": f"no such path: {self._path}"})
            return
        self._answer(lambda: self._release(control), write=True)

    def _answer(self, handle: Callable[[], tuple[int, object]], write: bool = False) -> None:
        try:
            if write:
                self._authenticate()
            status, document = handle()
        except StoreError as error:
            self.send_json(503, {"error": str(error)})
            return
        except ApiError as error:
            headers = (
                {"WWW-Authenticate": 'Bearer realm="gpuwatchd"'} if error.status == 401 else {}
            )
            # The body may be unread (a refused token, one too large): this
            # connection cannot carry another request.
            self.close_connection = True
            headers["Connection"] = "close"
            self.send_json(error.status, {"error": str(error)}, headers)
            return
        self.send_json(status, document)

    def _authenticate(self) -> None:
        """The operator of a valid bearer token (kept on the handler), or 401."""
        header = self.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        why = None
        if scheme.lower() != "bearer" or not presented.strip():
            why = "a bearer token is required"
        else:
            try:
                tokens = read_tokens(self.server.token_file)
            except OSError as error:
                log.error("cannot read the API token file %s: %s", self.server.token_file, error)
                tokens = ()
            # As bytes: compare_digest takes str only when it is ASCII, and
            # a header may hold any byte (http.server decodes it as latin-1).
            given = presented.strip().encode("latin-1", "replace")
            match = next((t for t in tokens if hmac.compare_digest(t.secret.encode(), given)), None)
            if match is None:
                why = "the bearer token is not valid"
            else:
                self.token = match
        if why is not None:
            control = self.server.control
            if control is not None:
                control.refused(
                    f"{self.command} {shown(self._path)} from {self.client_address[0]} "
                    f"refused: {why}"
                )
            raise ApiError(401, why)

    def _operator(self, body: Mapping[str, Any]) -> str:
        if self.token.operator:
            return self.token.operator
        claimed = body.get("operator") or "api"
        if not isinstance(claimed, str):
            raise ApiError(400, "operator must be text")
        try:
            return check_text(claimed, "operator", required=True, max_chars=MAX_OPERATOR_CHARS)
        except ValueError as error:
            raise ApiError(400, str(error)) from error

    def _body(self, required: bool) -> dict[str, Any]:
        """A quarantine's or release's body: only the fields such a write has."""
        document = self._json_body(required)
        unknown = sorted(set(document) - WRITE_FIELDS)
        if unknown:
            fields = ", ".join(shown(name, 40) for name in unknown[:5])
            raise ApiError(400, f"unknown field(s): {fields} (known: operator, reason, subject)")
        return document

    def _json_body(self, required: bool) -> dict[str, Any]:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            if required:
                raise ApiError(411, "a JSON body with a Content-Length is required")
            return {}
        try:
            length = int(length_header)
        except ValueError as error:
            raise ApiError(400, "Content-Length is not a number") from error
        if length < 0:
            raise ApiError(400, "Content-Length cannot be negative")
        if length > self.server.max_body_bytes:
            raise ApiError(413, f"the body is larger than {self.server.max_body_bytes} bytes")
        raw = self.rfile.read(length)
        if not raw and not required:
            return {}
        try:
            document = json.loads(raw)
        except ValueError as error:
            raise ApiError(400, f"the body is not JSON: {error}") from error
        except RecursionError as error:
            raise ApiError(400, "the body is JSON nested too deeply") from error
        if not isinstance(document, dict):
            raise ApiError(400, "the body must be a JSON object")
        return document

    def _subject(self, text: object, control: Control) -> str:
        if not isinstance(text, str):
            raise ApiError(400, "subject must be text such as gpu:3")
        snapshot = self.server.current()
        try:
            held = control.quarantines()
            subject = resolve_subject(text, snapshot.gpus, held)
            known = node_subjects(snapshot.gpus, snapshot.ports)
            check_on_node(subject, known, (q.subject for q in held))
        except ValueError as error:
            raise ApiError(400, str(error)) from error
        return subject

    def _reason(self, body: Mapping[str, Any], required: bool) -> str:
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise ApiError(400, "reason must be text")
        try:
            return check_text(reason, "reason", required)
        except ValueError as error:
            raise ApiError(400, str(error)) from error

    def _quarantine(self, control: Control) -> tuple[int, object]:
        body = self._body(required=True)
        subject = self._subject(body.get("subject"), control)
        reason = self._reason(body, required=True)
        decision, held = control.quarantine(subject, reason, self._operator(body))
        # 200 and no decision: it was already quarantined, and that one stands.
        return (200 if decision is None else 201), {
            "decision": dataclasses.asdict(decision) if decision is not None else None,
            "quarantine": quarantine_json(held),
        }

    def _release(self, control: Control) -> tuple[int, object]:
        body = self._body(required=False)
        subject = self._subject(unquote(self._path[len(QUARANTINES) + 1 :]), control)
        reason = self._reason(body, required=False)
        decision = control.release(subject, reason, self._operator(body))
        if decision is None:
            raise ApiError(404, f"{subject} is not quarantined")
        return 200, {"decision": dataclasses.asdict(decision)}

    def _dcgm_run(self, control: Control) -> tuple[int, object]:
        try:
            run = run_of(self._json_body(required=True))
        except ValueError as error:
            raise ApiError(400, f"not a DCGM run: {shown(str(error), 200)}") from error
        return 201, {"id": control.record_dcgm(run)}

    def _journal(self, control: Control) -> tuple[int, object]:
        query = {name: values[-1] for name, values in parse_qs(urlsplit(self.path).query).items()}
        since = _moment("since", query.get("since"), control.now())
        until = _moment("until", query["until"], control.now()) if "until" in query else None
        subject = query.get("subject")
        try:
            limit = int(query.get("limit", MAX_JOURNAL_ENTRIES))
        except ValueError as error:
            raise ApiError(400, "limit must be a whole number") from error
        if not 0 <= limit <= MAX_JOURNAL_ENTRIES:
            raise ApiError(400, f"limit must be 0 to {MAX_JOURNAL_ENTRIES}")
        # One more than asked says whether older entries were left out.
        entries = control.journal(since, subject, limit + 1, until)
        kept = entries[len(entries) - limit :] if limit else ()
        return 200, {
            "entries": [dataclasses.asdict(entry) for entry in kept],
            "truncated": len(entries) > limit,
        }


def _quarantines_json(control: Control) -> list[dict[str, Any]]:
    return [quarantine_json(q) for q in control.quarantines()]


def _moment(name: str, value: str | None, now: float) -> float:
    """`value` as seconds since the epoch, or a duration back from now (`1h`);
    when missing (`since` only), a day back."""
    if value is None:
        return now - JOURNAL_DAYS_DEFAULT * 86400
    try:
        return parse_moment(value, now)
    except ValueError as error:
        raise ApiError(400, f"{name}: {error}") from error


def base_url(host: str, port: int, tls: bool) -> str:
    """The daemon's URL at `host:port` (an IPv6 host in brackets)."""
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class StatusServer(HTTPServer):
    """The listener: each connection in its own thread, in a slot of
    `connections` (gpuwatchd.connections: how many at once, and how long a
    request line and headers may take)."""

    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int] | str,
        metrics: MetricsPage,
        current: Callable[[], Snapshot],
        max_poll_age_seconds: float,
        clock_now: Callable[[], float],
        control: Control | None = None,
        token_file: str = "",
        api: ApiConfig | None = None,
        state_dir: str | None = None,
    ) -> None:
        """Without `control` the API serves status only (no quarantines, journal or writes).
        `state_dir`, the daemon's, is said in the status: the CLI asks the
        daemon for what a database it holds has only if it holds that one."""
        api = api or ApiConfig()
        self.tls: ssl.SSLContext | None = None
        if api.tls_cert_file and api.tls_key_file:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(api.tls_cert_file, api.tls_key_file)
        if isinstance(address, tuple) and ":" in address[0]:
            self.address_family = socket.AF_INET6
        # A path for UnixStatusServer, which typeshed's TCPServer does not know.
        super().__init__(address, _Handler)  # type: ignore[arg-type]
        self.metrics = metrics
        self.current = current
        self.max_poll_age_seconds = max_poll_age_seconds
        self.clock_now = clock_now
        self.control = control
        self.token_file = token_file
        self.state_dir = state_dir
        self.max_body_bytes = api.max_body_bytes
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.connections = Connections(api.max_connections, api.header_timeout)

    def get_request(self) -> tuple[Any, Any]:
        try:
            return super().get_request()
        except OSError as error:
            if error.errno in (errno.EMFILE, errno.ENFILE):
                # The connection stays queued: without a pause the accept loop
                # would spin on it at full CPU until a descriptor is free.
                log.warning("cannot accept a connection: %s", error.strerror)
                time.sleep(SHUTDOWN_POLL_SECONDS)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        connection = self.connections.admit(request, self._stopping.is_set)
        if connection is None:
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve, args=(connection, client_address), name="http-client", daemon=True
        )
        try:
            thread.start()
        except BaseException:
            self.connections.close(connection)
            raise

    def service_actions(self) -> None:
        # Between accepts, and ten times a second while none come.
        self.connections.expire()

    def _serve(self, connection: Connection, client_address: Any) -> None:
        """One connection, in its own thread."""
        try:
            if self.tls is None or self._handshake(self.tls, connection, client_address):
                _Handler(connection, client_address, self)
        except Exception:
            self.handle_error(connection.sock, client_address)
        finally:
            self.connections.close(connection)
            self.shutdown_request(connection.sock)

    def _handshake(self, tls: ssl.SSLContext, connection: Connection, client_address: Any) -> bool:
        """The TLS handshake, in the connection's own thread (a slow or silent
        client cannot hold up the accept loop) and within its header deadline."""
        connection.sock.settimeout(REQUEST_TIMEOUT_SECONDS)
        wrapped = tls.wrap_socket(connection.sock, server_side=True, do_handshake_on_connect=False)
        if not self.connections.wrapped(connection, wrapped):
            return False
        try:
            wrapped.do_handshake()
        except (ssl.SSLError, OSError) as error:
            log.debug("TLS handshake with %s failed: %s", client_address[0], error)
            return False
        return True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is one debug line; anything else a logged traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError | ssl.SSLError):
            log.debug("%s: connection ended: %s", client_address[0], error)
        else:
            log.exception("request from %s failed", client_address[0])

    def status(self) -> dict[str, Any]:
        document = to_json(self.current())
        if self.state_dir is not None:
            document["state_dir"] = self.state_dir
        return document

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
        return base_url(str(host), int(port), tls=self.tls is not None)

    def start(self) -> None:
        # Polling for shutdown ten times a second keeps stopping quick.
        self._thread = threading.Thread(
            target=self.serve_forever, args=(SHUTDOWN_POLL_SECONDS,), name="http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.shutdown()
        self.server_close()


class UnixStatusServer(StatusServer):
    """The listener on a Unix socket (`api.listen: unix:<path>`), mode 0660:
    reaching the API takes the daemon's user or group, and writes still take
    a token. A socket left by a daemon that died is replaced; anything else
    at the path is refused and left as it was (gpuwatchd.unix_socket)."""

    address_family = socket.AF_UNIX
    bound: unix_socket.Bound | None = None  # the socket file this listener made

    def server_bind(self) -> None:
        self.bound = unix_socket.bind(self.socket, str(self.server_address), UNIX_SOCKET_MODE)
        self.server_name, self.server_port = "localhost", 0

    def get_request(self) -> tuple[Any, Any]:
        request, _ = super().get_request()
        # A Unix peer has no address: name the socket, where log lines and
        # journaled refusals name a client.
        return request, (f"{UNIX_PREFIX}{self.server_address}", 0)

    @property
    def url(self) -> str:
        return f"{UNIX_PREFIX}{self.server_address}"

    def server_close(self) -> None:
        # Also called when server_bind refused the path: then nothing was
        # bound, and nothing is removed.
        super().server_close()
        bound, self.bound = self.bound, None
        if bound is not None and not bound.remove():
            log.warning("%s is no longer the socket this daemon bound: left as it is", bound.path)
