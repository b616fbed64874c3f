"""Many simulated nodes in one process, for a fleet's monitoring stack on one
small machine (scripts/fleet-stack).

    python -m gpuwatchd.sim.fleet NODES.yaml --listen 127.0.0.1:PORT
        [--interval 10s] [--state-dir DIR] [--duration 10m] [--source nvml ...]

NODES.yaml lists the nodes, each a name and a scenario (a built-in name, or a
scenario document as `gpuwatchd run --simulate` reads from a file):

    nodes:
      - {name: node-001, scenario: calm}
      - {name: node-002, scenario: {node: {gpus: 8}, faults: [{at: 2s, kind: gpu_lost, gpu: 1}]}}

Each node is the production daemon (its sources, checks, policy and state
database) over its own simulated node (fake libnvidia-ml under nvidia-ml-py,
an InfiniBand sysfs tree). nvidia-ml-py loads one library per process, so the
nodes poll in turn, each with its own fake library installed for its poll;
one round polls every node, and a round starts every --interval (at once when
the last one took longer). After its poll a node's /metrics is rendered once
and served as bytes at http://LISTEN/nodes/NAME/metrics until its next poll,
so that a fleet's scrapes cost no renders. The clock is the real one: the
scrapers stamp samples with the wall clock, and the daemons' windows must
agree with theirs.

/healthz answers 200 once every node has been polled. The process stops by
itself after --duration, or on SIGTERM or SIGINT. Canaries are left out (a
burst per GPU per node would cost more CPU than the whole fleet's polls).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpuwatchd.assemble import build_sources, simulate
from gpuwatchd.clock import Clock, SystemClock
from gpuwatchd.config import Config, parse_listen
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.units import parse_duration

log = logging.getLogger(__name__)

METRICS_PATH = "/nodes/{name}/metrics"


@dataclass(frozen=True)
class FleetNode:
    name: str
    scenario: scenarios.Scenario


def read_nodes(path: Path) -> tuple[FleetNode, ...]:
    """The nodes of a NODES.yaml file (see the module's docstring)."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    nodes = []
    for position, entry in enumerate(document["nodes"]):
        name, scenario = entry["name"], entry["scenario"]
        if not isinstance(name, str) or "/" in name:
            raise ValueError(f"{path}: node {position + 1}: a name without `/`, got {name!r}")
        if isinstance(scenario, str):
            nodes.append(FleetNode(name, scenarios.load(scenario)))
        else:
            nodes.append(FleetNode(name, scenarios.parse(yaml.safe_dump(scenario), name)))
    if len({node.name for node in nodes}) != len(nodes):
        raise ValueError(f"{path}: node names repeat")
    return tuple(nodes)


class _Member:
    """One node: its simulated hardware and the daemon that watches it."""

    def __init__(
        self, node: FleetNode, config: Config, clock: Clock, root: Path, stack: ExitStack
    ) -> None:
        state = root / node.name
        config = replace(config, daemon=replace(config.daemon, state_dir=str(state / "state")))
        self.config, self.hardware = simulate(config, clock, node.scenario, state / "sysfs")
        try:
            # NVML starts (nvmlInit, XID registration) against this node's library.
            sources = build_sources(self.config, clock, xid_thread=False)
        finally:
            self.hardware.uninstall()
        self.daemon = Daemon(
            self.config,
            sources,
            clock,
            before_poll=self.hardware.advance,
            boot_id_path=str(self.hardware.boot_id_path),
        )
        stack.callback(self._close)
        self.body = b""

    def poll(self) -> None:
        with self.hardware.nvml:
            self.daemon.step()
        self.body = generate_latest(self.daemon.registry)

    def _close(self) -> None:
        with self.hardware.nvml:
            self.daemon.close()


class SimulatedFleet:
    """`nodes` as daemons under `root` (one directory each), polled by `poll_round`."""

    def __init__(
        self,
        nodes: Sequence[FleetNode],
        root: Path,
        config: Config,
        stack: ExitStack,
        clock: Clock | None = None,
    ) -> None:
        clock = clock or SystemClock()
        self.members = {node.name: _Member(node, config, clock, root, stack) for node in nodes}
        self.rounds = 0

    def poll_round(self) -> None:
        for member in self.members.values():
            member.poll()
        self.rounds += 1

    def body(self, name: str) -> bytes | None:
        member = self.members.get(name)
        return member.body if member is not None and self.rounds else None


class FleetServer(ThreadingHTTPServer):
    daemon_threads = True
    # Two scrapers open a connection per target each interval.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], fleet: SimulatedFleet) -> None:
        super().__init__(address, _Handler)
        self.fleet = fleet


class _Handler(BaseHTTPRequestHandler):
    server: FleetServer

    def log_message(self, format: str, *args: Any) -> None:
        """Every scrape would be a line."""

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if parts == ["healthz"]:
            ready = self.server.fleet.rounds > 0
            self._send(200 if ready else 503, b"ok\n" if ready else b"polling\n", "text/plain")
            return
        if len(parts) == 3 and parts[0] == "nodes" and parts[2] == "metrics":
            body = self.server.fleet.body(parts[1])
            if body is not None:
                self._send(200, body, CONTENT_TYPE_LATEST)
                return
        self._send(404, b"no such node or path\n", "text/plain")


def run(
    fleet: SimulatedFleet,
    interval: float,
    stop: threading.Event,
    deadline: float,
    on_round: Callable[[float], None] | None = None,
) -> None:
    """Poll rounds every `interval` until `stop` or the monotonic `deadline`."""
    while not stop.is_set() and time.monotonic() < deadline:
        started = time.monotonic()
        fleet.poll_round()
        took = time.monotonic() - started
        if on_round is not None:
            on_round(took)
        stop.wait(max(0.0, min(interval - took, deadline - time.monotonic())))


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("nodes", type=Path, help="the NODES.yaml file")
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve /nodes/NAME/metrics")
    parser.add_argument("--interval", default="10s", help="one round of polls this often")
    parser.add_argument("--state-dir", type=Path, required=True, help="the nodes' directories")
    parser.add_argument("--duration", default="1h", help="stop by itself after this long")
    parser.add_argument(
        "--source",
        action="append",
        choices=("nvml", "infiniband"),
        help="sources the daemons poll (default: both)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    host, port = parse_listen(args.listen)
    interval, duration = parse_duration(args.interval), parse_duration(args.duration)
    config = Config().only_sources(tuple(args.source or ("nvml", "infiniband")))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with ExitStack() as stack:
        fleet = SimulatedFleet(read_nodes(args.nodes), args.state_dir, config, stack)
        server = FleetServer((host, port), fleet)
        stack.callback(server.server_close)
        threading.Thread(target=server.serve_forever, name="fleet-http", daemon=True).start()
        stack.callback(server.shutdown)
        print(f"{len(fleet.members)} nodes at http://{host}:{port}/nodes/NAME/metrics", flush=True)

        def on_round(took: float) -> None:
            # The stack's measurements read these lines: a round's cost per node.
            print(f"round {fleet.rounds}: {took:.2f}s", flush=True)

        run(fleet, interval, stop, time.monotonic() + duration, on_round)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
