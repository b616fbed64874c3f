"""Fleet safety against the real Prometheus: it scrapes ten simulated
gpuwatchd targets (metrics files served by a tiny HTTP server of the test's
own) and is asked, with the default queries, whether an automatic drain may
go ahead. Under the limits it may; over the share or the rate of new drains
it may not; an unreachable Prometheus fails closed (or open, if configured)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from actions_support import fake_scontrol, free_port, wait_for

from gpuwatchd.actions.fleet import FleetSafety, FleetSafetyConfig
from gpuwatchd.actions.scheduler import SchedulerWorker
from gpuwatchd.actions.slurm import Slurm, SlurmConfig
from gpuwatchd.clock import FakeClock
from gpuwatchd.model import Health, Quarantine
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.store import Store

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus")

NODES = 10


@dataclass
class Fleet:
    """What each simulated node's /metrics says, and the Prometheus scraping them."""

    prometheus_url: str
    drained: set[int] = field(default_factory=set)

    def metrics(self, node: int) -> bytes:
        value = 1 if node in self.drained else 0
        return (
            "# TYPE gpuwatchd_scheduler_drained gauge\n"
            f'gpuwatchd_scheduler_drained{{scheduler="slurm"}} {value}\n'
        ).encode()

    def query(self, expression: str) -> list[Any]:
        url = f"{self.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
        with urllib.request.urlopen(url, timeout=5) as response:
            result: list[Any] = json.load(response)["data"]["result"]
            return result

    def drain(self, *nodes: int) -> None:
        """Mark nodes drained and wait until Prometheus has scraped it."""
        self.drained = set(nodes)
        # The very nodes, not their number: while a scrape round is half
        # done, a node drained before still counts and one just drained
        # already does.
        wanted = {f"node-{n}" for n in nodes}

        def scraped() -> bool:
            result = self.query("gpuwatchd_scheduler_drained == 1")
            return {series["metric"]["instance"] for series in result} == wanted

        wait_for(scraped, f"Prometheus to see {len(nodes)} drained nodes")


@contextlib.contextmanager
def _targets(fleet: Fleet) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = fleet.metrics(int(self.path.rsplit("/", 1)[-1]))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    fleet = Fleet(f"http://127.0.0.1:{port}")
    with _targets(fleet) as targets_port:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "gpuwatchd",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{targets_port}"],
                            "labels": {"__metrics_path__": f"/node/{n}", "instance": f"node-{n}"},
                        }
                        for n in range(NODES)
                    ],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: _nodes_up(fleet, process), "Prometheus to scrape every node")
            yield fleet
        finally:
            process.terminate()
            process.communicate(timeout=15)


def _nodes_up(fleet: Fleet, process: subprocess.Popen[str]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"prometheus exited: {process.communicate()[1][-2000:]}")
    try:
        result = fleet.query('count(up{job="gpuwatchd"} == 1)')
    except OSError:
        return False
    return bool(result) and int(float(result[0]["value"][1])) == NODES


def _safety(fleet: Fleet, **settings: Any) -> FleetSafety:
    return FleetSafety(FleetSafetyConfig(prometheus_url=fleet.prometheus_url, **settings))


def test_a_drain_goes_ahead_while_the_fleet_is_under_the_limits(fleet: Fleet) -> None:
    fleet.drain()
    verdict = _safety(fleet).check()
    assert verdict.allowed and verdict.reason == "0 of 10 nodes drained, 0 recently"


def test_a_drain_is_held_back_when_the_drained_share_is_at_the_limit(fleet: Fleet) -> None:
    fleet.drain(3)
    verdict = _safety(fleet, max_new_share=1.0).check()
    assert not verdict.allowed
    assert verdict.reason == "1 of 10 nodes drained, 1 recently: at or over the limit of 10%"


def test_a_drain_is_held_back_when_too_many_nodes_were_drained_recently(fleet: Fleet) -> None:
    fleet.drain(3)
    assert _safety(fleet, max_share=0.5, max_new_share=0.5).check().allowed
    verdict = _safety(fleet, max_share=0.5).check()
    assert not verdict.allowed and "over the limit of 5% recently" in verdict.reason


def test_an_unreachable_prometheus_fails_closed_unless_configured_open() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    closed = FleetSafety(FleetSafetyConfig(prometheus_url=url, timeout=2.0)).check()
    assert not closed.allowed and "failing closed" in closed.reason
    opened = FleetSafety(FleetSafetyConfig(prometheus_url=url, fail_open=True)).check()
    assert opened.allowed and "failing open" in opened.reason


def test_over_the_limit_the_quarantine_stands_undrained_journaled_until_the_fleet_recovers(
    fleet: Fleet, tmp_path: Path
) -> None:
    scontrol = fake_scontrol(tmp_path / "slurm")
    store = Store.open(str(tmp_path / "state"))
    config = SlurmConfig(enabled=True, node_name="node-9", scontrol=str(scontrol.path))
    slurm = SchedulerWorker(Slurm(config), _safety(fleet), store, FakeClock(), False)
    quarantine = Quarantine("node", "gpu_quarantine_ratio", "auto", 0.0)
    slurm.update(Snapshot(time=0.0, quarantines=(quarantine,), health={"node": Health.QUARANTINED}))
    fleet.drain(1, 2)
    due = slurm.run_once(0.0)
    assert scontrol.updates() == [] and slurm.findings()[0].code == "fleet_drain_withheld"
    assert any("held back by fleet safety: 2 of 10" in e.message for e in store.journal.entries())

    fleet.drain()
    assert due is not None
    slurm.run_once(due)
    assert scontrol.state["state"] == "IDLE+DRAIN" and slurm.findings() == ()
    store.close()


@pytest.mark.parametrize(
    "queries",
    [
        {"drained_query": "0/0"},  # Prometheus answers NaN
        {"nodes_query": "0/0"},
        {"nodes_query": "1/0"},  # +Inf
        {"new_drains_query": "-1/0"},
    ],
)
def test_a_nan_or_infinite_answer_cannot_answer_and_fails_closed(
    fleet: Fleet, queries: dict[str, str]
) -> None:
    fleet.drain()
    verdict = _safety(fleet, **queries).check()
    assert not verdict.allowed
    assert "not a count" in verdict.reason and "failing closed" in verdict.reason


def test_the_password_in_the_prometheus_url_is_never_shown() -> None:
    url = f"http://fleet:hunter2@127.0.0.1:{free_port()}"
    verdict = FleetSafety(FleetSafetyConfig(prometheus_url=url, timeout=2.0)).check()
    assert not verdict.allowed and "fleet:***@127.0.0.1" in verdict.reason
    assert "hunter2" not in verdict.reason
