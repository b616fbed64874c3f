"""A listener's connections: at most `api.max_connections` open at once, and
each one's request line and headers (its TLS handshake too) within
`api.header_timeout` of its accept.

Until its request is in, a connection is worth nothing to anyone: when every
slot is taken, a new connection takes the slot of the one that has waited
longest for its request, which is closed. So idle and trickling connections
(a slowloris) cannot keep Prometheus' scrape or the CLI out: theirs send
their request at once and are answered, however many others hang on. Only
when every connection is being answered does a new one wait for the first to
end, in the kernel's listen backlog, to be answered then rather than closed
unanswered.

Why not a reserve of slots for /metrics and /healthz: what a connection asks
for is known only once its headers are in, so a reserve would be taken by
connections that send nothing, like every other slot.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# How often a listener that waits for a slot looks again whether it stops.
POLL_SECONDS = 0.1


class Connection:
    """One accepted connection and its socket (the TLS one once wrapped)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock


class Connections:
    """The slots of one listener, and the deadline of those waiting for their
    request; shared by the accept loop and the connections' threads."""

    def __init__(
        self,
        limit: int,
        header_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.header_timeout = header_timeout
        self._clock = clock
        self._changed = threading.Condition()
        self._open = 0
        # Those waiting for their request, oldest first, with when they began.
        self._waiting: dict[Connection, float] = {}
        self.cut_off = 0  # closed before their request came: too slow, or for a newer one

    @property
    def open(self) -> int:
        with self._changed:
            return self._open

    def admit(self, sock: socket.socket, stopping: Callable[[], bool]) -> Connection | None:
        """A slot for the connection `sock`: a free one, else that of the one
        waiting longest for its request; while every connection is being
        answered, it waits for one to end. None when the listener stops first."""
        with self._changed:
            while True:
                now = self._clock()
                self._expire(now)
                if self._open < self.limit:
                    break
                if self._waiting:
                    self._cut(next(iter(self._waiting)), "for a newer connection")
                    break
                if stopping():
                    return None
                self._changed.wait(POLL_SECONDS)
            self._open += 1
            connection = Connection(sock)
            self._waiting[connection] = now
            return connection

    def wrapped(self, connection: Connection, sock: socket.socket) -> bool:
        """The connection's socket is now `sock` (TLS); False when it was cut
        off meanwhile."""
        with self._changed:
            connection.sock = sock
            return connection in self._waiting

    def answering(self, connection: Connection) -> bool:
        """Its request line and headers are in: it is no longer cut off.
        False when it was cut off while they came."""
        with self._changed:
            return self._waiting.pop(connection, None) is not None

    def close(self, connection: Connection) -> None:
        """Its slot is free; called before its socket is closed, so that it
        is never shut down once its descriptor may be another's."""
        with self._changed:
            self._waiting.pop(connection, None)
            self._open -= 1
            self._changed.notify()

    def expire(self) -> None:
        """Cut off those that have not sent their request within the timeout."""
        with self._changed:
            self._expire(self._clock())

    def _expire(self, now: float) -> None:
        late = list(
            itertools.takewhile(
                lambda waiting: now - waiting[1] >= self.header_timeout, self._waiting.items()
            )
        )
        for connection, _ in late:
            self._cut(connection, f"no request within {self.header_timeout:g}s")

    def _cut(self, connection: Connection, why: str) -> None:
        del self._waiting[connection]
        self.cut_off += 1
        log.debug("connection closed before its request came: %s", why)
        # Shut down, not closed: its thread is blocked reading it, wakes to
        # the end of the stream, and closes it (after `close`).
        with contextlib.suppress(OSError):
            socket.socket.shutdown(connection.sock, socket.SHUT_RDWR)
