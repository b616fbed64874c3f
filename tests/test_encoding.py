"""The daemon's encoder writes a page byte for byte as prometheus_client
does, in the text format and in OpenMetrics: on a real node's page, on
hostile names, values and help texts, and on the families it hands back to
the library (histograms, units, timestamps, `_created`)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import simulated_daemon
from prometheus_client import exposition
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from gpuwatchd.encoding import encode
from gpuwatchd.exporter import SnapshotCollector

NODE = """
node: {gpus: 2, nvlinks: 4, hcas: 2}
faults:
  - {at: 20s, kind: nvlink_crc_storm, gpu: 0, link: 1, rate: 2000/s}
  - {at: 20s, kind: ib_port_down, hca: mlx5_1, port: 1}
  - {at: 30s, kind: ecc_uncorrectable, gpu: 1}
"""
HOSTILE_VALUES = ('say "hi"', "back\\slash", "two\nlines", "", "é ü 温度", "\\n", '"')
NUMBERS = (0.0, -0.0, 1, 1.5, -2.25, 1e-300, 123456789012345678, math.inf, -math.inf, math.nan)


class Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def by_the_library(families: list[Metric], openmetrics_format: bool) -> bytes:
    if openmetrics_format:
        return openmetrics.generate_latest(Families(families)).removesuffix(b"# EOF\n")
    return exposition.generate_latest(Families(families))


def hostile_families() -> list[Metric]:
    gauge = GaugeMetricFamily(
        "gpuwatchd_test_gauge", 'Help with a \\ backslash,\na newline and "quotes".', labels=["v"]
    )
    for number, value in enumerate(HOSTILE_VALUES):
        gauge.add_metric([value], float(number))
    counter = CounterMetricFamily("gpuwatchd_test_events", "Events.", labels=["b", "a"])
    for number, value in enumerate(NUMBERS):
        counter.add_metric([f"b{number}", "a"], value)
    colon = GaugeMetricFamily("gpuwatchd:recorded:ratio", "A colon in the name.", value=0.5)
    odd_labels = GaugeMetricFamily("gpuwatchd_test_odd", "Label names.", labels=["le", "_x9"])
    odd_labels.add_metric(["0.5", "y"], 1.0)
    return [
        gauge,
        counter,
        colon,
        odd_labels,
        InfoMetricFamily("gpuwatchd_test_build", "Build.", value={"version": '1.0 "rc"'}),
        GaugeMetricFamily("gpuwatchd_test_empty", "No samples."),
        GaugeMetricFamily("gpuwatchd_test_unlabelled", "One value.", value=7),
    ]


def library_families() -> list[Metric]:
    """Families the daemon's encoder leaves to prometheus_client."""
    unit = GaugeMetricFamily("gpuwatchd_test_temperature_celsius", "T.", value=40, unit="celsius")
    created = CounterMetricFamily("gpuwatchd_test_created", "C.", value=3, created=1700000000.0)
    stamped = GaugeMetricFamily("gpuwatchd_test_stamped", "S.", labels=["x"])
    stamped.add_metric(["y"], 1.0, timestamp=1700000000.5)
    histogram = HistogramMetricFamily(
        "gpuwatchd_test_seconds", "H.", buckets=[("0.1", 1), ("+Inf", 3)], sum_value=0.7
    )
    states = StateSetMetricFamily("gpuwatchd_test_state", "S.", value={"a": True, "b": False})
    summary = SummaryMetricFamily("gpuwatchd_test_summary", "Q.", count_value=2, sum_value=1.0)
    unknown = UnknownMetricFamily("gpuwatchd_test_unknown", "U.", value=1)
    return [unit, created, stamped, histogram, states, summary, unknown]


@pytest.mark.parametrize("openmetrics_format", [False, True], ids=["text", "openmetrics"])
def test_a_real_nodes_page_is_encoded_as_the_library_encodes_it(
    tmp_path: Path, openmetrics_format: bool
) -> None:
    with simulated_daemon(NODE, tmp_path, canary=True) as sim:
        snapshot = sim.run_until(120)
    assert snapshot.findings and snapshot.quarantines
    families = list(SnapshotCollector(lambda: snapshot).collect())
    expected = by_the_library(families, openmetrics_format)
    assert encode(families, openmetrics_format) == expected


@pytest.mark.parametrize("openmetrics_format", [False, True], ids=["text", "openmetrics"])
def test_hostile_names_values_and_help_are_escaped_as_the_library_escapes_them(
    openmetrics_format: bool,
) -> None:
    families = hostile_families()
    assert encode(families, openmetrics_format) == by_the_library(families, openmetrics_format)


@pytest.mark.parametrize("openmetrics_format", [False, True], ids=["text", "openmetrics"])
def test_families_it_does_not_handle_are_left_to_the_library(openmetrics_format: bool) -> None:
    families = [*library_families(), *hostile_families()]
    assert encode(families, openmetrics_format) == by_the_library(families, openmetrics_format)
