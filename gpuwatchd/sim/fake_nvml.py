"""A fake libnvidia-ml under the real nvidia-ml-py, serving a `SimulatedGpus` model.

nvidia-ml-py looks every NVML function up by name on its module-global
`pynvml.nvmlLib` (and caches what it found). `FakeNvml.install()` puts a
library object there whose attributes are ctypes callbacks with NVML's C
signatures, so the binding's own wrappers, structs and error classes run as
they do on a GPU node: a name the fake does not export raises
`NVMLError_FunctionNotFound` exactly as an old driver would.

Pointer arguments are declared `c_void_p` and cast inside. One `FakeNvml`
delegates to a swappable model (`fake.model = ...`); tests can remove a
function (`remove_function`) or make a function, or one field value, fail
with any NVML error on one GPU or all (`fail`, `fail_field`), or only for
some arguments (one link, one clock, one field's scope), as a captured node
replays its refusals (`gpuwatchd.sim.replay`).

Per generation, as HARDWARE-NOTES.md describes:
- Volta/Ampere: `nvmlDeviceGetNvLinkErrorCounter` and the per-link `_L<n>`
  field ids answer; the scoped `NVML_FI_DEV_NVLINK_ERROR_DL_*` fields do not.
- Hopper: `nvmlDeviceGetNvLinkErrorCounter` answers CRC flit, replay and
  recovery per link (what nvidia-smi, DCGM, gpud and DataDog read); the
  legacy `_L<n>`/`_TOTAL` fields answer success with zero (DataDog PR
  #55966); the scoped DL fields answer per link from R575 on and with the
  device total, whatever the scope, before it (see `_scoped_dl`).
- Blackwell: only the `NVML_FI_DEV_NVLINK_COUNT_*` fields answer; older
  GPUs answer them INVALID_ARGUMENT (DataDog's NVLink collector).
- Per link, `fail_link` and `fail_field(..., scope=link)` make one link
  refuse one call or field.
- Ampere and newer report remapped rows, older GPUs retired pages.
- `nvmlDeviceGetViolationStatus` answers on every driver: nvml.h's
  DEPRECATED(13.0) is a no-op macro in the CUDA 13.0 (R580) header and a
  compiler warning from 13.1, with removal announced for CUDA 14.0. The
  perf-policy field values answer on every driver too.
- The clocks-event counter fields answer under the ids of the driver's branch,
  and the ids of the other branches name power smoothing fields (`_COUNTERS`);
  `field_numbering` makes a driver number them as another branch does (an
  R580 numbered as R590, as NVML's change log has it).
- A field id past the branch's NVML_FI_MAX answers INVALID_ARGUMENT.
- Clocks locked by an operator show as they do on a real GPU: the current
  clock held at the lock, the maximum and application clocks unchanged and no
  clocks-event reason bit (NVML has only setters for locked clocks).
- The framebuffer answers through nvmlDeviceGetMemoryInfo (v1: used
  includes the driver's reservation) and nvmlDeviceGetMemoryInfo_v2
  (reservation apart); the energy counter in millijoules on every GPU (Volta on).
- The PCIe link answers its current and maximum generation and width and its
  replay counter on every GPU (nvml.h: Fermi/Kepler on).
- Hopper and newer GPUs report their NVSwitch fabric registration (state and
  status) through nvmlDeviceGetGpuFabricInfo and its versioned V call, the V
  call with the health mask fields the branch has; older GPUs answer
  NotSupported.
- nvmlDeviceGetArchitecture answers each GPU's NVML_DEVICE_ARCH_*.
- Hopper and newer answer NVML_FI_DEV_NVLINK_GET_STATE per link (scope =
  link) with NVML_FEATURE_ENABLED or DISABLED, as NCCL reads the link state
  there (NVIDIA/nccl src/graph/xml.cc, SM90 and newer); older GPUs refuse it.
- The energy counter and the PCIe replay counter answer as field values too
  (NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, NVML_FI_DEV_PCIE_REPLAY_COUNTER).
- Temperature thresholds answer through nvmlDeviceGetTemperatureThreshold and,
  on Hopper and later, through the T.Limit fields and the margin temperature.
- A lost GPU answers GPU_IS_LOST, a GPU that needs a reset RESET_REQUIRED, to
  every device call; a field-value batch still answers SUCCESS and carries the
  error in each field (nvml.h). The recovery action field answers from R565,
  the reset and drain-and-reset status fields from R560.
- The event wait answers GPU_IS_LOST while a registered GPU is lost.
- `hang(function, gpu)` makes a device call block until released, as calls
  into a driver in trouble do: nvidia-smi stuck in uninterruptible sleep after
  XID 45 (leptonai/gpud PR #117) or on a hung GPU (NVIDIA/gpu-monitoring-tools
  #46: "the driver is hung"); DCGM calls blocking past 45 s on one GPU of a
  GB200 node while other queries return at once (NVIDIA/DCGM #313); a
  driver-facing call that blocks indefinitely, and blocks the monitor
  restarted by its liveness probe again (NVIDIA/NVSentinel #1576). The other
  GPUs answer meanwhile; once released, the call answers as it would have.

docs/nvml-fidelity.md lists every behaviour with its source and certainty.

What a poll costs in calls is counted (`calls`, by function). A driver's
own time per call can be charged (`call_latency_s`: each device call waits
that long, as a call into the driver does, without using CPU), and the
fake's own Python can be timed (`metered`: `own_seconds`, the thread CPU
spent inside the fake), so that a benchmark shows the driver time a real node
pays and leaves the fake's Python out of the daemon's.

Typical use (simulator or test):

    gpus = SimulatedGpus(scenario, start=clock.now())
    with FakeNvml(gpus):          # or fake.install() / fake.uninstall()
        source = NvmlSource(clock, config)
        gpus.advance(clock.now()); source.poll(clock.now())
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import pynvml

from gpuwatchd.model import (
    FABRIC_CONFIGURATION_CORRECT,
    FABRIC_HEALTH_FALSE,
    FABRIC_HEALTH_FIELDS,
    FABRIC_STATE_NOT_SUPPORTED,
    GPU_RECOVERY_ACTIONS,
    fabric_health_field,
)
from gpuwatchd.sim.gpu import GpuState, SimulatedGpu, SimulatedGpus, XidRecord
from gpuwatchd.sources.nvml import field_id_limit

log = logging.getLogger(__name__)

# An R570 production driver: the first branch with the GPU recovery action.
DEFAULT_DRIVER_VERSION = "570.172.08"
R580_DRIVER_VERSION = "580.82.07"
# What one NVML call costs in the driver, for benchmarks that charge it: the
# public measurements are about 22 us a call on an RTX 5080 (0.09 ms for four
# queries through nvidia-ml-py, Python included: davidboulay/OpenKraken PR #3)
# and about 365 us for nvmlDeviceGetPowerUsage on a K40m (2,743 calls a
# second: wookayin/gpustat issue #76); none is published for an H100, whose
# calls reach the GSP firmware ("pretty serializing since they need to talk to
# PMU and/or GSP", an NVIDIA engineer in flightlessmango/MangoHud #1307). The
# lower one, so that the driver time it shows is a floor.
MEASURED_CALL_LATENCY_S = 20e-6

_HANDLE_BASE = 0x6000  # device handles are opaque, non-null pointers
_EVENT_SET_BASE = 0x7000
_SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
)

# NVML return codes and value types, typed (the binding is untyped).
_SUCCESS: int = pynvml.NVML_SUCCESS
_ARGUMENT_VERSION_MISMATCH: int = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
_GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
_RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
_INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
_INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
_NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
_UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN
_ULL_TYPE: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_UINT_TYPE: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_RECOVERY_ACTION_FIELD: int = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
# R560's reset verdicts (nvml.h 12.6, fields 226 and 227: "GPU reset status",
# "GPU drain and reset status"), by the recovery actions each says yes to.
_RESET_STATUS_FIELDS: dict[int, frozenset[str]] = {
    pynvml.NVML_FI_DEV_RESET_STATUS: frozenset({"gpu_reset"}),
    pynvml.NVML_FI_DEV_DRAIN_AND_RESET_STATUS: frozenset({"drain_and_reset"}),
}
# What each branch's fabric health mask reports, and what a healthy GPU
# registered with the fabric reads in each field (nvml.h: degraded bandwidth
# from 12.4 = R550; route recovery, route unhealthy and access timeout
# recovery from 12.8 = R570, "Added 3 new flags to GPU Fabric Health Mask" in
# NVML's change log; incorrect configuration from 13.0 = R580).
_FABRIC_HEALTH: tuple[tuple[int, dict[str, int]], ...] = (
    (550, {"degraded_bandwidth": FABRIC_HEALTH_FALSE}),
    (
        570,
        {
            "degraded_bandwidth": FABRIC_HEALTH_FALSE,
            "route_recovery": FABRIC_HEALTH_FALSE,
            "route_unhealthy": FABRIC_HEALTH_FALSE,
            "access_timeout_recovery": FABRIC_HEALTH_FALSE,
        },
    ),
    (
        580,
        {
            "degraded_bandwidth": FABRIC_HEALTH_FALSE,
            "route_recovery": FABRIC_HEALTH_FALSE,
            "route_unhealthy": FABRIC_HEALTH_FALSE,
            "access_timeout_recovery": FABRIC_HEALTH_FALSE,
            "incorrect_configuration": FABRIC_CONFIGURATION_CORRECT,
        },
    ),
)
# nvmlDeviceGetArchitecture's answer by simulated generation (nvml.h NVML_DEVICE_ARCH_*).
_ARCHITECTURES = {
    "volta": pynvml.NVML_DEVICE_ARCH_VOLTA,
    "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
    "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}
# Calls whose first argument after the device handle is an NVLink.
_LINK_CALLS = frozenset({"nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter"})
_SINT_TYPE: int = pynvml.NVML_VALUE_TYPE_SIGNED_INT
_NVLINK_STATE_FIELD: int = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
_ENERGY_FIELD: int = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
_PCIE_REPLAY_FIELD: int = pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER

_P = ctypes.c_void_p
_U = ctypes.c_uint
_I = ctypes.c_int
_ULL = ctypes.c_ulonglong

# nvmlDeviceGetNvLinkErrorCounter's counters, and the per-link field ids of the
# same counters on drivers before Hopper, by NVLINK_ERROR_TYPES name.
_ERROR_COUNTERS = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
    pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA: "ecc_data",
}
_LANE_FIELD_PREFIXES = {
    "crc_flit": "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L",
    "crc_data": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L",
    "replay": "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L",
    "recovery": "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L",
    "ecc_data": "NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L",
}
_LANE_FIELDS: dict[int, tuple[str, int]] = {
    getattr(pynvml, f"{prefix}{link}"): (kind, link)
    for kind, prefix in _LANE_FIELD_PREFIXES.items()
    for link in range(12)
    if hasattr(pynvml, f"{prefix}{link}")
}
# The legacy per-link and total fields, which Hopper answers with zero.
_LEGACY_LINK_FIELDS = frozenset(_LANE_FIELDS) | {
    getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL")
    for kind in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY", "ECC_DATA")
}
# nvmlDeviceGetNvLinkErrorCounter's counters on Hopper: those nvidia-smi
# `nvlink -e` and gpud read there. Whether a Hopper driver answers the data CRC
# and data ECC counters is not known here; they are refused.
_HOPPER_COUNTERS = frozenset({"crc_flit", "replay", "recovery"})
_SCOPED_DL_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: "crc_flit",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: "recovery",
}
# nvml.h documents the scoped DL fields as per link ("Link ID needs to be
# specified in the scopeId field") from NVML 12.9, the R575 driver, on.
SCOPED_DL_FIELDS_BRANCH = 575
_NVLINK5_COUNT_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: "effective_errors",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS: "recovery",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS: "recovery_failed",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS: "malformed_packets",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS: "link_integrity",
}
_NVLINK5_BER_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER: "effective",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER: "symbol",
}
# Every NVLink5 COUNT field id (201-222, nvml.h): INVALID_ARGUMENT before Blackwell.
_NVLINK5_FIELD_IDS = range(
    pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS, pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER + 1
)
_PERF_POLICY_FIELDS = {
    pynvml.NVML_FI_DEV_PERF_POLICY_POWER: "power",
    pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: "thermal",
    pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: "sync_boost",
    pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: "board_limit",
    pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: "low_utilization",
    pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: "reliability",
}
_PERF_POLICIES = {
    pynvml.NVML_PERF_POLICY_POWER: "power",
    pynvml.NVML_PERF_POLICY_THERMAL: "thermal",
    pynvml.NVML_PERF_POLICY_SYNC_BOOST: "sync_boost",
    pynvml.NVML_PERF_POLICY_BOARD_LIMIT: "board_limit",
    pynvml.NVML_PERF_POLICY_LOW_UTILIZATION: "low_utilization",
    pynvml.NVML_PERF_POLICY_RELIABILITY: "reliability",
}
# What the clocks-event counter ids and their neighbours mean to each driver
# branch, from nvml.h (NVIDIA/go-nvml gen/nvml/nvml.h) of the CUDA release the
# branch ships with: (first branch, counter id -> THROTTLE_REASONS name, power
# smoothing ids). The ids are spelt out, not taken from the binding, whose
# constants follow one header only.
# - CUDA 12.8 (R570): NVML_FI_PWR_SMOOTHING_* 251-268, no counters.
# - CUDA 12.9 (R575) and 13.0 (R580): CLOCKS_EVENT_REASON_SW_THERM/HW_THERM/
#   HW_POWER_BRAKE_SLOWDOWN 251-253, NVML_FI_PWR_SMOOTHING_* 256-273.
# - CUDA 13.1 (R590) to 13.3: NVML_FI_PWR_SMOOTHING_* 251-268 and 275-288,
#   the counters 269-271.
_COUNTERS: tuple[tuple[int, dict[int, str], range | tuple[int, ...]], ...] = (
    (570, {}, range(251, 269)),
    (
        575,
        {251: "thermal", 252: "hw_thermal_slowdown", 253: "hw_power_brake_slowdown"},
        range(256, 274),
    ),
    (
        590,
        {269: "thermal", 270: "hw_thermal_slowdown", 271: "hw_power_brake_slowdown"},
        (*range(251, 269), *range(275, 289)),
    ),
)
# NVML_FI_DEV_TEMPERATURE_*_TLIMIT (193-196 in every header from CUDA 12.2):
# the margin (nvmlDeviceGetMarginTemperature) at which each threshold is
# reached, as nvidia-smi shows "GPU Slowdown T.Limit Temp: -2 C". T.Limit
# (margin 0) is taken as the GPU's max operating temperature, which makes
# H100's -2 C and -5 C its 89 C slowdown and 92 C shutdown. MEM_MAX's value
# is not modelled (NotSupported).
_TLIMIT_FIELDS = {
    pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: "shutdown_celsius",
    pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: "slowdown_celsius",
    pynvml.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: "gpu_max_operating_celsius",
}
_ECC_TYPES = {
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected",
}
_ECC_SCOPES = {pynvml.NVML_VOLATILE_ECC: "volatile", pynvml.NVML_AGGREGATE_ECC: "aggregate"}
_RETIREMENT_CAUSES = {
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "multiple_single_bit",
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "double_bit",
}
_ERROR_NAMES = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_").replace("_", " ").capitalize()
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_")
}


@dataclass(frozen=True)
class _Export:
    """One exported symbol: its C argument types and the Python that answers it.

    A device function's first argument is the device handle; the fake turns
    it into the GPU index (or answers for a lost GPU) before calling `answer`.
    """

    argtypes: tuple[Any, ...]
    answer: Callable[..., int]
    device: bool = False
    restype: Any = ctypes.c_int


@dataclass
class DeviceModes:
    """What a GPU's modes read, for the canaries' checks before a burst
    (settable per GPU through `FakeNvml.modes`)."""

    # nvmlComputeMode_t (nvml.h): 0 default, 1 exclusive thread, 2 prohibited,
    # 3 exclusive process.
    compute_mode: int = 0
    # nvmlDeviceGetMigMode's current mode (NVML_DEVICE_MIG_ENABLE = 1); None:
    # a GPU without MIG, which answers NVML_ERROR_NOT_SUPPORTED.
    mig_mode: int | None = 0
    # Process ids of the MPS clients on the GPU.
    mps_pids: tuple[int, ...] = ()
    # Framebuffer total and allocated bytes, in place of the simulated GPU's
    # own (None: the GPU's).
    memory_total: int | None = None
    memory_used: int | None = None


@dataclass
class _EventSet:
    # Index of the next of the model's XIDs to look at: those before it came
    # before the set existed, or were delivered (or were not for its GPUs).
    cursor: int
    gpus: set[int] = field(default_factory=set)


class _Library:
    """Stands where nvidia-ml-py expects the loaded libnvidia-ml: one attribute per symbol."""


class Hang:
    """A device call made to block (`FakeNvml.hang`): `entered` is set once a
    caller is blocked in it, `callers` are the threads that called it, and
    `release()` lets every caller through."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.callers: list[threading.Thread] = []
        self._released = threading.Event()

    def block(self) -> None:
        self.callers.append(threading.current_thread())
        self.entered.set()
        self._released.wait()

    def release(self) -> None:
        self._released.set()


def _write_string(address: int | None, size: int, text: str) -> int:
    data = text.encode() + b"\0"
    if address is None or len(data) > size:
        return _INSUFFICIENT_SIZE
    ctypes.memmove(address, data, len(data))
    return _SUCCESS


def _put(ctype: Any, address: int | None, value: int) -> int:
    if address is None:
        return _INVALID_ARGUMENT
    ctype.from_address(address).value = value
    return _SUCCESS


def _driver_branch(version: str) -> int:
    return int(version.split(".", 1)[0])


def encode_ber(ber: float) -> int:
    """An NVLink BER field as nvml.h packs it: mantissa (1-9) in bits 8-11,
    exponent in bits 0-7, BER = mantissa x 10^-exponent; zero is DCGM's
    sentinel 15 x 10^-255 (IsEffectiveBerThresholdExceeded)."""
    if ber <= 0:
        return 15 << 8 | 255
    exponent = math.ceil(-math.log10(ber))
    mantissa = max(1, min(9, round(ber * 10.0**exponent)))
    return mantissa << 8 | exponent


class FakeNvml:
    """A libnvidia-ml stand-in answering from a `SimulatedGpus` model."""

    def __init__(
        self,
        model: SimulatedGpus,
        driver_version: str = DEFAULT_DRIVER_VERSION,
        max_wait_s: float | None = None,
        field_numbering: int | None = None,
        call_latency_s: float = 0.0,
    ) -> None:
        """`max_wait_s` caps how long `nvmlEventSetWait_v2` blocks in real time
        (a fast-forwarded simulation or a test need not wait the full timeout).
        `field_numbering`: the branch whose clocks-event counter and power
        smoothing ids the library answers, where they are not its own branch's
        header's: an R580 numbered as R590 is, as NVML's change log tells it
        (v575 to v580, the power smoothing ids back at their R570 values).
        `call_latency_s`: how long each device call waits, as the driver's
        time (MEASURED_CALL_LATENCY_S is the public figure); 0 waits not at all."""
        self._model = model
        self.driver_version = driver_version
        self.max_wait_s = max_wait_s
        self.field_numbering = field_numbering
        self.call_latency_s = call_latency_s
        # Calls made, by function; the driver time charged for them.
        self.calls: Counter[str] = Counter()
        self.charged_seconds = 0.0
        # When metered, the thread CPU spent inside the fake (its own Python).
        self.metered = False
        self.own_seconds = 0.0
        self._initialized = 0
        self._errors: dict[tuple[str | None, int | None], int] = {}
        self._field_errors: dict[tuple[int, int | None, int | None], int] = {}
        # function -> (GPU, leading arguments) -> code
        self._call_errors: dict[str, dict[tuple[int | None, tuple[int, ...]], int]] = {}
        # (function, GPU or None for every GPU) -> the hang its callers block in
        self._hangs: dict[tuple[str, int | None], Hang] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._next_event_set = _EVENT_SET_BASE
        self._error_strings: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._previous_library: Any = None
        # GPU index -> its modes (the default DeviceModes when absent).
        self.modes: dict[int, DeviceModes] = {}
        self.library = _Library()
        self._exports = self._exports_table()
        for name in self._exports:
            self.restore_function(name)

    # -- what tests and the simulator call ------------------------------------

    @property
    def model(self) -> SimulatedGpus:
        return self._model

    @model.setter
    def model(self, model: SimulatedGpus) -> None:
        self._model = model
        for event_set in self._event_sets.values():
            event_set.cursor = model.xid_count

    def install(self) -> FakeNvml:
        """Make nvidia-ml-py use this fake as its loaded library."""
        self._previous_library = pynvml.nvmlLib
        pynvml.nvmlLib = self.library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        return self

    def uninstall(self) -> None:
        pynvml.nvmlLib = self._previous_library
        pynvml._nvmlGetFunctionPointer_cache.clear()

    def __enter__(self) -> FakeNvml:
        return self.install()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.uninstall()

    def remove_function(self, name: str) -> None:
        """Stop exporting `name`, as a driver that predates it (FunctionNotFound)."""
        if hasattr(self.library, name):
            delattr(self.library, name)
        pynvml._nvmlGetFunctionPointer_cache.pop(name, None)

    def restore_function(self, name: str) -> None:
        export = self._exports[name]
        prototype = ctypes.CFUNCTYPE(export.restype, *export.argtypes)
        setattr(self.library, name, prototype(self._entry(name, export)))
        pynvml._nvmlGetFunctionPointer_cache.pop(name, None)

    def fail(
        self,
        code: int,
        function: str | None = None,
        gpu: int | None = None,
        args: tuple[int, ...] | None = None,
    ) -> None:
        """Make `function` (every device function when None) return `code` on
        `gpu` (every GPU when None); a system function such as
        `nvmlEventSetWait_v2` fails for every caller. With `args`, only the
        calls of `function` whose C arguments after the device handle (all of
        them, for a function without one) begin with `args`: one link's state,
        one clock, one index's handle."""
        if args is None:
            self._errors[function, gpu] = code
        elif function is not None:
            self._call_errors.setdefault(function, {})[gpu, args] = code

    def fail_field(
        self, field_id: int, code: int, gpu: int | None = None, scope: int | None = None
    ) -> None:
        """Make one field id answer `code` in its own nvmlReturn, on `gpu` and
        for scope id `scope` (a link) or on all when None."""
        self._field_errors[field_id, gpu, scope] = code

    def fail_link(self, code: int, function: str, link: int, gpu: int | None = None) -> None:
        """Make an NVLink function (`nvmlDeviceGetNvLinkState`,
        `nvmlDeviceGetNvLinkErrorCounter`) return `code` for one link."""
        self.fail(code, function, gpu, args=(link,))

    def hang(self, function: str, gpu: int | None = None) -> Hang:
        """Make the device function `function` block on `gpu` (every GPU when
        None) until the returned Hang is released; it then answers as usual."""
        hang = Hang()
        self._hangs[function, gpu] = hang
        return hang

    def clear_failures(self) -> None:
        """Forget every failure, and release and forget every hang."""
        self._errors.clear()
        self._field_errors.clear()
        self._call_errors.clear()
        for hang in self._hangs.values():
            hang.release()
        self._hangs.clear()

    # -- the C entry points ---------------------------------------------------

    def _entry(self, name: str, export: _Export) -> Callable[..., int]:
        def entry(*args: Any) -> int:
            self.calls[name] += 1
            if export.device and self.call_latency_s > 0:
                self.charged_seconds += self.call_latency_s
                time.sleep(self.call_latency_s)
            started = time.thread_time() if self.metered else 0.0
            # An exception must not escape into ctypes: it would be printed
            # and the caller would read 0, NVML_SUCCESS.
            try:
                return self._dispatch(name, export, args)
            except Exception:
                log.exception("fake NVML: %s failed", name)
                return _UNKNOWN
            finally:
                if self.metered:
                    self.own_seconds += time.thread_time() - started

        return entry

    def _dispatch(self, name: str, export: _Export, args: tuple[Any, ...]) -> int:
        if name not in ("nvmlInitWithFlags", "nvmlErrorString") and not self._initialized:
            return _UNINITIALIZED
        if not export.device:
            error = self._call_error(name, None, args) or self._errors.get((name, None))
            return export.answer(*args) if error is None else error
        gpu = self._index(args[0])
        if gpu is None:
            return _INVALID_ARGUMENT
        hang = self._hangs.get((name, gpu)) or self._hangs.get((name, None))
        if hang is not None:
            hang.block()
        link = args[1] if name in _LINK_CALLS else None
        error = (
            self._gpu_error(gpu)
            or self._call_error(name, gpu, args[1:])
            or self._configured_error(name, gpu, link)
        )
        if error is None:
            return export.answer(gpu, *args[1:])
        if name == "nvmlDeviceGetFieldValues":
            # nvml.h: the call itself answers SUCCESS (or INVALID_ARGUMENT);
            # each field carries its own error in nvmlReturn.
            count, address = args[1:]
            for value in (pynvml.c_nvmlFieldValue_t * count).from_address(address):
                value.nvmlReturn = error
            return _SUCCESS
        return error

    def _gpu_error(self, gpu: int) -> int | None:
        """What every call on the GPU answers, if it is not itself."""
        state = self._model.state(gpu)
        if state.lost:
            return _GPU_IS_LOST
        # nvml.h: NVML_ERROR_RESET_REQUIRED, "the GPU requires a reset before
        # it can be used again"; gpud reads it from any call as ErrGPURequiresReset.
        if state.reset_required:
            return _RESET_REQUIRED
        return None

    def _call_error(self, name: str, gpu: int | None, args: tuple[Any, ...]) -> int | None:
        for (on_gpu, prefix), code in self._call_errors.get(name, {}).items():
            if on_gpu in (gpu, None) and args[: len(prefix)] == prefix:
                return code
        return None

    def _configured_error(self, name: str, gpu: int, link: int | None = None) -> int | None:
        for fault in self._model.nvml_errors(gpu):
            if fault.call == name and fault.link in (None, link):
                return fault.code
        for key in ((name, gpu), (name, None), (None, gpu), (None, None)):
            if key in self._errors:
                return self._errors[key]
        return None

    def _index(self, handle: int | None) -> int | None:
        index = (handle or 0) - _HANDLE_BASE
        return index if 0 <= index < len(self._model.gpus) else None

    def _gpu(self, gpu: int) -> SimulatedGpu:
        return self._model.gpus[gpu]

    def _state(self, gpu: int) -> GpuState:
        return self._model.state(gpu)

    def _exports_table(self) -> dict[str, _Export]:
        return {
            "nvmlInitWithFlags": _Export((_U,), self._init),
            "nvmlShutdown": _Export((), self._shutdown),
            "nvmlErrorString": _Export((_I,), self._error_string, restype=_P),
            "nvmlSystemGetDriverVersion": _Export((_P, _U), self._driver_version),
            "nvmlDeviceGetCount_v2": _Export((_P,), self._count),
            "nvmlDeviceGetHandleByIndex_v2": _Export((_U, _P), self._handle),
            "nvmlEventSetCreate": _Export((_P,), self._event_set_create),
            "nvmlEventSetWait_v2": _Export((_P, _P, _U), self._event_set_wait),
            "nvmlEventSetFree": _Export((_P,), self._event_set_free),
            **{
                name: _Export((_P, *argtypes), answer, device=True)
                for name, argtypes, answer in (
                    ("nvmlDeviceGetName", (_P, _U), self._name),
                    ("nvmlDeviceGetArchitecture", (_P,), self._architecture),
                    ("nvmlDeviceGetUUID", (_P, _U), self._uuid),
                    ("nvmlDeviceGetSerial", (_P, _U), self._serial),
                    ("nvmlDeviceGetBoardPartNumber", (_P, _U), self._board_part_number),
                    ("nvmlDeviceGetPciInfo_v3", (_P,), self._pci_info),
                    ("nvmlDeviceGetTemperatureV", (_P,), self._temperature_v),
                    ("nvmlDeviceGetTemperature", (_U, _P), self._temperature),
                    ("nvmlDeviceGetTemperatureThreshold", (_U, _P), self._threshold),
                    ("nvmlDeviceGetMarginTemperature", (_P,), self._margin),
                    ("nvmlDeviceGetFieldValues", (_I, _P), self._field_values),
                    ("nvmlDeviceGetClockInfo", (_U, _P), self._clock_info),
                    ("nvmlDeviceGetMaxClockInfo", (_U, _P), self._max_clock_info),
                    ("nvmlDeviceGetClock", (_U, _U, _P), self._clock),
                    ("nvmlDeviceGetCurrentClocksEventReasons", (_P,), self._event_reasons),
                    ("nvmlDeviceGetViolationStatus", (_U, _P), self._violation_status),
                    ("nvmlDeviceGetPowerUsage", (_P,), self._power_usage),
                    ("nvmlDeviceGetEnforcedPowerLimit", (_P,), self._power_limit),
                    ("nvmlDeviceGetTotalEnergyConsumption", (_P,), self._energy),
                    ("nvmlDeviceGetMemoryInfo", (_P,), self._memory_info),
                    ("nvmlDeviceGetCurrPcieLinkGeneration", (_P,), self._pcie_generation),
                    ("nvmlDeviceGetMaxPcieLinkGeneration", (_P,), self._pcie_max_generation),
                    ("nvmlDeviceGetCurrPcieLinkWidth", (_P,), self._pcie_width),
                    ("nvmlDeviceGetMaxPcieLinkWidth", (_P,), self._pcie_max_width),
                    ("nvmlDeviceGetPcieReplayCounter", (_P,), self._pcie_replays),
                    ("nvmlDeviceGetGpuFabricInfo", (_P,), self._fabric_info),
                    ("nvmlDeviceGetGpuFabricInfoV", (_P,), self._fabric_info_v),
                    ("nvmlDeviceGetMemoryInfo_v2", (_P,), self._memory_info_v2),
                    ("nvmlDeviceGetUtilizationRates", (_P,), self._utilization),
                    ("nvmlDeviceGetTotalEccErrors", (_U, _U, _P), self._ecc_errors),
                    ("nvmlDeviceGetRemappedRows", (_P, _P, _P, _P), self._remapped_rows),
                    ("nvmlDeviceGetRetiredPages", (_U, _P, _P), self._retired_pages),
                    ("nvmlDeviceGetRetiredPagesPendingStatus", (_P,), self._retired_pending),
                    ("nvmlDeviceGetRowRemapperHistogram", (_P,), self._remapper_histogram),
                    ("nvmlDeviceGetSramEccErrorStatus", (_P,), self._sram_status),
                    ("nvmlDeviceGetNvLinkState", (_U, _P), self._nvlink_state),
                    ("nvmlDeviceGetNvLinkErrorCounter", (_U, _U, _P), self._nvlink_counter),
                    ("nvmlDeviceGetSupportedEventTypes", (_P,), self._supported_events),
                    ("nvmlDeviceRegisterEvents", (_ULL, _P), self._register_events),
                    ("nvmlDeviceGetComputeMode", (_P,), self._compute_mode),
                    ("nvmlDeviceGetCudaComputeCapability", (_P, _P), self._cuda_capability),
                    ("nvmlDeviceGetMigMode", (_P, _P), self._mig_mode),
                    ("nvmlDeviceGetVbiosVersion", (_P, _U), self._vbios_version),
                    ("nvmlDeviceGetEccMode", (_P, _P), self._ecc_mode),
                    ("nvmlDeviceGetPersistenceMode", (_P,), self._persistence_mode),
                    ("nvmlDeviceGetMPSComputeRunningProcesses_v3", (_P, _P), self._mps),
                )
            },
        }

    # -- system ---------------------------------------------------------------

    def _init(self, flags: int) -> int:
        error = self._model.nvml_init_error()
        if error is not None:
            return error
        self._initialized += 1
        return _SUCCESS

    def _shutdown(self) -> int:
        self._initialized -= 1
        return _SUCCESS

    def _error_string(self, code: int) -> int:
        text = _ERROR_NAMES.get(code, f"Unknown NVML error {code}")
        buffer = self._error_strings.setdefault(code, ctypes.create_string_buffer(text.encode()))
        return ctypes.addressof(buffer)

    def _driver_version(self, buffer: int | None, size: int) -> int:
        return _write_string(buffer, size, self.driver_version)

    def _count(self, count: int | None) -> int:
        return _put(ctypes.c_uint, count, len(self._model.present))

    def _handle(self, index: int, handle: int | None) -> int:
        # A GPU missing from the bus is not enumerated: NVML numbers the GPUs it
        # finds (nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex), so the ones
        # after it move down one index.
        if index >= len(self._model.present):
            return _INVALID_ARGUMENT
        gpu = self._model.present[index]
        if self._state(gpu).lost:
            return _GPU_IS_LOST
        return _put(ctypes.c_void_p, handle, _HANDLE_BASE + gpu)

    # -- identity -------------------------------------------------------------

    def _name(self, gpu: int, buffer: int | None, size: int) -> int:
        return _write_string(buffer, size, self._gpu(gpu).spec.name)

    def _architecture(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_uint, value, _ARCHITECTURES[self._gpu(gpu).spec.architecture])

    def _uuid(self, gpu: int, buffer: int | None, size: int) -> int:
        return _write_string(buffer, size, self._gpu(gpu).uuid)

    # nvml.h: the serial (NVML_DEVICE_SERIAL_BUFFER_SIZE, 30) and the board
    # part number (NVML_DEVICE_PART_NUMBER_BUFFER_SIZE, 80), both from the
    # board's InfoROM.
    def _serial(self, gpu: int, buffer: int | None, size: int) -> int:
        return _write_string(buffer, size, self._gpu(gpu).serial)

    def _board_part_number(self, gpu: int, buffer: int | None, size: int) -> int:
        return _write_string(buffer, size, self._gpu(gpu).spec.board_part_number)

    def _pci_info(self, gpu: int, info: int) -> int:
        simulated = self._gpu(gpu)
        struct = pynvml.nvmlPciInfo_t.from_address(info)
        domain, bus, device = simulated.pci_bus_id.replace(".", ":").split(":")[:3]
        struct.busId = simulated.pci_bus_id.encode()
        struct.busIdLegacy = simulated.pci_bus_id[4:].encode()
        struct.domain, struct.bus, struct.device = int(domain, 16), int(bus, 16), int(device, 16)
        struct.pciDeviceId = simulated.spec.pci_device_id
        return _SUCCESS

    # -- temperatures, clocks, power, utilisation ------------------------------

    def _temperature_v(self, gpu: int, address: int) -> int:
        struct = pynvml.c_nvmlTemperature_v1_t.from_address(address)
        if struct.version != pynvml.nvmlTemperature_v1:
            return _ARGUMENT_VERSION_MISMATCH
        if struct.sensorType != pynvml.NVML_TEMPERATURE_GPU:
            return _INVALID_ARGUMENT
        struct.temperature = self._state(gpu).temperature_celsius
        return _SUCCESS

    def _temperature(self, gpu: int, sensor: int, value: int | None) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            return _INVALID_ARGUMENT
        return _put(ctypes.c_uint, value, self._state(gpu).temperature_celsius)

    def _threshold(self, gpu: int, kind: int, value: int | None) -> int:
        spec = self._gpu(gpu).spec
        thresholds = {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: spec.shutdown_celsius,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: spec.slowdown_celsius,
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: spec.memory_max_operating_celsius,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: spec.gpu_max_operating_celsius,
        }
        if kind not in thresholds:
            return _NOT_SUPPORTED
        return _put(ctypes.c_uint, value, thresholds[kind])

    def _t_limit(self, gpu: int) -> int | None:
        """T.Limit, on GPUs that report temperatures against it (Hopper and later)."""
        spec = self._gpu(gpu).spec
        return spec.gpu_max_operating_celsius if spec.at_least("hopper") else None

    def _margin(self, gpu: int, address: int) -> int:
        t_limit = self._t_limit(gpu)
        if t_limit is None:
            return _NOT_SUPPORTED
        struct = pynvml.c_nvmlMarginTemperature_v1_t.from_address(address)
        if struct.version != pynvml.nvmlMarginTemperature_v1:
            return _ARGUMENT_VERSION_MISMATCH
        struct.marginTemperature = t_limit - self._state(gpu).temperature_celsius
        return _SUCCESS

    def _clocks(self, gpu: int, clock_id: int) -> dict[int, int]:
        """MHz by clock type, for one NVML_CLOCK_ID_*."""
        spec, state = self._gpu(gpu).spec, self._state(gpu)
        sm = {
            pynvml.NVML_CLOCK_ID_CURRENT: state.sm_clock_mhz,
            pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET: spec.sm_default_application_mhz,
            pynvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT: spec.sm_default_application_mhz,
            pynvml.NVML_CLOCK_ID_CUSTOMER_BOOST_MAX: spec.sm_max_mhz,
        }
        if clock_id not in sm:
            return {}
        current = clock_id == pynvml.NVML_CLOCK_ID_CURRENT
        return {
            pynvml.NVML_CLOCK_GRAPHICS: sm[clock_id],
            pynvml.NVML_CLOCK_SM: sm[clock_id],
            pynvml.NVML_CLOCK_MEM: state.memory_clock_mhz if current else spec.memory_mhz,
        }

    def _clock(self, gpu: int, kind: int, clock_id: int, value: int | None) -> int:
        clocks = self._clocks(gpu, clock_id)
        if kind not in clocks:
            return _NOT_SUPPORTED
        return _put(ctypes.c_uint, value, clocks[kind])

    def _clock_info(self, gpu: int, kind: int, value: int | None) -> int:
        return self._clock(gpu, kind, pynvml.NVML_CLOCK_ID_CURRENT, value)

    def _max_clock_info(self, gpu: int, kind: int, value: int | None) -> int:
        return self._clock(gpu, kind, pynvml.NVML_CLOCK_ID_CUSTOMER_BOOST_MAX, value)

    def _event_reasons(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_ulonglong, value, self._state(gpu).clocks_event_reasons)

    def _violation_status(self, gpu: int, policy: int, address: int) -> int:
        if policy not in _PERF_POLICIES:
            return _NOT_SUPPORTED
        struct = pynvml.c_nvmlViolationTime_t.from_address(address)
        struct.referenceTime = int(self._model.now * 1e6)
        struct.violationTime = self._state(gpu).violation_ns[_PERF_POLICIES[policy]]
        return _SUCCESS

    def _power_usage(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_uint, value, self._state(gpu).power_milliwatts)

    def _power_limit(self, gpu: int, value: int | None) -> int:
        limit = round(self._model.settings(gpu).power_limit_watts * 1000)
        return _put(ctypes.c_uint, value, limit)

    def _energy(self, gpu: int, value: int | None) -> int:
        # nvml.h: millijoules since the driver was last reloaded, "for Volta
        # or newer" (every simulated GPU is).
        return _put(ctypes.c_ulonglong, value, self._state(gpu).energy_millijoules)

    def _framebuffer(self, gpu: int) -> tuple[int, int, int]:
        """Total, reserved and allocated bytes: the simulated GPU's, or a test's."""
        spec, state, modes = self._gpu(gpu).spec, self._state(gpu), self._modes(gpu)
        if modes.memory_total is not None:
            return modes.memory_total, 0, modes.memory_used or 0
        return spec.memory_total_bytes, spec.memory_reserved_bytes, state.memory_used_bytes

    def _memory_info(self, gpu: int, address: int) -> int:
        # nvml.h, nvmlMemory_t: `used` is the "sum of Reserved and Allocated
        # device memory", so used + free = total.
        total, reserved, used = self._framebuffer(gpu)
        struct = pynvml.c_nvmlMemory_t.from_address(address)
        struct.total = total
        struct.used = used + reserved
        struct.free = total - struct.used
        return _SUCCESS

    def _memory_info_v2(self, gpu: int, address: int) -> int:
        # nvml.h, nvmlMemory_v2_t: the reservation apart ("Device memory
        # reserved for system use (driver or firmware)"), `used` the allocated
        # memory, as nvidia-smi shows Total = Reserved + Used + Free; the
        # struct's version is checked like every versioned struct.
        struct = pynvml.c_nvmlMemory_v2_t.from_address(address)
        if struct.version != pynvml.nvmlMemory_v2:
            return _ARGUMENT_VERSION_MISMATCH
        total, reserved, used = self._framebuffer(gpu)
        struct.total, struct.reserved, struct.used = total, reserved, used
        struct.free = total - reserved - used
        return _SUCCESS

    # -- PCIe -------------------------------------------------------------------
    # nvml.h: link generation and width "for Fermi or newer", the replay
    # counter "for Kepler or newer" (every simulated GPU); the maxima are "the
    # maximum ... possible with this device and system", i.e. what the GPU's
    # slot allows, not what it trained to.

    def _pcie_generation(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_uint, value, self._state(gpu).pcie_generation)

    def _pcie_max_generation(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_uint, value, self._gpu(gpu).spec.pcie_max_generation)

    def _pcie_width(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_uint, value, self._state(gpu).pcie_width)

    def _pcie_max_width(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_uint, value, self._gpu(gpu).spec.pcie_max_width)

    def _pcie_replays(self, gpu: int, value: int | None) -> int:
        # An unsigned int in nvml.h: it wraps at 2^32 like the hardware's.
        return _put(ctypes.c_uint, value, self._state(gpu).pcie_replays & 0xFFFFFFFF)

    # -- NVSwitch fabric ---------------------------------------------------------
    # nvml.h: "For Hopper or newer fully supported devices"; on Hopper +
    # NVSwitch systems the GPU registers with the fabric manager, and `status`
    # "must be checked only if state returns complete". A GPU with no fabric
    # to join answers state NOT_SUPPORTED. The V call checks its struct's
    # version (nvmlGpuFabricInfo_v2) like every versioned struct.

    def _fabric(self, gpu: int) -> tuple[int, int] | None:
        if not self._gpu(gpu).spec.at_least("hopper"):
            return None
        return self._state(gpu).fabric

    def _fabric_info(self, gpu: int, address: int) -> int:
        fabric = self._fabric(gpu)
        if fabric is None:
            return _NOT_SUPPORTED
        struct = pynvml.c_nvmlGpuFabricInfo_t.from_address(address)
        struct.state, struct.status = fabric
        return _SUCCESS

    def _fabric_info_v(self, gpu: int, address: int) -> int:
        fabric = self._fabric(gpu)
        if fabric is None:
            return _NOT_SUPPORTED
        struct = pynvml.c_nvmlGpuFabricInfoV_t.from_address(address)
        if struct.version != pynvml.nvmlGpuFabricInfo_v2:
            return _ARGUMENT_VERSION_MISMATCH
        struct.state, struct.status = fabric
        struct.healthMask = self._health_mask(gpu, fabric[0])
        return _SUCCESS

    def _health_mask(self, gpu: int, state: int) -> int:
        """The fields the driver's branch reports, each as a healthy GPU reads
        it unless a `fabric_health` fault sets it; 0 (every field "not
        supported") on a GPU with no fabric to join. What a healthy board
        reads is assumed: no capture shows one."""
        tables = [fields for first, fields in _FABRIC_HEALTH if self._branch() >= first]
        if state == FABRIC_STATE_NOT_SUPPORTED or not tables:
            return 0
        faulty = self._state(gpu).fabric_health
        mask = 0
        for name, healthy in tables[-1].items():
            value = fabric_health_field(faulty, name) or healthy
            mask |= value << FABRIC_HEALTH_FIELDS[name][0]
        return mask

    def _utilization(self, gpu: int, address: int) -> int:
        state = self._state(gpu)
        struct = pynvml.c_nvmlUtilization_t.from_address(address)
        struct.gpu = state.utilization_gpu_percent
        struct.memory = state.utilization_memory_percent
        return _SUCCESS

    # -- modes the canaries read before a burst ----------------------------------

    def _modes(self, gpu: int) -> DeviceModes:
        return self.modes.get(gpu, DeviceModes())

    def _compute_mode(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_uint, value, self._modes(gpu).compute_mode)

    # nvml.h: nvmlDeviceGetCudaComputeCapability(device, int *major, int *minor).
    def _cuda_capability(self, gpu: int, major: int | None, minor: int | None) -> int:
        capability = self._gpu(gpu).spec.compute_capability
        _put(ctypes.c_int, major, capability[0])
        return _put(ctypes.c_int, minor, capability[1])

    def _mig_mode(self, gpu: int, current: int | None, pending: int | None) -> int:
        mode = self._modes(gpu).mig_mode
        if mode is None:
            return _NOT_SUPPORTED
        mode = mode or self._model.settings(gpu).mig_mode
        _put(ctypes.c_uint, current, mode)
        return _put(ctypes.c_uint, pending, mode)

    # nvml.h: nvmlDeviceGetVbiosVersion writes the VBIOS version string
    # (NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE, 32); nvmlDeviceGetEccMode the
    # current and pending mode and nvmlDeviceGetPersistenceMode the mode, as
    # nvmlEnableState_t (NVML_FEATURE_ENABLED 1). ECC mode "Fermi and newer
    # ... Requires ECC mode" support: data-centre boards have it.
    def _vbios_version(self, gpu: int, buffer: int | None, size: int) -> int:
        return _write_string(buffer, size, self._model.settings(gpu).vbios_version)

    def _ecc_mode(self, gpu: int, current: int | None, pending: int | None) -> int:
        mode = self._model.settings(gpu).ecc_mode
        _put(ctypes.c_uint, current, mode)
        return _put(ctypes.c_uint, pending, mode)

    def _persistence_mode(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_uint, value, self._model.settings(gpu).persistence_mode)

    def _mps(self, gpu: int, count: int | None, infos: int | None) -> int:
        # nvml.h: with *infoCount too small (or infos NULL) and processes
        # running, NVML_ERROR_INSUFFICIENT_SIZE and the count needed; none
        # running, NVML_SUCCESS and a count of 0.
        pids = self._modes(gpu).mps_pids
        if count is None:
            return _INVALID_ARGUMENT
        room = ctypes.c_uint.from_address(count).value
        ctypes.c_uint.from_address(count).value = len(pids)
        if not pids:
            return _SUCCESS
        if infos is None or room < len(pids):
            return _INSUFFICIENT_SIZE
        array = (pynvml.c_nvmlProcessInfo_v3_t * len(pids)).from_address(infos)
        for slot, pid in zip(array, pids, strict=True):
            slot.pid = pid
            slot.usedGpuMemory = 0
            slot.gpuInstanceId = 0xFFFFFFFF
            slot.computeInstanceId = 0xFFFFFFFF
        return _SUCCESS

    # -- memory errors ---------------------------------------------------------

    def _ecc_errors(self, gpu: int, kind: int, scope: int, value: int | None) -> int:
        if kind not in _ECC_TYPES or scope not in _ECC_SCOPES:
            return _INVALID_ARGUMENT
        count = self._state(gpu).ecc_errors[_ECC_TYPES[kind], _ECC_SCOPES[scope]]
        return _put(ctypes.c_ulonglong, value, count)

    def _remapped_rows(
        self, gpu: int, correctable: int, uncorrectable: int, pending: int, failure: int
    ) -> int:
        if not self._gpu(gpu).spec.remaps_rows:
            return _NOT_SUPPORTED
        repairs = self._state(gpu).repairs
        ctypes.c_uint.from_address(correctable).value = repairs.remapped_rows_correctable
        ctypes.c_uint.from_address(uncorrectable).value = repairs.remapped_rows_uncorrectable
        ctypes.c_uint.from_address(pending).value = int(repairs.row_remap_pending)
        ctypes.c_uint.from_address(failure).value = int(repairs.row_remap_failed)
        return _SUCCESS

    def _retired_pages(self, gpu: int, cause: int, count: int, addresses: int | None) -> int:
        if self._gpu(gpu).spec.remaps_rows:
            return _NOT_SUPPORTED
        if cause not in _RETIREMENT_CAUSES:
            return _INVALID_ARGUMENT
        pages = self._state(gpu).repairs.retired_pages[_RETIREMENT_CAUSES[cause]]
        room = ctypes.c_uint.from_address(count)
        if addresses is None or room.value < pages:
            room.value = pages
            return _SUCCESS if pages == 0 else _INSUFFICIENT_SIZE
        page_array = (ctypes.c_ulonglong * pages).from_address(addresses)
        for page in range(pages):
            page_array[page] = 0x1000 * (cause * 1024 + page + 1)
        room.value = pages
        return _SUCCESS

    def _retired_pending(self, gpu: int, value: int | None) -> int:
        if self._gpu(gpu).spec.remaps_rows:
            return _NOT_SUPPORTED
        return _put(ctypes.c_uint, value, int(self._state(gpu).repairs.retired_pages_pending))

    def _remapper_histogram(self, gpu: int, address: int) -> int:
        # Row remapping, and its histogram, are Ampere and newer (nvml.h).
        banks = self._state(gpu).repairs.remapper_banks
        if not banks:
            return _NOT_SUPPORTED
        struct = pynvml.c_nvmlRowRemapperHistogramValues.from_address(address)
        for bucket, count in banks.items():
            setattr(struct, bucket, count)
        return _SUCCESS

    def _sram_status(self, gpu: int, address: int) -> int:
        # nvml.h: "For Ampere or newer fully supported devices"; the struct's
        # version is checked like every versioned struct.
        if not self._gpu(gpu).spec.remaps_rows:
            return _NOT_SUPPORTED
        struct = pynvml.c_nvmlEccSramErrorStatus_v1_t.from_address(address)
        if struct.version != pynvml.nvmlEccSramErrorStatus_v1:
            return _ARGUMENT_VERSION_MISMATCH
        struct.bThresholdExceeded = int(self._state(gpu).repairs.sram_threshold_exceeded)
        return _SUCCESS

    # -- NVLink ----------------------------------------------------------------

    def _nvlink_state(self, gpu: int, link: int, value: int | None) -> int:
        if link >= pynvml.NVML_NVLINK_MAX_LINKS:
            return _INVALID_ARGUMENT
        links = self._state(gpu).links
        if link >= len(links):
            return _NOT_SUPPORTED
        return _put(ctypes.c_uint, value, int(links[link].active))

    def _nvlink_counter(self, gpu: int, link: int, counter: int, value: int | None) -> int:
        spec, links = self._gpu(gpu).spec, self._state(gpu).links
        # Blackwell removed the call (HARDWARE-NOTES; nvml.h points to the COUNT fields).
        if spec.at_least("blackwell") or link >= len(links):
            return _NOT_SUPPORTED
        kind = _ERROR_COUNTERS.get(counter)
        if kind is None or (spec.at_least("hopper") and kind not in _HOPPER_COUNTERS):
            return _NOT_SUPPORTED
        # NVLink 2 (Volta) has no data ECC; NVLink 3 (Ampere) added it.
        if kind == "ecc_data" and not spec.at_least("ampere"):
            return _NOT_SUPPORTED
        return _put(ctypes.c_ulonglong, value, links[link].counters[kind])

    def _link_field(self, gpu: int, field_id: int, scope: int) -> tuple[int, int] | int | None:
        """An NVLink field's answer, or None when `field_id` is no NVLink field."""
        state, spec = self._state(gpu), self._gpu(gpu).spec
        if field_id in _NVLINK5_FIELD_IDS and not spec.at_least("blackwell"):
            return _INVALID_ARGUMENT
        if field_id in _NVLINK5_COUNT_FIELDS or field_id in _NVLINK5_BER_FIELDS:
            if scope >= len(state.links):
                return _INVALID_ARGUMENT
            link = state.links[scope]
            if field_id in _NVLINK5_BER_FIELDS:
                return _ULL_TYPE, encode_ber(link.ber[_NVLINK5_BER_FIELDS[field_id]])
            return _ULL_TYPE, link.counters[_NVLINK5_COUNT_FIELDS[field_id]]
        if field_id == _NVLINK_STATE_FIELD:
            if not spec.at_least("hopper"):
                return _NOT_SUPPORTED
            if scope >= len(state.links):
                return _INVALID_ARGUMENT
            return _UINT_TYPE, int(state.links[scope].active)
        if field_id in _SCOPED_DL_FIELDS:
            return self._scoped_dl(gpu, _SCOPED_DL_FIELDS[field_id], scope)
        if field_id in _LEGACY_LINK_FIELDS:
            if spec.architecture == "hopper":
                return _ULL_TYPE, 0
            if field_id in _LANE_FIELDS and not spec.at_least("hopper"):
                kind, number = _LANE_FIELDS[field_id]
                if number < len(state.links):
                    return _ULL_TYPE, state.links[number].counters[kind]
            return _NOT_SUPPORTED
        return None

    def _scoped_dl(self, gpu: int, kind: str, scope: int) -> tuple[int, int] | int:
        """Hopper's DL fields. Before R575 nvml.h says nothing of a link in the
        scope id and DCGM reads these fields with scope 0 as the device "Total"
        (DCGM_FI_DEV_NVLINK_CRC_ERROR_TOTAL): such a driver answers the
        device's total whatever the scope."""
        links = self._state(gpu).links
        if self._gpu(gpu).spec.architecture != "hopper":
            return _NOT_SUPPORTED
        if self._branch() < SCOPED_DL_FIELDS_BRANCH:
            return _ULL_TYPE, sum(link.counters[kind] for link in links)
        if scope >= len(links):
            return _INVALID_ARGUMENT
        return _ULL_TYPE, links[scope].counters[kind]

    # -- field values ------------------------------------------------------------

    def _field_values(self, gpu: int, count: int, address: int) -> int:
        for value in (pynvml.c_nvmlFieldValue_t * count).from_address(address):
            value.timestamp = int(self._model.now * 1e6)
            value.latencyUsec = 0
            error = self._field_error(gpu, value.fieldId, value.scopeId)
            answer = self._field(gpu, value.fieldId, value.scopeId) if error is None else error
            if isinstance(answer, int):
                value.nvmlReturn = answer
                continue
            value.nvmlReturn = _SUCCESS
            value.valueType, number = answer
            if value.valueType == _UINT_TYPE:
                value.value.uiVal = number
            elif value.valueType == _SINT_TYPE:
                value.value.siVal = number
            else:
                value.value.ullVal = number
        return _SUCCESS

    def _field_error(self, gpu: int, field_id: int, scope: int) -> int | None:
        if field_id == _NVLINK_STATE_FIELD:
            # Assumed: the call and the field read the same link status, so a
            # link whose state the call refuses refuses it as a field too.
            call = "nvmlDeviceGetNvLinkState"
            refused = self._call_error(call, gpu, (scope,)) or self._configured_error(
                call, gpu, scope
            )
            if refused is not None:
                return refused
        for fault in self._model.nvml_errors(gpu):
            if getattr(pynvml, fault.call or "", None) == field_id and fault.link in (None, scope):
                return fault.code
        for key in ((gpu, scope), (gpu, None), (None, scope), (None, None)):
            if (field_id, *key) in self._field_errors:
                return self._field_errors[field_id, *key]
        return None

    def _field(self, gpu: int, field_id: int, scope: int) -> tuple[int, int] | int:
        """(value type, value) of one field, or the NVML error it answers."""
        state = self._state(gpu)
        # Assumed: a field id past those the branch's NVML defines answers
        # INVALID_ARGUMENT, as the NVLink5 fields do on GPUs without them
        # (DataDog's collector).
        limit = field_id_limit(self._branch())
        if limit is not None and field_id >= limit:
            return _INVALID_ARGUMENT
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, state.memory_temperature_celsius
        if field_id == _ENERGY_FIELD:
            return _ULL_TYPE, state.energy_millijoules
        if field_id == _PCIE_REPLAY_FIELD:
            return _UINT_TYPE, state.pcie_replays & 0xFFFFFFFF
        if field_id in _PERF_POLICY_FIELDS:
            return _ULL_TYPE, state.violation_ns[_PERF_POLICY_FIELDS[field_id]]
        if field_id == _RECOVERY_ACTION_FIELD:
            return _UINT_TYPE, state.recovery_action
        if field_id in _RESET_STATUS_FIELDS:
            action = GPU_RECOVERY_ACTIONS.get(state.recovery_action, "")
            return _UINT_TYPE, int(action in _RESET_STATUS_FIELDS[field_id])
        branch_answer = self._branch_field(gpu, field_id)
        if branch_answer is not None:
            return branch_answer
        t_limit = self._t_limit(gpu)
        if field_id in _TLIMIT_FIELDS and t_limit is not None:
            return _SINT_TYPE, t_limit - getattr(self._gpu(gpu).spec, _TLIMIT_FIELDS[field_id])
        link_answer = self._link_field(gpu, field_id, scope)
        return _NOT_SUPPORTED if link_answer is None else link_answer

    def _branch(self) -> int:
        return _driver_branch(self.driver_version)

    def _branch_field(self, gpu: int, field_id: int) -> tuple[int, int] | None:
        """A counter or power smoothing field, as the library numbers them."""
        branch = self.field_numbering or self._branch()
        tables = [table for table in _COUNTERS if branch >= table[0]]
        if not tables:
            return None
        _, counters, power_smoothing = tables[-1]
        if field_id in counters:
            return _ULL_TYPE, self._state(gpu).violation_ns[counters[field_id]]
        # Power smoothing is a Blackwell feature. Its settings are small
        # numbers, nothing like a nanosecond counter: the block's first field
        # (ENABLED) and the others read 1, its second (PRIV_LVL) 0 (assumed).
        if field_id in power_smoothing and self._gpu(gpu).spec.at_least("blackwell"):
            return _UINT_TYPE, int(list(power_smoothing).index(field_id) != 1)
        return None

    # -- events ----------------------------------------------------------------

    def _supported_events(self, gpu: int, value: int | None) -> int:
        return _put(ctypes.c_ulonglong, value, _SUPPORTED_EVENTS)

    def _event_set_create(self, handle: int | None) -> int:
        self._next_event_set += 1
        self._event_sets[self._next_event_set] = _EventSet(cursor=self._model.xid_count)
        return _put(ctypes.c_void_p, handle, self._next_event_set)

    def _register_events(self, gpu: int, types: int, handle: int | None) -> int:
        event_set = self._event_sets.get(handle or 0)
        if event_set is None:
            return _INVALID_ARGUMENT
        if types & ~_SUPPORTED_EVENTS:
            return _NOT_SUPPORTED
        if types & pynvml.nvmlEventTypeXidCriticalError:
            event_set.gpus.add(gpu)
        return _SUCCESS

    def _event_set_free(self, handle: int | None) -> int:
        if self._event_sets.pop(handle or 0, None) is None:
            return _INVALID_ARGUMENT
        return _SUCCESS

    def _event_set_wait(self, handle: int | None, data: int, timeout_ms: int) -> int:
        event_set = self._event_sets.get(handle or 0)
        if event_set is None:
            return _INVALID_ARGUMENT
        record = self._next_xid(event_set)
        # nvml.h, nvmlEventSetWait_v2: GPU_IS_LOST "if a GPU has fallen off the
        # bus or is otherwise inaccessible". Which GPU is not said; assumed here:
        # any GPU registered in the set, once the events queued before are read.
        if record is None and any(self._model.state(gpu).lost for gpu in event_set.gpus):
            return _GPU_IS_LOST
        if record is None and timeout_ms > 0:
            wait_s = timeout_ms / 1000
            if self.max_wait_s is not None:
                wait_s = min(wait_s, self.max_wait_s)
            self._model.wait_for_xid(event_set.cursor, wait_s)
            record = self._next_xid(event_set)
        if record is None:
            return _TIMEOUT
        struct = pynvml.c_nvmlEventData_t.from_address(data)
        struct.device = ctypes.cast(
            ctypes.c_void_p(_HANDLE_BASE + record.gpu), pynvml.c_nvmlDevice_t
        )
        struct.eventType = pynvml.nvmlEventTypeXidCriticalError
        struct.eventData = record.code
        struct.gpuInstanceId = struct.computeInstanceId = 0xFFFFFFFF
        return _SUCCESS

    def _next_xid(self, event_set: _EventSet) -> XidRecord | None:
        for record in self._model.xids_from(event_set.cursor):
            event_set.cursor += 1
            if record.gpu in event_set.gpus:
                return record
        return None
