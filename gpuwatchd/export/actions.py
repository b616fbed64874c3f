"""Metric families of the actions, rendered from a Snapshot: webhook
deliveries and outboxes, and whether the scheduler holds the node out.

Deliveries are counted since the daemon started (a counter that restarts at
0, as Prometheus expects); the outbox gauges read the state database, so they
survive restarts. `gpuwatchd_scheduler_drained` is what fleet safety counts
across the fleet.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwatchd.snapshot import Snapshot


def families(snapshot: Snapshot) -> Iterator[Metric]:
    deliveries = CounterMetricFamily(
        "gpuwatchd_webhook_deliveries",
        "Webhook delivery attempts since the daemon started, by result: delivered, retry "
        "(failed, tried again later) or dead_letter (given up on).",
        labels=("webhook", "result"),
    )
    pending = GaugeMetricFamily(
        "gpuwatchd_webhook_outbox_pending",
        "Events waiting in a webhook's outbox to be delivered, in order.",
        labels=("webhook",),
    )
    dead = GaugeMetricFamily(
        "gpuwatchd_webhook_dead_letters",
        "Events a webhook gave up on (refused with a 4xx, or failing too long), kept for "
        "`gpuwatchd status`.",
        labels=("webhook",),
    )
    for webhook in snapshot.webhooks:
        deliveries.add_metric([webhook.name, "delivered"], webhook.delivered)
        deliveries.add_metric([webhook.name, "retry"], webhook.retried)
        deliveries.add_metric([webhook.name, "dead_letter"], webhook.dead_lettered)
        pending.add_metric([webhook.name], webhook.pending)
        dead.add_metric([webhook.name], webhook.dead_letters)
    yield deliveries
    yield pending
    yield dead
    drained = GaugeMetricFamily(
        "gpuwatchd_scheduler_drained",
        "1 while gpuwatchd holds the node out of the scheduler (its Slurm drain, its "
        "Kubernetes taint), 0 when not.",
        labels=("scheduler",),
    )
    withheld = GaugeMetricFamily(
        "gpuwatchd_scheduler_drain_withheld",
        "1 while fleet safety holds back a drain the node's quarantines want, 0 when not.",
        labels=("scheduler",),
    )
    for scheduler in snapshot.schedulers:
        drained.add_metric([scheduler.name], float(scheduler.drained))
        withheld.add_metric([scheduler.name], float(scheduler.withheld is not None))
    yield drained
    yield withheld
