"""The Prometheus side: a custom collector that renders the latest Snapshot,
and the page /metrics serves.

Metric families are built fresh from one immutable Snapshot, so a GPU that
vanished leaves no stale series and no scrape sees half a poll. The daemon's
own instrumentation (poll duration, refused API writes) and the process's
own figures are live collectors in a registry of their own, not the global one.

A Snapshot changes only when the daemon publishes a new one (after a poll, or
an operator's quarantine or release), so `MetricsPage` encodes its families
once per Snapshot and format and serves those bytes to every scrape until the
next one; only the live collectors are encoded at each scrape. Everything a
scrape shows from the Snapshot (canary results included: they are collected
into the Snapshot at the poll) is therefore what an uncached render shows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import (
    CONTENT_TYPE_LATEST,
    CONTENT_TYPE_PLAIN_0_0_4,
    choose_encoder,
)
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_LATEST
from prometheus_client.openmetrics.exposition import UNDERSCORES
from prometheus_client.registry import Collector

from gpuwatchd import __version__, version
from gpuwatchd.canary import export as canary
from gpuwatchd.checks.registry import CHECK_NAMES
from gpuwatchd.encoding import encode
from gpuwatchd.export import actions, config, gpu, health, infiniband, pcie
from gpuwatchd.export.detail import flagged_of
from gpuwatchd.export.held import held_series
from gpuwatchd.snapshot import Snapshot

FamilyRenderer = Callable[[Snapshot], Iterable[Metric]]


def _daemon_families(snapshot: Snapshot) -> Iterator[Metric]:
    yield InfoMetricFamily(
        "gpuwatchd_build",
        "Version of gpuwatchd, and the build it is (package, git commit), as --version says.",
        value={"version": __version__, "build": version.build()},
    )
    up = GaugeMetricFamily(
        "gpuwatchd_source_up",
        "1 when the source's last poll worked, 0 when it failed.",
        labels=("source",),
    )
    yield held_series(up, [((name,), float(ok)) for name, ok in sorted(snapshot.source_up.items())])
    failed = GaugeMetricFamily(
        "gpuwatchd_check_failed",
        "1 when the check raised an error in the last poll (its findings are missing), else 0.",
        labels=("check",),
    )
    yield held_series(
        failed, [((name,), float(name in snapshot.check_errors)) for name in CHECK_NAMES]
    )
    yield GaugeMetricFamily(
        "gpuwatchd_last_poll_timestamp_seconds",
        "When the daemon last finished a poll, in seconds since the epoch.",
        value=snapshot.time,
    )
    yield GaugeMetricFamily(
        "gpuwatchd_state_persisted",
        "1 while decisions and the journal are written to the state database, 0 when not.",
        value=float(snapshot.state_persisted),
    )


RENDERERS: tuple[FamilyRenderer, ...] = (
    _daemon_families,
    gpu.families,
    config.families,
    infiniband.families,
    pcie.families,
    health.families,
    actions.families,
    lambda snapshot: (
        canary.families(snapshot.canary, snapshot.export, flagged_of(snapshot))
        if snapshot.canary
        else ()
    ),
)


class SnapshotCollector(Collector):
    def __init__(
        self,
        current: Callable[[], Snapshot],
        renderers: tuple[FamilyRenderer, ...] = RENDERERS,
    ) -> None:
        self._current = current
        self._renderers = renderers

    def collect(self) -> Iterator[Metric]:
        snapshot = self._current()
        for render in self._renderers:
            # A family with no samples says nothing: absent readings are absent series.
            yield from (family for family in render(snapshot) if family.samples)


Encoder = Callable[[Collector], bytes]

# The OpenMetrics encoder closes the page with this line; the Snapshot's part
# is cached without it, and the live part, encoded last, brings it (a text
# format page has no such line: nothing to remove).
OPENMETRICS_EOF = b"# EOF\n"
# The formats gpuwatchd.encoding writes as prometheus_client would (by content
# type, as choose_encoder names them: underscore escaping, OpenMetrics 1.0.0):
# True for OpenMetrics. Any other is left to prometheus_client's encoder.
LEAN_FORMATS = {
    CONTENT_TYPE_PLAIN_0_0_4: False,
    f"{CONTENT_TYPE_LATEST}; escaping={UNDERSCORES}": False,
    OPENMETRICS_LATEST: True,
    f"{OPENMETRICS_LATEST}; escaping={UNDERSCORES}": True,
}
# A format scraped within this many Snapshots is encoded as soon as the next
# one is published (prerender), so that its scrape only sends bytes: Prometheus
# scraping every 30 s a daemon polling every 10 s still finds its page ready,
# while a format asked for once (a curl) stops costing a render per poll.
PRERENDER_SNAPSHOTS = 3


class _Live(Collector):
    """The live registry's collectors, as one collector of the whole page."""

    def __init__(self, live: CollectorRegistry) -> None:
        self._live = live

    def collect(self) -> Iterator[Metric]:
        yield from self._live.collect()


class MetricsPage:
    """What /metrics serves: the Snapshot's families, encoded once per
    Snapshot and format, then the live collectors, encoded at every scrape.

    `registry` is the same page uncached (what `generate_latest` renders);
    `live` holds the collectors whose values move between Snapshots: the
    process's CPU, memory and open files (client_python's ProcessCollector,
    read from /proc, so that a fleet can watch what the agent costs) and
    whatever the daemon instruments itself with (`poll_duration`). `procfs`
    is the /proc the process figures are read from."""

    def __init__(
        self,
        current: Callable[[], Snapshot],
        renderers: tuple[FamilyRenderer, ...] = RENDERERS,
        procfs: str = "/proc",
    ) -> None:
        self._current = current
        self._renderers = renderers
        self.live = CollectorRegistry(auto_describe=False)
        ProcessCollector(proc=procfs, registry=self.live)
        self.poll_duration = Histogram(
            "gpuwatchd_poll_duration_seconds",
            "Time one poll of every source and check took.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.live,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(current, renderers))
        self.registry.register(_Live(self.live))
        # Held while a Snapshot is encoded, so that scrapes arriving together
        # wait for one encoding instead of each making its own.
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._generation = 0  # Snapshots seen
        self._encoded: dict[str, bytes] = {}  # content type -> the Snapshot's part
        # Content type -> its encoder and the generation it was last asked for in.
        self._asked: dict[str, tuple[Encoder, int]] = {}

    def render(self, accept: str) -> tuple[bytes, str]:
        """The page in the format `accept` (an Accept header) asks for, and its content type."""
        encoder, content_type = choose_encoder(accept)
        with self._lock:
            snapshot, generation = self._refresh()
            self._asked[content_type] = (encoder, generation)
            held = self._held(snapshot, encoder, content_type)
        return held + self._live_part(encoder, content_type), content_type

    def _live_part(self, encoder: Encoder, content_type: str) -> bytes:
        """The live collectors' part of the page, which closes it."""
        openmetrics_format = LEAN_FORMATS.get(content_type)
        if openmetrics_format is None:
            return encoder(self.live)
        live = encode(self.live.collect(), openmetrics_format)
        return live + OPENMETRICS_EOF if openmetrics_format else live

    def prerender(self) -> None:
        """Encode the current Snapshot in the formats scraped lately, so that
        their next scrape costs no render: the daemon calls this after a poll."""
        with self._lock:
            snapshot, generation = self._refresh()
            for content_type, (encoder, asked) in list(self._asked.items()):
                if generation - asked > PRERENDER_SNAPSHOTS:
                    del self._asked[content_type]
                else:
                    self._held(snapshot, encoder, content_type)

    def _refresh(self) -> tuple[Snapshot, int]:
        """The current Snapshot and its generation; the encodings of one no
        longer current are forgotten."""
        snapshot = self._current()
        if snapshot is not self._snapshot:
            self._snapshot, self._encoded = snapshot, {}
            self._generation += 1
        return snapshot, self._generation

    def _held(self, snapshot: Snapshot, encoder: Encoder, content_type: str) -> bytes:
        body = self._encoded.get(content_type)
        if body is None:
            collector = SnapshotCollector(lambda: snapshot, self._renderers)
            openmetrics_format = LEAN_FORMATS.get(content_type)
            if openmetrics_format is not None:
                body = encode(collector.collect(), openmetrics_format)
            else:
                body = encoder(collector).removesuffix(OPENMETRICS_EOF)
            self._encoded[content_type] = body
        return body
