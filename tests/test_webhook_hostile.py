"""Webhook delivery against hostile receivers: one that trickles its answer a
byte at a time, and one that answers with an endless body. Neither holds the
request past its timeout nor fills memory."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

from gpuwatchd.actions.webhook import DELIVERED, RETRY, post

Serve = Callable[[socket.socket], None]


@contextlib.contextmanager
def receiver(serve: Serve) -> Iterator[str]:
    """A loopback receiver that reads one request and answers it with `serve`."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def run() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            with contextlib.suppress(OSError):
                serve(connection)
        stop.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    finally:
        thread.join(timeout=30)
        listener.close()
        assert stop.is_set(), "the receiver did not finish"


def test_a_receiver_trickling_its_answer_is_given_up_at_the_timeout() -> None:
    sent = threading.Event()

    def trickle(connection: socket.socket) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\n")
        # A header byte every 50 ms, each well inside the 0.5 s timeout, for
        # up to 200 s unless the client hangs up first.
        for _ in range(4000):
            connection.sendall(b"X")
            sent.wait(0.05)

    with receiver(trickle) as url:
        attempt = post(url, b"{}", {}, timeout=0.5, ca_file=None)
    assert attempt == type(attempt)(RETRY, "no complete answer within 500ms")


def test_an_endless_answer_body_is_not_read_to_its_end() -> None:
    written = [0]

    def flood(connection: socket.socket) -> None:
        size = 400 << 20
        connection.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = b"\0" * (1 << 20)
        while written[0] < size:
            written[0] += connection.send(chunk)

    with receiver(flood) as url:
        attempt = post(url, b"{}", {}, timeout=5, ca_file=None)
    assert attempt.result == DELIVERED
    # The client hung up after 64 KiB: the receiver got no further than what
    # the kernel's socket buffers took.
    assert written[0] < 64 << 20
