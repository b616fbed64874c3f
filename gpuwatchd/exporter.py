"""The Prometheus side: a custom collector that renders the latest Snapshot.

Metric families are built fresh on every scrape from one immutable Snapshot,
so a GPU that vanished leaves no stale series and no scrape sees half a poll.
The daemon's own instrumentation (poll duration) is a Histogram in the
daemon's own registry, not the global one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwatchd import __version__
from gpuwatchd.canary import export as canary
from gpuwatchd.checks.registry import CHECK_NAMES
from gpuwatchd.export import actions, config, gpu, health, infiniband, pcie
from gpuwatchd.snapshot import Snapshot

FamilyRenderer = Callable[[Snapshot], Iterable[Metric]]


def _daemon_families(snapshot: Snapshot) -> Iterator[Metric]:
    yield InfoMetricFamily(
        "gpuwatchd_build", "Version of gpuwatchd.", value={"version": __version__}
    )
    up = GaugeMetricFamily(
        "gpuwatchd_source_up",
        "1 when the source's last poll worked, 0 when it failed.",
        labels=("source",),
    )
    for name, ok in sorted(snapshot.source_up.items()):
        up.add_metric([name], float(ok))
    yield up
    failed = GaugeMetricFamily(
        "gpuwatchd_check_failed",
        "1 when the check raised an error in the last poll (its findings are missing), else 0.",
        labels=("check",),
    )
    for name in CHECK_NAMES:
        failed.add_metric([name], float(name in snapshot.check_errors))
    yield failed
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
    lambda snapshot: canary.families(snapshot.canary) if snapshot.canary else (),
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


def make_registry(
    current: Callable[[], Snapshot],
    renderers: tuple[FamilyRenderer, ...] = RENDERERS,
) -> tuple[CollectorRegistry, Histogram]:
    """The registry /metrics serves, and the poll-duration histogram the daemon
    observes. The agent's own cost is there too (`process_cpu_seconds_total`,
    `process_resident_memory_bytes`, open files...: client_python's
    ProcessCollector, read from /proc), so that a fleet can watch what it costs."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(current, renderers))
    ProcessCollector(registry=registry)
    poll_duration = Histogram(
        "gpuwatchd_poll_duration_seconds",
        "Time one poll of every source and check took.",
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        registry=registry,
    )
    return registry, poll_duration
