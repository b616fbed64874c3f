"""The Grafana dashboards: generated and committed in step, every panel titled,
described, with a unit and the templated datasource, laid out without overlap,
and every query valid PromQL over series that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_prometheus_rules import EXPORTED_METRICS, recorded_series, series_names

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
PROVISIONING = REPO / "grafana" / "provisioning"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
VARIABLES = ("datasource", "cluster", "instance", "gpu")
GRID_WIDTH = 24

# What Grafana puts in place of its built-in variables, for a query run outside it.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but the rows that group them."""
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            yield panel


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every query of the dashboard, variables included."""
    for panel in panels(dashboard):
        for target in panel["targets"]:
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["definition"]
            inner = re.fullmatch(r"label_values\((.*), \w+\)", query)
            assert inner, f"variable {variable['name']}: {query}"
            yield f"variable {variable['name']}", inner.group(1)


def substitute(expr: str, values: dict[str, str]) -> str:
    """The query as Grafana sends it, with `values` for the template variables."""
    everything = {**BUILTINS, **values}

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in everything, f"unknown variable ${name} in {expr}"
        return everything[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


# Every template variable at its "All" value.
ALL = {"cluster": ".*", "instance": ".*", "gpu": ".*"}


def test_committed_dashboards_are_what_the_script_generates() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make-dashboards"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert [path.stem for path in DASHBOARDS] == [
        "gpuwatchd-fleet",
        "gpuwatchd-interconnect",
        "gpuwatchd-node",
        "gpuwatchd-sdc",
    ]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.stem)
def test_dashboard_is_templated_by_datasource_cluster_instance_and_gpu(path: Path) -> None:
    dashboard = load(path)
    assert dashboard["uid"] == path.stem
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert tuple(variables) == VARIABLES
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in VARIABLES[1:]:
        assert variables[name]["datasource"] == DATASOURCE, name


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.stem)
def test_every_panel_is_titled_described_with_a_unit_and_the_templated_datasource(
    path: Path,
) -> None:
    for panel in panels(load(path)):
        title = panel["title"]
        assert title.strip(), panel["id"]
        assert panel["description"].strip().endswith("."), title
        assert panel["fieldConfig"]["defaults"]["unit"], title
        assert panel["datasource"] == DATASOURCE, title
        assert panel["targets"], title
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, title
            assert target["expr"].strip(), title


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.stem)
def test_panels_have_unique_ids_and_do_not_overlap(path: Path) -> None:
    dashboard = load(path)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= GRID_WIDTH, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.stem)
def test_queries_read_only_exported_or_recorded_series(path: Path) -> None:
    known = EXPORTED_METRICS | recorded_series()
    for title, expr in expressions(load(path)):
        unknown = series_names(expr) - known
        assert not unknown, f"{path.stem} / {title} reads {unknown}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses a rules file's expressions: each query becomes a record.
    rules = [
        {"record": f"dashboard:query_{index}", "expr": substitute(expr, ALL)}
        for index, (_, expr) in enumerate(
            pair for path in DASHBOARDS for pair in expressions(load(path))
        )
    ]
    rules_file = tmp_path / "dashboard-queries.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")
def test_a_gpu_whose_mismatch_counter_was_first_scraped_after_a_mismatch_is_listed(
    tmp_path: Path,
) -> None:
    # A daemon's first burst can end before Prometheus first scrapes it: the
    # counter is born at 2, and increase() alone sees nothing (stack test,
    # CI of an earlier stop). GPU 3's counter never left 0. The range is
    # BUILTINS' hour.
    sdc = load(REPO / "grafana" / "dashboards" / "gpuwatchd-sdc.json")
    queries = {title: substitute(expr, ALL) for title, expr in expressions(sdc)}
    rules = [
        {"record": "t:listed", "expr": queries["GPUs with mismatches"]},
        {"record": "t:counted", "expr": queries["GPUs with a mismatch in 24h"]},
        {"record": "t:summed", "expr": queries["Mismatches in range"]},
    ]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "t", "rules": rules}]}))
    labels = 'cluster="c1", instance="node-a", result="mismatch"'
    runs = [
        (f'gpuwatchd_canary_runs_total{{{labels}, gpu="7", canary="mma_int8"}}', "2x30"),
        (f'gpuwatchd_canary_runs_total{{{labels}, gpu="3", canary="mma_int8"}}', "0x30"),
        (f'gpuwatchd_canary_gpu_runs_total{{{labels}, gpu="7"}}', "2x30"),
        (f'gpuwatchd_canary_gpu_runs_total{{{labels}, gpu="3"}}', "0x30"),
    ]
    listed = 't:listed{canary="mma_int8", cluster="c1", gpu="7", instance="node-a"}'
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in runs],
                "promql_expr_test": [
                    {
                        "expr": "t:listed",
                        "eval_time": "20m",
                        "exp_samples": [{"labels": listed, "value": 2}],
                    },
                    {
                        "expr": "t:counted",
                        "eval_time": "20m",
                        "exp_samples": [{"labels": "t:counted", "value": 1}],
                    },
                    {
                        "expr": "t:summed",
                        "eval_time": "20m",
                        "exp_samples": [{"labels": "t:summed", "value": 2}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_provisioning_points_grafana_at_prometheus_and_the_dashboards_folder() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "gpuwatchd.yml").read_text())
    assert [source["type"] for source in datasources["datasources"]] == ["prometheus"]
    # Copied into a Grafana that has its own (first-day review N14): no clash
    # with its default, nor with the generic name and uid a site's may have.
    [source] = datasources["datasources"]
    assert source["isDefault"] is False
    assert source["name"] == source["uid"] == "gpuwatchd-prometheus"
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpuwatchd.yml").read_text())
    [provider] = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"]
