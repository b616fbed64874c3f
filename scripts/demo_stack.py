"""The whole gpuwatchd monitoring stack on loopback: simulated nodes, the real
Prometheus with the shipped rules, the real Alertmanager with the shipped
routing, and a receiver that prints what Alertmanager sends.

    scripts/demo-stack [--base-port 19400] [--time-scale 60] [--workdir DIR]

Four simulated GPU nodes run `gpuwatchd run --simulate` (one calm, one with GPU
faults, one with NVLink and InfiniBand faults, one whose GPU corrupts canary
results; their scenario files are written under the work directory), and a
fifth target has no daemon at all. The NVLink-and-InfiniBand and the canary
nodes export `export.detail: compact`, the other two `full`: the rules and
dashboards serve both. Prometheus scrapes them every second and
evaluates config/prometheus/rules/ with every duration (`for:`, range
windows, offsets) divided by --time-scale, so that alerts meant to wait 15
minutes fire within seconds. Alertmanager runs config/alertmanager/alertmanager.yml
with its webhook and Slack receivers pointed at this process, which prints
every notification. Ctrl-C stops everything and removes the work directory
(unless --workdir was given).

Prometheus is at http://127.0.0.1:BASE, Alertmanager at BASE+1; point a Grafana
at Prometheus and load grafana/dashboards/ to see the dashboards fill.

Python 3.11 with gpuwatchd installed (run it with the project's virtual
environment's python), and the Debian packages prometheus and
prometheus-alertmanager (or the upstream binaries on PATH).

The integration test (tests/test_stack_integration.py) runs the same Stack.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, Self

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "config" / "prometheus" / "rules"
ALERTMANAGER_CONFIG = REPO / "config" / "alertmanager" / "alertmanager.yml"
CLUSTER = "demo"
# Prometheus' rules select this job.
JOB = "gpuwatchd"
SCRAPE_SECONDS = 1
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0

H100 = {"gpus": 8, "model": "NVIDIA H100 80GB HBM3", "nvlinks": 18, "hcas": 8}


@dataclass(frozen=True)
class Node:
    """A scrape target. `scenario` is a built-in scenario's name or a scenario
    document; None stands for a node whose daemon is down."""

    name: str
    scenario: str | dict[str, Any] | None
    # Its daemon's export.detail.
    detail: str = "full"


# The daemon's default canary interval, scaled like the rules' durations.
CANARY_INTERVAL_SECONDS = 600.0

NODES: tuple[Node, ...] = (
    Node("node-1", "calm"),
    Node(
        "node-2",
        {
            "node": H100,
            "seed": 2,
            "faults": [
                {"at": "1s", "kind": "thermal_throttle", "gpu": 3},
                {"at": "2s", "kind": "clock_drift", "gpu": 0, "ratio": 0.7},
                {"at": "2s", "kind": "ecc_uncorrectable", "gpu": 1},
                {"at": "2s", "kind": "ecc_sbe_storm", "gpu": 7, "rate": "50/s"},
                {"at": "2s", "kind": "row_remap_failure", "gpu": 5},
                {"at": "3s", "kind": "gpu_lost", "gpu": 6},
            ],
        },
    ),
    Node(
        "node-3",
        {
            "node": H100,
            "seed": 3,
            "faults": [
                {"at": "2s", "kind": "nvlink_crc_storm", "gpu": 5, "link": 7, "rate": "2000/s"},
                {"at": "2s", "kind": "nvlink_down", "gpu": 2, "link": 3},
                {"at": "2s", "kind": "ib_port_down", "hca": "mlx5_1", "port": 1},
                # One GPU with ECC off: the node's GPUs disagree, and the node
                # differs from its cluster (the fleet's configuration drift row).
                # Off from the start, as a mode that takes a reboot to change is:
                # the daemon reads such settings at start and then every
                # static_refresh (10 min), and the demo runs unscaled.
                {"at": "0s", "kind": "config_drift", "gpu": 4, "setting": "ecc_mode"},
                {"at": "2s", "kind": "ib_link_flap", "hca": "mlx5_2", "port": 1, "rate": "20/min"},
                {
                    "at": "2s",
                    "kind": "ib_symbol_errors",
                    "hca": "mlx5_3",
                    "port": 1,
                    "rate": "50/s",
                },
                {
                    "at": "2s",
                    "kind": "ib_congestion",
                    "hca": "mlx5_4",
                    "port": 1,
                    "rate": "800000000/s",
                },
            ],
        },
        detail="compact",
    ),
    Node(
        "node-4",
        {"node": H100, "seed": 4, "faults": [{"at": "2s", "kind": "sdc", "gpu": 7}]},
        detail="compact",
    ),
    Node("node-5", None),
)


# --- durations -------------------------------------------------------------

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_RANGE = re.compile(r"\[(\w+)(?::(\w+))?\]")
_OFFSET = re.compile(r"\boffset (\w+)")


def duration_seconds(duration: str) -> float:
    parts = _DURATION.findall(duration)
    assert "".join(n + u for n, u in parts) == duration, f"not a duration: {duration}"
    return sum(int(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def _scaled(duration: str, scale: float) -> str:
    return f"{max(1, round(duration_seconds(duration) / scale))}s"


def lookback(expr: str) -> float:
    """Seconds an expression reaches into the past: its longest range window
    (or subquery range) plus its longest offset."""
    windows = [duration_seconds(match.group(1)) for match in _RANGE.finditer(expr)]
    offsets = [duration_seconds(match.group(1)) for match in _OFFSET.finditer(expr)]
    return max(windows, default=0.0) + max(offsets, default=0.0)


def scale_rules(document: dict[str, Any], scale: float) -> dict[str, Any]:
    """The rules with `for:`, range windows, subquery steps and offsets divided by `scale`."""

    def window(match: re.Match[str]) -> str:
        step = f":{_scaled(match.group(2), scale)}" if match.group(2) else ""
        return f"[{_scaled(match.group(1), scale)}{step}]"

    for group in document["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _RANGE.sub(window, rule["expr"])
            rule["expr"] = _OFFSET.sub(
                lambda m: f"offset {_scaled(m.group(1), scale)}", rule["expr"]
            )
            if "for" in rule:
                rule["for"] = _scaled(rule["for"], scale)
    return document


# --- the receiver of Alertmanager's notifications ---------------------------


@dataclass(frozen=True)
class Notification:
    path: str  # /webhook or /slack
    document: dict[str, Any]


class Receiver(ThreadingHTTPServer):
    """Records (and, for the demo, prints) what Alertmanager posts to it."""

    daemon_threads = True

    def __init__(self, port: int, echo: Callable[[Notification], None] | None = None) -> None:
        super().__init__(("127.0.0.1", port), _ReceiverHandler)
        self.echo = echo
        self.lock = threading.Lock()
        self.notifications: list[Notification] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def record(self, notification: Notification) -> None:
        # Alertmanager posts concurrently; one at a time keeps the echo's lines whole.
        with self.lock:
            self.notifications.append(notification)
            if self.echo is not None:
                self.echo(notification)

    def received(self) -> list[Notification]:
        with self.lock:
            return list(self.notifications)


class _ReceiverHandler(BaseHTTPRequestHandler):
    server: Receiver

    def log_message(self, format: str, *args: Any) -> None:
        """Alertmanager posts often: the notifications are the log."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        document = json.loads(self.rfile.read(length) or b"{}")
        self.server.record(Notification(self.path, document))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def print_notification(notification: Notification) -> None:
    if notification.path == "/slack":
        for attachment in notification.document.get("attachments", []):
            print(f"slack {notification.document.get('channel')}: {attachment.get('title')}")
        return
    for alert in notification.document.get("alerts", []):
        labels = alert["labels"]
        where = " ".join(
            f"{key}={labels[key]}"
            for key in ("instance", "gpu", "subject", "device", "port", "link")
            if key in labels
        )
        print(f"webhook: {alert['status']:8} {labels['alertname']} {where}")


# --- the stack --------------------------------------------------------------


def binary(*names: str, package: str | None = None) -> str:
    """The first of `names` on PATH. None there is an exit that names the
    Debian package to install (`package`, the first name by default)."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    package = package or names[0]
    raise SystemExit(
        f"none of {', '.join(names)} is on PATH: install Debian's {package} package "
        f"(`apt-get install {package}` as root; ./scripts/test installs every package "
        "the stacks need)"
    )


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


# A query is given as long as Prometheus gives it (its --query.timeout): on a
# busy machine a dashboard's range query over the stack's life takes seconds.
QUERY_TIMEOUT_S = 120.0


def instant_query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query's result from the Prometheus HTTP API at `url`, now
    or at the time `at`."""
    params = urllib.parse.urlencode({"query": expr} | ({} if at is None else {"time": at}))
    answer = get_json(f"{url}/api/v1/query?{params}", QUERY_TIMEOUT_S)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


class Services(ABC):
    """Processes started with their logs under `workdir`/logs, stopped in
    reverse order of start, and the receiver of Alertmanager's notifications.
    As a context manager: the receiver and `start()` on entry, all stopped on
    exit (or when `start()` fails)."""

    def __init__(self, workdir: Path, receiver: Receiver) -> None:
        self.workdir = workdir
        self.receiver = receiver
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Self:
        threading.Thread(target=self.receiver.serve_forever, name="receiver", daemon=True).start()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @abstractmethod
    def start(self) -> None:
        """Start the stack's processes (the subclass's)."""

    def stop(self) -> None:
        self.stop_processes()
        self.receiver.shutdown()
        self.receiver.server_close()

    def stop_processes(self) -> None:
        # In reverse order of start: the scrapers stop before the nodes go.
        for process in reversed(self.processes.values()):
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)

    def spawn(self, name: str, command: Sequence[str]) -> None:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "wb") as log:
            # A session of its own: Ctrl-C reaches this script, which stops the
            # children in order, rather than every process at once.
            self.processes[name] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, waiting: dict[str, str], timeout: float = READY_TIMEOUT_S) -> None:
        """Until each process named in `waiting` answers its URL."""
        waiting = dict(waiting)
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for name, url in list(waiting.items()):
                if self.processes[name].poll() is not None:
                    log = (self.workdir / "logs" / f"{name}.log").read_text()[-2000:]
                    raise RuntimeError(f"{name} exited early:\n{log}")
                try:
                    with urllib.request.urlopen(url, timeout=2):
                        del waiting[name]
                except (urllib.error.URLError, OSError):
                    pass  # not listening yet: asked again until the timeout
            time.sleep(0.2)
        if waiting:
            raise RuntimeError(f"not ready after {timeout:g}s: {', '.join(waiting)}")

    def start_alertmanager(self, address: str, receiver_url: str) -> None:
        """The shipped routing on `address`, its receivers pointed at
        `receiver_url` (/webhook and /slack) and its waits cut to a second."""
        config: dict[str, Any] = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
        slack_url = self.workdir / "slack_api_url"
        slack_url.write_text(f"{receiver_url}/slack\n")
        config["global"]["slack_api_url_file"] = str(slack_url)
        for receiver in config["receivers"]:
            for webhook in receiver.get("webhook_configs", []):
                webhook["url"] = f"{receiver_url}/webhook"
        config["templates"] = [
            str(ALERTMANAGER_CONFIG.parent / template) for template in config["templates"]
        ]
        routes = [config["route"]]
        while routes:
            route = routes.pop()
            for timer in ("group_wait", "group_interval"):
                if timer in route:
                    route[timer] = "1s"
            routes.extend(route.get("routes", []))
        path = self.workdir / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.spawn(
            "alertmanager",
            [
                binary("prometheus-alertmanager", "alertmanager"),
                f"--config.file={path}",
                f"--storage.path={self.workdir / 'alertmanager-data'}",
                f"--web.listen-address={address}",
                # No gossip with other Alertmanagers: it would listen on every interface.
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
        )


class Stack(Services):
    """Nodes, Prometheus and Alertmanager under `workdir`, on loopback ports:
    Prometheus on `base_port`, Alertmanager +1, the receiver +2, nodes from +10."""

    def __init__(
        self,
        workdir: Path,
        base_port: int,
        time_scale: float,
        nodes: Sequence[Node] = NODES,
        echo: Callable[[Notification], None] | None = None,
    ) -> None:
        super().__init__(workdir, Receiver(base_port + 2, echo))
        self.time_scale = time_scale
        self.nodes = tuple(nodes)
        self.prometheus_url = f"http://127.0.0.1:{base_port}"
        self.alertmanager_url = f"http://127.0.0.1:{base_port + 1}"
        self.node_ports = {node.name: base_port + 10 + i for i, node in enumerate(self.nodes)}
        self.started = time.time()

    def start(self) -> None:
        for node in self.nodes:
            if node.scenario is not None:
                self._start_node(node, node.scenario)
        self.start_alertmanager(self.alertmanager_url.split("//")[1], self.receiver.url)
        self._start_prometheus()
        waiting = {
            "prometheus": f"{self.prometheus_url}/-/ready",
            "alertmanager": f"{self.alertmanager_url}/-/ready",
        }
        for node in self.nodes:
            if node.scenario is not None:
                waiting[node.name] = f"http://127.0.0.1:{self.node_ports[node.name]}/healthz"
        self.wait_ready(waiting)
        self.started = time.time()

    def _start_node(self, node: Node, scenario: str | dict[str, Any]) -> None:
        if isinstance(scenario, dict):
            path = self.workdir / "scenarios" / f"{node.name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(scenario, sort_keys=False))
            scenario = str(path)
        command = [sys.executable, "-m", "gpuwatchd", "run", "--simulate", scenario]
        command += ["--config", str(self._node_config(node))]
        command += ["--listen", f"127.0.0.1:{self.node_ports[node.name]}"]
        command += ["--state-dir", str(self.workdir / "state" / node.name)]
        command += ["--interval", f"{SCRAPE_SECONDS}s"]
        self.spawn(node.name, command)

    def _node_config(self, node: Node) -> Path:
        """A node's config: canary bursts as much sooner as the rules' durations
        (10 minutes at time scale 1), the host's cores left to the demo, and
        the node's export detail."""
        path = self.workdir / f"gpuwatchd-{node.name}.yaml"
        interval = CANARY_INTERVAL_SECONDS / self.time_scale
        config = {
            "canary": {"interval": f"{interval:g}s", "host_cores": False},
            "export": {"detail": node.detail},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _write_rules(self) -> Path:
        rules = self.workdir / "rules"
        rules.mkdir(parents=True, exist_ok=True)
        for path in sorted(RULES.glob("*.yml")):
            document = scale_rules(yaml.safe_load(path.read_text()), self.time_scale)
            (rules / path.name).write_text(yaml.safe_dump(document, sort_keys=False))
        return rules

    def _start_prometheus(self) -> None:
        targets = [
            {
                "targets": [f"127.0.0.1:{self.node_ports[node.name]}"],
                "labels": {"cluster": CLUSTER, "instance": node.name},
            }
            for node in self.nodes
        ]
        interval = f"{SCRAPE_SECONDS}s"
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(self._write_rules() / "*.yml")],
            "alerting": {
                "alertmanagers": [
                    {"static_configs": [{"targets": [self.alertmanager_url.split("//")[1]]}]}
                ]
            },
            "scrape_configs": [{"job_name": JOB, "static_configs": targets}],
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        address = self.prometheus_url.split("//")[1]
        self.spawn(
            "prometheus",
            [
                binary("prometheus"),
                f"--config.file={path}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
                f"--web.listen-address={address}",
                # Alerts reach Alertmanager as soon as they fire, and again every second.
                f"--rules.alert.resend-delay={interval}",
                "--log.level=warn",
            ],
        )

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result, now or at the time `at`."""
        return instant_query(self.prometheus_url, expr, at)

    def query_range(self, expr: str, step_seconds: float = 2.0) -> list[dict[str, Any]]:
        """A range query's result from the stack's start to now."""
        params = urllib.parse.urlencode(
            {"query": expr, "start": self.started, "end": time.time(), "step": step_seconds}
        )
        answer = get_json(f"{self.prometheus_url}/api/v1/query_range?{params}", QUERY_TIMEOUT_S)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def metric_names(self) -> set[str]:
        """The names of the daemons' series Prometheus has stored since the
        stack started (the series index, not a query of their samples)."""
        params = urllib.parse.urlencode(
            {"match[]": f'{{job="{JOB}"}}', "start": self.started, "end": time.time()}
        )
        url = f"{self.prometheus_url}/api/v1/label/__name__/values?{params}"
        return set(get_json(url, QUERY_TIMEOUT_S)["data"])


def stop_on_signal() -> threading.Event:
    """An event that SIGINT (Ctrl-C) and SIGTERM set."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=19400,
        help="Prometheus' port; Alertmanager +1, the receiver +2, nodes from +10 (default 19400)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=60.0,
        help="divide the rules' durations by this (default 60; 1 = as shipped)",
    )
    parser.add_argument("--workdir", type=Path, help="keep configs, data and logs here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpuwatchd-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stop = stop_on_signal()
    try:
        with Stack(workdir, args.base_port, args.time_scale, echo=print_notification) as stack:
            print(f"Prometheus   {stack.prometheus_url}/alerts")
            print(f"Alertmanager {stack.alertmanager_url}")
            for node in stack.nodes:
                url = f"http://127.0.0.1:{stack.node_ports[node.name]}/metrics"
                state = "simulated" if node.scenario is not None else "no daemon (down)"
                print(f"{node.name:12} {url}  {state}")
            print(f"configs and logs in {workdir}; Ctrl-C stops everything")
            stop.wait()
            print("stopping")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
