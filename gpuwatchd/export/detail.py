"""How much /metrics says: `export.detail` (full or compact) and
`export.canary_cores`, and which subjects get their detailed series.

`full` exports every series of every subject. `compact` keeps per subject
what says whether it is healthy and what the shipped alerts read on a healthy
node (per-GPU NVLink totals, each port's state and its alerted counters,
health as one code per subject), and exports the rest (per-link, per-counter,
per-reason and per-canary series, static facts, the checks' derived values)
only for subjects that are not healthy or have an active finding: a subject
gets its detail from the poll on which its checks first see something, which
the node's own checks judge sooner than a central rule would.

The host's CPU canaries are summarised in both modes; per-core series are for
the cores that had a run other than a pass, or for every core with
`canary_cores: all` (20 series a logical CPU: 4,480 on a 224-thread host).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from gpuwatchd.model import Finding, Health, Severity, port_subject

if TYPE_CHECKING:  # gpuwatchd.snapshot imports ExportConfig from here
    from gpuwatchd.snapshot import Snapshot

Detail = Literal["full", "compact"]
CanaryCores = Literal["failed", "all"]


@dataclass(frozen=True)
class ExportConfig:
    # full: every series (the budget in the README's Metrics section); compact:
    # per-link, per-counter and per-canary detail only for subjects that are
    # not healthy, health as one code per subject.
    detail: Detail = "full"
    # Per-core host canary counters for the cores that failed a run, or for
    # every core checked; the host-wide summary is exported either way.
    canary_cores: CanaryCores = "failed"

    @property
    def compact(self) -> bool:
        return self.detail == "compact"


def troubled(health: Mapping[str, Health], findings: Collection[Finding]) -> frozenset[str]:
    """Subjects that are not healthy or have an active (warn or critical) finding."""
    flagged = {subject for subject, state in health.items() if state is not Health.HEALTHY}
    flagged.update(f.subject for f in findings if f.severity is not Severity.OK)
    return frozenset(flagged)


class _FlaggedOf:
    """`troubled` of a Snapshot's health and findings, kept for the last
    Snapshot: every exporter module of a render asks for it, and a Snapshot
    never changes (the reference held keeps its id from being re-used)."""

    def __init__(self) -> None:
        # One attribute, swapped whole: renders in two threads see a Snapshot and its answer.
        self._last: tuple[Snapshot, frozenset[str]] | None = None

    def __call__(self, snapshot: Snapshot) -> frozenset[str]:
        last = self._last
        if last is not None and last[0] is snapshot:
            return last[1]
        flagged = troubled(snapshot.health, snapshot.findings)
        self._last = (snapshot, flagged)
        return flagged


flagged_of = _FlaggedOf()

SubjectOf = Callable[[Sample], str | None]


def gpu_subject(sample: Sample) -> str | None:
    gpu = sample.labels.get("gpu")
    return None if gpu is None else f"gpu:{gpu}"


def link_subject(sample: Sample) -> str | None:
    gpu, link = sample.labels.get("gpu"), sample.labels.get("link")
    return None if gpu is None or link is None else f"nvlink:{gpu}/{link}"


def sample_port_subject(sample: Sample) -> str | None:
    device, port = sample.labels.get("device"), sample.labels.get("port")
    return None if device is None or port is None else port_subject(device, int(port))


def measurement_subject(sample: Sample) -> str | None:
    """The subject a check's derived value is about, by its labels."""
    return sample_port_subject(sample) or link_subject(sample) or gpu_subject(sample)


def only_for(family: Metric, subjects: Collection[str], subject_of: SubjectOf) -> Metric:
    """A copy of `family` with the series of `subjects` only; a series that
    names no subject (a node-wide value) is kept. `family` itself is left as
    it is: it may be held for the next render (gpuwatchd.export.held)."""
    kept = Metric(family.name, family.documentation, family.type, family.unit)
    for sample in family.samples:
        subject = subject_of(sample)
        if subject is None or subject in subjects:
            kept.samples.append(sample)
    return kept


def compacted(
    families: Iterable[Metric],
    export: ExportConfig,
    flagged: Collection[str],
    subject_of: SubjectOf,
    always: Collection[str] = frozenset(),
) -> Iterator[Metric]:
    """`families` as `export` wants them: in compact mode, a family not in
    `always` (by name) keeps the series of the `flagged` subjects only."""
    for family in families:
        if export.compact and family.name not in always:
            yield only_for(family, flagged, subject_of)
        else:
            yield family
