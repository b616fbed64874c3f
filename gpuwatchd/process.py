"""An external command run with a hard time limit (`scontrol`, `dcgmi`):
in its own process group, so that past the limit whatever a wrapper script
started is killed too, not only the script."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


class TimedOut(Exception):
    """The command ran past its limit and was killed, with its group."""


def run_bounded(command: Sequence[str], timeout: float) -> Finished:
    """Run `command` to its end; OSError when it cannot start, TimedOut
    (after killing its process group) when it runs past `timeout` seconds."""
    process = subprocess.Popen(
        list(command),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as error:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise TimedOut(f"did not finish within {timeout:g}s; killed") from error
    return Finished(process.returncode, stdout, stderr)
