"""The control API against hostile clients and intruders, over real HTTP on
loopback: text that is not printable, odd bearer bytes, deep or unknown JSON,
lying lengths, refused-write floods, untrusted token files, a flood of
connections and clients that vanish."""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from actions_support import wait_for
from api_support import Api, api_on, serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatchd.config import ApiConfig
from gpuwatchd.logs import JournalFormatter
from gpuwatchd.server import StatusServer

QUARANTINES = "/api/v1/quarantines"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with api_on(tmp_path) as api:
        yield api


def _raw(api: Api, request: bytes) -> bytes:
    """What the server answers to `request` sent as raw bytes, until it closes."""
    host, port = api.server.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _refused_rows(api: Api) -> list[str]:
    return [
        e.message
        for e in api.sim.daemon.store.journal.entries(limit=10_000)
        if e.kind == "api_refused"
    ]


@pytest.mark.parametrize(
    "character",
    ["\u0085", "\u2028", "\u2029", "\u202e", "\u2066", "\u009b", "\x1b", "\u200f", "\ue000"],
)
def test_a_reason_or_operator_that_is_not_printable_text_is_refused(
    api: Api, character: str
) -> None:
    for body in (
        {"subject": "gpu:2", "reason": f"fan{character}31m fake second line"},
        {"subject": "gpu:2", "reason": "fan", "operator": f"bo{character}b"},
    ):
        status, document = api.request("POST", QUARANTINES, body, token="bare-secret")
        assert status == 400 and "printable text" in document["error"]
    assert api.sim.daemon.store.quarantines() == ()


def test_a_bearer_of_any_bytes_is_refused_and_journaled(api: Api) -> None:
    answer = _raw(
        api,
        b"POST /api/v1/quarantines HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer \xff\xfe\xe9\r\nContent-Length: 2\r\n\r\n{}",
    )
    assert answer.startswith(b"HTTP/1.0 401 ")
    assert _refused_rows(api)[-1].endswith("refused: the bearer token is not valid")


def test_the_server_header_names_no_python_version(api: Api) -> None:
    answer = _raw(api, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    headers = answer.split(b"\r\n\r\n")[0].split(b"\r\n")
    assert b"Server: gpuwatchd" in headers
    assert b"Python" not in answer


def test_json_nested_deeper_than_python_can_parse_is_a_400(api: Api) -> None:
    depth = 30_000
    status, document = api.request("POST", QUARANTINES, raw=b"[" * depth + b"]" * depth)
    assert status == 400 and "nested too deeply" in document["error"]


def test_a_negative_content_length_is_a_400_without_reading_the_body(api: Api) -> None:
    answer = _raw(
        api,
        b"POST /api/v1/quarantines HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice-secret\r\n"
        b"Content-Length: -1\r\n\r\n" + b"x" * 1000,
    )
    assert answer.startswith(b"HTTP/1.0 400 ") and b"cannot be negative" in answer


def test_unknown_fields_in_a_write_are_refused(api: Api) -> None:
    body = {"subject": "gpu:2", "reason": "fan", "dry_run": True}
    status, document = api.request("POST", QUARANTINES, body)
    assert status == 400 and "unknown field(s): dry_run" in document["error"]


def test_the_journal_limit_is_bounded_and_the_newest_entries_come_with_a_truncation_flag(
    api: Api,
) -> None:
    status, document = api.request("GET", "/api/v1/journal?since=0&limit=-1", token=None)
    assert status == 400 and "limit must be 0 to 10000" in document["error"]
    store, now = api.sim.daemon.store, api.sim.clock.now()
    for number in range(30):
        store.journal.note("note", "node", f"entry {number}", now)
    status, document = api.request("GET", "/api/v1/journal?since=1h&limit=5", token=None)
    assert status == 200 and document["truncated"] is True
    assert [e["message"] for e in document["entries"]] == [f"entry {n}" for n in range(25, 30)]
    status, document = api.request("GET", "/api/v1/journal?since=1h&limit=10000", token=None)
    assert document["truncated"] is False


def test_the_journal_window_ends_before_until(api: Api) -> None:
    store, now = api.sim.daemon.store, api.sim.clock.now()
    for number in range(10):
        store.journal.note("note", "node", f"entry {number}", now - 10 + number)
    query = f"since={now - 10!r}&until={now - 4!r}&limit=3"
    status, document = api.request("GET", f"/api/v1/journal?{query}", token=None)
    assert status == 200 and document["truncated"] is True
    assert [e["message"] for e in document["entries"]] == ["entry 3", "entry 4", "entry 5"]
    status, document = api.request("GET", "/api/v1/journal?until=tomorrow", token=None)
    assert status == 400 and document["error"].startswith("until: ")


def test_refused_writes_are_counted_but_journaled_and_logged_only_ten_a_minute(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    before = len(_refused_rows(api))
    # Escapes sent raw, as a terminal-owning client would: set the title, clear the screen.
    path = b"/api/v1/quarantines/\x1b]0;owned\x07\x1b[2J\x1b[1;31mGPU-OK\x1b[0m" + b"A" * 5000
    request = b"DELETE " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    with caplog.at_level(logging.WARNING, logger="gpuwatchd.daemon"):
        for _ in range(50):
            assert _raw(api, request).startswith(b"HTTP/1.0 401 ")
    rows = _refused_rows(api)[before:]
    assert len(rows) == 10
    assert all("\x1b" not in row and "\x07" not in row and len(row) < 400 for row in rows)
    assert "\\x1b]0;owned\\x07" in rows[0]
    logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(logged) == 10 and all("\x1b" not in line for line in logged)
    assert "gpuwatchd_api_refused_requests_total 50.0" in api.metrics()
    # A minute later the next refusal is journaled, with how many were left out.
    api.sim.clock.advance(61)
    api.request("DELETE", f"{QUARANTINES}/gpu:1", token=None)
    assert "(40 more refused in the minute before, not logged)" in _refused_rows(api)[-1]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_token_file_open_to_group_or_others_is_refused(
    api: Api, tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "api-token").chmod(mode)
    with caplog.at_level(logging.ERROR, logger="gpuwatchd.server"):
        status, _ = api.request("POST", QUARANTINES, {"subject": "gpu:1", "reason": "x"})
    assert status == 401
    assert any("refused until `chmod 600" in r.getMessage() for r in caplog.records)


def test_a_token_file_that_is_a_symlink_is_not_followed(api: Api, tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    passwd.chmod(0o600)
    os.replace(tmp_path / "api-token", tmp_path / "moved")
    (tmp_path / "api-token").symlink_to(passwd)
    body = {"subject": "gpu:1", "reason": "x"}
    assert api.request("POST", QUARANTINES, body, token="x:0:0:root:/root:/bin/bash")[0] == 401


def _small(api: Api, tmp_path: Path, **settings: Any) -> StatusServer:
    return serve(api.sim, tmp_path / "api-token", ApiConfig(**settings))


def _address(server: StatusServer) -> tuple[str, int]:
    host, port = server.server_address[:2]
    return str(host), int(port)


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True


def test_a_new_connection_takes_the_slot_of_the_one_waiting_longest_for_its_request(
    api: Api, tmp_path: Path
) -> None:
    small = _small(api, tmp_path, max_connections=3, header_timeout=600.0)
    try:
        idle = [socket.create_connection(_address(small), timeout=5) for _ in range(3)]
        wait_for(lambda: small.connections.open == 3, "three idle connections")
        connection = http.client.HTTPConnection(*_address(small), timeout=5)
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        # The oldest idle one was closed for it; the other two hang on.
        assert idle[0].recv(1) == b""
        assert [_still_open(sock) for sock in idle[1:]] == [True, True]
        assert small.connections.cut_off == 1
        for sock in idle:
            sock.close()
    finally:
        small.stop()


def test_a_trickled_request_is_cut_off_at_the_header_timeout(api: Api, tmp_path: Path) -> None:
    # Each header line restarted http.server's 30 s timeout, so headers
    # trickled every 10 s kept a slot for ever (review adversarial-2, row 220).
    timeout = 0.5
    small = _small(api, tmp_path, header_timeout=timeout)
    try:
        with socket.create_connection(_address(small), timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            sock.settimeout(0.1)
            while not _closed_while_trickling(sock):
                assert time.monotonic() - started < 20 * timeout, "still open"
            assert time.monotonic() - started >= timeout
        assert small.connections.cut_off == 1
    finally:
        small.stop()


def _closed_while_trickling(sock: socket.socket) -> bool:
    """Whether the server closed `sock` within its timeout; if not, one more
    header line is sent."""
    try:
        if sock.recv(1) == b"":
            return True
    except TimeoutError:
        pass
    except ConnectionResetError:
        return True  # closed as a header line reached it
    try:
        sock.sendall(b"X-Trickle: 1\r\n")
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


def test_when_every_connection_is_being_answered_a_new_one_waits_its_turn(
    api: Api, tmp_path: Path
) -> None:
    # Not closed unanswered, as connections over the cap were (row 219's
    # writers got no answer): it waits in the listen backlog.
    small = _small(api, tmp_path, max_connections=1, header_timeout=600.0)
    written: list[int] = []
    try:
        # A poll in progress: the write waits for the daemon's judging lock.
        with api.sim.daemon._judging:
            body = json.dumps({"subject": "gpu:1", "reason": "drill"})
            writer = threading.Thread(
                target=lambda: written.append(_post(small, body, api.secret)), daemon=True
            )
            writer.start()
            wait_for(
                lambda: small.connections.open == 1 and not small.connections._waiting,
                "the write to be answered",
            )
            waiting = http.client.HTTPConnection(*_address(small), timeout=20)
            waiting.request("GET", "/healthz")
        assert waiting.getresponse().status == 200
        writer.join(timeout=20)
        assert written == [201]
    finally:
        small.stop()


def _post(server: StatusServer, body: str, secret: str) -> int:
    connection = http.client.HTTPConnection(*_address(server), timeout=20)
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    connection.request("POST", QUARANTINES, body, headers)
    return connection.getresponse().status


def test_the_listen_backlog_is_sized_for_scrapers_and_clients(api: Api) -> None:
    assert StatusServer.request_queue_size >= 128


def test_a_client_that_vanishes_is_one_debug_line(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="gpuwatchd.server"):
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            api.server.handle_error(None, ("127.0.0.1", 5555))
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records] == [
        ("DEBUG", "127.0.0.1: connection ended: [Errno 104] Connection reset by peer", None)
    ]


WRITE_BODIES = st.dictionaries(
    st.sampled_from(["subject", "reason", "operator"]) | st.text(max_size=8),
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from(["gpu:1", "node", "nvlink:0/1", "ib:mlx5_0/1", "gpu:GPU-x"])
    | st.lists(st.integers(), max_size=3),
    max_size=4,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=WRITE_BODIES, method=st.sampled_from(["POST", "DELETE"]))
def test_any_write_body_is_answered_below_500(
    api: Api, body: dict[str, object], method: str
) -> None:
    path = QUARANTINES if method == "POST" else f"{QUARANTINES}/gpu:1"
    status, document = api.request(method, path, raw=json.dumps(body).encode())
    assert status < 500, document
    if status >= 400:
        assert isinstance(document["error"], str)


def test_a_log_line_escapes_whatever_is_not_printable_text() -> None:
    record = logging.LogRecord(
        "gpuwatchd.x", logging.WARNING, "x", 1, "subject %s", ("\x1b]0;owned\x07\u202e\x9b",), None
    )
    line = JournalFormatter(syslog_prefix=True).format(record)
    assert (
        line == '<4>level=warning logger=gpuwatchd.x msg="subject \\x1b]0;owned\\x07\\u202e\\x9b"'
    )


def test_tokens_never_reach_logs_metrics_status_or_the_journal(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"subject": "gpu:1", "reason": "fan"}
    with caplog.at_level(logging.DEBUG):
        assert api.request("POST", QUARANTINES, body)[0] == 201
        assert api.request("POST", QUARANTINES, body, token="alice-secreX")[0] == 401
        # Already quarantined: 200, the original kept.
        assert api.request("POST", QUARANTINES, body, token="bare-secret")[0] == 200
    _, status = api.request("GET", "/api/v1/status", token=None)
    journal = json.dumps([e.message for e in api.sim.daemon.store.journal.entries(limit=10_000)])
    shown = [api.metrics(), json.dumps(status), journal, caplog.text]
    for secret in ("alice-secret", "alice-secreX", "bare-secret"):
        assert not any(secret in text for text in shown), secret


def _answer(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """The status line, headers (names in lower case) and body of a raw answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (x.partition(":") for x in lines)}
    return status, headers, body


# Each request is sent whole and read whole by the server before it answers
# (a line of exactly 65537 bytes, 101 headers with no end): no unread bytes,
# so the connection ends with a FIN, not a reset that could lose the answer.
LISTENER_ERRORS = {
    "put": (b"PUT /api/v1/quarantines HTTP/1.1\r\nHost: x\r\n\r\n", 405, "PUT is not allowed"),
    "patch_metrics": (b"PATCH /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 405, "PATCH is not"),
    "one_word": (b"GARBAGE\r\n\r\n", 400, "Bad request syntax ('GARBAGE')"),
    "bad_version": (b"GET / HTTP/x.y\r\n\r\n", 400, "Bad request version ('HTTP/x.y')"),
    "http_2": (b"GET / HTTP/2.0\r\n\r\n", 505, "Invalid HTTP version (2.0)"),
    "uri_too_long": (b"GET /" + b"a" * (65537 - 5), 414, "Request-URI Too Long"),
    "header_too_long": (
        b"GET / HTTP/1.1\r\nX: " + b"a" * (65537 - 3),
        431,
        "Line too long",
    ),
    "too_many_headers": (
        b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * 101,
        431,
        "Too many headers",
    ),
}


@pytest.mark.parametrize("name", sorted(LISTENER_ERRORS))
def test_errors_the_listener_sends_itself_are_json_like_the_apis(api: Api, name: str) -> None:
    request, code, error = LISTENER_ERRORS[name]
    status, headers, body = _answer(_raw(api, request))
    assert status.split(" ", 2)[:2] == ["HTTP/1.0", str(code)], status
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body)["error"].startswith(error)


def test_a_method_a_path_does_not_serve_is_405_with_the_methods_it_does(api: Api) -> None:
    allowed = {
        "/api/v1/quarantines": "GET, HEAD, POST",
        "/api/v1/quarantines/gpu%3A1": "DELETE",
        "/metrics": "GET, HEAD",
        "/api/v1/status": "GET, HEAD",
    }
    for path, methods in allowed.items():
        for method in ("PUT", "PATCH", "OPTIONS", "TRACE"):
            request = f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            status, headers, body = _answer(_raw(api, request))
            assert status.startswith("HTTP/1.0 405 "), (method, path, status)
            assert headers["allow"] == methods, (method, path)
            assert json.loads(body) == {"error": f"{method} is not allowed here"}


def test_an_error_answer_to_head_has_no_body(api: Api) -> None:
    status, headers, body = _answer(_raw(api, b"HEAD / HTTP/1.1\r\nX: " + b"a" * (65537 - 3)))
    assert status.startswith("HTTP/1.0 431 ")
    assert headers["content-type"] == "application/json" and int(headers["content-length"]) > 0
    assert body == b""
