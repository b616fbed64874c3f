"""Benchmark: one full read and render of an 8-HCA node, gpuwatchd vs node_exporter.

Usage:

    .venv/bin/python bench/bench_infiniband.py [--rounds 300]
        [--node-exporter /usr/bin/prometheus-node-exporter]

Writes the sysfs tree of a simulated HGX node (8 ConnectX-7 HCAs, one 400G
NDR port each, some minutes into a training run) to a temporary folder, then
times in the same run:

- gpuwatchd in process: `InfinibandSource.poll` plus the daemon's encoding
  (gpuwatchd.encoding, in the text format) of
  `gpuwatchd.export.infiniband.families`, and each part alone (the daemon
  reads once per poll and encodes the page once per poll), and the same
  render by prometheus_client's `generate_latest`;
- gpuwatchd over HTTP: the same collector served by prometheus_client on
  loopback, one read and render per scrape; and the daemon's own listener
  serving a held snapshot's page, encoded once and cached (as the daemon
  serves between polls);
- node_exporter over HTTP: `--collector.disable-defaults --collector.infiniband
  --path.sysfs=<tree> --web.disable-exporter-metrics` on loopback, with the
  collector's own `node_scrape_collector_duration_seconds` as well.

Prints the median and 90th percentile of each and the ratios gpuwatchd /
node_exporter (HTTP against HTTP, in process against node_exporter's
collector, whose time leaves out the encoding: "read + families" is the
like-for-like figure). bench/run.py takes its figures from `measure`.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.encoding import encode
from gpuwatchd.export.infiniband import families
from gpuwatchd.exporter import MetricsPage
from gpuwatchd.server import StatusServer
from gpuwatchd.sim.infiniband import SimulatedFabric
from gpuwatchd.sim.scenario import parse
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.sources import InfinibandSourceConfig
from gpuwatchd.sources.infiniband import InfinibandSource

SCENARIO = """
node: {gpus: 8, hcas: 8}
seed: 1
faults:
  - {at: 60s, kind: ib_symbol_errors, hca: mlx5_2, port: 1, rate: 50/s}
"""
WARMUP = 20


def snapshot_of(source: InfinibandSource) -> Snapshot:
    reading = source.poll(time.time())
    return Snapshot(
        time=reading.time,
        infiniband_devices=reading.infiniband_devices or (),
        ports=reading.ports or (),
    )


class ReadAndRender:
    """A collector that reads the tree on every collect, as node_exporter does."""

    def __init__(self, source: InfinibandSource) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        yield from families(snapshot_of(self.source))


class Held:
    """A collector that renders one snapshot, as the daemon's exporter does."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from families(self.snapshot)


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


def wait_for(url: str) -> None:
    for _ in range(200):  # up to ~10 s
        try:
            fetch(url)
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing answered at {url}")


def timed(
    rounds: int, action: Callable[[], object], clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    """`rounds` durations of `action` by `clock` (wall time unless told), after a warm-up."""
    for _ in range(WARMUP):
        action()
    durations = []
    for _ in range(rounds):
        start = clock()
        action()
        durations.append(clock() - start)
    return durations


def infiniband_series(text: str, prefix: str) -> int:
    return sum(
        len(family.samples)
        for family in text_string_to_metric_families(text)
        if family.name.startswith(prefix)
    )


def collector_seconds(text: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "node_scrape_collector_duration_seconds":
            return float(family.samples[0].value)
    raise SystemExit("node_exporter did not report its collector duration")


def summary(label: str, durations: list[float]) -> float:
    median = statistics.median(durations)
    p90 = statistics.quantiles(durations, n=10)[-1]
    print(f"{label:<46} median {median * 1e3:8.3f} ms   p90 {p90 * 1e3:8.3f} ms")
    return median


def held_page(snapshot: Snapshot) -> MetricsPage:
    """The daemon's /metrics for `snapshot` with the InfiniBand families only:
    encoded once, then served as bytes."""
    return MetricsPage(lambda: snapshot, renderers=(families,))


def measure(rounds: int, node_exporter_path: str, report: bool = True) -> dict[str, float]:
    """Medians in seconds (and series counts) of each way of reading and
    rendering the tree, side by side with node_exporter; printed when `report`."""
    show = summary if report else (lambda label, durations: statistics.median(durations))
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-bench-ib-") as directory:
        root = Path(directory)
        SimulatedFabric(parse(SCENARIO), root, 0.0).advance(600.0)
        source = InfinibandSource(InfinibandSourceConfig(sysfs_root=str(root)))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ReadAndRender(source))
        snapshot = snapshot_of(source)
        page = held_page(snapshot)
        daemon_like = StatusServer(("127.0.0.1", 0), page, lambda: snapshot, 3600.0, time.time)
        daemon_like.start()
        ours_port = free_loopback_port()
        server, thread = start_http_server(ours_port, addr="127.0.0.1", registry=registry)
        ours_url = f"http://127.0.0.1:{ours_port}/metrics"
        theirs_url = f"http://127.0.0.1:{free_loopback_port()}/metrics"
        command = [
            node_exporter_path,
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--path.sysfs={root}",
            "--web.disable-exporter-metrics",
            f"--web.listen-address={theirs_url.split('/')[2]}",
        ]
        node_exporter = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for(ours_url)
            wait_for(theirs_url)
            ours_text = generate_latest(registry).decode()
            theirs_text = fetch(theirs_url)
            figures = {
                "series": float(infiniband_series(ours_text, "gpuwatchd_infiniband_")),
                "bytes": float(len(ours_text)),
                "node_exporter_series": float(infiniband_series(theirs_text, "node_infiniband_")),
                "node_exporter_bytes": float(len(theirs_text)),
            }
            if report:
                print(
                    f"8 HCAs: gpuwatchd {figures['series']:.0f} series ({len(ours_text)} bytes), "
                    f"node_exporter {figures['node_exporter_series']:.0f} series "
                    f"({len(theirs_text)} bytes); {rounds} rounds each\n"
                )
            figures["read_render"] = show(
                "gpuwatchd read + render, in process",
                timed(rounds, lambda: encode(families(snapshot_of(source)), False)),
            )
            # The daemon reads once per poll and encodes the page once per
            # poll (cached for every scrape); these are its parts.
            figures["read"] = show(
                "  of which the read (poll)", timed(rounds, lambda: source.poll(0.0))
            )
            figures["build"] = show(
                "  of which the families (no encoding)",
                timed(rounds, lambda: families(snapshot)),
            )
            figures["render"] = show(
                "  of which the render (families + encoding)",
                timed(rounds, lambda: encode(families(snapshot), False)),
            )
            held = CollectorRegistry(auto_describe=False)
            held.register(Held(snapshot))
            figures["render_library"] = show(
                "  (the render by prometheus_client's encoder)",
                timed(rounds, lambda: generate_latest(held)),
            )
            figures["http_read_render"] = show(
                "gpuwatchd scrape over HTTP, read + render",
                timed(rounds, lambda: fetch(ours_url)),
            )
            figures["http_cached"] = show(
                "gpuwatchd scrape over HTTP, page cached per poll",
                timed(rounds, lambda: fetch(f"{daemon_like.url}/metrics")),
            )
            scrapes: list[str] = []
            figures["node_exporter_http"] = show(
                "node_exporter scrape over HTTP",
                timed(rounds, lambda: scrapes.append(fetch(theirs_url))),
            )
            figures["node_exporter_collector"] = show(
                "node_exporter infiniband collector (self-reported)",
                [collector_seconds(text) for text in scrapes[-rounds:]],
            )
        finally:
            node_exporter.terminate()
            node_exporter.wait(timeout=10)
            server.shutdown()
            thread.join(timeout=10)
            daemon_like.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="reads timed of each (default 300)")
    parser.add_argument(
        "--node-exporter",
        default="/usr/bin/prometheus-node-exporter",
        help="the node_exporter binary (default /usr/bin/prometheus-node-exporter, Debian's)",
    )
    arguments = parser.parse_args()
    figures = measure(arguments.rounds, arguments.node_exporter)
    collector = figures["node_exporter_collector"]
    print(
        f"\nratio gpuwatchd / node_exporter: HTTP scrape "
        f"{figures['http_read_render'] / figures['node_exporter_http']:.2f}x read + render per "
        f"scrape, {figures['http_cached'] / figures['node_exporter_http']:.2f}x page cached; "
        f"read + render vs collector {figures['read_render'] / collector:.2f}x, "
        f"read + families vs collector {(figures['read'] + figures['build']) / collector:.2f}x"
    )


if __name__ == "__main__":
    main()
