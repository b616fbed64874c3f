"""The InfiniBand source: every HCA port under `<sysfs_root>/class/infiniband`.

Reads, per device, `board_id`, `fw_ver`, `hca_type` and `node_guid`, and per
port `state`, `phys_state`, `rate`, `link_layer` and every file under
`counters/` and `hw_counters/`. Not all at every poll: a poll reads each
port's JUDGED_FILES (`state`, `phys_state`, `rate`) and PROMPT_COUNTERS, what
the infiniband check judges from poll to poll and the dashboards graph; the
rest is read every
`counter_interval` (when the device is new or re-created, at once), and the
sample keeps the values last read meanwhile. A port whose state or rate
changed, whose link went down or recovered (link_downed, link_error_recovery:
it may have retrained at another rate) or whose counters went back (a reset)
is read whole at once. A port whose files say what they said last poll is
handed back as the same sample object. What a file does not say (missing,
empty, unreadable, `N/A (no PMA)`, a number that is not a u64) is an absent
value, logged once per file; it never stops the rest of the port from being
read. A device that disappears while it is read (hot unplug, driver reload) is
left out of that poll.

A file whose read fails with EINVAL or EOPNOTSUPP is not read again while its
device stays: on restricted ConnectX-7 functions (DGX and GB200 systems) every
such read makes the driver log an `ACCESS_REG ... err(-22)` line, and the
refusal is the firmware's policy for that function, not a passing state. No
timed re-check: it would only buy more kernel log lines. A driver reload or
hot plug re-creates the device's directory, and then its files are tried again.

A node with no InfiniBand device at all (no `class/infiniband`, or nothing in
it but excluded devices) is a reading with no ports and an error that says so:
the source is not "up" where there is nothing to read.

The source knows nothing about health. The widths at which the IBTA
counters under `counters/` saturate (`model.COUNTER_BITS`) are a fact of this
hardware interface that the checks and the simulator share: they live in the
model.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from gpuwatchd.model import (
    BYTES_PER_GIGABIT,
    COUNTER_BITS,
    InfinibandDevice,
    PortSample,
    Reading,
)
from gpuwatchd.sources import InfinibandSourceConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

CLASS_PATH = ("class", "infiniband")

# Counters that drivers show in 4-byte words (IBTA PortXmitData/PortRcvData
# count octets divided by 4); the sample holds bytes.
WORD_COUNTERS = frozenset({"port_rcv_data", "port_xmit_data"})
BYTES_PER_WORD = 4

DEVICE_FILES = ("board_id", "fw_ver", "hca_type", "node_guid")

# Read at every poll: the counters the infiniband check (checks/infiniband.py)
# judges from poll to poll. It turns the increases of the IBTA error counters
# (flaps, symbol and receive errors, transmit waits and discards) and of
# port_rcv_packets (what receive errors are a share of) into rates over the
# poll times, and judges every IBTA counter's saturation at the latest poll:
# a value held from an earlier read would set its increase against the wrong
# seconds. The data counters too: the dashboards graph their rate() over
# Grafana's $__rate_interval (about a minute), which a value held for 30 s
# would make a staircase of. The other packet counters and hw_counters/ are
# only exported, as counters, whose rates PromQL takes over its own window.
PROMPT_COUNTERS = frozenset(COUNTER_BITS) | {"port_rcv_packets", *WORD_COUNTERS}
# Read at every poll too, and compared with the texts the port's last whole
# read found: the check judges state and rate at every poll (down, rate
# degraded, the line rate a bit error rate is over); a change in any of them
# reads the port whole.
JUDGED_FILES = ("state", "phys_state", "rate")
# A link that went down or retrained between two polls may have come back at
# another rate without a state change that the polls saw.
FLAP_COUNTERS = ("link_downed", "link_error_recovery")

# `4: ACTIVE`, `5: LinkUp`: a number, a colon, a name.
_STATE_RE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")
# `400 Gb/sec (4X NDR)`, `2.5 Gb/sec (1X SDR)`, `0 GB/sec`. Like node_exporter,
# the number is read as Gb/s whatever the case of the unit: the kernel's
# rate_show writes `Gb/sec`, and `0 GB/sec` (no rate) is 0 in either unit.
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*G[bB]/sec\b")

# Errors that mean the file (or the device under it) is gone, not unreadable.
_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENODEV, errno.ENXIO})
# Errors that the same file gives on every read: not asked again (see above).
REFUSED_ERRNOS = frozenset({errno.EINVAL, errno.EOPNOTSUPP})

# sysfs counters are u64 (the kernel prints them with %llu); anything longer
# is garbage, and unbounded it breaks every float it meets.
U64_MAX = 2**64 - 1
_U64_DIGITS = len(str(U64_MAX))
# The kernel prints a port's state and physical state as a u8 (struct
# ib_port_attr: enum ib_port_state, u8 phys_state): a larger number is garbage.
MAX_STATE = 255
# Far above any link there is (12X XDR is 2400 Gb/s): a larger rate is garbage.
MAX_RATE_GBPS = 100_000.0


def read_attribute(path: str) -> str:
    """The text of one sysfs attribute (at most a page, so one read).

    Raises OSError; some drivers fail in read() rather than open() (EINVAL,
    EOPNOTSUPP), so both are inside the caller's handler.
    """
    return text_of(read_bytes(path))


def read_bytes(path: str, folder: int | None = None) -> bytes:
    """One attribute's bytes; `path` relative to the open directory `folder`
    when given, which spares the kernel the walk down the whole path."""
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=folder)
    try:
        return os.read(descriptor, 4096)
    finally:
        os.close(descriptor)


def text_of(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()


def parse_state(text: str) -> tuple[int, str]:
    """`4: ACTIVE` -> (4, "ACTIVE")."""
    match = _STATE_RE.match(text)
    if match is None:
        raise ValueError(f"not a state such as '4: ACTIVE': {_clipped(text)}")
    digits = match.group(1)
    if len(digits) > len(str(MAX_STATE)) or int(digits) > MAX_STATE:
        raise ValueError(f"not a port state (above {MAX_STATE}): {_clipped(text)}")
    return int(digits), match.group(2)


def parse_rate(text: str) -> float:
    """`400 Gb/sec (4X NDR)` -> bytes per second (5e10)."""
    match = _RATE_RE.match(text)
    if match is None:
        raise ValueError(f"not a rate such as '400 Gb/sec (4X NDR)': {text!r}")
    gigabits = float(match.group(1))
    if not gigabits <= MAX_RATE_GBPS:
        raise ValueError(f"not a link rate (above {MAX_RATE_GBPS:g} Gb/s): {_clipped(text)}")
    return gigabits * BYTES_PER_GIGABIT


def parse_counter(text: str) -> int:
    """A decimal u64; anything else (`N/A (no PMA)`, `-1`, 400 digits) is an error."""
    digits = text.strip()
    # isascii: str.isdigit alone also accepts digits of other scripts.
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"not a number: {_clipped(text)}")
    if len(digits) > _U64_DIGITS or int(digits) > U64_MAX:
        raise ValueError(f"not a u64 (above {U64_MAX}): {_clipped(text)}")
    return int(digits)


def _clipped(text: str, limit: int = 40) -> str:
    """The text for a log line, cut short: a garbage file can be a page long."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def port_number(entry: str) -> int | None:
    """The port number a `ports/` entry names, or None for anything else."""
    if not (entry.isascii() and entry.isdigit()) or len(entry) > 5:
        return None
    return int(entry)


@dataclass(frozen=True)
class _Problem:
    subject: str
    path: str
    reason: str
    gone: bool  # the file is missing: maybe the device or port went away
    refused: bool = False  # the file fails the same way at every read


@dataclass
class _Attempt:
    """What one device or port read ran into, judged once the read is over."""

    subject: str
    problems: list[_Problem] = field(default_factory=list)
    # Files not to read: those that refused before (see REFUSED_ERRNOS).
    skip: frozenset[str] = frozenset()

    def text(self, path: str) -> str | None:
        if path in self.skip:
            return None
        try:
            text = read_attribute(path)
        except OSError as error:
            self.fail(path, error)
            return None
        return self._unless_empty(path, text)

    def _unless_empty(self, path: str, text: str) -> str | None:
        if not text:
            self.problems.append(_Problem(self.subject, path, "empty", gone=False))
            return None
        return text

    def counters(self, directory: str) -> dict[str, int]:
        """Every counter file of `directory` by name, read and judged as
        `text` and `parse_counter` would, with the files opened relative to
        the directory and a plain number taken without decoding: this loop
        reads most of the files of a whole read."""
        values: dict[str, int] = {}
        try:
            folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            self.fail(directory, error)
            return values
        skip = self.skip
        try:
            for name in sorted(os.listdir(folder)):
                if skip and f"{directory}/{name}" in skip:
                    continue
                try:
                    data = read_bytes(name, folder)
                except OSError as error:
                    self.fail(f"{directory}/{name}", error)
                    continue
                plain = _plain_u64(data)
                if plain is not None:
                    values[name] = plain
                    continue
                value = self.parsed(f"{directory}/{name}", text_of(data), parse_counter)
                if value is not None:
                    values[name] = value
        finally:
            os.close(folder)
        return values

    def parsed(self, path: str, text: str | None, parse: Callable[[str], T]) -> T | None:
        """`text`, read from `path`, parsed; None (and said) where it is not."""
        if text is None or self._unless_empty(path, text) is None:
            return None
        try:
            return parse(text)
        except ValueError as error:
            self.unparsable(path, error)
            return None

    def listing(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError as error:
            self.fail(path, error)
            return []

    def fail(self, path: str, error: OSError) -> None:
        gone = error.errno in _GONE_ERRNOS
        refused = error.errno in REFUSED_ERRNOS
        reason = "missing" if gone else (error.strerror or str(error))
        if refused:
            reason += (
                "; not read again while the device stays (restricted ConnectX-7 "
                "functions log a kernel ACCESS_REG error at every such read)"
            )
        self.problems.append(_Problem(self.subject, path, reason, gone, refused))

    def unparsable(self, path: str, error: ValueError) -> None:
        self.problems.append(_Problem(self.subject, path, str(error), gone=False))

    @property
    def missed_files(self) -> bool:
        return any(problem.gone for problem in self.problems)

    @property
    def refused(self) -> set[str]:
        return {problem.path for problem in self.problems if problem.refused}


@dataclass(frozen=True)
class _HeldDevice:
    """A device as its last whole read found it: what polls keep until the next."""

    inode: int  # its class/infiniband entry's: a re-created device is a new one
    read_at: float
    device: InfinibandDevice
    ports: tuple[int, ...]  # fixed while the device stays (ib_register_device)


@dataclass
class _HeldPort:
    """A port's last sample, and what its last whole read was read with."""

    sample: PortSample  # the last poll's: what the next prompt read compares with
    directory: str
    judged: tuple[str | None, ...]  # the texts of JUDGED_FILES
    # The PROMPT_COUNTERS its counters/ held as numbers, each with its path
    # under `directory` and the bytes one of its units is.
    prompt: tuple[tuple[str, str, int], ...]


class InfinibandSource:
    """Source over `<sysfs_root>/class/infiniband`, minus `exclude_devices`."""

    name = "infiniband"

    def __init__(self, config: InfinibandSourceConfig) -> None:
        self._class_dir = os.path.join(config.sysfs_root, *CLASS_PATH)
        self._exclude = frozenset(config.exclude_devices)
        self._interval = config.counter_interval
        self._reported: set[str] = set()
        # Per device: the identity of its directory (st_dev, st_ino) when its
        # files refused, and those files. A new directory is a new device.
        self._refused: dict[str, tuple[tuple[int, int], set[str]]] = {}
        self._devices: dict[str, _HeldDevice] = {}
        self._ports: dict[tuple[str, int], _HeldPort] = {}

    def poll(self, now: float) -> Reading:
        try:
            with os.scandir(self._class_dir) as listing:
                entries = sorted((entry.name, entry.inode()) for entry in listing)
        except FileNotFoundError:
            return self._nothing(now, f"{self._class_dir} is missing (no RDMA driver loaded)")
        except OSError as error:
            reason = f"cannot list {self._class_dir}: {error.strerror}"
            return Reading(source=self.name, time=now, error=reason)
        devices: list[InfinibandDevice] = []
        ports: list[PortSample] = []
        for name, inode in entries:
            if name in self._exclude or not self._nameable(name):
                continue
            read = self._read_device(name, inode, now)
            if read is not None:
                devices.append(read[0])
                ports.extend(read[1])
        self._forget_all_but(devices, ports)
        if not devices:
            return self._nothing(now, f"no InfiniBand device under {self._class_dir}")
        return Reading(
            source=self.name, time=now, infiniband_devices=tuple(devices), ports=tuple(ports)
        )

    def _forget_all_but(self, devices: list[InfinibandDevice], ports: list[PortSample]) -> None:
        names = {device.device for device in devices}
        self._devices = {name: held for name, held in self._devices.items() if name in names}
        keys = {(port.device, port.port) for port in ports}
        self._ports = {key: held for key, held in self._ports.items() if key in keys}

    def _nothing(self, now: float, reason: str) -> Reading:
        """A poll that found no device: read (no ports, so expected ports are
        missing), but not up; a node without InfiniBand should not enable it."""
        return Reading(source=self.name, time=now, infiniband_devices=(), ports=(), error=reason)

    def _nameable(self, name: str) -> bool:
        """Any printable name makes a subject (port_subject writes what a subject
        cannot spell as %XX); bytes that are not UTF-8, or control characters,
        cannot be a Prometheus label value or a log line an operator can read."""
        if name.isprintable():
            return True
        self._report_once(
            f"{self._class_dir}/{name!a}",
            f"ib: device {_clipped(name)} is not read: a name of bytes that are "
            "not printable UTF-8 cannot label a metric",
            missing=False,
        )
        return False

    def close(self) -> None:
        """Nothing is held open between polls."""

    def _held_device(self, name: str, inode: int, now: float) -> _HeldDevice | None:
        """The device as last read, unless it is to be read whole now."""
        held = self._devices.get(name)
        if held is None or held.inode != inode or not 0 <= now - held.read_at < self._interval:
            return None
        return held

    def _read_device(
        self, name: str, inode: int, now: float
    ) -> tuple[InfinibandDevice, list[PortSample]] | None:
        held = self._held_device(name, inode, now)
        if held is not None:
            prompt = self._prompt_samples(name, held.ports)
            if prompt is not None:
                return held.device, prompt
        directory = os.path.join(self._class_dir, name)
        skip = self._refused_files(name, directory)
        attempt = _Attempt(f"ib:{name}", skip=skip)
        ports_dir = os.path.join(directory, "ports")
        if held is None:
            facts = {file: attempt.text(os.path.join(directory, file)) for file in DEVICE_FILES}
            listed = (port_number(entry) for entry in attempt.listing(ports_dir))
            numbers = tuple(sorted(number for number in listed if number is not None))
        else:
            numbers = held.ports
        ports: list[PortSample] = []
        attempts = [attempt]
        lost_port = False
        for number in numbers:
            port_attempt = _Attempt(f"ib:{name}/{number}", skip=skip)
            port_dir = os.path.join(ports_dir, str(number))
            port = self._port(name, number, port_dir, port_attempt, whole=held is None)
            # Only a read that missed files pays for the check that the port is still there.
            if port_attempt.missed_files and not os.path.isdir(port_dir):
                lost_port = True
                continue
            ports.append(port)
            attempts.append(port_attempt)
        if (attempt.missed_files or lost_port) and not os.path.isdir(directory):
            log.debug("ib:%s: the device went away while it was read", name)
            return None
        for each in attempts:
            self._report(each)
            self._remember_refused(name, directory, each.refused)
        if held is not None:
            return held.device, ports
        device = InfinibandDevice(
            device=name,
            board_id=facts["board_id"],
            firmware_version=facts["fw_ver"],
            hca_type=facts["hca_type"],
            node_guid=facts["node_guid"],
        )
        self._devices[name] = _HeldDevice(inode, now, device, numbers)
        return device, ports

    def _refused_files(self, name: str, directory: str) -> frozenset[str]:
        remembered = self._refused.get(name)
        if remembered is None:
            return frozenset()
        if remembered[0] != _identity(directory):
            # Re-created by a driver reload or hot plug: its files may read now.
            del self._refused[name]
            for path in remembered[1]:
                self._reported.discard(path)
            return frozenset()
        return frozenset(remembered[1])

    def _remember_refused(self, name: str, directory: str, paths: set[str]) -> None:
        if not paths:
            return
        identity = _identity(directory)
        if identity is None:
            return
        self._refused.setdefault(name, (identity, set()))[1].update(paths)

    def _port(
        self, device: str, number: int, directory: str, attempt: _Attempt, whole: bool
    ) -> PortSample:
        """The port read whole, or only its prompt files where its last sample
        holds the rest and nothing says the rest changed."""
        if not whole:
            prompt = self._prompt_samples(device, (number,))
            if prompt is not None:
                return prompt[0]
        sample, judged = self._read_port(device, number, directory, attempt)
        prompt_files = tuple(
            (name, f"counters/{name}", BYTES_PER_WORD if name in WORD_COUNTERS else 1)
            for name in sorted(PROMPT_COUNTERS & sample.counters.keys())
        )
        self._ports[(device, number)] = _HeldPort(sample, directory, judged, prompt_files)
        return sample

    def _prompt_samples(self, device: str, numbers: tuple[int, ...]) -> list[PortSample] | None:
        """The ports' samples from a prompt read each; None where any of them
        is to be read whole (and then the device's read goes the long way,
        which tries the others' prompt reads again). Most polls of a device
        end here, so it makes no _Attempt: a prompt read that meets anything
        to say leaves that to the whole read."""
        samples: list[PortSample] = []
        for number in numbers:
            held = self._ports.get((device, number))
            sample = None if held is None else _prompt_read(held)
            if held is None or sample is None:
                return None
            held.sample = sample
            samples.append(sample)
        return samples

    def _read_port(
        self, device: str, number: int, directory: str, attempt: _Attempt
    ) -> tuple[PortSample, tuple[str | None, ...]]:
        """The port's sample from all its files, and the texts of JUDGED_FILES."""
        state_path, physical_path, rate_path = (os.path.join(directory, f) for f in JUDGED_FILES)
        judged = tuple(attempt.text(path) for path in (state_path, physical_path, rate_path))
        state = attempt.parsed(state_path, judged[0], parse_state)
        physical = attempt.parsed(physical_path, judged[1], parse_state)
        rate = attempt.parsed(rate_path, judged[2], parse_rate)
        link_layer = attempt.text(os.path.join(directory, "link_layer"))
        counters = attempt.counters(os.path.join(directory, "counters"))
        hw_counters = attempt.counters(os.path.join(directory, "hw_counters"))
        for name in WORD_COUNTERS & counters.keys():
            counters[name] *= BYTES_PER_WORD
        sample = PortSample(
            device=device,
            port=number,
            state_id=state[0] if state else None,
            state=state[1] if state else None,
            physical_state_id=physical[0] if physical else None,
            physical_state=physical[1] if physical else None,
            rate_bytes_per_second=rate,
            link_layer=link_layer,
            counters=counters,
            hw_counters=hw_counters,
        )
        return sample, judged

    def _report(self, attempt: _Attempt) -> None:
        for problem in attempt.problems:
            message = f"{problem.subject}: {problem.path}: {problem.reason}; read on without it"
            self._report_once(problem.path, message, missing=problem.gone)

    def _report_once(self, key: str, message: str, missing: bool = True) -> None:
        if key in self._reported:
            return
        self._reported.add(key)
        # Drivers differ in which files they offer (hfi1 has no hca_type, mlx4
        # no hw_counters): a missing file is information, a broken one a warning.
        log.log(logging.INFO if missing else logging.WARNING, message)


def _prompt_read(held: _HeldPort) -> PortSample | None:
    """The port's sample from its JUDGED_FILES and PROMPT_COUNTERS, the rest
    as `held` has it; None where the port is to be read whole: a file that
    does not read as before (a changed state or rate, an error, a counter
    that is no plain number), a flap, or a counter gone back. The files are
    opened relative to the port's directory; the held sample itself where
    nothing changed."""
    if None in held.judged:
        return None  # judged by the whole read, which skips refused files
    try:
        folder = os.open(held.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    last = held.sample.counters
    changed: dict[str, int] = {}
    try:
        for file, text in zip(JUDGED_FILES, held.judged, strict=True):
            if text_of(read_bytes(file, folder)) != text:
                return None
        for name, path, unit in held.prompt:
            value = _plain_u64(read_bytes(path, folder))
            if value is None:
                return None  # the whole read judges and says what it is
            value *= unit
            if value != last[name]:
                if value < last[name] or name in FLAP_COUNTERS:
                    return None
                changed[name] = value
    except OSError:
        return None
    finally:
        os.close(folder)
    return replace(held.sample, counters={**last, **changed}) if changed else held.sample


def _plain_u64(data: bytes) -> int | None:
    """A counter file's number where it is plainly a u64 as the kernel prints
    it (ASCII digits, too few to pass U64_MAX), taken without decoding; None
    for anything else, which parse_counter judges."""
    digits = data.strip()
    return int(digits) if digits.isdigit() and len(digits) < _U64_DIGITS else None


def _identity(directory: str) -> tuple[int, int] | None:
    try:
        status = os.stat(directory)
    except OSError:
        return None
    return status.st_dev, status.st_ino
