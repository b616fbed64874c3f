"""GPU and NVLink metric families, rendered fresh from a Snapshot.

Every GPU series carries `gpu`, `uuid` and `model`; an absent reading is an
absent series, never a zero. A lost GPU keeps only `gpuwatchd_gpu_up 0` and
its XID counters (the 79 that announced the loss among them).

Per-GPU NVLink totals (`gpuwatchd_gpu_nvlinks_up`,
`gpuwatchd_gpu_nvlink_errors_total`) are exported in both detail modes; with
`export.detail: compact`, the families outside COMPACT_GPU_FAMILIES and the
per-link ones are exported only for GPUs and links that are not healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwatchd.export.detail import ExportConfig, compacted, flagged_of, gpu_subject, link_subject
from gpuwatchd.export.held import Held, bits, held_series
from gpuwatchd.model import (
    CLOCKS_EVENT_REASONS,
    ECC_SCOPES,
    ECC_TYPES,
    FABRIC_HEALTH_FIELDS,
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_SUPPORTED,
    FABRIC_STATES,
    GPU_RECOVERY_ACTIONS,
    NVLINK_BER_TYPES,
    NVLINK_ERROR_TYPES,
    THROTTLE_REASONS,
    GpuSample,
    LinkSample,
)
from gpuwatchd.snapshot import Snapshot

GPU_LABELS = ("gpu", "uuid", "model")

Value = float | int | bool | None
Getter = Callable[[GpuSample], Value]

# The families compact mode exports for every GPU: whether it is up, hot,
# busy, throttled, erroring or out of spare memory, and its fabric state, as
# the shipped alerts read them. The rest (per-reason flags, thresholds,
# maximum and application clocks, PCIe link, remapper banks...) is detail.
COMPACT_GPU_FAMILIES = frozenset(
    {
        "gpuwatchd_gpu_up",
        "gpuwatchd_gpu_temperature_celsius",
        "gpuwatchd_gpu_clock_hertz",
        "gpuwatchd_gpu_power_watts",
        "gpuwatchd_gpu_utilization_ratio",
        "gpuwatchd_gpu_memory_utilization_ratio",
        "gpuwatchd_gpu_energy_joules",
        "gpuwatchd_gpu_framebuffer_bytes",
        "gpuwatchd_gpu_ecc_errors",
        "gpuwatchd_gpu_pcie_replays",
        "gpuwatchd_gpu_throttle_seconds",
        "gpuwatchd_gpu_row_remap_pending",
        "gpuwatchd_gpu_row_remap_failed",
        "gpuwatchd_gpu_retired_pages_pending",
        "gpuwatchd_gpu_fabric_state_id",
        "gpuwatchd_gpu_xid_errors",
        "gpuwatchd_gpu_nvlinks_up",
        "gpuwatchd_gpu_nvlink_errors",
    }
)


def _gpu_labels(gpu: GpuSample) -> tuple[str, ...]:
    return (str(gpu.index), gpu.uuid or "", gpu.name or "")


# A GPU's label values, made once a render for its many families, and its sample.
Board = tuple[tuple[str, ...], GpuSample]


def _gauge(
    name: str, documentation: str, boards: Sequence[Board], getter: Getter, unit: str = ""
) -> Metric:
    series = [
        (labels, float(value)) for labels, gpu in boards if (value := getter(gpu)) is not None
    ]
    return held_series(GaugeMetricFamily(name, documentation, labels=GPU_LABELS, unit=unit), series)


def _by_label(
    family: GaugeMetricFamily | CounterMetricFamily,
    boards: Sequence[Board],
    values: Callable[[GpuSample], Iterable[tuple[str | tuple[str, ...], Value]]],
) -> Metric:
    """A family whose series add labels (sensor, clock, reason...) to the GPU's."""
    series = [
        ((*labels, *((extra,) if isinstance(extra, str) else extra)), float(value))
        for labels, gpu in boards
        for extra, value in values(gpu)
        if value is not None
    ]
    return held_series(family, series)


# Single-valued gauges: (name, help, getter, unit).
_SCALARS: tuple[tuple[str, str, Getter, str], ...] = (
    ("gpuwatchd_gpu_power_watts", "Power draw of the GPU in watts.", lambda g: g.power_watts, ""),
    (
        "gpuwatchd_gpu_power_limit_watts",
        "Enforced power limit of the GPU in watts.",
        lambda g: g.power_limit_watts,
        "",
    ),
    (
        "gpuwatchd_gpu_pcie_link_generation",
        "PCIe generation the GPU's link runs at now (it may drop when the GPU idles).",
        lambda g: g.pcie_link_generation,
        "",
    ),
    (
        "gpuwatchd_gpu_pcie_link_max_generation",
        "Highest PCIe generation the GPU and its slot allow.",
        lambda g: g.pcie_link_max_generation,
        "",
    ),
    (
        "gpuwatchd_gpu_pcie_link_width",
        "Lanes the GPU's PCIe link runs at now.",
        lambda g: g.pcie_link_width,
        "",
    ),
    (
        "gpuwatchd_gpu_pcie_link_max_width",
        "Most lanes the GPU and its slot allow.",
        lambda g: g.pcie_link_max_width,
        "",
    ),
    (
        "gpuwatchd_gpu_fabric_state_id",
        "The GPU's registration with the NVSwitch fabric: "
        + ", ".join(f"{code} {name}" for code, name in FABRIC_STATES.items())
        + ".",
        lambda g: g.fabric_state,
        "",
    ),
    (
        "gpuwatchd_gpu_fabric_status",
        "NVML return code of the GPU's completed fabric registration (0: success).",
        lambda g: g.fabric_status if g.fabric_state == FABRIC_STATE_COMPLETED else None,
        "",
    ),
    (
        "gpuwatchd_gpu_fabric_health_mask",
        "The NVSwitch fabric's health mask for the GPU, as NVML reports it: one field per "
        "condition ("
        + ", ".join(f"{name} at bit {shift}" for name, (shift, _) in FABRIC_HEALTH_FIELDS.items())
        + "); a 2-bit field reads 0 not supported, 1 true, 2 false, the 4-bit "
        "configuration 0 not supported, 1 correct, 2-8 what is wrong (nvml.h "
        "NVML_GPU_FABRIC_HEALTH_MASK_*).",
        lambda g: (
            g.fabric_health_mask
            if g.fabric_state not in (None, FABRIC_STATE_NOT_SUPPORTED)
            else None
        ),
        "",
    ),
    (
        "gpuwatchd_gpu_utilization_ratio",
        "Share of the last sample period in which a kernel ran on the GPU (0-1).",
        lambda g: g.utilization_gpu_ratio,
        "",
    ),
    (
        "gpuwatchd_gpu_memory_utilization_ratio",
        "Share of the last sample period in which device memory was read or written (0-1).",
        lambda g: g.utilization_memory_ratio,
        "",
    ),
    (
        "gpuwatchd_gpu_row_remap_pending",
        "1 when a row remap is pending (takes effect at the next GPU reset).",
        lambda g: g.row_remap_pending,
        "",
    ),
    (
        "gpuwatchd_gpu_row_remap_failed",
        "1 when a row remap failed (the GPU ran out of spare rows).",
        lambda g: g.row_remap_failed,
        "",
    ),
    (
        "gpuwatchd_gpu_retired_pages_pending",
        "1 when retired pages wait for the next reboot to be blacklisted.",
        lambda g: g.retired_pages_pending,
        "",
    ),
    (
        "gpuwatchd_gpu_sram_threshold_exceeded",
        "1 when SRAM uncorrectable errors are past the field-diag threshold (NVIDIA RMA).",
        lambda g: g.sram_threshold_exceeded,
        "",
    ),
    (
        "gpuwatchd_gpu_recovery_action_id",
        "The driver's GPU recovery action: "
        + ", ".join(f"{code} {name}" for code, name in GPU_RECOVERY_ACTIONS.items())
        + ".",
        lambda g: g.recovery_action,
        "",
    ),
    (
        "gpuwatchd_gpu_xid_events_received",
        "1 while the GPU's XID events are being received, 0 when the event wait fails.",
        lambda g: g.xid_events_received,
        "",
    ),
    (
        "gpuwatchd_gpu_reset_required",
        "1 when NVML answers RESET_REQUIRED: the GPU must be reset before it can be used.",
        lambda g: g.reset_required,
        "",
    ),
)


def _gpu_families(boards: Sequence[Board]) -> Iterator[Metric]:
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_temperature_celsius",
            "GPU die (sensor=gpu) and HBM (sensor=memory) temperature in degrees Celsius.",
            labels=(*GPU_LABELS, "sensor"),
        ),
        boards,
        lambda g: (("gpu", g.temperature_gpu_celsius), ("memory", g.temperature_memory_celsius)),
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_temperature_threshold_celsius",
            "Temperature at which the GPU slows down or shuts down, and HBM's maximum "
            "operating temperature (threshold=memory_max), in degrees Celsius.",
            labels=(*GPU_LABELS, "threshold"),
        ),
        boards,
        lambda g: (
            ("slowdown", g.temperature_slowdown_celsius),
            ("shutdown", g.temperature_shutdown_celsius),
            ("memory_max", g.temperature_memory_max_celsius),
        ),
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_clock_hertz",
            "Current SM and memory clock in hertz.",
            labels=(*GPU_LABELS, "clock"),
        ),
        boards,
        lambda g: (("sm", g.sm_clock_hertz), ("memory", g.memory_clock_hertz)),
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_max_clock_hertz",
            "Maximum SM and memory clock in hertz.",
            labels=(*GPU_LABELS, "clock"),
        ),
        boards,
        lambda g: (("sm", g.sm_max_clock_hertz), ("memory", g.memory_max_clock_hertz)),
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_application_clock_hertz",
            "Application (target) SM and memory clock in hertz.",
            labels=(*GPU_LABELS, "clock"),
        ),
        boards,
        lambda g: (
            ("sm", g.sm_application_clock_hertz),
            ("memory", g.memory_application_clock_hertz),
        ),
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_clocks_event_active",
            "1 while the clocks-event (throttle) reason is active at the instant of the poll.",
            labels=(*GPU_LABELS, "reason"),
        ),
        boards,
        lambda g: ((reason, g.reason_active(reason)) for reason in CLOCKS_EVENT_REASONS),
    )
    yield _by_label(
        CounterMetricFamily(
            "gpuwatchd_gpu_throttle_seconds",
            "Cumulative time the GPU's clocks were held down, by cause (NVML violation time).",
            labels=(*GPU_LABELS, "reason"),
        ),
        boards,
        lambda g: ((reason, g.throttle_seconds.get(reason)) for reason in THROTTLE_REASONS),
    )
    yield _by_label(
        CounterMetricFamily(
            "gpuwatchd_gpu_ecc_errors",
            "Memory ECC errors by type, since the last reset (volatile) or ever (aggregate).",
            labels=(*GPU_LABELS, "type", "scope"),
        ),
        boards,
        lambda g: (
            ((kind, scope), g.ecc_errors.get((kind, scope)))
            for kind in ECC_TYPES
            for scope in ECC_SCOPES
        ),
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_framebuffer_bytes",
            "Device memory in bytes by state: used (allocated), free, and reserved by the "
            "driver and firmware; the states add up to the total. Where the driver has no "
            "nvmlDeviceGetMemoryInfo_v2, used includes the reservation and reserved is absent.",
            labels=(*GPU_LABELS, "state"),
        ),
        boards,
        lambda g: (
            ("used", g.memory_used_bytes),
            ("free", g.memory_free_bytes),
            ("reserved", g.memory_reserved_bytes),
        ),
    )
    # Counters of the GPU alone: no label beyond the GPU's.
    yield _by_label(
        CounterMetricFamily(
            "gpuwatchd_gpu_energy_joules",
            "Energy the GPU drew since the driver was loaded, in joules.",
            labels=GPU_LABELS,
        ),
        boards,
        lambda g: [((), g.energy_joules)],
    )
    yield _by_label(
        CounterMetricFamily(
            "gpuwatchd_gpu_pcie_replays",
            "PCIe replays of the GPU's link (NVML's 32-bit replay counter).",
            labels=GPU_LABELS,
        ),
        boards,
        lambda g: [((), g.pcie_replays)],
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_remapped_rows",
            "Rows of device memory remapped to spares, by the cause of the remap.",
            labels=(*GPU_LABELS, "cause"),
        ),
        boards,
        lambda g: (
            ("correctable", g.remapped_rows_correctable),
            ("uncorrectable", g.remapped_rows_uncorrectable),
        ),
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_row_remapper_banks",
            "Memory banks by the spare rows they have left (max: all, none: no remap possible).",
            labels=(*GPU_LABELS, "availability"),
        ),
        boards,
        lambda g: g.row_remapper_banks.items(),
    )
    yield _by_label(
        GaugeMetricFamily(
            "gpuwatchd_gpu_retired_pages",
            "Pages of device memory retired (pre-Ampere page retirement), by cause.",
            labels=(*GPU_LABELS, "cause"),
        ),
        boards,
        lambda g: g.retired_pages.items(),
    )
    for name, documentation, getter, unit in _SCALARS:
        yield _gauge(name, documentation, boards, getter, unit)


def _link_families(gpus: Sequence[GpuSample]) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "gpuwatchd_nvlink_up", "1 when the NVLink is active.", labels=("gpu", "link")
    )
    errors = CounterMetricFamily(
        "gpuwatchd_nvlink_errors",
        "NVLink errors by type: data-link-layer CRC flit/data, replay, recovery, ECC data; "
        "NVLink5 effective (post-FEC) errors, failed recoveries, malformed packets, "
        "link integrity errors.",
        labels=("gpu", "link", "type"),
    )
    ber = GaugeMetricFamily(
        "gpuwatchd_nvlink_ber",
        "NVLink5 bit error rate as the driver reports it: effective (after FEC) or symbol.",
        labels=("gpu", "link", "type"),
    )
    ups: list[tuple[tuple[str, ...], float]] = []
    counts: list[tuple[tuple[str, ...], float]] = []
    rates: list[tuple[tuple[str, ...], float]] = []
    for gpu in gpus:
        for link in gpu.nvlinks:
            labels = (str(link.gpu), str(link.link))
            if link.up is not None:
                ups.append((labels, float(link.up)))
            for kind in NVLINK_ERROR_TYPES:
                count = link.errors.get(kind)
                if count is not None:
                    counts.append(((*labels, kind), float(count)))
            for kind in NVLINK_BER_TYPES:
                rate = link.ber.get(kind)
                if rate is not None:
                    rates.append(((*labels, kind), rate))
    # Held by series too: rebuilt for one link's moved counter, the others'
    # lines are written from their kept prefixes.
    yield held_series(up, ups)
    yield held_series(errors, counts)
    yield held_series(ber, rates)


# A link's GPU, number, state, error counts, and its bit error rates' types and bits.
LinkKey = tuple[int, int, bool | None, tuple[tuple[str, int], ...], tuple[str, ...], bytes]
# What a node's links show: each GPU's labels and its links' readings.
LinksKey = tuple[tuple[tuple[str, ...], tuple[LinkKey, ...]], ...]
# A node's per-link series are most of its page, and a link's counters stand
# still until it errs: they (and the GPUs' link totals) are encoded again only
# when a link's reading changes.
_HELD_LINKS: Held[tuple[frozenset[str] | None, LinksKey]] = Held()
_HELD_LINK_TOTALS: Held[LinksKey] = Held()


class _LinkKeys:
    """`_link_key` of each link, kept for the links of the last call: a link
    that is the very sample it was then (a source hands back a reading that
    did not change) is not read again."""

    def __init__(self) -> None:
        # One attribute, swapped whole: id -> the link (kept, so that its id is not re-used), key.
        self._last: dict[int, tuple[LinkSample, LinkKey]] = {}

    def __call__(self, gpus: Sequence[GpuSample]) -> LinksKey:
        last, keys = self._last, {}
        for gpu in gpus:
            for link in gpu.nvlinks:
                kept = last.get(id(link))
                if kept is None or kept[0] is not link:
                    kept = (link, _link_key(link))
                keys[id(link)] = kept
        self._last = keys
        return tuple(
            (_gpu_labels(gpu), tuple(keys[id(link)][1] for link in gpu.nvlinks)) for gpu in gpus
        )


_links_key = _LinkKeys()


def _link_key(link: LinkSample) -> LinkKey:
    """Every value of `link` its series are made of."""
    errors = tuple(link.errors.items())
    return (link.gpu, link.link, link.up, errors, tuple(link.ber), bits(link.ber.values()))


def _held_links(
    gpus: Sequence[GpuSample], export: ExportConfig, flagged: frozenset[str]
) -> Iterator[Metric]:
    links = _links_key(gpus)
    yield from _HELD_LINK_TOTALS(links, lambda: _link_totals(gpus))
    compact = flagged if export.compact else None
    yield from _HELD_LINKS(
        (compact, links), lambda: compacted(_link_families(gpus), export, flagged, link_subject)
    )


def _link_totals(gpus: Sequence[GpuSample]) -> Iterator[Metric]:
    """Each GPU's NVLinks summed up: what compact mode keeps of them."""
    up = GaugeMetricFamily(
        "gpuwatchd_gpu_nvlinks_up",
        "NVLinks of the GPU that are active (the sum of its gpuwatchd_nvlink_up).",
        labels=GPU_LABELS,
    )
    errors = CounterMetricFamily(
        "gpuwatchd_gpu_nvlink_errors",
        "NVLink errors of the GPU by type, summed over its links (gpuwatchd_nvlink_errors_total "
        "per link).",
        labels=(*GPU_LABELS, "type"),
    )
    for gpu in gpus:
        states = [link.up for link in gpu.nvlinks if link.up is not None]
        if states:
            up.add_metric(_gpu_labels(gpu), float(sum(states)))
        for kind in NVLINK_ERROR_TYPES:
            counts = [n for link in gpu.nvlinks if (n := link.errors.get(kind)) is not None]
            if counts:
                errors.add_metric([*_gpu_labels(gpu), kind], float(sum(counts)))
    yield up
    yield errors


def families(snapshot: Snapshot) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "gpuwatchd_gpu_up", "1 when the GPU answers NVML, 0 when it is lost.", labels=GPU_LABELS
    )
    boards = [(_gpu_labels(gpu), gpu) for gpu in snapshot.gpus]
    yield held_series(up, [(labels, float(gpu.up)) for labels, gpu in boards])
    answering = [(labels, gpu) for labels, gpu in boards if gpu.up]
    export = snapshot.export
    flagged = flagged_of(snapshot)
    yield from compacted(
        _gpu_families(answering), export, flagged, gpu_subject, COMPACT_GPU_FAMILIES
    )
    yield from _held_links([gpu for _, gpu in answering], export, flagged)
    # A lost GPU's XIDs (79 among them) still count; everything else about it is unknown.
    yield _by_label(
        CounterMetricFamily(
            "gpuwatchd_gpu_xid_errors",
            "XID critical errors the driver reported this boot, per XID code: the kernel "
            "log's NVRM: Xid lines merged with NVML's events (from the daemon's start only "
            "where the kernel log cannot be read).",
            labels=(*GPU_LABELS, "xid"),
        ),
        boards,
        lambda g: ((str(code), count) for code, count in sorted(g.xid_counts.items())),
    )
