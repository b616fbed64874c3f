"""Many simulated nodes in one process (gpuwatchd.sim.fleet): each node's
daemon reads its own simulated hardware although nvidia-ml-py loads one
library per process, and each node's /metrics is served at its own path."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config
from gpuwatchd.sim.fleet import FleetServer, SimulatedFleet, read_nodes

NODES = """
nodes:
  - {name: calm-1, scenario: {node: {gpus: 2, nvlinks: 0, hcas: 0}, seed: 1}}
  - name: lost-1
    scenario:
      node: {gpus: 2, nvlinks: 0, hcas: 0}
      seed: 2
      faults: [{at: 0s, kind: gpu_lost, gpu: 1}]
  - {name: a100-1, scenario: {node: {gpus: 4, model: NVIDIA A100-SXM4-80GB, nvlinks: 0, hcas: 0}}}
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FleetServer]:
    path = tmp_path / "nodes.yaml"
    path.write_text(NODES)
    clock = FakeClock()
    with ExitStack() as stack:
        fleet = SimulatedFleet(
            read_nodes(path), tmp_path / "nodes", Config().only_sources(("nvml",)), stack, clock
        )
        server = FleetServer(("127.0.0.1", 0), fleet)
        stack.callback(server.server_close)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stack.callback(server.shutdown)
        yield server


def _get(server: FleetServer, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _gpus_up(text: str) -> dict[str, tuple[float, str]]:
    """GPU -> (gpuwatchd_gpu_up, model)."""
    return {
        sample.labels["gpu"]: (sample.value, sample.labels["model"])
        for family in text_string_to_metric_families(text)
        if family.name == "gpuwatchd_gpu_up"
        for sample in family.samples
    }


def test_the_fleet_is_not_ready_until_every_node_was_polled(server: FleetServer) -> None:
    assert _get(server, "/healthz")[0] == 503
    assert _get(server, "/nodes/calm-1/metrics")[0] == 404
    server.fleet.poll_round()
    assert _get(server, "/healthz")[0] == 200


def test_each_node_serves_its_own_hardware_at_its_own_path(server: FleetServer) -> None:
    for _ in range(3):
        server.fleet.poll_round()
    h100 = "NVIDIA H100 80GB HBM3"
    a100 = "NVIDIA A100-SXM4-80GB"
    assert _gpus_up(_get(server, "/nodes/calm-1/metrics")[1]) == {"0": (1, h100), "1": (1, h100)}
    # Lost from the start, before NVML could say what it is.
    assert _gpus_up(_get(server, "/nodes/lost-1/metrics")[1]) == {"0": (1, h100), "1": (0, "")}
    assert _gpus_up(_get(server, "/nodes/a100-1/metrics")[1]) == {
        str(gpu): (1, a100) for gpu in range(4)
    }


def test_an_unknown_node_or_path_is_not_found(server: FleetServer) -> None:
    server.fleet.poll_round()
    assert _get(server, "/nodes/nobody/metrics")[0] == 404
    assert _get(server, "/nodes/calm-1")[0] == 404


def test_a_nodes_file_with_a_repeated_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("nodes: [{name: n, scenario: calm}, {name: n, scenario: calm}]\n")
    with pytest.raises(ValueError, match="node names repeat"):
        read_nodes(path)
