"""systemd's notify protocol (sd_notify) over $NOTIFY_SOCKET, without libsystemd.

The daemon sends READY=1 after its first poll, WATCHDOG=1 from the poll loop
itself (so a stuck loop stops the pings and systemd restarts the service), and
STOPPING=1 on the way out. Without $NOTIFY_SOCKET every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # An address starting with @ is in the abstract namespace.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_seconds = int(usec) / 1e6 if usec.isdigit() and mine else None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, message: str) -> None:
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall(message.encode())
        except OSError as error:
            log.warning("cannot notify systemd at %s: %s", self.address.lstrip("\0"), error)

    def ready(self, status: str) -> None:
        self.send(f"READY=1\nSTATUS={status}")

    def watchdog(self) -> None:
        if self.watchdog_seconds is not None:
            self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")
