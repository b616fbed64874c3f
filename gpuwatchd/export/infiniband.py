"""InfiniBand metric families, rendered fresh from a Snapshot.

Names, help texts, units and labels are node_exporter's infiniband collector's
with `gpuwatchd_` in place of `node_`, so a query written for node_exporter
ports over by renaming the prefix (tests/golden holds node_exporter 1.5's own
output for a real tree, and a test keeps the two equal). Added beyond
node_exporter 1.5: `gpuwatchd_infiniband_hw_counters_total{device,port,counter}`
for every file under `hw_counters/` (plural, like the folder: promtool rejects
a name with `_counter_` in it). An absent value is an absent series.

With `export.detail: compact`, every port keeps its state, rate, traffic and
the error counters the shipped alerts read (COMPACT_PORT_FAMILIES); its other
counters and `hw_counters` are exported only while it is not healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwatchd.export.detail import compacted, flagged_of, sample_port_subject
from gpuwatchd.export.held import held_series
from gpuwatchd.model import InfinibandDevice, PortSample
from gpuwatchd.snapshot import Snapshot

PREFIX = "gpuwatchd_infiniband_"
PORT_LABELS = ("device", "port")

# `counters/` file -> (metric name after the prefix, node_exporter's help text).
COUNTER_METRICS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "excessive_buffer_overrun_errors": (
            "excessive_buffer_overrun_errors_total",
            "Number of times that OverrunErrors consecutive flow control update periods "
            "occurred, each having at least one overrun error.",
        ),
        "link_downed": (
            "link_downed_total",
            "Number of times the link failed to recover from an error state and went down",
        ),
        "link_error_recovery": (
            "link_error_recovery_total",
            "Number of times the link successfully recovered from an error state",
        ),
        "local_link_integrity_errors": (
            "local_link_integrity_errors_total",
            "Number of times that the count of local physical errors exceeded the threshold "
            "specified by LocalPhyErrors.",
        ),
        "multicast_rcv_packets": (
            "multicast_packets_received_total",
            "Number of multicast packets received (including errors)",
        ),
        "multicast_xmit_packets": (
            "multicast_packets_transmitted_total",
            "Number of multicast packets transmitted (including errors)",
        ),
        "port_rcv_constraint_errors": (
            "port_constraint_errors_received_total",
            "Number of packets received on the switch physical port that are discarded",
        ),
        "port_xmit_constraint_errors": (
            "port_constraint_errors_transmitted_total",
            "Number of packets not transmitted from the switch physical port",
        ),
        "port_rcv_data": (
            "port_data_received_bytes_total",
            "Number of data octets received on all links",
        ),
        "port_xmit_data": (
            "port_data_transmitted_bytes_total",
            "Number of data octets transmitted on all links",
        ),
        "port_rcv_discards": (
            "port_discards_received_total",
            "Number of inbound packets discarded by the port because the port is down or congested",
        ),
        "port_xmit_discards": (
            "port_discards_transmitted_total",
            "Number of outbound packets discarded by the port because the port is down or "
            "congested",
        ),
        "port_rcv_errors": (
            "port_errors_received_total",
            "Number of packets containing an error that were received on this port",
        ),
        "port_rcv_packets": (
            "port_packets_received_total",
            "Number of packets received on all VLs by this port (including errors)",
        ),
        "port_xmit_packets": (
            "port_packets_transmitted_total",
            "Number of packets transmitted on all VLs from this port (including errors)",
        ),
        "port_xmit_wait": (
            "port_transmit_wait_total",
            "Number of ticks during which the port had data to transmit but no data was sent "
            "during the entire tick",
        ),
        "unicast_rcv_packets": (
            "unicast_packets_received_total",
            "Number of unicast packets received (including errors)",
        ),
        "unicast_xmit_packets": (
            "unicast_packets_transmitted_total",
            "Number of unicast packets transmitted (including errors)",
        ),
        "port_rcv_remote_physical_errors": (
            "port_receive_remote_physical_errors_total",
            "Number of packets marked with the EBP (End of Bad Packet) delimiter received on "
            "the port.",
        ),
        "port_rcv_switch_relay_errors": (
            "port_receive_switch_relay_errors_total",
            "Number of packets that could not be forwarded by the switch.",
        ),
        "symbol_error": (
            "symbol_error_total",
            "Number of minor link errors detected on one or more physical lanes.",
        ),
        "VL15_dropped": (
            "vl15_dropped_total",
            "Number of incoming VL15 packets dropped due to resource limitations.",
        ),
    }
)

# Compact mode's per-port totals: each port's state, rate and traffic, and
# the IBTA error counters that the shipped alerts read.
COMPACT_PORT_FAMILIES = frozenset(
    PREFIX + name.removesuffix("_total")
    for name in (
        "state_id",
        "physical_state_id",
        "rate_bytes_per_second",
        "port_data_received_bytes_total",
        "port_data_transmitted_bytes_total",
        "port_transmit_wait_total",
        "link_downed_total",
        "link_error_recovery_total",
        "symbol_error_total",
        "port_errors_received_total",
        "local_link_integrity_errors_total",
        "excessive_buffer_overrun_errors_total",
    )
)

# `hw_counters/lifespan` is the driver's counter aging period in milliseconds,
# a setting rather than a count, so it is not exported as a counter.
NOT_HW_COUNTERS = frozenset({"lifespan"})

PortValue = Callable[[PortSample], float | int | None]

# Per-port gauges: (metric name after the prefix, help, value).
PORT_GAUGES: tuple[tuple[str, str, PortValue], ...] = (
    (
        "state_id",
        "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, "
        "5: act defer)",
        lambda port: port.state_id,
    ),
    (
        "physical_state_id",
        "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, "
        "4: shift, 5: link up, 6: link error recover, 7: phytest)",
        lambda port: port.physical_state_id,
    ),
    (
        "rate_bytes_per_second",
        "Maximum signal transfer rate",
        lambda port: port.rate_bytes_per_second,
    ),
)


def _port_labels(port: PortSample) -> tuple[str, ...]:
    return (port.device, str(port.port))


def _info(devices: Sequence[InfinibandDevice]) -> Metric:
    family = GaugeMetricFamily(
        PREFIX + "info",
        "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
        labels=("device", "board_id", "firmware_version", "hca_type"),
    )
    return held_series(family, [(_facts(device), 1.0) for device in devices])


def _facts(device: InfinibandDevice) -> tuple[str, ...]:
    # A label cannot be absent from one series of a family; an empty value
    # is what Prometheus treats as no label, and what node_exporter writes.
    facts = (device.board_id, device.firmware_version, device.hca_type)
    return (device.device, *(fact or "" for fact in facts))


# A port's label values, made once a render for its many families, and its sample.
Port = tuple[tuple[str, ...], PortSample]


def _gauges(ports: Sequence[Port]) -> Iterator[Metric]:
    for name, documentation, value in PORT_GAUGES:
        family = GaugeMetricFamily(PREFIX + name, documentation, labels=PORT_LABELS)
        yield _per_port(family, ports, value)


def _counters(ports: Sequence[Port]) -> Iterator[Metric]:
    for file, (name, documentation) in COUNTER_METRICS.items():
        family = CounterMetricFamily(PREFIX + name, documentation, labels=PORT_LABELS)
        yield _per_port(family, ports, _counter(file))


def _counter(file: str) -> PortValue:
    return lambda port: port.counters.get(file)


def _per_port(
    family: GaugeMetricFamily | CounterMetricFamily, ports: Sequence[Port], value: PortValue
) -> Metric:
    """`family` with a series a port that has a reading. A port's error
    counters stand still until it errs: the family is encoded again only when
    one of its series changed (gpuwatchd.export.held)."""
    readings = ((labels, value(port)) for labels, port in ports)
    return held_series(family, [(labels, float(r)) for labels, r in readings if r is not None])


def _hw_counters(ports: Sequence[Port]) -> Metric:
    family = CounterMetricFamily(
        PREFIX + "hw_counters_total",
        "Driver-specific hardware counter of the port, named by its file under hw_counters/.",
        labels=(*PORT_LABELS, "counter"),
    )
    series = [
        ((*labels, counter), float(reading))
        for labels, port in ports
        for counter, reading in sorted(port.hw_counters.items())
        if counter not in NOT_HW_COUNTERS
    ]
    return held_series(family, series)


def families(snapshot: Snapshot) -> list[Metric]:
    """Every InfiniBand family that has at least one series in the snapshot."""
    ports = [(_port_labels(port), port) for port in snapshot.ports]
    flagged = flagged_of(snapshot)
    rendered: list[Metric] = [
        _info(snapshot.infiniband_devices),
        *compacted(
            (*_gauges(ports), *_counters(ports), _hw_counters(ports)),
            snapshot.export,
            flagged,
            sample_port_subject,
            COMPACT_PORT_FAMILIES,
        ),
    ]
    # A family with no samples says nothing; node_exporter leaves it out too.
    return [family for family in rendered if family.samples]
