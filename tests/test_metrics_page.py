"""/metrics serves the Snapshot's page encoded once per Snapshot: a poll (or an
operator's change) replaces it, the live figures (the process's own, the poll
duration, refused API writes) move at every scrape, and what a scrape gets is
byte for byte what an uncached render of the same moment gives."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from api_support import serve
from daemon_support import simulated_daemon
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics

from gpuwatchd.config import Config
from gpuwatchd.export.detail import Detail, ExportConfig
from gpuwatchd.exporter import PRERENDER_SNAPSHOTS, RENDERERS, MetricsPage
from gpuwatchd.snapshot import Snapshot

FAULTS = """
node: {gpus: 2, nvlinks: 2, hcas: 2}
faults:
  - {at: 30s, kind: ib_symbol_errors, hca: mlx5_1, port: 1, rate: 50/s}
  - {at: 30s, kind: thermal_throttle, gpu: 1}
"""
# Faults that move series of every kind between polls: ports' and links'
# counters, a GPU's throttle, a link that goes down, AER counts.
MOVING = """
node: {gpus: 2, nvlinks: 2, hcas: 2}
faults:
  - {at: 30s, kind: ib_symbol_errors, hca: mlx5_1, port: 1, rate: 50/s}
  - {at: 30s, kind: thermal_throttle, gpu: 1}
  - {at: 20s, kind: nvlink_crc_storm, gpu: 0, link: 1, rate: 2000/s}
  - {at: 40s, kind: nvlink_down, gpu: 1, link: 0}
  - {at: 30s, kind: aer_errors, gpu: 0, severity: correctable, rate: 1/s}
"""
OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
PROMETHEUS_ACCEPT = "text/plain;version=0.0.4"
SNAPSHOT = Snapshot(time=1.0)


def fake_procfs(root: Path, cpu_ticks: int = 1234) -> str:
    """A /proc whose process figures stay put until the test moves them."""
    (root / "self" / "fd").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu 1 2 3 4\nbtime 1767225600\n")
    fields = ["S"] + ["0"] * 50
    fields[11], fields[12] = str(cpu_ticks), "10"  # utime, stime (after "pid (comm)")
    fields[19], fields[20], fields[21] = "500", "123456789", "4096"  # start, vsize, rss
    (root / "self" / "stat").write_text(f"4242 (gpuwatchd) {' '.join(fields)}\n")
    (root / "self" / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max open files            1024                 4096                 files\n"
    )
    for number in range(3):
        (root / "self" / "fd" / str(number)).touch()
    return str(root)


class Counting:
    """A family renderer that counts how often the Snapshot's page is built."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, snapshot: Snapshot) -> Iterator[Metric]:
        self.calls += 1
        yield GaugeMetricFamily("gpuwatchd_test_poll_time", "The Snapshot's time.", snapshot.time)


def test_a_scrape_is_byte_identical_to_an_uncached_render_in_either_format(
    tmp_path: Path,
) -> None:
    with simulated_daemon(FAULTS, tmp_path, canary=True) as sim:
        sim.run_until(120)
        page = MetricsPage(lambda: sim.daemon.snapshot, procfs=fake_procfs(tmp_path / "proc"))
        assert sim.daemon.snapshot.findings and sim.daemon.snapshot.canary is not None
        for _ in range(2):  # the first encodes, the second is served from the cache
            text, text_type = page.render(PROMETHEUS_ACCEPT)
            assert text == generate_latest(page.registry)
            assert text_type.startswith("text/plain")
            om, om_type = page.render(OPENMETRICS_ACCEPT)
            assert om == openmetrics.generate_latest(page.registry)
            assert om_type.startswith("application/openmetrics-text")
            assert om.count(b"# EOF\n") == 1 and om.endswith(b"# EOF\n")
        assert b"gpuwatchd_canary_runs_total" in text and b"process_cpu_seconds_total" in text


@pytest.mark.parametrize("detail", ["full", "compact"])
def test_pages_rendered_poll_after_poll_equal_renders_that_hold_nothing(
    tmp_path: Path, detail: Detail
) -> None:
    """The families and lines held from the poll before (and the samples a
    source hands back unchanged) never show a stale value: each poll's page,
    rendered after the last poll's as the daemon renders it, is byte for byte
    that Snapshot's page rendered after an empty one, which holds nothing of it."""
    procfs = fake_procfs(tmp_path / "proc")
    config = replace(Config(), export=ExportConfig(detail=detail))
    with simulated_daemon(MOVING, tmp_path, config, canary=True) as sim:
        sim.run_until(10)
        snapshots, pages = [], []
        for _ in range(6):  # across the faults' start at 30 s
            snapshot = sim.daemon.step()
            sim.clock.advance(sim.daemon.config.daemon.poll_interval)
            snapshots.append(snapshot)
            pages.append(both_formats(snapshot, procfs))
    assert pages[0] != pages[-1]
    for snapshot, rendered in zip(snapshots, pages, strict=True):
        both_formats(SNAPSHOT, procfs)
        assert rendered == both_formats(snapshot, procfs)


def both_formats(snapshot: Snapshot, procfs: str) -> tuple[bytes, ...]:
    """`snapshot`'s page in OpenMetrics and in text, less the poll duration histogram's
    creation time (each MetricsPage's own, the one line two pages differ by)."""
    created = b"gpuwatchd_poll_duration_seconds_created"
    page = MetricsPage(lambda: snapshot, procfs=procfs)
    return tuple(
        b"".join(
            line
            for line in page.render(accept)[0].splitlines(keepends=True)
            if not line.startswith(created)
        )
        for accept in (OPENMETRICS_ACCEPT, "")
    )


def test_a_poll_replaces_the_cached_page(tmp_path: Path) -> None:
    with simulated_daemon(FAULTS, tmp_path) as sim:
        sim.run_until(20)
        before, _ = sim.daemon.metrics.render("")
        sim.daemon.step()
        after, _ = sim.daemon.metrics.render("")
    last_poll = b"gpuwatchd_last_poll_timestamp_seconds "
    line_before = next(x for x in before.splitlines() if x.startswith(last_poll))
    line_after = next(x for x in after.splitlines() if x.startswith(last_poll))
    assert line_before != line_after


def test_the_snapshots_families_are_built_once_per_snapshot_and_format(tmp_path: Path) -> None:
    counting = Counting()
    current = [Snapshot(time=1.0)]
    page = MetricsPage(lambda: current[0], renderers=(counting,), procfs=str(tmp_path))
    for _ in range(3):
        page.render("")
    assert counting.calls == 1
    page.render(OPENMETRICS_ACCEPT)
    assert counting.calls == 2
    current[0] = Snapshot(time=2.0)
    body, _ = page.render("")
    assert counting.calls == 3
    assert b"gpuwatchd_test_poll_time 2.0" in body


def test_scrapes_arriving_together_wait_for_one_encoding(tmp_path: Path) -> None:
    counting = Counting()
    page = MetricsPage(lambda: SNAPSHOT, renderers=(counting,), procfs=str(tmp_path))
    start = threading.Barrier(8)
    bodies: list[bytes] = []

    def scrape() -> None:
        start.wait(timeout=10)
        bodies.append(page.render("")[0])

    threads = [threading.Thread(target=scrape) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert counting.calls == 1
    assert len(bodies) == 8 and len(set(bodies)) == 1


def test_the_process_figures_move_between_polls(tmp_path: Path) -> None:
    procfs = fake_procfs(tmp_path / "proc", cpu_ticks=100)
    page = MetricsPage(lambda: SNAPSHOT, renderers=RENDERERS, procfs=procfs)
    first, _ = page.render("")
    fake_procfs(tmp_path / "proc", cpu_ticks=300)
    second, _ = page.render("")
    assert b"process_cpu_seconds_total 1.1\n" in first
    assert b"process_cpu_seconds_total 3.1\n" in second
    assert first.split(b"# HELP process_")[0] == second.split(b"# HELP process_")[0]


def test_refused_writes_and_poll_durations_show_at_the_next_scrape(tmp_path: Path) -> None:
    with simulated_daemon(FAULTS, tmp_path) as sim:
        sim.daemon.step()
        metrics = sim.daemon.metrics
        before, _ = metrics.render("")
        sim.daemon.refused("a test's refused write")
        sim.daemon.metrics.poll_duration.observe(0.001)
        after, _ = metrics.render("")
    assert b"gpuwatchd_api_refused_requests_total 0.0" in before
    assert b"gpuwatchd_api_refused_requests_total 1.0" in after
    assert b"gpuwatchd_poll_duration_seconds_count 1.0" in before
    assert b"gpuwatchd_poll_duration_seconds_count 2.0" in after


def test_an_operators_quarantine_is_on_the_next_scrape_without_a_poll(tmp_path: Path) -> None:
    with simulated_daemon(FAULTS, tmp_path) as sim:
        sim.run_until(20)
        before, _ = sim.daemon.metrics.render("")
        sim.daemon.quarantine("gpu:0", "suspected by a test", "tester")
        after, _ = sim.daemon.metrics.render("")
    assert not quarantined(before, "gpu:0")
    assert quarantined(after, "gpu:0")


def quarantined(page: bytes, subject: str) -> bool:
    label = f'subject="{subject}"'.encode()
    return any(
        line.startswith(b"gpuwatchd_quarantined{") and label in line and line.endswith(b" 1.0")
        for line in page.splitlines()
    )


def test_a_recently_scraped_format_is_encoded_when_the_poll_ends(tmp_path: Path) -> None:
    counting = Counting()
    current = [Snapshot(time=0.0)]
    page = MetricsPage(lambda: current[0], renderers=(counting,), procfs=str(tmp_path))
    page.prerender()
    assert counting.calls == 0  # nobody scrapes: no render
    page.render(OPENMETRICS_ACCEPT)
    for poll in range(1, PRERENDER_SNAPSHOTS + 1):
        current[0] = Snapshot(time=float(poll))
        page.prerender()
        assert counting.calls == 1 + poll
        page.prerender()  # the same Snapshot: encoded already
        assert counting.calls == 1 + poll
    current[0] = Snapshot(time=99.0)
    page.prerender()  # scraped PRERENDER_SNAPSHOTS + 1 Snapshots ago: left to the next scrape
    assert counting.calls == 1 + PRERENDER_SNAPSHOTS
    body, _ = page.render(OPENMETRICS_ACCEPT)
    assert counting.calls == 2 + PRERENDER_SNAPSHOTS
    assert b"gpuwatchd_test_poll_time 99.0" in body


@pytest.mark.parametrize("accept", ["", OPENMETRICS_ACCEPT])
def test_the_listener_serves_the_cached_page(tmp_path: Path, accept: str) -> None:
    with simulated_daemon(FAULTS, tmp_path) as sim:
        sim.run_until(20)
        token = tmp_path / "token"
        token.write_text("secret\n")
        token.chmod(0o600)
        server = serve(sim, token)
        try:
            request = urllib.request.Request(f"{server.url}/metrics", headers={"Accept": accept})
            with urllib.request.urlopen(request, timeout=10) as response:
                served = response.read()
                content_type = response.headers["Content-Type"]
        finally:
            server.stop()
        expected, expected_type = sim.daemon.metrics.render(accept)
    assert content_type == expected_type
    snapshot_part = expected.split(b"# HELP process_")[0]
    assert served.startswith(snapshot_part)
