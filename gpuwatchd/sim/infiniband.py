"""The simulated node's InfiniBand HCAs: a real sysfs tree driven by a scenario.

Owns the files under `<sysfs_root>/class/infiniband/` for the scenario node's
HCAs (`mlx5_0`.., one 400 Gb/s NDR port each, ConnectX-7 identities): state,
rate, link layer, `counters/` and `hw_counters/`, with training-like traffic
in the background and the `ib_symbol_errors`, `ib_link_flap`, `ib_port_down`,
`ib_congestion`, `ib_counter_pinned` and `ib_counter_einval` faults of the
scenario on top. The reader in `gpuwatchd.sources.infiniband` reads this tree
exactly as it reads `/sys`.

`ib_counter_pinned` is what real ConnectX-7 ports show after months of uptime
(gpud PR #943: `link_downed` 255, `port_xmit_discards` 65535,
`port_xmit_wait` 2^32-1): the counter reads its IBTA maximum from the fault's
start until it ends, which is the counter being cleared (it then counts again
from what it would hold). `ib_counter_einval` makes a counter file fail its
read() with EINVAL, as restricted ConnectX-7 functions do: the file is a
symbolic link to a kernel file that the kernel itself refuses that way (see
`einval_target`), so the reader meets a real EINVAL from a real read().

Every value is a closed-form function of the seed and of the time since
start, so a run reads the same however often it is advanced. The IBTA error
counters clamp at their widths (`COUNTER_BITS`) as the hardware does, so a
long or heavy fault saturates them. Files are replaced atomically (written in
a staging folder beside the tree, then renamed into place), so a concurrent
reader never sees half a file.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuwatchd.counters import saturation_max
from gpuwatchd.model import BYTES_PER_GIGABIT, COUNTER_BITS
from gpuwatchd.sim.scenario import Fault, Scenario, ScenarioError
from gpuwatchd.sim.sysfs import TreeWriter
from gpuwatchd.sources.infiniband import BYTES_PER_WORD

PORT = 1
LINE_RATE = "400 Gb/sec (4X NDR)"
LINE_RATE_BYTES_PER_SECOND = 400 * BYTES_PER_GIGABIT
# What ConnectX ports show without a link (ibstat's "Rate: 10" on a down port).
NO_LINK_RATE = "10 Gb/sec (4X SDR)"
ACTIVE, LINK_UP = "4: ACTIVE", "5: LinkUp"
DOWN, POLLING = "1: DOWN", "2: Polling"

# ConnectX-7, the 400G HCA of HGX H100 nodes: hca_type is its PCI device id
# (0x1021 = 4129), board_id a PSID in the MT_ form the firmware reports.
BOARD_ID = "MT_0000000838"
HCA_TYPE = "MT4129"
FIRMWARE_VERSION = "28.39.1002"

# Training traffic: each rank's HCA carries a steady share of the line rate,
# in bursts (collectives) once per iteration. The counters start where some
# days of such uptime left them.
UTILIZATION = (0.35, 0.6)
BURST_AMPLITUDE = 0.8
ITERATION_SECONDS = (2.0, 8.0)
UPTIME_SECONDS = (86_400.0, 20 * 86_400.0)
# Packets of a 4096-byte MTU, headers included.
PACKET_BYTES = 4096 + 58
MULTICAST_PACKETS_PER_SECOND = 0.5  # SM and IPoIB housekeeping
# RDMA writes and reads of NCCL's chunked transfers.
WRITE_REQUEST_BYTES = 1 << 20
READ_REQUEST_BYTES = 4 << 20
# A healthy fabric still makes a port wait now and then: about one
# millionth of the time at the 8-bytes-per-tick convention (see checks).
BACKGROUND_XMIT_WAIT_TICKS_PER_SECOND = 6_000.0
BACKGROUND_XMIT_WAIT_START = (0, 100_000_000)

# Of the symbol errors that FEC cannot correct, about half land in a packet at
# training load (the rest hit idles) and make it a receive error.
RECEIVE_ERRORS_PER_SYMBOL_ERROR = 0.5
# Under sustained congestion, packets outlive the head-of-queue lifetime and
# are discarded: about one per ten million ticks of waiting.
XMIT_WAIT_TICKS_PER_DISCARD = 10_000_000
# A flapping link is down this long per flap (and at most half the period).
FLAP_DOWN_SECONDS = 2.0
# hw_counters/lifespan: the driver's counter aging period in milliseconds.
HW_COUNTER_LIFESPAN_MS = 10

COUNTER_FILES = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)
HW_COUNTER_FILES = (
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_read_requests",
    "rx_write_requests",
)


# Kernel files that have no read operation, or whose read the kernel refuses,
# so that open() works and read() fails with EINVAL (vfs_read without
# FMODE_CAN_READ; the security module's getprocattr for an attribute it does
# not keep). Which one does depends on the process's rights and the LSM:
# the first that does on this host is used.
EINVAL_CANDIDATES = (
    "/proc/self/clear_refs",
    "/proc/self/attr/sockcreate",
    "/proc/self/attr/keycreate",
    "/proc/self/attr/exec",
)


@functools.cache
def einval_target() -> str:
    """A file whose read() fails with EINVAL for this process."""
    for candidate in EINVAL_CANDIDATES:
        try:
            descriptor = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.read(descriptor, 4096)
        except OSError as error:
            if error.errno == errno.EINVAL:
                return candidate
        finally:
            os.close(descriptor)
    raise ScenarioError(
        "ib_counter_einval: no file on this host fails its read with EINVAL "
        f"(tried {', '.join(EINVAL_CANDIDATES)})"
    )


def counter_path(name: str) -> str:
    """Where a counter file lives under a port: counters/ or hw_counters/."""
    if name in COUNTER_FILES:
        return f"counters/{name}"
    if name in HW_COUNTER_FILES:
        return f"hw_counters/{name}"
    raise ScenarioError(
        f"{name!r} is not a simulated counter file (counters/: {', '.join(COUNTER_FILES)}; "
        f"hw_counters/: {', '.join(HW_COUNTER_FILES)})"
    )


@dataclass(frozen=True)
class _Traffic:
    """One direction of a port's data: a closed-form cumulative byte count."""

    start_bytes: int
    bytes_per_second: float
    angular: float  # 2 pi / iteration period
    phase: float

    def bytes_after(self, seconds: float) -> int:
        # The integral of rate * (1 + A sin(w s + phase)) from 0: it never
        # decreases, since A < 1 keeps the rate positive.
        swing = (BURST_AMPLITUDE / self.angular) * (
            math.cos(self.phase) - math.cos(self.angular * seconds + self.phase)
        )
        return self.start_bytes + math.floor(self.bytes_per_second * (seconds + swing))


def _traffic(rng: random.Random, utilization: float, iteration: float, uptime: float) -> _Traffic:
    mean = utilization * LINE_RATE_BYTES_PER_SECOND
    return _Traffic(
        start_bytes=math.floor(mean * uptime),
        bytes_per_second=mean,
        angular=2 * math.pi / iteration,
        phase=rng.uniform(0, 2 * math.pi),
    )


def _rate_count(fault: Fault, t: float, share: float = 1.0) -> int:
    """Events a rate fault has counted by time t (rate x time active)."""
    return math.floor((fault.rate or 0.0) * share * fault.elapsed(t))


def _flaps(fault: Fault, t: float) -> int:
    """Flaps of an `ib_link_flap` fault by time t: one at its start, then one
    every 1/rate seconds while it lasts."""
    if t < fault.at or not fault.rate:
        return 0
    started = math.floor(fault.elapsed(t) * fault.rate) + 1
    if math.isinf(fault.until):
        return started
    return min(started, math.ceil((fault.until - fault.at) * fault.rate))


def _flap_down(fault: Fault, t: float) -> bool:
    if not fault.active(t) or not fault.rate:
        return False
    period = 1.0 / fault.rate
    return (t - fault.at) % period < min(FLAP_DOWN_SECONDS, period / 2)


class _HcaModel:
    """One HCA's port: its background traffic and the scenario's faults on it."""

    def __init__(self, name: str, faults: tuple[Fault, ...], rng: random.Random) -> None:
        self.name = name
        self._faults = tuple(fault for fault in faults if fault.hca == name)
        for fault in self._of("ib_counter_einval"):
            counter_path(fault.counter or "")
        utilization = rng.uniform(*UTILIZATION)
        iteration = rng.uniform(*ITERATION_SECONDS)
        uptime = rng.uniform(*UPTIME_SECONDS)
        self.node_guid = ":".join(f"{rng.getrandbits(16):04x}" for _ in range(4))
        self._receive = _traffic(rng, utilization, iteration, uptime)
        self._transmit = _traffic(rng, utilization, iteration, uptime)
        self._xmit_wait_start = rng.randint(*BACKGROUND_XMIT_WAIT_START)
        # Raw counts at the last counter reset (driver reload), subtracted from now on.
        self._baseline: dict[str, int] = {}

    def _of(self, kind: str) -> tuple[Fault, ...]:
        return tuple(fault for fault in self._faults if fault.kind == kind)

    def port_files(self, t: float) -> dict[str, str]:
        """The port's files (relative to ports/1) and their text at time t."""
        down = any(fault.active(t) for fault in self._of("ib_port_down")) or any(
            _flap_down(fault, t) for fault in self._of("ib_link_flap")
        )
        files = {
            "state": DOWN if down else ACTIVE,
            "phys_state": POLLING if down else LINK_UP,
            "rate": NO_LINK_RATE if down else LINE_RATE,
            "link_layer": "InfiniBand",
        }
        counters, hw_counters = self._counts(t)
        files.update({f"counters/{name}": str(value) for name, value in counters.items()})
        files.update({f"hw_counters/{name}": str(value) for name, value in hw_counters.items()})
        files["hw_counters/lifespan"] = str(HW_COUNTER_LIFESPAN_MS)
        return files

    def refused_files(self, t: float) -> frozenset[str]:
        """The port's files (relative to ports/1) whose read fails with EINVAL at t."""
        refusing = self._of("ib_counter_einval")
        return frozenset(counter_path(f.counter or "") for f in refusing if f.active(t))

    def reset(self, t: float) -> None:
        """What a driver reload does to the port: every counter starts again at 0."""
        self._baseline = self._raw(t)

    def _counts(self, t: float) -> tuple[dict[str, int], dict[str, int]]:
        raw = self._raw(t)
        # A count cannot go below the value it was cleared at (a pin that ends
        # after a clear takes its offset back from a counter already at 0).
        values = {name: max(0, value - self._baseline.get(name, 0)) for name, value in raw.items()}
        counters = {name: self._clamped(name, values.get(name, 0)) for name in COUNTER_FILES}
        hw_counters = {name: values.get(name, 0) for name in HW_COUNTER_FILES}
        return counters, hw_counters

    @staticmethod
    def _clamped(name: str, value: int) -> int:
        limit = saturation_max(COUNTER_BITS.get(name))
        return value if limit is None else min(value, limit)

    def _unpinned(self, t: float) -> dict[str, int]:
        """Every count since boot as the faults other than pins make it."""
        # Traffic stops while the cable is out; short flaps are left in it.
        traffic_seconds = t - sum(fault.elapsed(t) for fault in self._of("ib_port_down"))
        received = self._receive.bytes_after(traffic_seconds)
        transmitted = self._transmit.bytes_after(traffic_seconds)
        symbol_errors = sum(_rate_count(fault, t) for fault in self._of("ib_symbol_errors"))
        flaps = sum(_flaps(fault, t) for fault in self._of("ib_link_flap"))
        downs = sum(1 for fault in self._of("ib_port_down") if fault.at <= t)
        congestion = sum(_rate_count(fault, t) for fault in self._of("ib_congestion"))
        multicast = math.floor(MULTICAST_PACKETS_PER_SECOND * traffic_seconds)
        wait = self._xmit_wait_start + math.floor(
            BACKGROUND_XMIT_WAIT_TICKS_PER_SECOND * traffic_seconds
        )
        counts = {
            "port_rcv_data": received // BYTES_PER_WORD,
            "port_xmit_data": transmitted // BYTES_PER_WORD,
            "port_rcv_packets": received // PACKET_BYTES,
            "port_xmit_packets": transmitted // PACKET_BYTES,
            "unicast_rcv_packets": received // PACKET_BYTES - multicast,
            "unicast_xmit_packets": transmitted // PACKET_BYTES - multicast,
            "multicast_rcv_packets": multicast,
            "multicast_xmit_packets": multicast,
            "symbol_error": symbol_errors,
            "port_rcv_errors": math.floor(symbol_errors * RECEIVE_ERRORS_PER_SYMBOL_ERROR),
            "link_downed": flaps + downs,
            "link_error_recovery": flaps,
            "port_xmit_wait": wait + congestion,
            "port_xmit_discards": congestion // XMIT_WAIT_TICKS_PER_DISCARD,
            "rx_write_requests": received // WRITE_REQUEST_BYTES,
            "rx_read_requests": received // READ_REQUEST_BYTES,
        }
        return counts

    def _raw(self, t: float) -> dict[str, int]:
        """Every count since boot, unclamped and in the units of the files,
        with the pins of `ib_counter_pinned`: while one lasts its counter holds
        a count past its width, which the clamp shows as the maximum; when it
        ends the counter is cleared (perfquery -R) and counts from 0."""
        counts = self._unpinned(t)
        for fault in self._of("ib_counter_pinned"):
            name = fault.counter or ""
            if fault.active(t):
                counts[name] = counts.get(name, 0) + (1 << COUNTER_BITS[name])
            elif t >= fault.until:
                counts[name] = counts.get(name, 0) - self._unpinned(fault.until).get(name, 0)
        return counts


class SimulatedFabric:
    """The HCAs of `scenario.node` as a sysfs tree under `sysfs_root`.

    `start` is the wall-clock time of the scenario's 0 s; `advance(now)`
    rewrites the tree as it stands at `now`.
    """

    def __init__(self, scenario: Scenario, sysfs_root: Path, start: float) -> None:
        self.root = Path(sysfs_root)
        self.start = start
        self._class_dir = self.root / "class" / "infiniband"
        self._tree = TreeWriter(self.root, "infiniband")
        rng = random.Random(f"{scenario.seed}/infiniband")
        self._hcas = tuple(
            _HcaModel(name, scenario.faults, rng) for name in scenario.node.hca_names
        )
        self.advance(start)

    def advance(self, now: float) -> None:
        t = max(0.0, now - self.start)
        for hca in self._hcas:
            device = self._class_dir / hca.name
            self._tree.write_all(device, self._device_files(hca))
            port = device / "ports" / str(PORT)
            refused = hca.refused_files(t)
            files = hca.port_files(t)
            self._tree.write_all(
                port, {name: text for name, text in files.items() if name not in refused}
            )
            for name in refused:
                self._tree.link(port / name, einval_target())

    def reset_counters(self, hca: str, now: float) -> None:
        """A driver reload (or `perfquery -R`) on `hca`: its counters restart from 0."""
        for model in self._hcas:
            if model.name == hca:
                model.reset(max(0.0, now - self.start))
        self.advance(now)

    @staticmethod
    def _device_files(hca: _HcaModel) -> Mapping[str, str]:
        return {
            "board_id": BOARD_ID,
            "fw_ver": FIRMWARE_VERSION,
            "hca_type": HCA_TYPE,
            "node_guid": hca.node_guid,
        }
