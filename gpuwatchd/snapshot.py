"""The immutable picture of the node that the exporter, the HTTP server and
`gpuwatchd status` show. The daemon builds a new one after every poll and
swaps it in atomically; readers never see a half-updated node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuwatchd.canary.stats import CanaryStats
from gpuwatchd.export.detail import ExportConfig
from gpuwatchd.model import (
    Finding,
    GpuSample,
    Health,
    InfinibandDevice,
    Measurement,
    PcieFunctionSample,
    PortSample,
    Quarantine,
)


@dataclass(frozen=True)
class WebhookStatus:
    """One webhook: deliveries since the daemon started, by result, and its outbox."""

    name: str
    delivered: int = 0
    retried: int = 0
    dead_lettered: int = 0
    pending: int = 0  # events waiting in the outbox
    dead_letters: int = 0  # events given up on, kept for a while
    last_error: str | None = None


@dataclass(frozen=True)
class SchedulerStatus:
    """One scheduler action (slurm, kubernetes)."""

    name: str
    node: str
    dry_run: bool = False
    drained: bool = False  # gpuwatchd's drain (cordon) is in place
    withheld: str | None = None  # why fleet safety holds a wanted drain back
    error: str | None = None  # the last attempt's failure, retried


@dataclass(frozen=True)
class Snapshot:
    time: float
    gpus: tuple[GpuSample, ...] = ()
    infiniband_devices: tuple[InfinibandDevice, ...] = ()
    ports: tuple[PortSample, ...] = ()
    pcie_functions: tuple[PcieFunctionSample, ...] = ()
    driver_version: str | None = None
    # Enabled sources: True when the last poll worked; the error text when not.
    source_up: Mapping[str, bool] = field(default_factory=dict)
    source_errors: Mapping[str, str] = field(default_factory=dict)
    # Checks that raised in the last poll: name -> the error.
    check_errors: Mapping[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    measurements: tuple[Measurement, ...] = ()
    health: Mapping[str, Health] = field(default_factory=dict)  # subject -> state
    node_health: Health = Health.HEALTHY
    quarantines: tuple[Quarantine, ...] = ()
    # Subject -> when it entered its current health state.
    health_since: Mapping[str, float] = field(default_factory=dict)
    # False when the state database cannot be written (the daemon keeps monitoring).
    state_persisted: bool = True
    polls: int = 0
    webhooks: tuple[WebhookStatus, ...] = ()
    schedulers: tuple[SchedulerStatus, ...] = ()
    # Canary runs and results since the daemon started; None without canaries.
    canary: CanaryStats | None = None
    # How much /metrics says (export.detail, export.canary_cores).
    export: ExportConfig = field(default_factory=ExportConfig)
