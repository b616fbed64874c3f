"""The PCIe source: AER counters and link of the GPUs' and HCAs' PCIe functions.

Reads, under `<sysfs_root>`, every NVIDIA display or 3D controller in
`bus/pci/devices/` (vendor 0x10de, class 0x03xxxx; NVSwitches are bridges,
class 0x0680, and are left out) and the PCIe function behind each
`class/infiniband/<device>/device` link. For each: `aer_dev_correctable`,
`aer_dev_nonfatal` and `aer_dev_fatal`, and `current_link_speed` /
`current_link_width`.

The AER files are what drivers/pci/pcie/aer.c writes (`aer_stats_attrs`,
since Linux 4.19): one `NAME count` line per error bit the kernel names, a
`<array>_bit[N] count` line for a bit it does not name (reserved, or newer than
the kernel) whose count is not zero, then `TOTAL_ERR_COR`,
`TOTAL_ERR_NONFATAL` or `TOTAL_ERR_FATAL` and the total. The
counts are the errors the function reported since boot (the kernel's own
counters, not the device's), so they survive a daemon restart. A function
without AER (the files absent: no AER capability, or AER handled by
firmware) has no AER values; a file that is unreadable or not in that format
is an absent severity, said once per file, never a crash and never a zero.

The source knows nothing about health, nor which GPU index an address is:
the checks map an address to the GPU whose NVML PCI bus id it is.

Unchanged in, unchanged out: whether a `bus/pci/devices` entry is an NVIDIA
GPU is read once per entry (its inode: a function removed and added again is
a new entry), and a function whose five files say what they said last poll
is handed back as the same sample object, an AER file as the same parse.
The five files of each function stay open between polls and are read at
offset 0 (`HeldFiles`: how sysfs is meant to be read again, and checked
against files renamed or removed in a tree of plain files); `close` closes
them.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatchd.model import AER_SEVERITIES, PcieFunctionSample, Reading
from gpuwatchd.sources import PcieSourceConfig
from gpuwatchd.sources.infiniband import parse_counter, read_attribute, read_bytes, text_of

log = logging.getLogger(__name__)

DEVICES_PATH = ("bus", "pci", "devices")
INFINIBAND_PATH = ("class", "infiniband")
NVIDIA_VENDOR = 0x10DE
# PCI base class 0x03: display controllers (0x0300 VGA, 0x0302 3D: data-centre GPUs).
DISPLAY_CLASS = 0x03
# `0000:18:00.0`: domain, bus, device, function, as the kernel names a function.
_ADDRESS_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# `32.0 GT/s PCIe` (Linux 5.x on), `8 GT/s` (older): the transfer rate of one lane.
_SPEED_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s\b")
# PCIe generation by a lane's transfer rate (PCI-SIG).
GENERATION_BY_GIGATRANSFERS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
# Error names in aer.c are short words such as RxErr, CmpltTO, TLPBlockedErr.
_CAUSE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,40}$")
MAX_AER_LINES = 64
# A file exactly as aer.c prints it (`%s %llu\n` a line; the text comes
# stripped): every line then passes _aer_lines' checks, a count of at most 19
# digits being below U64_MAX.
_AER_NAME = r"[A-Za-z][A-Za-z0-9_]{0,40}"
_AER_FILE_RE = re.compile(rf"(?:{_AER_NAME} [0-9]{{1,19}}\n)*{_AER_NAME} [0-9]{{1,19}}")
_AER_LINE_RE = re.compile(rf"({_AER_NAME}) ([0-9]+)")
# aer_stats_dev_attr names a bit its string table leaves NULL after the stats
# array it counts in and the bit (`"%s_bit[%d] %llu"`, e.g.
# `dev_cor_errs_bit[5] 3`): counted under that name, which says which bit.
_BIT_NAME_RE = re.compile(r"([a-z_]+)_bit\[(0|[1-9][0-9]?)\]")
# The stats array of each file, by its total line (aer.c: dev_cor_errs,
# dev_nonfatal_errs, dev_fatal_errs); the status registers have 32 bits.
_BIT_ARRAYS = {
    "TOTAL_ERR_COR": "dev_cor_errs",
    "TOTAL_ERR_NONFATAL": "dev_nonfatal_errs",
    "TOTAL_ERR_FATAL": "dev_fatal_errs",
}
AER_STATUS_BITS = 32


def parse_aer(text: str, total_name: str) -> tuple[int, dict[str, int]]:
    """One aer_dev_* file: its total and the non-zero counts by error name.

    Raises ValueError when the file is not aer.c's format: a line that is not
    `NAME count`, a count that is not a u64, a name twice (aer.c writes each
    once: which of two would be the count?), a bit line of another file's
    array or past bit 31, or no total line.
    """
    # Three of these a function every poll: the file as the kernel writes it
    # is taken in two passes of the regex engine; anything else (a bit line
    # too), or a file that breaks a rule, goes line by line, which says what
    # is wrong.
    if _AER_FILE_RE.fullmatch(text):
        counts = {name: int(digits) for name, digits in _AER_LINE_RE.findall(text)}
        lines = text.count("\n") + 1
        if len(counts) == lines <= MAX_AER_LINES and total_name in counts:
            total = counts.pop(total_name)
            return total, {name: count for name, count in counts.items() if count}
    return _aer_lines(text, total_name)


def _aer_lines(text: str, total_name: str) -> tuple[int, dict[str, int]]:
    """parse_aer, one line at a time."""
    total: int | None = None
    causes: dict[str, int] = {}
    lines = text.splitlines()
    if len(lines) > MAX_AER_LINES:
        raise ValueError(f"{len(lines)} lines, more than aer.c writes")
    seen: set[str] = set()
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or not _aer_name(parts[0], total_name):
            raise ValueError(f"not a 'NAME count' line: {line[:60]!r}")
        if parts[0] in seen:
            raise ValueError(f"{parts[0]} twice")
        seen.add(parts[0])
        count = parse_counter(parts[1])
        if parts[0] == total_name:
            total = count
        elif count:
            causes[parts[0]] = count
    if total is None:
        raise ValueError(f"no {total_name} line")
    return total, causes


def _aer_name(name: str, total_name: str) -> bool:
    """Whether aer.c writes `name` in the file whose total is `total_name`."""
    if _CAUSE_RE.match(name):
        return True
    bit = _BIT_NAME_RE.fullmatch(name)
    return (
        bit is not None
        and bit.group(1) == _BIT_ARRAYS.get(total_name)
        and int(bit.group(2)) < AER_STATUS_BITS
    )


def parse_speed(text: str) -> int:
    """`32.0 GT/s PCIe` -> 5 (the generation)."""
    match = _SPEED_RE.match(text)
    generation = GENERATION_BY_GIGATRANSFERS.get(float(match.group(1))) if match else None
    if generation is None:
        raise ValueError(f"not a PCIe link speed such as '32.0 GT/s PCIe': {text[:40]!r}")
    return generation


def parse_width(text: str) -> int:
    """`16` -> 16; the kernel writes 0 or 255 for a link that is down or unknown."""
    width = parse_counter(text)
    if not 0 < width <= 32:
        raise ValueError(f"not a PCIe link width: {text[:40]!r}")
    return width


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text is not None else None
    except ValueError:
        return None


def nvidia_gpu(vendor: str | None, pci_class: str | None) -> bool:
    """Whether a function's `vendor` and `class` files name an NVIDIA GPU
    (a display or 3D controller; NVSwitches are bridges)."""
    value = _hex(pci_class)
    return _hex(vendor) == NVIDIA_VENDOR and value is not None and value >> 16 == DISPLAY_CLASS


def nvidia_gpus_on_bus(sysfs_root: str) -> tuple[str, ...]:
    """The addresses of the NVIDIA GPUs on the PCI bus under `sysfs_root`,
    whatever their driver: what says a node has GPUs when NVML cannot."""
    devices = os.path.join(sysfs_root, *DEVICES_PATH)
    try:
        addresses = sorted(os.listdir(devices))
    except OSError:
        return ()

    def attribute(address: str, name: str) -> str | None:
        try:
            return read_attribute(f"{devices}/{address}/{name}")
        except OSError:
            return None

    return tuple(
        address
        for address in addresses
        if _ADDRESS_RE.match(address)
        and nvidia_gpu(attribute(address, "vendor"), attribute(address, "class"))
    )


# A directory's mtime (which an entry created, removed or renamed over moves)
# is trusted to tell a change only where it was taken well after the
# directory last changed: file systems stamp from a coarse clock (a jiffy on
# ext4, xfs and tmpfs; 2 s on FAT), so a change in the tick of the stamp
# could leave it as it was (git's "racy" index entries).
RACY_NANOSECONDS = 2_000_000_000


class HeldFiles:
    """Files of one directory held open between polls and read at offset 0.

    On sysfs that is how an attribute is read again: a read at offset 0 calls
    its show() anew (Documentation/filesystems/sysfs.rst: "If userspace seeks
    back to zero or does a pread(2) with an offset of '0' the show() method
    will be called again, rearmed, to fill the buffer"), and once its device
    is removed a held file's read fails (kernfs_seq_start: ENODEV). A tree of
    plain files (a capture, the simulator, a test's) changes by files renamed
    over others or removed, and there a held file would go on saying what the
    replaced one said. So each read first stats the directory by its path and
    opens the files again where the path names another directory, one whose
    entries changed since (which moves its mtime), or one that changed too
    shortly before they were opened for its stamp to tell.
    """

    def __init__(self, directory: str, names: tuple[str, ...]) -> None:
        self.directory = directory
        self.names = names
        self._stamp: tuple[int, int, int, int] | None = None
        self._descriptors: tuple[int, ...] = ()

    def read(self) -> tuple[bytes, ...] | None:
        """Every file's bytes; None where the directory or any file does not
        read (the caller then reads them one by one, and says what is wrong)."""
        try:
            status = os.stat(self.directory)
        except OSError:
            self.close()
            return None
        stamp = (status.st_dev, status.st_ino, status.st_mtime_ns, status.st_ctime_ns)
        if stamp != self._stamp:
            self._open(stamp, status.st_mtime_ns)
        if not self._descriptors:
            return None  # they did not open at this stamp: not tried again until it moves
        try:
            return tuple(os.pread(descriptor, 4096, 0) for descriptor in self._descriptors)
        except OSError:
            self.close()
            return None

    def _open(self, stamp: tuple[int, int, int, int], modified_ns: int) -> None:
        self.close()
        opened: list[int] = []
        try:
            for name in self.names:
                path = f"{self.directory}/{name}"
                opened.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            for descriptor in opened:
                os.close(descriptor)
            opened = []
        self._descriptors = tuple(opened)
        racy = time.time_ns() - modified_ns < RACY_NANOSECONDS
        self._stamp = None if racy else stamp

    def close(self) -> None:
        for descriptor in self._descriptors:
            os.close(descriptor)
        self._descriptors = ()
        self._stamp = None

    def __del__(self) -> None:
        # A source dropped unclosed (a one-off reader, a test's) must not
        # leave its descriptors open for the rest of the process.
        self.close()


# The files of a function, in the order its sample key holds their bytes.
AER_FILES = tuple(file for file, _ in AER_SEVERITIES.values())
LINK_FILES = ("current_link_speed", "current_link_width")
# Functions whose files stay open between polls (five each): an HGX node has
# 8 GPUs and up to 16 HCA functions; a node whose SR-IOV virtual functions
# list as HCAs could have hundreds, and those beyond it are opened at each
# read, so that the daemon's descriptors (1024 under systemd's default soft
# limit) are not spent on them.
MAX_HELD_FUNCTIONS = 48


@dataclass(frozen=True)
class _Function:
    """A function to read: its address, the directory its files are read in,
    `gpu` or `hca`, and the HCA's InfiniBand device name."""

    address: str
    directory: str
    kind: str
    name: str | None


# What a function's files held (None: unreadable), the key of its sample.
_Contents = tuple[bytes | None, ...]


class PcieSource:
    """Source over `<sysfs_root>/bus/pci/devices` (GPUs) and the HCAs' functions."""

    name = "pcie"

    def __init__(self, config: PcieSourceConfig) -> None:
        self._devices_dir = os.path.join(config.sysfs_root, *DEVICES_PATH)
        self._infiniband_dir = os.path.join(config.sysfs_root, *INFINIBAND_PATH)
        self._reported: set[str] = set()
        # Per bus entry: its inode and its function where it is an NVIDIA
        # GPU. A PCI function's vendor and class do not change while it exists.
        self._entries: dict[str, tuple[int, _Function | None]] = {}
        self._listed: list[tuple[str, int]] = []  # the entries they are of
        # The HCAs' functions by InfiniBand device and address, and the
        # functions the last poll read: what it kept the rest for.
        self._hcas: dict[tuple[str, str], _Function] = {}
        self._found: list[_Function] = []
        # Per function: the files' contents of the last poll and its sample.
        self._samples: dict[_Function, tuple[_Contents, PcieFunctionSample]] = {}
        # Per AER file: its last bytes and their parse.
        self._aer: dict[str, tuple[bytes, tuple[int, dict[str, int]]]] = {}
        # Per function: its AER and link files, open.
        self._held: dict[_Function, HeldFiles] = {}

    def poll(self, now: float) -> Reading:
        found = self._functions()
        functions = [self._sample(function) for function in found]
        if found != self._found:
            self._forget_all_but(found)
            self._found = found
        if not functions:
            reason = f"no GPU or InfiniBand PCIe function under {self._devices_dir}"
            return Reading(source=self.name, time=now, pcie_functions=(), error=reason)
        return Reading(source=self.name, time=now, pcie_functions=tuple(functions))

    def close(self) -> None:
        for files in self._held.values():
            files.close()
        self._held.clear()

    def _functions(self) -> list[_Function]:
        """Every function to read, by address; the same objects while their
        entries stay (which spares building and hashing new ones)."""
        found: dict[str, _Function] = {}
        entries = self._listing(self._devices_dir)
        for address, inode in entries:
            gpu = self._gpu(address, inode)
            if gpu is not None:
                found[address] = gpu
        if entries != self._listed:
            known = {address for address, _ in entries}
            self._entries = {a: e for a, e in self._entries.items() if a in known}
            self._listed = entries
        hcas: dict[tuple[str, str], _Function] = {}
        for name, _ in self._listing(self._infiniband_dir):
            hca = self._hca_address(name)
            if hca is not None and hca not in found:
                # Every PCI function has its entry under bus/pci/devices, a
                # link to the directory the HCA's `device` link leads to.
                function = self._hcas.get((name, hca))
                if function is None:
                    function = _Function(hca, f"{self._devices_dir}/{hca}", "hca", name)
                found[hca] = hcas[(name, hca)] = function
        self._hcas = hcas
        return [found[address] for address in sorted(found)]

    def _hca_address(self, name: str) -> str | None:
        """The address `class/infiniband/<name>/device` leads to (the last
        part of the link: the function's directory), None where it leads to
        no PCI function (a soft-RoCE device, a sub-function) or is no link."""
        try:
            target = os.readlink(f"{self._infiniband_dir}/{name}/device")
        except OSError:
            return None
        address = os.path.basename(target)
        return address if _ADDRESS_RE.match(address) else None

    def _listing(self, directory: str) -> list[tuple[str, int]]:
        """The names in `directory` with their inodes (which listing gives)."""
        try:
            with os.scandir(directory) as entries:
                return sorted((entry.name, entry.inode()) for entry in entries)
        except FileNotFoundError:
            return []
        except OSError as error:
            self._report_once(directory, f"pcie: cannot list {directory}: {error.strerror}")
            return []

    def _gpu(self, address: str, inode: int) -> _Function | None:
        """The function of a bus entry where it is an NVIDIA GPU."""
        known = self._entries.get(address)
        if known is not None and known[0] == inode:
            return known[1]
        directory = f"{self._devices_dir}/{address}"
        function = None
        if _ADDRESS_RE.match(address):
            vendor = self._text(f"{directory}/vendor")
            if (
                vendor is not None
                and _hex(vendor) == NVIDIA_VENDOR
                and nvidia_gpu(vendor, self._text(f"{directory}/class"))
            ):
                function = _Function(address, directory, "gpu", None)
        self._entries[address] = (inode, function)
        return function

    def _forget_all_but(self, functions: list[_Function]) -> None:
        kept = set(functions)
        self._samples = {f: held for f, held in self._samples.items() if f in kept}
        paths = {f"{f.directory}/{file}" for f in functions for file in AER_FILES}
        self._aer = {path: held for path, held in self._aer.items() if path in paths}
        for function in self._held.keys() - kept:
            self._held.pop(function).close()

    def _sample(self, function: _Function) -> PcieFunctionSample:
        contents = self._contents(function)
        held = self._samples.get(function)
        if held is not None and held[0] == contents:
            return held[1]
        sample = self._parse(function, contents)
        self._samples[function] = (contents, sample)
        return sample

    def _contents(self, function: _Function) -> _Contents:
        """The bytes of the function's AER and link files: from its files
        held open where they all read, else one by one."""
        files = self._held.get(function)
        if files is None and len(self._held) < MAX_HELD_FUNCTIONS:
            files = self._held[function] = HeldFiles(function.directory, AER_FILES + LINK_FILES)
        held = None if files is None else files.read()
        return held if held is not None else self._read_contents(function)

    def _read_contents(self, function: _Function) -> _Contents:
        """The bytes of the function's AER and link files, read relative to
        its directory (one walk down the path, not one a file)."""
        try:
            folder: int | None = os.open(
                function.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            )
        except OSError:
            folder = None  # each file then says for itself what is wrong
        try:
            aer = tuple(self._bytes(function, file, folder, quiet=False) for file in AER_FILES)
            link = tuple(self._bytes(function, file, folder, quiet=True) for file in LINK_FILES)
        finally:
            if folder is not None:
                os.close(folder)
        return aer + link

    def _parse(self, function: _Function, contents: _Contents) -> PcieFunctionSample:
        totals: dict[str, int] = {}
        causes: dict[str, int] = {}
        aer, (speed, width) = contents[: len(AER_FILES)], contents[len(AER_FILES) :]
        for (severity, (file, total_name)), data in zip(AER_SEVERITIES.items(), aer, strict=True):
            parsed = self._aer_counts(f"{function.directory}/{file}", data, severity, total_name)
            if parsed is None:
                continue
            totals[severity] = parsed[0]
            causes.update({f"{severity}:{cause}": count for cause, count in parsed[1].items()})
        speed_path, width_path = (f"{function.directory}/{file}" for file in LINK_FILES)
        return PcieFunctionSample(
            address=function.address,
            kind=function.kind,
            name=function.name,
            aer_errors=totals,
            aer_causes=causes,
            link_generation=self._parsed(speed_path, speed, parse_speed),
            link_width=self._parsed(width_path, width, parse_width),
        )

    def _aer_counts(
        self, path: str, data: bytes | None, severity: str, total_name: str
    ) -> tuple[int, dict[str, int]] | None:
        if data is None:
            return None
        held = self._aer.get(path)
        if held is not None and held[0] == data:
            return held[1]
        try:
            parsed = parse_aer(text_of(data), total_name)
        except ValueError as error:
            self._report_once(path, f"pcie: {path}: {error}; {severity} errors are absent")
            return None
        self._aer[path] = (data, parsed)
        return parsed

    def _parsed(self, path: str, data: bytes | None, parse: Callable[[str], int]) -> int | None:
        if data is None:
            return None
        try:
            return parse(text_of(data))
        except ValueError as error:
            self._report_once(path, f"pcie: {path}: {error}; read on without it")
            return None

    def _bytes(
        self, function: _Function, file: str, folder: int | None, quiet: bool
    ) -> bytes | None:
        """The file's bytes; None (said once, unless `quiet` and missing) when
        unreadable. `folder`: the function's directory, open."""
        path = f"{function.directory}/{file}"
        try:
            return read_bytes(path) if folder is None else read_bytes(file, folder)
        except FileNotFoundError:
            if not quiet:
                note = "the function has no AER"
                self._report_once(path, f"pcie: {path} is missing ({note})", info=True)
            return None
        except OSError as error:
            self._report_once(path, f"pcie: {path}: {error.strerror}; read on without it")
            return None

    def _text(self, path: str) -> str | None:
        """The file's text; None when unreadable (said once unless missing)."""
        try:
            return read_attribute(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            self._report_once(path, f"pcie: {path}: {error.strerror}; read on without it")
            return None

    def _report_once(self, key: str, message: str, info: bool = False) -> None:
        if key in self._reported:
            return
        self._reported.add(key)
        log.log(logging.INFO if info else logging.WARNING, message)
