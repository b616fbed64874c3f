"""Test support for the control API: the production daemon over a simulated
node (fake clock), its StatusServer on loopback, and a client that makes
requests as any client does."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon_support import SimulatedDaemon, simulated_daemon

from gpuwatchd.config import ApiConfig
from gpuwatchd.server import StatusServer

SCENARIO = "node: {gpus: 4, nvlinks: 4, hcas: 2}\nfaults: []\n"


@dataclass
class Api:
    sim: SimulatedDaemon
    server: StatusServer
    secret: str

    @property
    def url(self) -> str:
        return self.server.url

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = "",
        raw: bytes | None = None,
        context: ssl.SSLContext | None = None,
        timeout: float = 5.0,
    ) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        token = self.secret if token == "" else token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text


def serve(sim: SimulatedDaemon, token_file: Path, api: ApiConfig | None = None) -> StatusServer:
    server = StatusServer(
        ("127.0.0.1", 0),
        sim.daemon.metrics,
        lambda: sim.daemon.snapshot,
        60.0,
        sim.clock.now,
        control=sim.daemon,
        token_file=str(token_file),
        api=api,
    )
    server.start()
    return server


@contextlib.contextmanager
def api_on(tmp_path: Path) -> Iterator[Api]:
    """The API of a daemon 20 s into a calm node, with tokens for alice and a bare one."""
    token_file = tmp_path / "api-token"
    token_file.write_text("# operators\nalice:alice-secret\nbare-secret\n")
    token_file.chmod(0o600)
    with simulated_daemon(SCENARIO, tmp_path) as sim:
        sim.run_until(20)
        server = serve(sim, token_file)
        try:
            yield Api(sim, server, "alice-secret")
        finally:
            server.stop()
