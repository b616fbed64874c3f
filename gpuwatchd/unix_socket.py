"""The path of the API's Unix socket (`api.listen: unix:PATH`): what the
daemon may bind there, replace and remove.

The daemon binds PATH when nothing is there, or when a socket nobody listens
on is (one a daemon that died left: connecting is refused), and at exit
removes only the socket it bound itself (the same device and inode).
Anything else at PATH (the live socket of another process, a regular file,
a symbolic link, a FIFO, a directory) is refused with a message and left
exactly as it was: never removed, never followed, never chmodded.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass

# How long a listening socket may take to accept the probe's connection: a
# live daemon's accept queue takes it at once, even while the daemon is busy.
PROBE_TIMEOUT_SECONDS = 2.0

_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


@dataclass(frozen=True)
class Bound:
    """The socket file a listener made: its path and what it is there."""

    path: str
    device: int
    inode: int

    def remove(self) -> bool:
        """Remove the socket if the path still names it (not a file or socket
        put there since); whether it did."""
        try:
            found = os.lstat(self.path)
        except FileNotFoundError:
            return False
        if not stat.S_ISSOCK(found.st_mode):
            return False
        if (found.st_dev, found.st_ino) != (self.device, self.inode):
            return False
        os.unlink(self.path)
        return True


def stale_socket(path: str) -> os.stat_result | None:
    """The stale socket at `path`, which binding may replace; None when
    nothing is there. OSError, naming what is there, for anything else."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(found.st_mode):
        kind = _KINDS.get(stat.S_IFMT(found.st_mode), "not a socket")
        raise OSError(errno.EEXIST, f"{path} exists and is {kind}, not a socket: left as it is")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(PROBE_TIMEOUT_SECONDS)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return found  # nobody listens: a dead daemon's
        except FileNotFoundError:
            return None  # removed meanwhile
        except OSError as error:  # a timeout, EACCES: someone may listen
            raise OSError(
                errno.EADDRINUSE,
                f"cannot tell whether another process listens on {path} "
                f"({error.strerror or error}): left as it is",
            ) from error
    raise OSError(errno.EADDRINUSE, f"another process listens on {path}: left as it is")


def bind(sock: socket.socket, path: str, mode: int) -> Bound:
    """Bind `sock` to `path`, created with `mode`, after removing a stale
    socket there; OSError, touching nothing, when anything else is there."""
    stale = stale_socket(path)
    if stale is not None:
        Bound(path, stale.st_dev, stale.st_ino).remove()
    # Created with its mode whatever the umask: no moment when others could
    # connect, and no chmod by path, which would follow a symbolic link put
    # there meanwhile.
    previous = os.umask(0o777 & ~mode)
    try:
        sock.bind(path)
    finally:
        os.umask(previous)
    made = os.lstat(path)
    return Bound(path, made.st_dev, made.st_ino)
