"""The CLI's side of the control API: requests to a daemon, and the same
operations on the state database when the local daemon is not running.

`DaemonDown` is raised only when nothing listens at the address (connection
refused): the one case where working on the state database directly is
safe, since no daemon holds it in memory (a daemon running elsewhere holds
the database itself locked: gpuwatchd.store). Any other failure to get an answer
(a timeout, a TLS error) is `DaemonUnreachable`, and an error the daemon
answers is `DaemonError`: the CLI reports both as they are.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatchd.actions.dispatch import manual_events, node_name
from gpuwatchd.actions.manual import check_on_node, node_subjects, resolve_subject
from gpuwatchd.config import Config, unix_socket_path
from gpuwatchd.dcgm import DcgmRun, record_run
from gpuwatchd.evidence import board_evidence
from gpuwatchd.identity import Roster
from gpuwatchd.model import Board, Decision, Quarantine
from gpuwatchd.policy import NODE
from gpuwatchd.store import LOCK_WAIT_SECONDS, EventsOf, Store

REQUEST_TIMEOUT_SECONDS = 10.0


class DaemonUnreachable(Exception):
    """No answer from the daemon; the message says why."""


class DaemonDown(DaemonUnreachable):
    """Nothing listens at the daemon's address."""


class DaemonError(Exception):
    """The daemon answered with an error; the message is its own."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class DaemonClient:
    url: str
    context: ssl.SSLContext | None = None  # for https; None: the system's CAs
    timeout: float = REQUEST_TIMEOUT_SECONDS

    def get(self, path: str) -> dict[str, Any]:
        return self.send("GET", path)

    def send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        socket_path = unix_socket_path(self.url)
        if socket_path is not None:
            return self._send_unix(socket_path, method, path, data, headers)
        request = urllib.request.Request(
            f"{self.url.rstrip('/')}{path}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout, context=self.context
            ) as response:
                document: dict[str, Any] = json.load(response)
                return document
        except urllib.error.HTTPError as error:
            raise DaemonError(
                _error_text(error.read, error.code, error.reason), error.code
            ) from error
        except urllib.error.URLError as error:
            if isinstance(error.reason, ConnectionRefusedError):
                raise DaemonDown(str(error.reason)) from error
            raise DaemonUnreachable(str(error.reason)) from error
        except (OSError, ValueError) as error:
            raise DaemonUnreachable(str(error)) from error

    def _send_unix(
        self, socket_path: str, method: str, path: str, data: bytes | None, headers: dict[str, str]
    ) -> dict[str, Any]:
        """The request over the daemon's Unix socket (`api.listen: unix:<path>`)."""
        connection = _UnixConnection(socket_path, self.timeout)
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            body = response.read()
        except (FileNotFoundError, ConnectionRefusedError) as error:
            raise DaemonDown(f"nothing listens on {socket_path}: {error.strerror}") from error
        except (OSError, http.client.HTTPException) as error:
            raise DaemonUnreachable(f"{socket_path}: {error}") from error
        finally:
            connection.close()
        if response.status >= 400:
            text = _error_text(lambda: body, response.status, response.reason)
            raise DaemonError(text, response.status)
        try:
            document: dict[str, Any] = json.loads(body)
        except ValueError as error:
            raise DaemonUnreachable(f"{socket_path}: not a JSON answer: {error}") from error
        return document


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _error_text(read: Callable[[], bytes], code: int, reason: str) -> str:
    try:
        return str(json.loads(read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {code} {reason}"


def subject_path(subject: str) -> str:
    return f"/api/v1/quarantines/{urllib.parse.quote(subject, safe='')}"


@dataclass(frozen=True)
class SavedVerdict:
    """What the state database says of the node: its health and quarantines
    as the daemon last saved them, and when (wall-clock seconds; None when no
    daemon ever wrote a poll)."""

    health: str
    quarantines: tuple[Quarantine, ...]
    last_poll: float | None


class Offline:
    """The control API's operations on the state database of a node whose
    daemon is not running; the daemon loads what they write when it starts."""

    def __init__(self, config: Config, state_dir: str, wait: float = LOCK_WAIT_SECONDS) -> None:
        self.config = config
        self.state_dir = state_dir
        self.store = Store.open(state_dir, wait=wait)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Offline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subject(self, text: str) -> str:
        """`text` as a subject of this node, by its last known samples. With
        none saved yet only `node` and held subjects are taken: unlike a
        starting daemon, nothing here will ever check a guess against the
        hardware, and a phantom GPU's quarantine would count against the node."""
        readings = self.store.samples.readings(time.time(), max_age=math.inf)
        # The GPUs as last seen: of the boards saved for one index, the newest.
        boards = set(self._roster().boards)
        gpus = [
            gpu
            for reading in readings
            for gpu in reading.gpus or ()
            if gpu.uuid and Board(gpu.uuid, gpu.index, gpu.pci_bus_id) in boards
        ]
        ports = [port for reading in readings for port in reading.ports or ()]
        quarantines = self.store.quarantines()
        subject = resolve_subject(text, gpus, quarantines)
        held = {q.subject for q in quarantines}
        known = node_subjects(gpus, ports)
        if known <= {NODE} and subject not in held | {NODE}:
            raise ValueError(
                f"{subject}: the state database in {self.state_dir} holds no readings of this "
                "node yet, so whether it has that part is unknown; start gpuwatchd once, or "
                "quarantine node"
            )
        check_on_node(subject, known, held)
        return subject

    def quarantine(self, subject: str, reason: str, operator: str) -> Decision | None:
        board = self._roster().board_of(subject)
        events = self._events(operator)
        return self.store.quarantine(subject, reason, operator, time.time(), events, board)

    def _roster(self) -> Roster:
        """The boards at their indices as the daemon last saw them: what an
        operator who types `gpu:3` with the daemon down means."""
        return Roster(self.store.samples.boards())

    def release(self, subject: str, reason: str, operator: str) -> Decision | None:
        return self.store.release(subject, operator, time.time(), reason, self._events(operator))

    def quarantines(self) -> tuple[Quarantine, ...]:
        return self.store.quarantines()

    def node_verdict(self) -> SavedVerdict:
        """The node's health as the daemon last saved it, and when."""
        state = self.store.load_state()
        node = state.subject(NODE)
        health = node.health.label if node is not None else "healthy"
        return SavedVerdict(health, state.quarantines, self.store.last_poll())

    def evidence(self, board: str) -> dict[str, Any]:
        return board_evidence(self.store, board)

    def record_dcgm(self, run: DcgmRun) -> int:
        return record_run(self.store, run)

    def _events(self, operator: str) -> EventsOf:
        names = [webhook.name for webhook in self.config.actions.webhooks]
        return manual_events(node_name(self.config.actions), operator, names)
