"""Model objects that flow from the sources to the checks, policy and exporter.

Everything here is immutable. A value the hardware did not give is `None`
(or a missing mapping key), never zero: absent is not zero.
"""

from __future__ import annotations

import enum
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpuwatchd.faults import fault_code

# The clocks-event (throttle) reason bits of nvmlDeviceGetCurrentClocksEventReasons,
# under the label values exported in gpuwatchd_gpu_clocks_event_active{reason}.
CLOCKS_EVENT_REASONS: Mapping[str, int] = MappingProxyType(
    {
        "gpu_idle": 0x1,
        # nvml.h documents 0x2 as "limited by current setting of applications
        # clocks" up to the CUDA 12.9 header and as "@deprecated No longer used"
        # from CUDA 13.0 (R580) on: older drivers may still set it, newer ones
        # do not, so clocks set by an operator are judged from the clocks
        # themselves (checks/clocks.py), not from this bit.
        "applications_clocks_setting": 0x2,
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal_slowdown": 0x20,
        "hw_thermal_slowdown": 0x40,
        "hw_power_brake_slowdown": 0x80,
        "display_clocks_setting": 0x100,
    }
)

# Cumulative violation (throttle) time, by NVML perf policy, under the label
# values of gpuwatchd_gpu_throttle_seconds_total{reason}; the last two are the
# driver's HW slowdown counters (NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_*, from
# R575 on), which integrate HW slowdown events shorter than a poll.
THROTTLE_REASONS: tuple[str, ...] = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)

# NVLink error counters, under the label values of gpuwatchd_nvlink_errors_total{type}:
# the data-link-layer counters of NVLink 2-4, then NVLink5's (Blackwell) counters,
# which have other meanings (effective errors are what FEC left) and get their own names.
NVLINK_ERROR_TYPES: tuple[str, ...] = (
    "crc_flit",
    "crc_data",
    "replay",
    "recovery",
    "ecc_data",
    "effective_errors",
    "recovery_failed",
    "malformed_packets",
    "link_integrity",
)
# NVLink5 bit error rates (gauges, not counters), under gpuwatchd_nvlink_ber{type}:
# "effective" (after FEC) and "symbol".
NVLINK_BER_TYPES: tuple[str, ...] = ("effective", "symbol")

ECC_TYPES: tuple[str, ...] = ("corrected", "uncorrected")
ECC_SCOPES: tuple[str, ...] = ("volatile", "aggregate")

# Row-remapper histogram buckets (nvmlRowRemapperHistogramValues_t), most spare rows first.
ROW_REMAPPER_BUCKETS: tuple[str, ...] = ("max", "high", "partial", "low", "none")

# nvmlDeviceGpuRecoveryAction_t (the field from R565, NVML's change log; first
# in the 12.8 = R570 header; 6 and 7 from nvidia-ml-py 13.615), under the label
# values of gpuwatchd_gpu_recovery_action.
GPU_RECOVERY_ACTIONS: Mapping[int, str] = MappingProxyType(
    {
        0: "none",
        1: "gpu_reset",
        2: "node_reboot",
        3: "drain_p2p",
        4: "drain_and_reset",
        5: "recover_imex_domain",
        6: "bus_reset",
        7: "system_reboot",
    }
)

# nvmlGpuFabricState_t (nvml.h NVML_GPU_FABRIC_STATE_*), under the code table
# of gpuwatchd_gpu_fabric_state_id.
FABRIC_STATES: Mapping[int, str] = MappingProxyType(
    {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
)
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_COMPLETED = 3

# The fabric's health mask (nvmlGpuFabricInfo_v2_t.healthMask) is no set of
# bits: it packs one small enumeration per condition, at the shift and width
# nvml.h's NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*/_WIDTH_* give (read with its
# NVML_GPU_FABRIC_HEALTH_GET). Widths as the CUDA 12.8 header on has them:
# the 12.4-12.6 headers, and nvidia-ml-py 12.570.86, misprint the 2-bit
# widths as 0x11, which would read a neighbour's bit into each field.
# Degraded bandwidth from R550; route recovery, route unhealthy and access
# timeout recovery from R570; incorrect configuration from R580 (13.0).
FABRIC_HEALTH_FIELDS: Mapping[str, tuple[int, int]] = MappingProxyType(
    {
        "degraded_bandwidth": (0, 0x3),
        "route_recovery": (2, 0x3),
        "route_unhealthy": (4, 0x3),
        "access_timeout_recovery": (6, 0x3),
        "incorrect_configuration": (8, 0xF),
    }
)
# The 2-bit fields read 0 not supported, 1 true (the condition holds), 2 false.
FABRIC_HEALTH_TRUE = 1
FABRIC_HEALTH_FALSE = 2
# The configuration field reads 0 not supported, 1 none (correct), and from 2
# what is wrong (NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_*).
FABRIC_CONFIGURATION_CORRECT = 1
FABRIC_INCORRECT_CONFIGURATIONS: Mapping[int, str] = MappingProxyType(
    {
        2: "incorrect_sysguid",
        3: "incorrect_chassis_sn",
        4: "no_partition",
        5: "insufficient_nvlinks",
        6: "incompatible_gpu_fw",
        7: "invalid_location",
        8: "gpu_state_invalid",
    }
)


def fabric_health_field(mask: int, name: str) -> int:
    """One condition's value in a fabric health mask (NVML_GPU_FABRIC_HEALTH_GET)."""
    shift, width = FABRIC_HEALTH_FIELDS[name]
    return (mask >> shift) & width


# Retired pages (pre-Ampere page retirement), by cause.
RETIRED_PAGE_CAUSES: tuple[str, ...] = ("multiple_single_bit", "double_bit")


@dataclass(frozen=True)
class LinkSample:
    """One NVLink of one GPU."""

    gpu: int
    link: int
    up: bool | None
    errors: Mapping[str, int] = field(
        default_factory=dict
    )  # NVLINK_ERROR_TYPES -> cumulative count
    ber: Mapping[str, float] = field(default_factory=dict)  # NVLINK_BER_TYPES -> errors per bit


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. `up` is False for a GPU that is lost (off the bus)."""

    index: int
    up: bool
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    # The board as its InfoROM names it (nvmlDeviceGetSerial,
    # nvmlDeviceGetBoardPartNumber): what a vendor's RMA form asks for.
    serial: str | None = None
    board_part_number: str | None = None
    temperature_gpu_celsius: float | None = None
    temperature_memory_celsius: float | None = None
    temperature_slowdown_celsius: float | None = None
    temperature_shutdown_celsius: float | None = None
    # HBM's maximum operating temperature (NVML_TEMPERATURE_THRESHOLD_MEM_MAX).
    temperature_memory_max_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    sm_max_clock_hertz: float | None = None
    memory_max_clock_hertz: float | None = None
    sm_application_clock_hertz: float | None = None
    memory_application_clock_hertz: float | None = None
    sm_default_application_clock_hertz: float | None = None
    clocks_event_reasons: int | None = None  # bitmask, see CLOCKS_EVENT_REASONS
    throttle_seconds: Mapping[str, float] = field(default_factory=dict)  # THROTTLE_REASONS
    power_watts: float | None = None
    power_limit_watts: float | None = None
    # Configuration that GPUs of one node should share (checks/config_drift.py):
    # nvmlDeviceGetVbiosVersion, and the current ECC, persistence and MIG modes.
    vbios_version: str | None = None
    ecc_enabled: bool | None = None
    persistence_enabled: bool | None = None
    mig_enabled: bool | None = None
    # Energy since the driver was last loaded (nvmlDeviceGetTotalEnergyConsumption).
    energy_joules: float | None = None
    # Framebuffer (device memory) by use. With nvmlDeviceGetMemoryInfo_v2 the
    # three add up to the total; where only v1 answers, `used` includes the
    # driver's reservation and `reserved` is absent (nvml.h, nvmlMemory_t).
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    # PCIe link: current and maximum generation and width ("maximum possible
    # with this device and system", nvml.h), and the link's replay counter.
    pcie_link_generation: int | None = None
    pcie_link_max_generation: int | None = None
    pcie_link_width: int | None = None
    pcie_link_max_width: int | None = None
    pcie_replays: int | None = None
    # Registration with the NVSwitch fabric (nvmlDeviceGetGpuFabricInfoV):
    # one of FABRIC_STATES' codes, and the registration's NVML return code,
    # which nvml.h says to read only once the state is COMPLETED.
    fabric_state: int | None = None
    fabric_status: int | None = None
    # The fabric's health mask (FABRIC_HEALTH_FIELDS), from the versioned
    # call only (the unversioned struct has none).
    fabric_health_mask: int | None = None
    utilization_gpu_ratio: float | None = None
    utilization_memory_ratio: float | None = None
    ecc_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (type, scope)
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    retired_pages: Mapping[str, int] = field(default_factory=dict)  # RETIRED_PAGE_CAUSES -> count
    retired_pages_pending: bool | None = None
    # SRAM (L2, register file...) ECC: whether the field-diag error threshold
    # is exceeded (NVIDIA's RMA criterion for SRAM), from nvmlDeviceGetSramEccErrorStatus.
    sram_threshold_exceeded: bool | None = None
    # Banks of the row remapper by spare rows left (max, high, partial, low,
    # none), from nvmlDeviceGetRowRemapperHistogram.
    row_remapper_banks: Mapping[str, int] = field(default_factory=dict)
    # The driver's own verdict on what the GPU needs (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    # R565 and later; on R560 its reset and drain-and-reset status fields, as
    # `gpu_reset` and `drain_and_reset`): one of GPU_RECOVERY_ACTIONS' codes.
    recovery_action: int | None = None
    # A call answered NVML_ERROR_RESET_REQUIRED: "the GPU requires a reset
    # before it can be used again" (nvml.h).
    reset_required: bool = False
    # Whether any call gave a value this poll: a GPU that answers every call
    # with an error (TIMEOUT, say) is up but tells nothing.
    responsive: bool = True
    # Why a GPU that is not lost gave nothing this poll: the error its handle
    # or every call answered (None when it answered, or its read hung).
    unanswered: str | None = None
    # NVML answered NO_PERMISSION for the GPU's handle: the daemon's user may
    # not open the GPU's device file (a configuration error, not a fault).
    no_permission: bool = False
    # Why a GPU that is not lost has no reading this poll: an NVML call on it
    # has not returned within the source's read timeout (it may be stuck in
    # the driver). Its values are absent; it is no evidence of a fault.
    read_hung: str | None = None
    # Whether XID events of this GPU are being received (None: not asked for,
    # or the GPU does not report them).
    xid_events_received: bool | None = None
    nvlinks: tuple[LinkSample, ...] = ()
    # Every XID seen on this GPU this boot (the kernel log's, merged with NVML's
    # events; since the daemon started where the log cannot be read), per code.
    xid_counts: Mapping[int, int] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return f"gpu:{self.index}"

    @property
    def read(self) -> bool:
        """Whether this poll read the GPU: it is up and its read returned."""
        return self.up and self.read_hung is None

    def reason_active(self, reason: str) -> bool | None:
        if self.clocks_event_reasons is None:
            return None
        return bool(self.clocks_event_reasons & CLOCKS_EVENT_REASONS[reason])


@dataclass(frozen=True)
class NvlinkXidDetail:
    """What the driver's line of an NVLink5 XID (144-150) says after the code:
    `NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 ...)`, the
    unit, its severity word, the link (-1: the GPU's, no one link) and the
    first two values, which NVIDIA's "XID 144-150 Decode" reads."""

    unit: str
    fatal: bool
    link: int
    intrinfo: int
    error_status: int


@dataclass(frozen=True)
class XidEvent:
    """One XID critical error, stamped on receipt (NVML gives no timestamp).

    NVML's event carries the code alone; the kernel log's line of the same XID
    adds `nvlink` (144-150) and `recovery_action` (154: the action it changed
    to, 0 for None)."""

    gpu: int
    code: int
    time: float
    uuid: str | None = None
    nvlink: NvlinkXidDetail | None = None
    recovery_action: int | None = None


@dataclass(frozen=True)
class SxidEvent:
    """One NVSwitch error the nvswitch driver logged (`nvidia-nvswitch3: SXid
    (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ...`): the switch, its PCI
    address, the SXid, the driver's word for it (`Fatal`, `Non-fatal` or
    `Correctable`) and the rest of its line."""

    switch: str
    address: str
    code: int
    severity: str
    time: float
    description: str = ""

    @property
    def fatal(self) -> bool:
        """The driver reported it fatal to the fabric."""
        return self.severity == "Fatal"


@dataclass(frozen=True)
class InfinibandDevice:
    """Static facts of one HCA (`class/infiniband/<device>`)."""

    device: str
    board_id: str | None = None
    firmware_version: str | None = None
    hca_type: str | None = None
    node_guid: str | None = None


# Widths of the IBTA PortCounters behind each InfiniBand `counters/` file (the kernel's
# PORT_PMA_ATTR table in drivers/infiniband/core/sysfs.c). They clamp at
# 2**bits - 1 instead of wrapping. The data and packet counters have no entry:
# where the HCA offers PortCountersExtended (mlx5 does) the kernel shows their
# 64-bit versions, which do not fill up in practice.
COUNTER_BITS: Mapping[str, int] = MappingProxyType(
    {
        "symbol_error": 16,
        "link_error_recovery": 8,
        "link_downed": 8,
        "port_rcv_errors": 16,
        "port_rcv_remote_physical_errors": 16,
        "port_rcv_switch_relay_errors": 16,
        "port_xmit_discards": 16,
        "port_xmit_constraint_errors": 8,
        "port_rcv_constraint_errors": 8,
        "local_link_integrity_errors": 4,
        "excessive_buffer_overrun_errors": 4,
        "VL15_dropped": 16,
        "port_xmit_wait": 32,
    }
)

# A link's rate in Gb/s as bytes a second.
BYTES_PER_GIGABIT = 125_000_000


@dataclass(frozen=True)
class PortSample:
    """One InfiniBand (or RoCE) port: state, rate and every counter file.

    `counters` and `hw_counters` hold the files under `counters/` and
    `hw_counters/` by file name; `port_rcv_data` and `port_xmit_data` are
    already converted from 4-byte words to bytes.
    """

    device: str
    port: int
    state_id: int | None = None
    state: str | None = None
    physical_state_id: int | None = None
    physical_state: str | None = None
    rate_bytes_per_second: float | None = None
    link_layer: str | None = None
    counters: Mapping[str, int] = field(default_factory=dict)
    hw_counters: Mapping[str, int] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return port_subject(self.device, self.port)


# The characters of a device name that stand for themselves in its port's
# subject; any other (a space, `%`, `/`, anything the kernel lets a rename
# give it) is written %XX, each byte of its UTF-8.
_PLAIN_DEVICE_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]+")


def port_subject(device: str, port: int) -> str:
    """`ib:<device>/<port>`, the device name %-escaped where it is more than
    letters, digits, `_`, `.` and `-`: `mlx5 x` port 1 is `ib:mlx5%20x/1`, a
    subject the API, the CLI and scheduler conditions can take (review
    adversarial-2, row 101)."""
    return f"ib:{_PLAIN_DEVICE_CHARACTERS.sub(_escaped, device)}/{port}"


def _escaped(run: re.Match[str]) -> str:
    # surrogateescape: a name that is not UTF-8 is listed with its bytes so.
    return "".join(f"%{byte:02X}" for byte in run.group().encode("utf-8", "surrogateescape"))


def port_of_subject(subject: str) -> tuple[str, int] | None:
    """The device name and port number of an `ib:` subject; None for others."""
    if not subject.startswith("ib:"):
        return None
    device, _, number = subject.removeprefix("ib:").rpartition("/")
    if not device or not (number.isascii() and number.isdigit()):
        return None
    return urllib.parse.unquote(device, errors="surrogateescape"), int(number)


# PCIe Advanced Error Reporting severities, under the label values of
# gpuwatchd_pcie_aer_errors_total{severity}, with the sysfs file of each and the
# name of the total line that closes it (drivers/pci/pcie/aer.c, aer_stats_attrs).
AER_SEVERITIES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "correctable": ("aer_dev_correctable", "TOTAL_ERR_COR"),
        "nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
        "fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL"),
    }
)
# What a PCIe function watched for AER is: a GPU, or an InfiniBand HCA.
PCIE_FUNCTION_KINDS: tuple[str, ...] = ("gpu", "hca")


def canonical_address(bus_id: str) -> str | None:
    """A PCI address as the kernel writes it: `00000000:18:00.0` (NVML) or
    `0000:18:00.0` (sysfs) -> `0000:18:00.0`; None for what is no address."""
    try:
        domain, bus, rest = bus_id.strip().lower().split(":")
        device, function = rest.split(".")
        numbers = (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
    except ValueError:
        return None
    return "{:04x}:{:02x}:{:02x}.{:x}".format(*numbers)


@dataclass(frozen=True)
class PcieFunctionSample:
    """One PCIe function (a GPU or an HCA) as sysfs shows it under
    `bus/pci/devices/<address>`: its AER counters since boot and its link.

    `address` is the kernel's `0000:18:00.0`; `name` is the HCA's InfiniBand
    device (`mlx5_0`), None for a GPU. `aer_errors` holds each severity's
    total (AER_SEVERITIES) and `aer_causes` the non-zero counts of that
    severity's error names (`fatal:SDES`), both absent where unreadable.
    """

    address: str
    kind: str
    name: str | None = None
    aer_errors: Mapping[str, int] = field(default_factory=dict)
    aer_causes: Mapping[str, int] = field(default_factory=dict)
    link_generation: int | None = None
    link_width: int | None = None


# The name of the NVML source's readings.
NVML_SOURCE = "nvml"


@dataclass(frozen=True)
class NvmlUnavailable:
    """NVML could not start on a node whose PCI bus has NVIDIA GPUs: the NVML
    return code of the failure (None: no code, the library itself is
    missing), its text, and the GPUs' PCI addresses."""

    code: int | None
    error: str
    pci_addresses: tuple[str, ...]


@dataclass(frozen=True)
class Reading:
    """What one source returned from one poll. A source fills only its own part."""

    source: str
    time: float
    gpus: tuple[GpuSample, ...] | None = None
    xid_events: tuple[XidEvent, ...] = ()
    sxid_events: tuple[SxidEvent, ...] = ()
    infiniband_devices: tuple[InfinibandDevice, ...] | None = None
    ports: tuple[PortSample, ...] | None = None
    pcie_functions: tuple[PcieFunctionSample, ...] | None = None
    driver_version: str | None = None
    error: str | None = None  # the source as a whole failed this poll
    # The NVML source's: NVML cannot start on a node that has GPUs, and
    # whether the nvidia-uvm kernel module (CUDA's) is loaded.
    nvml_unavailable: NvmlUnavailable | None = None
    nvidia_uvm_loaded: bool | None = None


class Severity(enum.IntEnum):
    OK = 0
    WARN = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class Health(enum.IntEnum):
    HEALTHY = 0
    DEGRADED = 1
    UNHEALTHY = 2
    QUARANTINED = 3
    # The node's only: every source it reads is down, so nothing says it is well.
    UNKNOWN = 4

    @property
    def label(self) -> str:
        return self.name.lower()


class Action(enum.Enum):
    """What an operator (or the scheduler) should do about a finding."""

    NONE = "none"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    # Stop the GPU's peer-to-peer traffic (its jobs), then ask the driver again.
    DRAIN_P2P = "drain_p2p"
    # Recover the multi-node NVLink (IMEX) domain the GPU belongs to.
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    # Look at the node's driver install and its services (persistence, fabric
    # manager, modules): not the GPU.
    CHECK_DRIVER = "check_driver"
    INSPECT_HARDWARE = "inspect_hardware"


@dataclass(frozen=True)
class Finding:
    """A check's verdict on one subject.

    `code` names the verdict (`nvlink_crc_storm`, `ecc_uncorrectable`) and
    `fault_code` is its id in the catalog (gpuwatchd.faults, `GW-1304`);
    `evidence` holds the numbers the verdict rests on; `definitive` marks a
    hardware fault that quarantines at once (no confirmation window).
    """

    subject: str
    check: str
    code: str
    severity: Severity
    message: str
    action: Action = Action.NONE
    evidence: Mapping[str, float | int | str] = field(default_factory=dict)
    definitive: bool = False
    immediate: bool = False

    @property
    def fault_code(self) -> str | None:
        # Derived, never passed: one catalog says what each code's id is.
        return fault_code(self.code)


@dataclass(frozen=True)
class Measurement:
    """A value a check derived (a ratio over a window, say), exported as the
    gauge `gpuwatchd_<name>` with `labels`."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Board:
    """A GPU as the hardware it is: its UUID, and where NVML has it now (or had
    it when last seen). NVML's index order "has no guarantees of consistency
    between reboots" (nvml.h, nvmlDeviceGetHandleByIndex_v2): the UUID is the
    identity, the index and bus are for showing it."""

    uuid: str
    index: int
    pci_bus_id: str | None = None


@dataclass(frozen=True)
class Quarantine:
    """A subject taken out of service. `hardware` ones are never auto-released;
    `source` is `auto` or `manual` (manual ones are released only manually).
    A `dry_run` one records what policy would have done: nothing acts on it.

    A GPU's (or its NVLink's) quarantine holds the board: its `uuid`, the
    index it had when last seen (`last_index`) and its PCI bus, so that it
    follows the board when NVML numbers the GPUs differently (identity.py)."""

    subject: str
    reason: str
    source: str
    since: float
    hardware: bool = False
    operator: str | None = None
    code: str | None = None
    dry_run: bool = False
    uuid: str | None = None
    last_index: int | None = None
    pci_bus_id: str | None = None

    @property
    def fault_code(self) -> str | None:
        """The fault code of the finding that quarantined it; None for a manual one."""
        return fault_code(self.code)


@dataclass(frozen=True)
class Decision:
    """A quarantine or release of a subject, as policy decided it."""

    kind: str  # "quarantine" | "release"
    subject: str
    reason: str
    source: str  # "auto" | "manual"
    time: float
    dry_run: bool = False
    code: str | None = None
    uuid: str | None = None  # the board of a GPU's or NVLink's decision
