"""InfiniBand port health: link state and rate, flaps, bit errors, congestion.

Reads the port samples in History (from `gpuwatchd.sources.infiniband`) and
judges each port `ib:<device>/<port>`:

- `ib_port_down` (critical): an expected port is not ACTIVE / LinkUp;
  `ib_port_missing` (critical): an expected port is gone from sysfs;
  `ib_port_rate_degraded` (warn): an expected port trained below its rate.
- `ib_link_flapping`: link_downed + link_error_recovery increments in a window.
- `ib_symbol_errors`, `ib_receive_errors`: errors per bit received (an
  estimated bit error rate) over a window.
- `ib_congestion` (port_xmit_wait as a share of time), `ib_xmit_discards`.
- `ib_counter_saturated`: an IBTA counter stuck at its maximum, so that its
  increases are unknown until someone clears it.

Every increase comes from `gpuwatchd.counters`, so resets (driver reload) and
saturation never give negative or absurd rates. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from gpuwatchd.checks import CheckOutput
from gpuwatchd.counters import (
    Increase,
    gauge_integral,
    increase,
    increase_over,
    is_saturated,
    until_saturated,
    window,
)
from gpuwatchd.history import History, series
from gpuwatchd.model import Action, Finding, Measurement, PortSample, Severity
from gpuwatchd.settings import Seconds
from gpuwatchd.sources.infiniband import BYTES_PER_GIGABIT, COUNTER_BITS
from gpuwatchd.units import format_duration

NAME = "infiniband"

ACTIVE = 4  # state 4: ACTIVE
LINK_UP = 5  # phys_state 5: LinkUp
BITS_PER_BYTE = 8

FLAP_COUNTERS = ("link_downed", "link_error_recovery")
SYMBOL_COUNTERS = ("symbol_error",)
# Receive-side errors that mean bits were damaged on the way in or the lossless
# contract broke (IBTA PortCounters; node_exporter's help texts describe each).
RECEIVE_COUNTERS = (
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
# A saturated port_xmit_wait only blinds the congestion estimate, and on busy
# ports its 32 bits fill within hours: reported, but at severity ok.
TELEMETRY_COUNTERS = frozenset({"port_xmit_wait"})

_PORT_PATTERN = re.compile(r"^[^/\s]+/[^/\s]+$")
_WILDCARDS = frozenset("*?[")

Port = tuple[str, int]
Samples = Sequence[tuple[float, PortSample]]


@dataclass(frozen=True)
class InfinibandCheckConfig:
    # Ports that must be up, as `device/port` patterns (`mlx5_*/1`). A listed
    # port that is down, or that sysfs does not show, is critical.
    expected_ports: tuple[str, ...] = ()
    # Also expect every port seen ACTIVE in history to stay up. Unused ports
    # (never cabled) then raise nothing, while any port that carried traffic
    # and went down does; after a reboot a port that never came up is caught
    # only through expected_ports, and a port down for longer than the
    # daemon's history is forgotten, so production nodes should list theirs.
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
    receive_ber_warn: float = 1e-12
    receive_ber_critical: float = 1e-10
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
        if not 0 < self.receive_ber_warn <= self.receive_ber_critical:
            raise ValueError("receive_ber_warn must be above 0 and at most receive_ber_critical")
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
    return f"ib:{port[0]}/{port[1]}"


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
    return series(samples, lambda sample: sample.counters.get(name))


def _capacity(sample: PortSample) -> float | None:
    """Bytes per second the port can carry: none while it is known not ACTIVE."""
    if sample.state_id is not None and sample.state_id != ACTIVE:
        return 0.0
    return sample.rate_bytes_per_second


@dataclass(frozen=True)
class _Counted:
    """A counter's increase over a window, cut where it saturated (so that time
    in which it had stopped counting does not dilute its rate), and the bytes
    the link could carry at its line rate over that same span."""

    increase: Increase
    capacity_bytes: float


def _counted(recent: Samples, name: str) -> _Counted:
    bits = COUNTER_BITS.get(name)
    judged = until_saturated(_counter(recent, name), bits)
    capacity = gauge_integral(series(recent[: len(judged)], _capacity))
    return _Counted(increase(judged, bits=bits), capacity)


def _link_state(
    port: Port, samples: Samples, config: InfinibandCheckConfig, out: _Verdicts
) -> None:
    latest = samples[-1][1]
    state_bad = latest.state_id is not None and latest.state_id != ACTIVE
    physical_bad = latest.physical_state_id is not None and latest.physical_state_id != LINK_UP
    evidence: dict[str, float | int | str] = {
        key: value
        for key, value in (
            ("state_id", latest.state_id),
            ("state", latest.state),
            ("physical_state_id", latest.physical_state_id),
            ("physical_state", latest.physical_state),
        )
        if value is not None
    }
    if state_bad or physical_bad:
        state = latest.state or latest.state_id or "?"
        physical = latest.physical_state or latest.physical_state_id or "?"
        out.find(
            port,
            "ib_port_down",
            Severity.CRITICAL,
            f"port is {state}/{physical}, expected ACTIVE/LinkUp",
            Action.INSPECT_HARDWARE,
            evidence,
        )
        return
    rate = latest.rate_bytes_per_second
    if rate is None or latest.state_id != ACTIVE:
        return
    seen = [s.rate_bytes_per_second for _, s in samples if s.state_id == ACTIVE]
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
                **evidence,
                "rate_gbps": rate / BYTES_PER_GIGABIT,
                "expected_gbps": expected / BYTES_PER_GIGABIT,
            },
        )


def _flaps(
    port: Port, samples: Samples, now: float, config: InfinibandCheckConfig, out: _Verdicts
) -> None:
    downed, recovered = (
        increase_over(_counter(samples, name), now, config.flap_window, bits=COUNTER_BITS[name])
        for name in FLAP_COUNTERS
    )
    flaps = int(downed.increase + recovered.increase)
    if flaps < config.flap_warn_count:
        return
    saturated = downed.saturated or recovered.saturated
    out.find(
        port,
        "ib_link_flapping",
        Severity.CRITICAL if flaps >= config.flap_critical_count else Severity.WARN,
        f"{'at least ' if saturated else ''}{flaps} flap event(s) in "
        f"{format_duration(config.flap_window)} (link_downed +{int(downed.increase)}, "
        f"link_error_recovery +{int(recovered.increase)})",
        Action.INSPECT_HARDWARE,
        {
            "link_downed": int(downed.increase),
            "link_error_recovery": int(recovered.increase),
            "window_seconds": config.flap_window,
            "resets": downed.resets + recovered.resets,
            "saturated": int(saturated),
        },
    )


def _bit_errors(
    port: Port, samples: Samples, now: float, config: InfinibandCheckConfig, out: _Verdicts
) -> None:
    recent = window(samples, now, config.ber_window)
    judged = (
        (
            "ib_symbol_errors",
            "symbol",
            SYMBOL_COUNTERS,
            config.symbol_ber_warn,
            config.symbol_ber_critical,
        ),
        (
            "ib_receive_errors",
            "receive",
            RECEIVE_COUNTERS,
            config.receive_ber_warn,
            config.receive_ber_critical,
        ),
    )
    # Too little data makes an error or two read as a high BER.
    if recent[-1][0] - recent[0][0] < config.ber_min_span:
        return
    for code, kind, names, warn, critical in judged:
        parts = [_counted(recent, name) for name in names]
        usable = [part for part in parts if part.increase.seconds > 0 and part.capacity_bytes > 0]
        if not usable:
            continue
        ber = sum(part.increase.increase / (part.capacity_bytes * BITS_PER_BYTE) for part in usable)
        out.measure(f"{kind}_error_ratio", port, ber)
        if ber < warn:
            continue
        saturated = any(part.increase.saturated for part in parts)
        span = max(part.increase.seconds for part in usable)
        out.find(
            port,
            code,
            Severity.CRITICAL if ber >= critical else Severity.WARN,
            f"{kind} errors at an estimated BER of {'at least ' if saturated else ''}{ber:.2g} "
            f"over {format_duration(span)} (warn at {warn:g}, critical at {critical:g})",
            Action.INSPECT_HARDWARE,
            {
                "errors": int(sum(part.increase.increase for part in usable)),
                "ber": ber,
                "window_seconds": span,
                "resets": sum(part.increase.resets for part in parts),
                "saturated": int(saturated),
            },
        )


def _congestion(
    port: Port, samples: Samples, now: float, config: InfinibandCheckConfig, out: _Verdicts
) -> None:
    recent = window(samples, now, config.congestion_window)
    wait = _counted(recent, "port_xmit_wait")
    if wait.capacity_bytes > 0 and wait.increase.seconds > 0:
        # Clamped: a ratio above 1 means the tick assumption is wrong for this HCA.
        lost_bytes = wait.increase.increase * config.xmit_wait_bytes_per_tick
        ratio = min(1.0, lost_bytes / wait.capacity_bytes)
        out.measure("xmit_wait_ratio", port, ratio)
        if ratio >= config.xmit_wait_warn_ratio:
            out.find(
                port,
                "ib_congestion",
                Severity.WARN,
                f"waited for credits {ratio:.0%} of {format_duration(wait.increase.seconds)} "
                f"(warn at {config.xmit_wait_warn_ratio:.0%}): fabric congestion",
                Action.NONE,
                {
                    "xmit_wait_ticks": int(wait.increase.increase),
                    "ratio": ratio,
                    "window_seconds": wait.increase.seconds,
                    "saturated": int(wait.increase.saturated),
                },
            )
    discards = _counted(recent, "port_xmit_discards").increase
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


def _saturation(port: Port, samples: Samples, out: _Verdicts) -> None:
    latest = samples[-1][1]
    stuck = {
        name: latest.counters[name]
        for name, bits in COUNTER_BITS.items()
        if is_saturated(latest.counters.get(name), bits)
    }
    for name in stuck:
        out.measure("counter_saturated", port, 1.0, counter=name)
    if not stuck:
        return
    names = ", ".join(sorted(stuck))
    out.find(
        port,
        "ib_counter_saturated",
        Severity.OK if stuck.keys() <= TELEMETRY_COUNTERS else Severity.WARN,
        f"{names} stopped at the IBTA maximum: what they count since is unknown "
        "until the port's counters are cleared (perfquery -x)",
        Action.NONE,
        {"counters": names, **stuck},
    )


def _expected(history: History, ports: Sequence[Port], config: InfinibandCheckConfig) -> set[Port]:
    expected = {port for port in ports if _listed(port, config.expected_ports)}
    if config.expect_ports_seen_active:
        expected |= {
            port
            for port in ports
            if any(sample.state_id == ACTIVE for _, sample in history.port(*port))
        }
    return expected


def _missing(port: Port, last_seen: float | None, now: float, out: _Verdicts) -> None:
    evidence: dict[str, float | int | str] = {}
    if last_seen is not None:
        evidence["seconds_since_seen"] = now - last_seen
    out.find(
        port,
        "ib_port_missing",
        Severity.CRITICAL,
        "expected port is not in sysfs (HCA lost or driver not loaded)",
        Action.INSPECT_HARDWARE,
        evidence,
    )


def run(history: History, now: float, config: InfinibandCheckConfig) -> CheckOutput:
    ports = history.port_keys()
    if not ports:
        # No InfiniBand reading yet: nothing is known, so nothing is judged.
        return CheckOutput()
    out = _Verdicts()
    expected = _expected(history, ports, config)
    # The newest sample of any port is the last poll: a port not in it is gone.
    last_poll = max(history.port(*port)[-1][0] for port in ports)
    for port in ports:
        samples = history.port(*port)
        if samples[-1][0] < last_poll:
            if port in expected:
                _missing(port, samples[-1][0], now, out)
            continue
        if port in expected:
            _link_state(port, samples, config, out)
        _flaps(port, samples, now, config, out)
        _bit_errors(port, samples, now, config, out)
        _congestion(port, samples, now, config, out)
        _saturation(port, samples, out)
    for port in sorted(_named_ports(config.expected_ports) - set(ports)):
        _missing(port, None, now, out)
    return CheckOutput(tuple(out.findings), tuple(out.measurements))
