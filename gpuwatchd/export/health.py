"""Health metric families, rendered fresh from a Snapshot: health states,
active findings, quarantines and the values the checks derived.

State enums are exported the node_exporter way, one series per state with 1
for the current one, so `gpuwatchd_health_state{state="quarantined"} == 1`
selects quarantined subjects and no series goes stale when a state changes.
Dry-run quarantines have a family of their own, so that rules and actions on
`gpuwatchd_quarantined` never fire for a dry run.

With `export.detail: compact`, health is one `gpuwatchd_health_state_id`
series per subject whose value is the state's code (0 healthy ... 3
quarantined), an NVLink's only while it is not healthy, and the checks'
derived values only for subjects that are not healthy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuwatchd.export.detail import flagged_of, measurement_subject, only_for
from gpuwatchd.export.held import Held, held_series
from gpuwatchd.model import Health, Measurement, Quarantine, Severity
from gpuwatchd.policy import AUTO, NODE
from gpuwatchd.snapshot import Snapshot

# `unknown` is the node's alone (every source down): a subject's series are
# the other four, the node's all five.
SUBJECT_STATES = tuple(health for health in Health if health is not Health.UNKNOWN)
STATES = tuple(health.label for health in Health)
STATE_CODES = ", ".join(f"{health.value} {health.label}" for health in Health)
# A quarantine's `reason` label: an automatic one's reason is its finding's
# fault code (a bounded set); an operator's is free text, a series for each
# wording, so the label says only whose it is (the text is in the API,
# `quarantine list` and the journal).
OPERATOR_REASON = "operator"

# Help of the gauges the checks derive; a measurement not listed here is
# exported with a generic help text rather than dropped.
MEASUREMENT_HELP = {
    "gpu_clock_drift_ratio": (
        "SM clock of a busy GPU over the median of the node's busy GPUs, over the "
        "clock check's window (1 = in step with its peers)."
    ),
    "gpu_throttle_ratio": (
        "Share of the thermal check's window the GPU spent in each throttle "
        "(violation) reason, from NVML's cumulative violation time (0-1)."
    ),
}


def families(snapshot: Snapshot) -> Iterator[Metric]:
    flagged = flagged_of(snapshot)
    if snapshot.export.compact:
        yield _health_state_id(snapshot, flagged)
        yield _node_health_state_id(snapshot)
    else:
        yield _held_health_state(snapshot)
        yield _node_health_state(snapshot)
    yield _findings(snapshot)
    live = [q for q in snapshot.quarantines if not q.dry_run]
    dry = [q for q in snapshot.quarantines if q.dry_run]
    yield _quarantines(
        "gpuwatchd_quarantined",
        "1 for each subject in quarantine, with why (the finding's code, or operator for a "
        "quarantine by hand: its words are in `gpuwatchd quarantine list`), whether policy "
        "(auto) or an operator (manual) put it there, and the finding's fault code.",
        live,
    )
    yield _quarantines(
        "gpuwatchd_quarantined_dry_run",
        "1 for each subject policy would have quarantined, had dry_run been off.",
        dry,
    )
    for family in _measurements(snapshot.measurements):
        yield only_for(family, flagged, measurement_subject) if snapshot.export.compact else family


# Four series a subject, a node's most numerous family, and health changes
# seldom: encoded again only when a subject's health changes.
_HELD_HEALTH: Held[tuple[tuple[str, Health], ...]] = Held()


def _held_health_state(snapshot: Snapshot) -> Metric:
    (family,) = _HELD_HEALTH(
        tuple(sorted(snapshot.health.items())), lambda: (_health_state(snapshot),)
    )
    return family


def _health_state(snapshot: Snapshot) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "gpuwatchd_health_state",
        "Health of each subject (node, gpu, nvlink, ib port): 1 for its current state "
        f"({', '.join(STATES)}; unknown is the node's alone), 0 for the others.",
        labels=("subject", "state"),
    )
    for subject, health in sorted(snapshot.health.items()):
        for state in Health if subject == NODE else SUBJECT_STATES:
            family.add_metric([subject, state.label], float(state is health))
    return family


def _health_state_id(snapshot: Snapshot, flagged: frozenset[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "gpuwatchd_health_state_id",
        f"Health of each subject (node, gpu, ib port; an nvlink only while it is not "
        f"healthy) as a code: {STATE_CODES}.",
        labels=("subject",),
    )
    for subject, health in sorted(snapshot.health.items()):
        # A node's NVLinks are most of its subjects; a healthy one says
        # nothing its GPU's link totals do not.
        if not subject.startswith("nvlink:") or subject in flagged:
            family.add_metric([subject], float(health.value))
    return family


def _node_health_state_id(snapshot: Snapshot) -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "gpuwatchd_node_health_state_id",
        f"Health of the node as a whole as a code: {STATE_CODES}.",
        value=float(snapshot.node_health.value),
    )


def _node_health_state(snapshot: Snapshot) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "gpuwatchd_node_health_state",
        "Health of the node as a whole: 1 for its current state, 0 for the others "
        "(unknown: every source the daemon reads is down).",
        labels=("state",),
    )
    for state in Health:
        family.add_metric([state.label], float(state is snapshot.node_health))
    return family


def _findings(snapshot: Snapshot) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "gpuwatchd_finding",
        "1 for each active finding (warn or critical) of a check on a subject, by finding code "
        "and its fault code (docs/fault-codes.md).",
        labels=("subject", "check", "severity", "code", "fault_code"),
    )
    # fault_code is one value per code: the label adds no series.
    active = {
        (f.subject, f.check, f.severity.label, f.code, f.fault_code or "")
        for f in snapshot.findings
        if f.severity is not Severity.OK
    }
    for labels in sorted(active):
        family.add_metric(list(labels), 1.0)
    return family


def _quarantines(
    name: str, documentation: str, quarantines: Iterable[Quarantine]
) -> GaugeMetricFamily:
    labels = ("subject", "reason", "source", "fault_code")
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for q in sorted(quarantines, key=lambda q: q.subject):
        reason = q.reason if q.source == AUTO else OPERATOR_REASON
        # fault_code is empty (absent to Prometheus) for a manual quarantine: no finding made it.
        family.add_metric([q.subject, reason, q.source, q.fault_code or ""], 1.0)
    return family


def _measurements(measurements: Sequence[Measurement]) -> Iterator[Metric]:
    by_name: dict[str, list[Measurement]] = defaultdict(list)
    for measurement in measurements:
        by_name[measurement.name].append(measurement)
    for name, members in sorted(by_name.items()):
        # Every series of a family has the same label names: a label one
        # measurement lacks (a GPU without a UUID) is exported empty, which
        # Prometheus reads as absent.
        label_names = list(dict.fromkeys(label for m in members for label in m.labels))
        series = {tuple(m.labels.get(label, "") for label in label_names): m.value for m in members}
        family = GaugeMetricFamily(
            f"gpuwatchd_{name}",
            MEASUREMENT_HELP.get(name, "A value derived by one of gpuwatchd's checks."),
            labels=label_names,
        )
        # The checks' values move (and many stand still) poll by poll: encoded
        # again only when one moved, as the readings' families are.
        yield held_series(family, sorted(series.items()), tuple(label_names))
