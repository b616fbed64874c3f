"""The README's series budget, checked against real scrapes: the production
daemon over simulated nodes of several shapes, in both export detail modes,
counts exactly the series the README's table says, and compact mode keeps an
8-GPU, 18-NVLink, 8-HCA node under 600."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from daemon_support import simulated_daemon
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.config import Config
from gpuwatchd.export.detail import CanaryCores, Detail, ExportConfig
from gpuwatchd.snapshot import Snapshot

README = Path(__file__).resolve().parent.parent / "README.md"
HEADER = "| series | per | full | compact |"
COMPACT_TARGET = 600


@dataclass(frozen=True)
class Shape:
    """What the README's formula counts per, read off a daemon's Snapshot."""

    gpus: int
    nvlinks: int
    ports: int
    hcas: int
    canaries: int  # C, a GPU
    gemm_canaries: int  # C_T: canaries with a TFLOP/s figure
    thread_canaries: int  # C_S: canaries whose threads record their SM
    host_canaries: int  # H
    cores: int  # T: cores with per-core canary series

    def count(self, per: str) -> int:
        busy_peers = self.gpus if self.gpus >= 3 else 0
        return {
            "node": 1,
            "GPU": self.gpus,
            "GPU with 3 busy peers": busy_peers,
            "GPU with NVLinks": self.gpus if self.nvlinks else 0,
            "NVLink": self.gpus * self.nvlinks,
            "port": self.ports,
            "HCA": self.hcas,
            "canary of a GPU": self.gpus * self.canaries,
            "GEMM canary of a GPU": self.gpus * self.gemm_canaries,
            "thread canary of a GPU": self.gpus * self.thread_canaries,
            "host canary": self.host_canaries,
            "host canary on a core": self.cores * self.host_canaries,
        }[per]


def budget_rows() -> list[tuple[str, int, int]]:
    """(per, full, compact) of each row of the README's series budget table."""
    text = README.read_text()
    table = text[text.index(HEADER) :].split("\n\n", 1)[0].splitlines()[2:]
    rows = []
    for line in table:
        _, per, full, compact = (cell.strip() for cell in line.strip("|").rsplit("|", 3))
        rows.append((per, int(full), int(compact)))
    return rows


def predicted(shape: Shape, detail: Detail) -> int:
    column = 1 if detail == "full" else 2
    return sum(shape.count(row[0]) * int(row[column]) for row in budget_rows())


def scraped_series(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def shape_of(snapshot: Snapshot, cores: int) -> Shape:
    assert snapshot.canary is not None
    planned = snapshot.canary.planned
    first_gpu = {canary for target, canary in planned if target == "gpu:0"}
    gemms = {
        canary
        for (target, canary), result in snapshot.canary.latest.items()
        if target == "gpu:0" and result.tflops is not None
    }
    threads = {
        canary
        for (target, canary), result in snapshot.canary.latest.items()
        if target == "gpu:0" and result.sm_coverage_ratio is not None
    }
    host = {canary for target, canary in planned if target.startswith("cpu:")}
    gpus = snapshot.gpus
    return Shape(
        gpus=len(gpus),
        nvlinks=len(gpus[0].nvlinks) if gpus else 0,
        ports=len(snapshot.ports),
        hcas=len(snapshot.infiniband_devices),
        canaries=len(first_gpu),
        gemm_canaries=len(gemms),
        thread_canaries=len(threads),
        host_canaries=len(host),
        cores=cores,
    )


def scrape(
    tmp_path: Path, node: str, detail: Detail, canary_cores: CanaryCores = "failed"
) -> tuple[str, Shape]:
    """A calm simulated node's /metrics after a minute, canaries and host cores on."""
    config = replace(Config(), export=ExportConfig(detail=detail, canary_cores=canary_cores))
    with simulated_daemon(
        f"node: {node}\n", tmp_path, config=config, canary=True, host_cores=True
    ) as sim:
        snapshot = sim.run_until(60)
        text = generate_latest(sim.daemon.registry).decode()
    cores = {target for target, _ in snapshot.canary.planned if target.startswith("cpu:")}  # type: ignore[union-attr]
    return text, shape_of(snapshot, len(cores) if canary_cores == "all" else 0)


SHAPES = (
    "{gpus: 1, nvlinks: 18, hcas: 8}",
    "{gpus: 8, nvlinks: 18, hcas: 8}",
    "{gpus: 16, nvlinks: 18, hcas: 8}",
    "{gpus: 4, nvlinks: 0, hcas: 0}",
    "{gpus: 2, nvlinks: 6, hcas: 3}",
)


@pytest.mark.parametrize("detail", ["full", "compact"])
@pytest.mark.parametrize("node", SHAPES)
def test_the_readme_budget_counts_every_series_of_a_calm_node(
    tmp_path: Path, node: str, detail: Detail
) -> None:
    text, shape = scrape(tmp_path, node, detail)
    assert shape.canaries and shape.gemm_canaries and shape.host_canaries
    assert scraped_series(text) == predicted(shape, detail), (shape, detail)


def test_every_core_checked_adds_its_series_when_asked_for(tmp_path: Path) -> None:
    text, shape = scrape(tmp_path, "{gpus: 2, nvlinks: 0, hcas: 1}", "compact", "all")
    assert shape.cores >= 1
    assert scraped_series(text) == predicted(shape, "compact")


def test_compact_mode_keeps_an_hgx_node_under_its_target(tmp_path: Path) -> None:
    text, _ = scrape(tmp_path, SHAPES[1], "compact")
    assert scraped_series(text) <= COMPACT_TARGET


def test_a_subject_that_is_not_healthy_gets_its_detail_in_compact_mode(tmp_path: Path) -> None:
    config = replace(Config(), export=ExportConfig(detail="compact"))
    scenario = """\
node: {gpus: 8, nvlinks: 18, hcas: 8}
faults:
  - {at: 0s, kind: nvlink_crc_storm, gpu: 5, link: 7, rate: 2000/s}
  - {at: 0s, kind: ib_symbol_errors, hca: mlx5_3, port: 1, rate: 50/s}
"""
    with simulated_daemon(scenario, tmp_path, config=config) as sim:
        sim.run_until(300)
        text = generate_latest(sim.daemon.registry).decode()
    links = re.findall(r'^gpuwatchd_nvlink_up\{gpu="(\d+)",link="(\d+)"\}', text, re.MULTILINE)
    assert links == [("5", "7")]
    assert 'gpuwatchd_health_state_id{subject="nvlink:5/7"}' in text
    hw_ports = set(
        re.findall(r'^gpuwatchd_infiniband_hw_counters_total\{[^}]*device="(\w+)"', text, re.M)
    )
    assert hw_ports == {"mlx5_3"}
    # The healthy links are still there, summed up per GPU.
    assert text.count("gpuwatchd_gpu_nvlinks_up{") == 8
