"""Configuration info series, rendered fresh from a Snapshot.

`gpuwatchd_gpu_config_info{gpu,uuid,model,driver_version,vbios_version,
ecc_mode,persistence_mode,mig_mode} 1`: one series per GPU, node_exporter's
`_info` layout for static facts, so the fleet rules can count the values a
cluster's GPUs hold. A setting a GPU does not report is an empty label. The
power limit and application clocks are numbers and have their own gauges
(gpuwatchd_gpu_power_limit_watts, gpuwatchd_gpu_application_clock_hertz).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import InfoMetricFamily, Metric

from gpuwatchd.export.held import Held
from gpuwatchd.model import GpuSample
from gpuwatchd.snapshot import Snapshot

LABELS = (
    "gpu",
    "uuid",
    "model",
    "driver_version",
    "vbios_version",
    "ecc_mode",
    "persistence_mode",
    "mig_mode",
)


def _mode(value: bool | None) -> str:
    return "" if value is None else ("enabled" if value else "disabled")


def _labels(gpu: GpuSample, driver: str | None) -> tuple[str, ...]:
    return (
        str(gpu.index),
        gpu.uuid or "",
        gpu.name or "",
        driver or "",
        gpu.vbios_version or "",
        _mode(gpu.ecc_enabled),
        _mode(gpu.persistence_enabled),
        _mode(gpu.mig_enabled),
    )


Rows = tuple[tuple[str, ...], ...]  # each answering GPU's label values
# Static facts: encoded again only when one changes.
_HELD_INFO: Held[Rows] = Held()


def families(snapshot: Snapshot) -> Iterator[Metric]:
    rows = tuple(_labels(gpu, snapshot.driver_version) for gpu in snapshot.gpus if gpu.up)
    yield from _HELD_INFO(rows, lambda: (_info(rows),))


def _info(rows: Rows) -> InfoMetricFamily:
    info = InfoMetricFamily(
        "gpuwatchd_gpu_config",
        "The GPU's configuration: driver and VBIOS versions, ECC, persistence and MIG "
        "modes (enabled or disabled; empty where not reported).",
        labels=LABELS,
    )
    for labels in rows:
        info.add_metric(labels, {})
    return info
