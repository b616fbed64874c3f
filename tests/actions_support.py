"""Test support for the actions: a webhook receiver, a fake `scontrol`, and a
real `gpuwatchd run` process on loopback.

Everything listens on 127.0.0.1 and every wait is bounded; faults are
switched by the test (a receiver's mode, the fake scontrol's state file),
never waited for by sleeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_range(count: int) -> int:
    """A port P such that P..P+count-1 are free on loopback now."""
    for _ in range(50):
        base = random.randrange(20000, 60000)
        with contextlib.ExitStack() as probes:
            try:
                for port in range(base, base + count):
                    probes.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise AssertionError("no free range of loopback ports")


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll `condition` until it returns something true; its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A webhook receiver. `mode`: ok (200), fail (500), reject (400),
    slow (holds the request until `release` is set, then 503, recording
    nothing), or any status number. `received` holds what was accepted;
    `attempts` every request."""

    server: ThreadingHTTPServer
    mode: str | int = "ok"
    received: list[Request] = field(default_factory=list)
    attempts: list[Request] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def payloads(self) -> list[Any]:
        return [request.json() for request in self.received]


@contextlib.contextmanager
def receiver(port: int = 0) -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            request = Request(self.path, dict(self.headers.items()), self.rfile.read(length))
            state.attempts.append(request)
            mode = state.mode
            if mode == "slow":
                state.release.wait(10)
                status = 503
            elif mode == "ok":
                state.received.append(request)
                status = 200
            else:
                status = {"fail": 500, "reject": 400}.get(str(mode), mode)
            self.send_response(int(status))
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    state = Receiver(server)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


FAKE_SCONTROL = '''#!{python}
"""A fake scontrol: answers `show node` from {state} and records every call."""
import json, os, sys, time
state_path, calls_path = {state!r}, {calls!r}
with open(state_path) as handle:
    state = json.load(handle)
with open(calls_path, "a") as handle:
    handle.write(json.dumps(sys.argv[1:]) + "\\n")
if state.get("hang"):
    time.sleep(30)
if state.get("hang_in_child"):
    # A wrapper script whose child holds the pipes: killing the script alone
    # would leave the child running and the pipes open.
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with open(state_path + ".child", "w") as handle:
        handle.write(str(child.pid))
    child.wait()
if state.get("fail"):
    print("slurm_update error: Unable to contact slurm controller", file=sys.stderr)
    sys.exit(1)
if sys.argv[1:3] == ["show", "node"]:
    print(f"NodeName={{sys.argv[3]}} Arch=x86_64 CoresPerSocket=48")
    print(f"   State={{state['state']}} ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A")
    print("   OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1")
    if state.get("comment"):
        print(f"   Comment={{state['comment']}}")
    if state.get("reason"):
        print(f"   Reason={{state['reason']}} [root@2026-01-01T00:00:00]")
    sys.exit(0)
if sys.argv[1] == "update":
    fields = dict(arg.split("=", 1) for arg in sys.argv[2:])
    if fields.get("State") == "DRAIN":
        state["state"] = state["state"].split("+")[0] + "+DRAIN"
        state["reason"] = fields["Reason"]
    elif fields.get("State") == "RESUME":
        state["state"] = state["state"].split("+")[0]
        state["reason"] = ""
    if "Comment" in fields:
        state["comment"] = fields["Comment"]
    # Written whole, then renamed: the test reads the state while the daemon
    # runs this, and must never see a half-written file.
    with open(state_path + ".new", "w") as handle:
        json.dump(state, handle)
    os.replace(state_path + ".new", state_path)
'''


@dataclass
class FakeScontrol:
    path: Path
    state_path: Path
    calls_path: Path

    @property
    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.state_path.read_text())
        return state

    def set(self, **changes: Any) -> None:
        staged = self.state_path.with_name(self.state_path.name + ".set")
        staged.write_text(json.dumps({**self.state, **changes}))
        staged.replace(self.state_path)

    def calls(self) -> list[list[str]]:
        if not self.calls_path.exists():
            return []
        return [json.loads(line) for line in self.calls_path.read_text().splitlines()]

    def updates(self) -> list[list[str]]:
        return [call for call in self.calls() if call[0] == "update"]


def fake_scontrol(directory: Path, state: str = "IDLE", reason: str = "") -> FakeScontrol:
    directory.mkdir(parents=True, exist_ok=True)
    fake = FakeScontrol(directory / "scontrol", directory / "node.json", directory / "calls.log")
    fake.state_path.write_text(json.dumps({"state": state, "reason": reason, "comment": ""}))
    fake.path.write_text(
        FAKE_SCONTROL.format(
            python=sys.executable, state=str(fake.state_path), calls=str(fake.calls_path)
        )
    )
    fake.path.chmod(0o755)
    return fake


@dataclass
class DaemonProcess:
    process: subprocess.Popen[str]
    url: str
    config_path: Path
    state_dir: Path

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def stop(self) -> str:
        """SIGTERM, and the daemon's log."""
        if self.process.poll() is None:
            self.process.terminate()
        _, stderr = self.process.communicate(timeout=15)
        return stderr


def write_config(path: Path, state_dir: Path, port: int, extra: dict[str, Any]) -> Path:
    document = {"daemon": {"listen": f"127.0.0.1:{port}", "state_dir": str(state_dir)}, **extra}
    path.write_text(yaml.safe_dump(document))
    return path


@contextlib.contextmanager
def daemon_process(
    config_path: Path,
    simulate: str = "calm",
    interval: str = "200ms",
    descriptors: int | None = None,
) -> Iterator[DaemonProcess]:
    """`gpuwatchd run --simulate` with a config, and at most `descriptors`
    open files when given; yields once it has polled."""

    def limit() -> None:
        if descriptors is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    config = yaml.safe_load(config_path.read_text())
    url = f"http://{config['daemon']['listen']}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwatchd",
            "run",
            "--config",
            str(config_path),
            "--simulate",
            simulate,
            "--interval",
            interval,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=limit,
    )
    running = DaemonProcess(process, url, config_path, Path(config["daemon"]["state_dir"]))
    try:
        wait_for(lambda: _polled(running), "the daemon's first poll")
        yield running
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=15)


def _polled(running: DaemonProcess) -> bool:
    if running.process.poll() is not None:
        raise AssertionError(f"daemon exited: {running.process.communicate()[1]}")
    return answers(f"{running.url}/healthz")


def answers(url: str) -> bool:
    """Whether `url` answers 200 now (/healthz: once the daemon has polled)."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False
