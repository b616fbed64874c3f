"""InfiniBand port health: link state and rate, flaps, bit errors, congestion.

Reads the port samples in History (from `gpuwatchd.sources.infiniband`) and
judges each port `ib:<device>/<port>`:

- `ib_port_down` (critical): an expected port is not ACTIVE / LinkUp;
  `ib_port_missing` (critical): an expected port is gone from sysfs. Expected
  are the ports `expected_ports` lists and, by default, every port the node
  was seen with ACTIVE: remembered in the state database by the daemon
  (`learned_ports`), so that after a restart or a reboot a port that is gone
  or never came up is missed by name with no list to type on a uniform fleet;
  `ib_port_rate_degraded` (warn): an expected port trained below its rate.
- `ib_link_flapping`: link-down events (link_downed, or the port seen
  leaving ACTIVE/LinkUp, whichever says more) + link_error_recovery increments
  in a window.
- `ib_symbol_errors`: symbol errors per bit the link carried at its line rate,
  bits over bits: an estimate of the post-FEC bit error rate, as ibdiagnet
  computes it. `ib_receive_errors`: received packets with errors per packet
  received (a packet error ratio, not a BER).
- `ib_congestion` (port_xmit_wait as a share of time), `ib_xmit_discards`.
- `ib_counter_saturated`: IBTA counters stuck at their maximum, one finding per
  port that names them and how to clear them. Real ConnectX-7 ports show
  `link_downed` 255, `port_xmit_discards` 65535 and `port_xmit_wait` 2^32-1
  after months of uptime (gpud PR #943): a counter already pinned when the port
  was first seen says nothing about now, so that is severity ok and the port
  stays healthy; one that filled up while watched was counting a live fault,
  and warns for as long as the history holds the moment it filled.

Every increase comes from `gpuwatchd.counters`, so resets (driver reload) and
saturation never give negative or absurd rates. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import partial

from gpuwatchd.checks import CheckOutput
from gpuwatchd.counters import (
    Increase,
    is_saturated,
    saturation_max,
    since_cleared,
    until_saturated,
)
from gpuwatchd.history import Column, History, Track, series
from gpuwatchd.model import (
    BYTES_PER_GIGABIT,
    COUNTER_BITS,
    Action,
    Finding,
    Measurement,
    PortSample,
    Reading,
    Severity,
    port_of_subject,
    port_subject,
)
from gpuwatchd.settings import Seconds
from gpuwatchd.units import format_duration

NAME = "infiniband"

ACTIVE = 4  # state 4: ACTIVE
LINK_UP = 5  # phys_state 5: LinkUp
BITS_PER_BYTE = 8

FLAP_COUNTERS = ("link_downed", "link_error_recovery")
SYMBOL_COUNTERS = ("symbol_error",)
# Received packets that arrived damaged (IBTA PortRcvErrors) or marked bad by
# the sender's side of the link (PortRcvRemotePhysicalErrors, EBP); counted
# against port_rcv_packets, which includes them.
RECEIVE_ERROR_COUNTERS = ("port_rcv_errors", "port_rcv_remote_physical_errors")
RECEIVED_PACKETS = "port_rcv_packets"
# A saturated port_xmit_wait only blinds the congestion estimate, and on busy
# ports its 32 bits fill within hours: reported, but at severity ok.
TELEMETRY_COUNTERS = frozenset({"port_xmit_wait"})
# The counters that stand still on a healthy port (traffic moves the others),
# watched by one change mark with the port's state and rate (`_quiet`).
QUIET_COUNTERS = (*FLAP_COUNTERS, *SYMBOL_COUNTERS, *RECEIVE_ERROR_COUNTERS, "port_xmit_discards")

# The value each IBTA counter stands at once saturated.
_SATURATION_MAX = {
    name: limit
    for name, bits in COUNTER_BITS.items()
    if (limit := saturation_max(bits)) is not None
}

_PORT_PATTERN = re.compile(r"^[^/\s]+/[^/\s]+$")
_WILDCARDS = frozenset("*?[")

Port = tuple[str, int]
Samples = Sequence[tuple[float, PortSample]]
Ports = Track[PortSample]
Standing = Mapping[str, int] | None


@dataclass(frozen=True)
class InfinibandCheckConfig:
    # Ports that must be up, as `device/port` patterns (`mlx5_*/1`). A listed
    # port that is down, or that sysfs does not show, is critical.
    expected_ports: tuple[str, ...] = ()
    # Also expect every port seen ACTIVE to stay up. Unused ports (never
    # cabled) then raise nothing, while any port that carried traffic and went
    # down does. The daemon remembers these ports in the state database, so
    # after a restart or a reboot a port that is gone or never came up is
    # still expected: the first healthy start teaches a uniform fleet its
    # ports with nothing to type (gpud asks for a port count per node group).
    expect_ports_seen_active: bool = True
    # The lowest acceptable rate of an expected ACTIVE port, in Gb/s as sysfs
    # `rate` shows it (400 for NDR). 0 keeps only the rule that a port must
    # not run below the highest rate it had in history: a 400G link retrained
    # to 200G halves its rank's bandwidth and stalls every collective on it.
    min_rate_gbps: float = 0.0
    # Link flaps (link_downed + link_error_recovery increments) in this window.
    # Azure's HPC health checks fail a node on any IB link flap within 6h and
    # Meta's GCM treats IB flaps as critical; a window longer than the daemon's
    # history sees only the history.
    flap_window: Seconds = 3600.0
    # One flap warns; a flap often counts on both counters, so 3 means the link
    # went down or retrained at least twice: repeated, critical.
    flap_warn_count: int = 1
    flap_critical_count: int = 3
    # Bit errors are judged over this window: ibdiagnet's fabric health
    # procedure measures BER over 5-10 minutes of traffic.
    ber_window: Seconds = 600.0
    # Below this much data in the window an error or two reads as a high BER.
    ber_min_span: Seconds = 60.0
    # Errors per bit at the line rate. 1e-12 is the IBTA link BER requirement
    # and ibdiagnet's default --ber_thresh (on HDR/NDR symbol_error counts what
    # FEC left uncorrected). 1e-10 is a hundred times that, about 40 errors/s
    # at 400G, past the 10 symbol errors/s NVIDIA's NVSentinel calls degraded.
    symbol_ber_warn: float = 1e-12
    symbol_ber_critical: float = 1e-10
    # Received packets with errors per packet received. A link at the IBTA BER
    # limit (1e-12) damages about one 4 KiB-MTU packet (33,232 bits with
    # headers) in 30 million: 3.3e-8 warns, and a hundred times that, as for
    # symbols, is critical. No verdict before 1/warn packets were received,
    # since below that a single error is already past the threshold.
    receive_packet_error_ratio_warn: float = 3.3e-8
    receive_packet_error_ratio_critical: float = 3.3e-6
    # Congestion and discards are judged over this window.
    congestion_window: Seconds = 300.0
    # port_xmit_wait counts ticks, and a tick's length is the hardware's
    # choice: NVIDIA's ibdiagnet manual ("Congestion Assessment on InfiniBand
    # Links") gives one tick per 8 bytes of port time on Quantum switches
    # (PortSamplesControl.Tick = 7) and per 32 bytes per lane on Switch-IB.
    # ConnectX HCAs publish no figure; we assume the Quantum convention. Set
    # this to Tick + 1 from `perfquery -c` on your HCA to be exact.
    xmit_wait_bytes_per_tick: float = 8.0
    # Warn when the port spent this share of the window with data to send and
    # no credits: 10% of a rank's bandwidth lost makes it an all-reduce straggler.
    xmit_wait_warn_ratio: float = 0.1
    # Warn on any transmit discard in the window: infiniband-diags'
    # ibqueryerrors reports every nonzero error counter by default, and an RDMA
    # discard costs a transport retry timeout.
    xmit_discards_warn_count: int = 1

    def __post_init__(self) -> None:
        for pattern in self.expected_ports:
            if not _PORT_PATTERN.match(pattern):
                raise ValueError(f"expected_ports: {pattern!r} is not device/port (mlx5_0/1)")
        if self.flap_warn_count < 1 or self.flap_critical_count < self.flap_warn_count:
            raise ValueError("flap counts must be 1 <= flap_warn_count <= flap_critical_count")
        if not 0 < self.symbol_ber_warn <= self.symbol_ber_critical:
            raise ValueError("symbol_ber_warn must be above 0 and at most symbol_ber_critical")
        if not 0 < self.receive_packet_error_ratio_warn <= self.receive_packet_error_ratio_critical:
            raise ValueError(
                "receive_packet_error_ratio_warn must be above 0 and at most "
                "receive_packet_error_ratio_critical"
            )
        if min(self.flap_window, self.ber_window, self.congestion_window) <= 0:
            raise ValueError("windows must be longer than 0s")
        if self.xmit_wait_bytes_per_tick <= 0 or not 0 < self.xmit_wait_warn_ratio <= 1:
            raise ValueError("xmit_wait_bytes_per_tick must be > 0, xmit_wait_warn_ratio 0-1")
        if self.min_rate_gbps < 0 or self.xmit_discards_warn_count < 1:
            raise ValueError("min_rate_gbps must be >= 0 and xmit_discards_warn_count >= 1")


@dataclass
class _Verdicts:
    findings: list[Finding] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)

    def find(
        self,
        port: Port,
        code: str,
        severity: Severity,
        message: str,
        action: Action,
        evidence: dict[str, float | int | str],
    ) -> None:
        subject = _subject(port)
        self.findings.append(Finding(subject, NAME, code, severity, message, action, evidence))

    def measure(self, name: str, port: Port, value: float, **extra: str) -> None:
        labels = {"device": port[0], "port": str(port[1]), **extra}
        self.measurements.append(Measurement(f"infiniband_{name}", labels, value))


def _subject(port: Port) -> str:
    return port_subject(*port)


def _listed(port: Port, patterns: Sequence[str]) -> bool:
    return any(fnmatchcase(f"{port[0]}/{port[1]}", pattern) for pattern in patterns)


def _named_ports(patterns: Sequence[str]) -> set[Port]:
    """The ports that plain (wildcard-free) patterns name."""
    named: set[Port] = set()
    for pattern in patterns:
        device, _, number = pattern.partition("/")
        if not _WILDCARDS & set(pattern) and number.isdigit():
            named.add((device, int(number)))
    return named


def _counter(samples: Samples, name: str) -> list[tuple[float, int | None]]:
    return series(samples, partial(_count, name))


def _count(name: str, sample: PortSample) -> int | None:
    return sample.counters.get(name)


def _column(track: Ports, name: str) -> Column[PortSample]:
    return track.column((NAME, name), partial(_count, name), COUNTER_BITS.get(name))


def _capacity(sample: PortSample) -> float | None:
    """Bytes per second the port can carry: none while it is known not ACTIVE."""
    if sample.state_id is not None and sample.state_id != ACTIVE:
        return 0.0
    return sample.rate_bytes_per_second


def _quiet(sample: PortSample) -> tuple[int | float | None, ...]:
    """The port's state, rate and QUIET_COUNTERS: where these stood still
    since a window began, no flap or error grew in it, which one change mark a
    poll tells (where a Column each would take every sample in); where they
    stood still over the whole track, so did its state and rate (`_link_state`)."""
    counters = sample.counters
    return (
        sample.state_id,
        sample.physical_state_id,
        sample.rate_bytes_per_second,
        *(counters.get(name) for name in QUIET_COUNTERS),
    )


def _judged(track: Ports, first: int, names: Sequence[str], still: Standing) -> tuple[int, int]:
    """The positions (first, last) of the stretch of samples from `first` on
    over which all of `names` counted: after the last time any was cleared
    from its maximum, up to where any saturated again. Time in which a counter
    had stopped counting would dilute its rate; over this stretch a rate is a
    lower bound of the true one instead."""
    last = len(track) - 1
    if not any(_saturated(track, first, last, name, still) for name in names):
        return first, last
    start, end = _stretch(track.tail(first), names)
    return first + start, first + start + end - 1


def _stretch(recent: Samples, names: Sequence[str]) -> tuple[int, int]:
    """Where the stretch `_judged` means starts in `recent`, and how long it is."""
    start = max(
        len(recent) - len(since_cleared(_counter(recent, name), COUNTER_BITS.get(name)))
        for name in names
    )
    tail = recent[start:]
    end = min(len(until_saturated(_counter(tail, name), COUNTER_BITS.get(name))) for name in names)
    return start, end


def _standing(track: Ports, quiet_since: int, first: int) -> Standing:
    """The latest counters where `_quiet` stood still from position `first`
    on (it last changed at `quiet_since`): the values the quiet counters
    stood at throughout. None where they may have moved."""
    return track.samples[-1].counters if quiet_since <= first else None


def _saturated(track: Ports, first: int, last: int, name: str, still: Standing) -> bool:
    if name not in COUNTER_BITS:
        # Not an IBTA counter of a fixed width (port_rcv_packets): it never saturates.
        return False
    if still is not None and name in QUIET_COUNTERS:
        return is_saturated(still.get(name), COUNTER_BITS.get(name))
    return _column(track, name).saturated(first, last)


def _increase(track: Ports, stretch: tuple[int, int], name: str, still: Standing) -> Increase:
    """A quiet counter that stood `still` grew as a constant does, which is
    what its Column would say: nothing, over the time it was present."""
    if still is None or name not in QUIET_COUNTERS:
        return _column(track, name).increase(*stretch, track.times)
    first, last = stretch
    value = still.get(name)
    if value is None or last < first:
        return Increase(increase=0.0, seconds=0.0)
    return Increase(
        increase=0.0,
        seconds=track.times[last] - track.times[first],
        saturated=is_saturated(value, COUNTER_BITS.get(name)),
    )


def _capacity_bits(track: Ports, stretch: tuple[int, int]) -> float:
    """The bits the link could carry at its line rate over the stretch."""
    return track.area((NAME, "capacity"), _capacity).integral(*stretch) * BITS_PER_BYTE


def _link_state(
    port: Port, track: Ports, quiet_since: int, config: InfinibandCheckConfig, out: _Verdicts
) -> None:
    latest = track.samples[-1]
    state_bad = latest.state_id is not None and latest.state_id != ACTIVE
    physical_bad = latest.physical_state_id is not None and latest.physical_state_id != LINK_UP
    if state_bad or physical_bad:
        state = latest.state or latest.state_id or "?"
        physical = latest.physical_state or latest.physical_state_id or "?"
        out.find(
            port,
            "ib_port_down",
            Severity.CRITICAL,
            f"port is {state}/{physical}, expected ACTIVE/LinkUp",
            Action.INSPECT_HARDWARE,
            _state_evidence(latest),
        )
        return
    rate = latest.rate_bytes_per_second
    if rate is None or latest.state_id != ACTIVE:
        return
    # A mark of its own only where the quiet fields (the state and rate among
    # them) changed at all: on a healthy port, none to bring up to date.
    if quiet_since and track.last_change((NAME, "active rate"), _active_rate):
        seen = [s.rate_bytes_per_second for s in track.samples if s.state_id == ACTIVE]
    else:
        # The same state and rate throughout: the latest one's.
        seen = [rate]
    expected = max([config.min_rate_gbps * BYTES_PER_GIGABIT, *(r for r in seen if r)])
    if rate < expected:
        out.find(
            port,
            "ib_port_rate_degraded",
            Severity.WARN,
            f"link runs at {rate / BYTES_PER_GIGABIT:g} Gb/s, "
            f"expected {expected / BYTES_PER_GIGABIT:g} Gb/s",
            Action.INSPECT_HARDWARE,
            {
                **_state_evidence(latest),
                "rate_gbps": rate / BYTES_PER_GIGABIT,
                "expected_gbps": expected / BYTES_PER_GIGABIT,
            },
        )


def _state_evidence(latest: PortSample) -> dict[str, float | int | str]:
    """The port's state as read, for a finding (only made for one: most polls have none)."""
    return {
        key: value
        for key, value in (
            ("state_id", latest.state_id),
            ("state", latest.state),
            ("physical_state_id", latest.physical_state_id),
            ("physical_state", latest.physical_state),
        )
        if value is not None
    }


def _active_rate(sample: PortSample) -> tuple[bool, float | None]:
    return sample.state_id == ACTIVE, sample.rate_bytes_per_second


def _active(sample: PortSample) -> int | None:
    return 1 if sample.state_id == ACTIVE else None


def _up(sample: PortSample) -> int | None:
    up = _is_up(sample)
    return None if up is None else int(up)


def _is_up(sample: PortSample) -> bool | None:
    if sample.state_id is None or sample.physical_state_id is None:
        return None
    return sample.state_id == ACTIVE and sample.physical_state_id == LINK_UP


def _drops(track: Ports, first: int) -> int:
    """How often the port was seen to leave ACTIVE/LinkUp from position
    `first` on: what still tells a link went down when link_downed is pinned
    (a poll misses a drop shorter than its interval, which link_error_recovery
    may still count). Up is 1 and down 0, so a drop is what a counter's
    increase calls a reset."""
    up = track.column((NAME, "up"), _up)
    return up.increase(first, len(track) - 1, track.times).resets


def _flaps(
    port: Port,
    track: Ports,
    quiet_since: int,
    now: float,
    config: InfinibandCheckConfig,
    out: _Verdicts,
) -> None:
    recent = (track.before(now - config.flap_window), len(track) - 1)
    if _standing(track, quiet_since, recent[0]) is not None:
        # The flap counters and the state stood still over the window: no flap.
        return
    downed, recovered = (_increase(track, recent, name, None) for name in FLAP_COUNTERS)
    drops = _drops(track, recent[0])
    # Each drop seen also counts on link_downed where that counter still moves:
    # the larger of the two, never their sum.
    downs = max(int(downed.increase), drops)
    flaps = downs + int(recovered.increase)
    if flaps < config.flap_warn_count:
        return
    saturated = downed.saturated or recovered.saturated
    out.find(
        port,
        "ib_link_flapping",
        Severity.CRITICAL if flaps >= config.flap_critical_count else Severity.WARN,
        f"{'at least ' if saturated else ''}{flaps} flap event(s) in "
        f"{format_duration(config.flap_window)} (link_downed +{int(downed.increase)}, "
        f"seen down {drops}x, link_error_recovery +{int(recovered.increase)})",
        Action.INSPECT_HARDWARE,
        {
            "link_downed": int(downed.increase),
            "state_drops": drops,
            "link_error_recovery": int(recovered.increase),
            "window_seconds": config.flap_window,
            "resets": downed.resets + recovered.resets,
            "saturated": int(saturated),
        },
    )


@dataclass(frozen=True)
class _Ratio:
    """One error ratio of a port over the BER window."""

    code: str
    measurement: str
    what: str
    errors: Increase
    ratio: float
    warn: float
    critical: float


def _symbol_ratio(
    track: Ports, first: int, still: Standing, config: InfinibandCheckConfig
) -> _Ratio | None:
    judged = _judged(track, first, SYMBOL_COUNTERS, still)
    errors = _increase(track, judged, "symbol_error", still)
    bits = _capacity_bits(track, judged)
    if errors.seconds <= 0 or bits <= 0:
        return None
    return _Ratio(
        "ib_symbol_errors",
        "symbol_error_ratio",
        "symbol errors at an estimated BER",
        errors,
        errors.increase / bits,
        config.symbol_ber_warn,
        config.symbol_ber_critical,
    )


def _receive_ratio(
    track: Ports, first: int, still: Standing, config: InfinibandCheckConfig
) -> _Ratio | None:
    judged = _judged(track, first, (*RECEIVE_ERROR_COUNTERS, RECEIVED_PACKETS), still)
    parts = [_increase(track, judged, name, still) for name in RECEIVE_ERROR_COUNTERS]
    packets = _increase(track, judged, RECEIVED_PACKETS, still)
    if packets.seconds <= 0 or packets.increase < 1 / config.receive_packet_error_ratio_warn:
        return None
    errors = Increase(
        increase=sum(part.increase for part in parts),
        seconds=max(part.seconds for part in parts),
        resets=sum(part.resets for part in parts),
        saturated=any(part.saturated for part in parts),
    )
    return _Ratio(
        "ib_receive_errors",
        "receive_packet_error_ratio",
        "received packets with errors at a ratio",
        errors,
        errors.increase / packets.increase,
        config.receive_packet_error_ratio_warn,
        config.receive_packet_error_ratio_critical,
    )


def _bit_errors(
    port: Port,
    track: Ports,
    quiet_since: int,
    now: float,
    config: InfinibandCheckConfig,
    out: _Verdicts,
) -> None:
    first = track.before(now - config.ber_window)
    # Too little data makes an error or two read as a high rate.
    if track.times[-1] - track.times[first] < config.ber_min_span:
        return
    still = _standing(track, quiet_since, first)
    ratios = (
        _symbol_ratio(track, first, still, config),
        _receive_ratio(track, first, still, config),
    )
    for ratio in ratios:
        if ratio is None:
            continue
        out.measure(ratio.measurement, port, ratio.ratio)
        if ratio.ratio < ratio.warn:
            continue
        saturated = ratio.errors.saturated
        out.find(
            port,
            ratio.code,
            Severity.CRITICAL if ratio.ratio >= ratio.critical else Severity.WARN,
            f"{ratio.what} of {'at least ' if saturated else ''}{ratio.ratio:.2g} "
            f"over {format_duration(ratio.errors.seconds)} "
            f"(warn at {ratio.warn:g}, critical at {ratio.critical:g})",
            Action.INSPECT_HARDWARE,
            {
                "errors": int(ratio.errors.increase),
                "ratio": ratio.ratio,
                "window_seconds": ratio.errors.seconds,
                "resets": ratio.errors.resets,
                "saturated": int(saturated),
            },
        )


def _congestion(
    port: Port,
    track: Ports,
    quiet_since: int,
    now: float,
    config: InfinibandCheckConfig,
    out: _Verdicts,
) -> None:
    first = track.before(now - config.congestion_window)
    still = _standing(track, quiet_since, first)
    judged = _judged(track, first, ("port_xmit_wait",), still)
    wait = _increase(track, judged, "port_xmit_wait", still)
    capacity_bytes = _capacity_bits(track, judged) / BITS_PER_BYTE
    if capacity_bytes > 0 and wait.seconds > 0:
        # Clamped: a ratio above 1 means the tick assumption is wrong for this HCA.
        lost_bytes = wait.increase * config.xmit_wait_bytes_per_tick
        ratio = min(1.0, lost_bytes / capacity_bytes)
        out.measure("xmit_wait_ratio", port, ratio)
        if ratio >= config.xmit_wait_warn_ratio:
            out.find(
                port,
                "ib_congestion",
                Severity.WARN,
                f"waited for credits {ratio:.0%} of {format_duration(wait.seconds)} "
                f"(warn at {config.xmit_wait_warn_ratio:.0%}): fabric congestion",
                Action.NONE,
                {
                    "xmit_wait_ticks": int(wait.increase),
                    "ratio": ratio,
                    "window_seconds": wait.seconds,
                    "saturated": int(wait.saturated),
                },
            )
    if still is not None:
        # port_xmit_discards stood still over the window: nothing discarded.
        return
    discards_judged = _judged(track, first, ("port_xmit_discards",), still)
    discards = _increase(track, discards_judged, "port_xmit_discards", still)
    if discards.increase >= config.xmit_discards_warn_count:
        out.find(
            port,
            "ib_xmit_discards",
            Severity.WARN,
            f"discarded {int(discards.increase)} outbound packet(s) in "
            f"{format_duration(discards.seconds)}",
            Action.NONE,
            {
                "discards": int(discards.increase),
                "window_seconds": discards.seconds,
                "saturated": int(discards.saturated),
            },
        )


def _saturation(port: Port, track: Ports, out: _Verdicts) -> None:
    counters = track.samples[-1].counters
    # What is_saturated says of each counter, at a comparison each: every port, every poll.
    stuck = {
        name: value
        for name, limit in _SATURATION_MAX.items()
        if (value := counters.get(name)) is not None and value >= limit
    }
    for name in stuck:
        out.measure("counter_saturated", port, 1.0, counter=name)
    if not stuck:
        return
    first = track.samples[0]
    # Pinned since the port was first seen (at daemon start, or before the
    # history's horizon): filled by a past nobody watched, not by a fault now.
    inherited = {
        name for name in stuck if is_saturated(first.counters.get(name), COUNTER_BITS[name])
    }
    filled = stuck.keys() - inherited - TELEMETRY_COUNTERS
    names = ", ".join(f"{name} ({value})" for name, value in sorted(stuck.items()))
    since = "while watched" if filled else "since the port was first seen"
    out.find(
        port,
        "ib_counter_saturated",
        Severity.WARN if filled else Severity.OK,
        f"{names} at the IBTA maximum {since}: they count nothing more until cleared "
        f"(`perfquery -C {port[0]} -P {port[1]} -R` clears the port's counters); "
        "meanwhile link flaps are judged from port state changes and the counters "
        "that still move",
        Action.NONE,
        {"counters": ", ".join(sorted(stuck)), "filled_while_watched": len(filled), **stuck},
    )


def _expected(
    history: History, ports: Sequence[Port], config: InfinibandCheckConfig, learned: set[Port]
) -> set[Port]:
    expected = {port for port in ports if _listed(port, config.expected_ports)}
    if config.expect_ports_seen_active:
        expected |= learned
        expected |= {port for port in ports if _seen_active(history.port_track(*port))}
    return expected


def _seen_active(track: Ports) -> bool:
    if not track.last_change((NAME, "quiet"), _quiet):
        # The state stood still over the whole track: the latest one's.
        return track.samples[-1].state_id == ACTIVE
    return track.column((NAME, "active"), _active).present(0, len(track) - 1) > 0


def learned_ports(readings: Iterable[Reading]) -> set[str]:
    """The subjects of the ports ACTIVE in these readings: what a node learns
    it must keep (`expect_ports_seen_active`; the daemon records them)."""
    return {
        port.subject
        for reading in readings
        for port in reading.ports or ()
        if port.state_id == ACTIVE
    }


def _missing(
    port: Port, last_seen: float | None, now: float, learned: bool, out: _Verdicts
) -> None:
    evidence: dict[str, float | int | str] = {"learned": int(learned)}
    if last_seen is not None:
        evidence["seconds_since_seen"] = now - last_seen
    why = "seen ACTIVE on this node before" if learned else "listed in expected_ports"
    out.find(
        port,
        "ib_port_missing",
        Severity.CRITICAL,
        f"expected port ({why}) is not in sysfs (HCA lost or driver not loaded)",
        Action.INSPECT_HARDWARE,
        evidence,
    )


def run(
    history: History,
    now: float,
    config: InfinibandCheckConfig,
    learned: Collection[str] = frozenset(),
) -> CheckOutput:
    """`learned`: the `ib:<device>/<port>` subjects the node learned it must
    keep (recorded in the state database), expected with `expect_ports_seen_active`."""
    last_poll = history.last_port_poll
    if last_poll is None:
        # No InfiniBand reading yet: nothing is known, so nothing is judged.
        return CheckOutput()
    ports = history.port_keys()
    remembered = {port for port in map(port_of_subject, learned) if port is not None}
    out = _Verdicts()
    expected = _expected(history, ports, config, remembered)
    for port in ports:
        track = history.port_track(*port)
        # A port not in the last poll that listed ports is gone.
        if track.times[-1] < last_poll:
            if port in expected:
                _missing(port, track.times[-1], now, port in remembered, out)
            continue
        # Where the quiet fields last changed: windows from there on are judged
        # with no Column of theirs.
        quiet_since = track.last_change((NAME, "quiet"), _quiet)
        if port in expected:
            _link_state(port, track, quiet_since, config, out)
        _flaps(port, track, quiet_since, now, config, out)
        _bit_errors(port, track, quiet_since, now, config, out)
        _congestion(port, track, quiet_since, now, config, out)
        _saturation(port, track, out)
    unseen = _named_ports(config.expected_ports)
    if config.expect_ports_seen_active:
        unseen |= remembered
    for port in sorted(unseen - set(ports)):
        _missing(port, None, now, port in remembered, out)
    return CheckOutput(tuple(out.findings), tuple(out.measurements))
