"""The NVML source: every GPU's health signals, read through nvidia-ml-py.

Reads, for every GPU: identity, GPU and HBM temperatures and their thresholds,
clocks (current, max, application), the clocks-event reasons and cumulative
throttle time, power, its limit and the energy counter, utilisation, the
framebuffer's used, free and reserved bytes, the PCIe link's generation and
width (current and maximum) and its replay counter, its registration with
the NVSwitch fabric, ECC counts, row remapping or
page retirement, and per NVLink its state and error counters; and counts XID
critical errors from an NVML event set. Knows nothing about health.

A value the GPU or driver does not provide (NotSupported, FunctionNotFound,
NoPermission, NoData, Deprecated, a field value's own error) is absent, never
0, and logged once per (GPU, value). A refusal that cannot change while the
process runs (the driver or the binding lacks the function, a struct version
mismatch, Deprecated, InvalidArgument for a field id past those the driver's
NVML defines: `FIELD_ID_LIMITS`) is not asked again; NotSupported is asked
again every REASK_REFUSED_S, since it can be a mode rather than the hardware
(row remapping and utilisation are refused while MIG instances exist); NoPermission
and NoData are asked every poll. A name the installed nvidia-ml-py lacks
counts as FunctionNotFound. Only the driver's own word makes a GPU lost:
GPU_IS_LOST ("the GPU has fallen off the bus", nvml.h), or a handle or every
call failing on a GPU for whose bus the kernel log (or NVML's events) holds
XID 79. A lost GPU is reported down while the others keep being read, and up
again once it answers. Any other failure to get a handle (nvml.h lists
INSUFFICIENT_POWER, IRQ_ISSUE, UNKNOWN...) or Unknown from every call makes
the GPU unanswered this poll (`GpuSample.unanswered`), NO_PERMISSION among
them (`GpuSample.no_permission`, a configuration error): asked again next
poll. A call that answers RESET_REQUIRED marks the GPU as needing a reset
(`GpuSample.reset_required`): a state to judge, not a value to leave out.

What a poll asks costs driver time on a real node (each call tens of
microseconds, more where it reaches the GSP), so a poll makes about 21 calls
of an H100: what NVML gives as field values (HBM temperature, violation
time, energy, the PCIe replay counter, the recovery action, the links'
states on Hopper and newer, NVLink5's counters) comes in one
nvmlDeviceGetFieldValues batch, with the call where a driver refuses a
field; what a GPU keeps while the driver stays loaded (maximum clocks and
PCIe link, the default application clock, power limit, VBIOS, ECC and MIG
mode, temperature thresholds) is read every `static_refresh`; and the
NVLink counters Hopper and older give one call a link and counter are read
at the poll their DL fields say one moved, and every `link_counter_interval`
where nothing says so (`_read_counter_calls`).

The driver's verdict on what a GPU needs is its recovery action field (R565
on), or on R560 its reset and drain-and-reset status fields, read as the
actions `gpu_reset` and `drain_and_reset`; older branches have neither.

Per generation (see HARDWARE-NOTES.md), by the GPU's architecture
(`nvmlDeviceGetArchitecture`, read once), NVLink counters come from
NVLink5's `NVML_FI_DEV_NVLINK_COUNT_*` fields on Blackwell and newer
(effective errors after FEC, recovery events and failures, malformed packets,
link integrity errors, and the effective and symbol BER), under their own
names; on Hopper and older from `nvmlDeviceGetNvLinkErrorCounter` (as
nvidia-smi, DCGM and gpud read it) or, where it does not answer and only on
drivers from R575 on, whose nvml.h documents the link as their scope,
Hopper's scoped `NVML_FI_DEV_NVLINK_ERROR_DL_*` fields. Where the
architecture is not known, the first of all three that answers on any link
is read. A refusal is the link's own; a link
discovery or counter probe that gets neither an answer nor "not here" (a
Timeout, say) is done again at the next poll, and a GPU where no interface
answers is probed again every `LINK_REPROBE_POLLS` polls.
Throttle time comes from `nvmlDeviceGetViolationStatus` (R580 still answers
it; removal is announced for CUDA 14), or from its field-value replacements
where a driver refuses it; the HW thermal and power-brake slowdown counters
are field values whose ids depend on the driver's branch (`counter_ids`). A
value at a counter id that does not behave as a counter of nanoseconds (it
reads 1 poll after poll, or does not grow while its reason bit is set) is
left absent for good and said once (`_check_counters`).
Temperature thresholds come from `nvmlDeviceGetTemperatureThreshold`, or from
the T.Limit fields and the margin temperature where a driver refuses it.

Hangs: an NVML call on a GPU in trouble can block inside the driver for a
long time or for good (nvidia-smi in uninterruptible sleep after XID 45,
leptonai/gpud PR #117; DCGM calls blocking past 45 s on one GPU, NVIDIA/DCGM
#313), and Python cannot interrupt a C call. So the GPUs are read one after
another in a reader thread, handed to it together, and `poll()` waits for
each read for `read_timeout` at most from when it began (by the daemon's
clock). A read past it is given up: the GPU's sample says so
(`GpuSample.read_hung`, its values absent), the reader stuck in it is left
to return whenever the driver lets it (its result is dropped), and a new
reader reads the other GPUs (those queued behind it are taken back from it,
so none is read twice). While that call has not returned, no other read of
the GPU is started (threads do not pile up on a stuck GPU); once it has, the
GPU is read again at the next poll. A hang is not evidence of a hardware
fault (the stall in DCGM #313 is on a GPU that works, and ends when its load
does): a GPU that is lost says so by its answers, not by its silence.
Restarting the daemon would not help either: a call stuck in the kernel
stays stuck, and the restarted monitor blocks on it again (NVIDIA/NVSentinel
#1576). The XID thread's waits are bounded by their one-second timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import queue
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple

import pynvml

from gpuwatchd.clock import Clock
from gpuwatchd.model import (
    CLOCKS_EVENT_REASONS,
    GPU_RECOVERY_ACTIONS,
    NVML_SOURCE,
    ROW_REMAPPER_BUCKETS,
    THROTTLE_REASONS,
    GpuSample,
    LinkSample,
    NvmlUnavailable,
    Reading,
    SxidEvent,
    XidEvent,
)
from gpuwatchd.sources import NvmlSourceConfig, SourceUnavailable
from gpuwatchd.sources.kernel_xids import KernelXids
from gpuwatchd.sources.kmsg import nvml_address, system_uptime
from gpuwatchd.sources.pcie import nvidia_gpus_on_bus

log = logging.getLogger(__name__)

# How long the XID thread blocks in one nvmlEventSetWait_v2, and how long it
# waits before registering again after a failed wait (doubling up to the max).
XID_WAIT_MS = 1000
REREGISTER_BACKOFF_S = 1.0
REREGISTER_BACKOFF_MAX_S = 60.0
# How long a refused value (NotSupported, NoPermission, NoData...) is left
# unasked before it is asked again.
REASK_REFUSED_S = 600.0

_XID: int = pynvml.nvmlEventTypeXidCriticalError
_GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
# XID 79, "GPU has fallen off the bus": the kernel log's word that a GPU is lost.
_FALLEN_OFF_BUS = 79
_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN
_RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
_NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
_FUNCTION_NOT_FOUND: int = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
_INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
_SUCCESS: int = pynvml.NVML_SUCCESS
# Codes meaning "this GPU or driver does not provide the value" (absent, not
# an error). The permanent ones cannot change while the process runs: the
# loaded driver and binding stay what they are.
_PERMANENT_REFUSALS = frozenset(
    {
        _FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_DEPRECATED,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
_REFUSALS = _PERMANENT_REFUSALS | {
    _NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_NO_DATA,
}

_MHZ = 1e6
_MILLI = 1e-3
_NANO = 1e-9


# The links discovery asks: as many as any nvml.h allows (NVML_NVLINK_MAX_LINKS,
# 36 in nvidia-ml-py 13's header, 18 in 12's). The binding's constant is the
# header it was made from, not the driver's: an older binding would leave a
# newer driver's links past 17 unasked, and a capture it takes would differ
# from one taken under a newer binding. A link past the driver's own limit
# answers INVALID_ARGUMENT, which is "no such link".
NVLINK_MAX_LINKS = max(36, pynvml.NVML_NVLINK_MAX_LINKS)
# NVLink discovery: codes meaning "no such link" (gpud stops enumerating there
# too); any other error leaves the discovery open, done again next poll.
_NO_SUCH_LINK = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT})
# NVLink counter probe: codes meaning "this interface is not on this GPU".
_ABSENT = _PERMANENT_REFUSALS | {pynvml.NVML_ERROR_INVALID_ARGUMENT}
# A GPU on which no NVLink counter interface answered is probed again after
# this many polls (10 minutes at the default 10 s poll).
LINK_REPROBE_POLLS = 60
# NVLink BER fields (nvml.h NVML_NVLINK_BER_*): mantissa and exponent, and
# DCGM's zero sentinel (IsEffectiveBerThresholdExceeded: mantissa 15, exponent 255).
_BER_MANTISSA_SHIFT = 8
_BER_MANTISSA_MASK = 0xF
_BER_EXPONENT_MASK = 0xFF
_BER_ZERO = (15, 255)


class _GpuLost(Exception):
    """The driver says the GPU has fallen off the bus (GPU_IS_LOST)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Unanswered(Exception):
    """The GPU gave nothing this poll: no handle, or an error from every call."""

    def __init__(self, reason: str, code: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def _error_text(code: int) -> str:
    return str(pynvml.NVMLError(code))


def _binding(name: str) -> Any:
    """`pynvml.<name>`, or None where the installed nvidia-ml-py predates it."""
    return getattr(pynvml, name, None)


def _driver_branch(version: str | None) -> int:
    """The driver's branch ("550.54.15" -> 550); 0 when unknown, which reads
    nothing that needs a recent driver."""
    try:
        return int((version or "").split(".", 1)[0])
    except ValueError:
        return 0


# (first branch, one more than the largest field id its NVML defines): the
# NVML_FI_MAX of the nvml.h its CUDA release ships (NVIDIA/go-nvml
# gen/nvml/nvml.h at the commit named). A field id at or past it is not in the
# loaded library, and cannot be while the driver stays loaded. R565 had no
# public header: NVML's change log (v560 to v565) adds field 230 to it, so 231
# is what is known of it. A branch newer than the table gets the last row's
# limit, which is then a lower bound.
FIELD_ID_LIMITS = (
    (525, 170),  # CUDA 12.0, 399f8e0
    (530, 173),  # 12.1, 9fc23a0
    (535, 197),  # 12.2, 075f45f (12.3 = R545, b57740a, the same)
    (550, 200),  # 12.4, f7ceebd
    (555, 223),  # 12.5, 5f61a8a
    (560, 230),  # 12.6, 7ec3ff8
    (565, 231),  # no header; the change log's field 230
    (570, 269),  # 12.8, f420a32
    (575, 274),  # 12.9, 62ce1e3 (13.0 = R580, 9da9e13, the same)
    (590, 289),  # 13.1, 2a1f6c3
)


def field_id_limit(driver_branch: int) -> int | None:
    """One past the largest field id the branch's NVML defines; None for a
    branch older than the table or unknown (0), of which nothing is claimed."""
    limit = None
    for first_branch, branch_limit in FIELD_ID_LIMITS:
        if driver_branch >= first_branch:
            limit = branch_limit
    return limit


@dataclass(frozen=True)
class _Scalar:
    """One GpuSample field read by one call: `function(handle, *args)`, converted."""

    attr: str
    function: str
    args: tuple[int, ...] = ()
    convert: Callable[[Any], float | int | str] = float


def _scaled(factor: float) -> Callable[[Any], float]:
    return lambda value: float(value) * factor


_IDENTITY = (
    _Scalar("name", "nvmlDeviceGetName", convert=str),
    _Scalar("uuid", "nvmlDeviceGetUUID", convert=str),
    _Scalar("pci_bus_id", "nvmlDeviceGetPciInfo_v3", convert=lambda info: str(info.busId)),
    # "For all products with an inforom" (nvml.h): absent on boards without one.
    _Scalar("serial", "nvmlDeviceGetSerial", convert=str),
    _Scalar("board_part_number", "nvmlDeviceGetBoardPartNumber", convert=str),
)
_SCALARS = (
    _Scalar("sm_clock_hertz", "nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_SM,), _scaled(_MHZ)),
    _Scalar(
        "memory_clock_hertz", "nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_MEM,), _scaled(_MHZ)
    ),
    _Scalar(
        "sm_application_clock_hertz",
        "nvmlDeviceGetClock",
        (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET),
        _scaled(_MHZ),
    ),
    _Scalar(
        "memory_application_clock_hertz",
        "nvmlDeviceGetClock",
        (pynvml.NVML_CLOCK_MEM, pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET),
        _scaled(_MHZ),
    ),
    _Scalar("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", convert=int),
    _Scalar("power_watts", "nvmlDeviceGetPowerUsage", convert=_scaled(_MILLI)),
    # The PCIe link as it trained (it can train down while the GPU runs).
    _Scalar("pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration", convert=int),
    _Scalar("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", convert=int),
    # Configuration compared across the node's GPUs (checks/config_drift.py)
    # that an operator can change while the driver runs (nvidia-smi -pm).
    _Scalar("persistence_enabled", "nvmlDeviceGetPersistenceMode", convert=bool),
)
# Values a GPU keeps while the driver stays loaded, or that change only by an
# operator's hand (a power limit, a VBIOS flashed) or at a GPU reset (the ECC
# and MIG modes the calls answer as [current, pending]; the current one
# counts): read every `static_refresh`, not every poll.
_STATIC_SCALARS = (
    _Scalar(
        "sm_max_clock_hertz", "nvmlDeviceGetMaxClockInfo", (pynvml.NVML_CLOCK_SM,), _scaled(_MHZ)
    ),
    _Scalar(
        "memory_max_clock_hertz",
        "nvmlDeviceGetMaxClockInfo",
        (pynvml.NVML_CLOCK_MEM,),
        _scaled(_MHZ),
    ),
    _Scalar(
        "sm_default_application_clock_hertz",
        "nvmlDeviceGetClock",
        (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT),
        _scaled(_MHZ),
    ),
    _Scalar("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", convert=_scaled(_MILLI)),
    # As far as the GPU and its slot allow ("possible with this device and
    # system", nvml.h).
    _Scalar("pcie_link_max_generation", "nvmlDeviceGetMaxPcieLinkGeneration", convert=int),
    _Scalar("pcie_link_max_width", "nvmlDeviceGetMaxPcieLinkWidth", convert=int),
    _Scalar("vbios_version", "nvmlDeviceGetVbiosVersion", convert=str),
    _Scalar("ecc_enabled", "nvmlDeviceGetEccMode", convert=lambda modes: bool(modes[0])),
    _Scalar("mig_enabled", "nvmlDeviceGetMigMode", convert=lambda modes: bool(modes[0])),
)


@dataclass(frozen=True)
class _FieldScalar:
    """A GpuSample field that is a field value too (nvml.h): read in the
    poll's one batch, by `call` where a driver refuses the field."""

    field_name: str
    convert: Callable[[float | int], float | int]
    call: _Scalar


# Energy in millijoules since the driver was loaded (Volta and newer).
_FIELD_SCALARS = (
    _FieldScalar(
        "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        _scaled(_MILLI),
        _Scalar("energy_joules", "nvmlDeviceGetTotalEnergyConsumption", convert=_scaled(_MILLI)),
    ),
    _FieldScalar(
        "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
        int,
        _Scalar("pcie_replays", "nvmlDeviceGetPcieReplayCounter", convert=int),
    ),
)


@dataclass(frozen=True)
class _Threshold:
    """A temperature threshold: nvmlDeviceGetTemperatureThreshold's type, and
    the NVML_FI_DEV_TEMPERATURE_*_TLIMIT field nvml.h names as its replacement
    on Ada and later ("no longer the preferred interface", CUDA 12.2 header on).

    The TLIMIT fields are margins, not temperatures: the threshold is reached
    when the margin temperature (nvmlDeviceGetMarginTemperature, "distance to
    nearest slowdown threshold", nvidia-smi's "GPU T.Limit Temp") falls to the
    field's value (nvidia-smi: "GPU Slowdown T.Limit Temp: -2 C"), so the
    absolute threshold is current + margin - field. MEM_MAX has no fallback:
    its value is a margin of the GPU sensor, which says nothing of HBM's own
    temperature.
    """

    attr: str
    kind: int
    tlimit_field: str | None


_THRESHOLDS = (
    _Threshold(
        "temperature_slowdown_celsius",
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        "NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT",
    ),
    _Threshold(
        "temperature_shutdown_celsius",
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
        "NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT",
    ),
    _Threshold("temperature_memory_max_celsius", pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, None),
)
# THROTTLE_REASONS -> (perf policy of nvmlDeviceGetViolationStatus, the field
# value of the same time, in ns). The fields are read, in the poll's one
# batch; the call where a driver refuses a field. nvml.h marks the call
# DEPRECATED(13.0), a no-op macro in the CUDA 13.0 header and a compiler
# warning from 13.1, with removal announced for CUDA 14.0 (R580 still answers
# it), and from 13.1 names fields 74 and 76 after the clocks-event reasons
# that replace it. Perf-policy fields 74-79 keep their ids in every header
# from 12.0 to 13.3.
_VIOLATION_CALL = "nvmlDeviceGetViolationStatus"
_THROTTLE = {
    "power": (pynvml.NVML_PERF_POLICY_POWER, "NVML_FI_DEV_PERF_POLICY_POWER"),
    "thermal": (pynvml.NVML_PERF_POLICY_THERMAL, "NVML_FI_DEV_PERF_POLICY_THERMAL"),
    "sync_boost": (pynvml.NVML_PERF_POLICY_SYNC_BOOST, "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
    "board_limit": (pynvml.NVML_PERF_POLICY_BOARD_LIMIT, "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT"),
    "low_utilization": (
        pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
        "NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION",
    ),
    "reliability": (pynvml.NVML_PERF_POLICY_RELIABILITY, "NVML_FI_DEV_PERF_POLICY_RELIABILITY"),
}


@dataclass(frozen=True)
class _CounterIds:
    """The ids of the driver's cumulative clocks-event counters (ns) on the
    driver branches from `first_branch` on, by THROTTLE_REASONS name."""

    first_branch: int
    ids: Mapping[str, int]


# Field names of the counters, by THROTTLE_REASONS name. "thermal" is the
# SW thermal counter: nvml.h's translation table for the deprecated
# nvmlDeviceGetViolationStatus maps NVML_PERF_POLICY_THERMAL to
# NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN.
_COUNTER_NAMES = {
    "thermal": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}
# The counters' ids moved between headers, and each id names another field on
# other branches, so the id is chosen by the driver's branch, never taken from
# the installed binding (nvml.h, NVIDIA/go-nvml gen/nvml/nvml.h, by CUDA release):
# - 12.8 (R570): no counters; 251-253 are NVML_FI_PWR_SMOOTHING_ENABLED,
#   _PRIV_LVL and _IMM_RAMP_DOWN_ENABLED.
# - 12.9 (R575) and 13.0 (R580): 251, 252, 253; 269-271 are power smoothing
#   fields (ACTIVE_PRESET_PROFILE, ADMIN_OVERRIDE_PERCENT_TMP_FLOOR, _RAMP_UP_RATE).
# - 13.1 (R590) to 13.3: 269, 270, 271; 251-253 are power smoothing again.
# NVML's change log says otherwise of R580 ("v575 to v580: Fixed bug with
# NVML_FI_PWR_SMOOTHING_* field value numbering, which was different than the
# v570 values. Adjusted NVML_FI_DEV_CLOCKS_EVENT_REASON_* ... numbering"),
# which would put R580's counters at 269-271 as in 13.1. Until a capture of
# an R580 node settles it, the 13.0 header's ids are read and the values are
# checked by behaviour (`_check_counters`): a power smoothing setting read
# there is left absent, never taken for slowdown time.
_COUNTER_IDS = (
    _CounterIds(575, {"thermal": 251, "hw_thermal_slowdown": 252, "hw_power_brake_slowdown": 253}),
    _CounterIds(590, {"thermal": 269, "hw_thermal_slowdown": 270, "hw_power_brake_slowdown": 271}),
)


# THROTTLE_REASONS that only the counters give (no perf policy counts them).
_COUNTED_ONLY = tuple(reason for reason in THROTTLE_REASONS if reason not in _THROTTLE)
# The clocks-event reason bit each counter integrates (nvml.h names each
# counter after its nvmlClocksEventReason*).
_COUNTER_REASON_BITS = {
    "thermal": CLOCKS_EVENT_REASONS["sw_thermal_slowdown"],
    "hw_thermal_slowdown": CLOCKS_EVENT_REASONS["hw_thermal_slowdown"],
    "hw_power_brake_slowdown": CLOCKS_EVENT_REASONS["hw_power_brake_slowdown"],
}
# A value at a counter id that reads exactly 1 this many polls in a row, or
# does not grow over this many poll intervals that began and ended with its
# reason bit set, is no counter. A power smoothing setting (enabled, privilege
# level: nvml.h 12.8 and 13.1 put them at 251-253) reads 0 or 1; a slowdown
# counter integrates nanoseconds (nvml.h: "in ns"), so exactly 1 ns is no
# reading of it, and it must grow while its slowdown holds. Two of each leave
# a poll's chance coincidence (a bit set as a brief event ends) aside. A 0
# alone proves nothing: a healthy board's HW slowdown counters stay 0.
_COUNTER_ONES = 2
_COUNTER_STUCK_INTERVALS = 2
# A value that grew by a microsecond or more is trusted as a counter: the
# settings that share the ids are small numbers (enabled, a privilege level),
# a counted slowdown grows by far more. A smaller growth only waits for a
# larger one; it makes no counter stuck either.
_COUNTER_TRUSTED_GROWTH_NS = 1000


def counter_ids(driver_version: str | None) -> Mapping[str, int]:
    """The clocks-event counter ids the driver `driver_version` answers; none
    when its branch predates them or cannot be told from the version."""
    branch = _driver_branch(driver_version)
    chosen: Mapping[str, int] = {}
    for table in _COUNTER_IDS:
        if branch >= table.first_branch:
            chosen = table.ids
    return chosen


_ECC_TYPES = {
    "corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}
_ECC_SCOPES = {"volatile": pynvml.NVML_VOLATILE_ECC, "aggregate": pynvml.NVML_AGGREGATE_ECC}
_RETIREMENT_CAUSES = {
    "multiple_single_bit": pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    "double_bit": pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
}
# A field value's valueType -> the member of its value union that holds it
# (ctypes gives a double as a float, the others as ints).
FIELD_VALUE_MEMBERS: Mapping[int, str] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
# A field value as C lays it out: a poll reads hundreds, so its members are
# unpacked from the request array's memory, where the binding's struct would
# make an object of each element and read each member through a Python hook.
_FIELD_VALUE = pynvml.c_nvmlFieldValue_t
_FIELD_VALUE_SIZE = ctypes.sizeof(_FIELD_VALUE)
_FIELD_VALUE_TYPES = dict(_FIELD_VALUE._fields_)
_RETURN_AT: int = _FIELD_VALUE.nvmlReturn.offset
_VALUE_TYPE_AT: int = _FIELD_VALUE.valueType.offset
_VALUE_AT: int = _FIELD_VALUE.value.offset
_RETURN = struct.Struct("@" + _FIELD_VALUE_TYPES["nvmlReturn"]._type_)
_VALUE_TYPE = struct.Struct("@" + _FIELD_VALUE_TYPES["valueType"]._type_)
# valueType -> how its union member's bytes read (the member's C type).
_VALUE_READERS: Mapping[int, struct.Struct] = {
    value_type: struct.Struct("@" + dict(pynvml.c_nvmlValue_t._fields_)[member]._type_)
    for value_type, member in FIELD_VALUE_MEMBERS.items()
}


@dataclass(frozen=True)
class _LinkCounters:
    """One interface through which a GPU reports its NVLink error counters.

    `fields`: NVLINK_ERROR_TYPES -> field-value name, asked with scope id = link;
    `ber_fields`: NVLINK_BER_TYPES -> field-value name of an encoded BER, likewise;
    `counters`: NVLINK_ERROR_TYPES -> counter of nvmlDeviceGetNvLinkErrorCounter;
    `min_driver_branch`: the first driver branch whose nvml.h documents the
    interface as it is read here; `nvlink5`: NVLink5's (Blackwell and newer).
    """

    name: str
    fields: Mapping[str, str] = field(default_factory=dict)
    ber_fields: Mapping[str, str] = field(default_factory=dict)
    counters: Mapping[str, int] = field(default_factory=dict)
    min_driver_branch: int = 0
    nvlink5: bool = False

    def keeping(self, kinds: set[str]) -> _LinkCounters:
        """This interface with only the kinds the GPU answered."""
        return replace(
            self,
            fields={k: v for k, v in self.fields.items() if k in kinds},
            ber_fields={k: v for k, v in self.ber_fields.items() if k in kinds},
            counters={k: v for k, v in self.counters.items() if k in kinds},
        )


# The first branch whose nvml.h documents Hopper's DL fields per link.
_SCOPED_DL_BRANCH = 575
# Those of the GPU's generation (`_interfaces`) are probed in this order; the
# first that answers on any link is read on all.
_LINK_COUNTER_INTERFACES = (
    # NVLink5 (Blackwell). Its counters mean other things than NVLink 2-4's and
    # keep their own names: effective errors are those FEC did not correct.
    # DCGM's MonitorNVLink5Fields judges these (DcgmHealthWatch.cpp). Older
    # GPUs answer INVALID_ARGUMENT or NOT_SUPPORTED (DataDog's collector).
    _LinkCounters(
        "NVML_FI_DEV_NVLINK_COUNT_* field values (NVLink5)",
        fields={
            "effective_errors": "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS",
            "recovery": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS",
            "recovery_failed": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS",
            "malformed_packets": "NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS",
            "link_integrity": "NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS",
        },
        ber_fields={
            "effective": "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER",
            "symbol": "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER",
        },
        nvlink5=True,
    ),
    # Pascal to Hopper: what nvidia-smi, DCGM (DcgmCacheManager.cpp, links 0-17),
    # gpud (components/accelerator/nvidia/nvlink) and DataDog read per link.
    _LinkCounters(
        "nvmlDeviceGetNvLinkErrorCounter",
        counters={
            "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
            "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
            "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
            "ecc_data": pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA,
        },
    ),
    # Hopper's scoped DL fields, only where the error-counter call does not
    # answer and only on drivers whose nvml.h says "Link ID needs to be
    # specified in the scopeId field" (NVML 12.9, R575). Before that DCGM reads
    # them with scope 0 as the device's "Total": read per link on an older
    # driver they could put one device total on every link.
    _LinkCounters(
        "scoped NVML_FI_DEV_NVLINK_ERROR_DL_* field values",
        fields={
            "crc_flit": "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
            "replay": "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
            "recovery": "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
        },
        min_driver_branch=_SCOPED_DL_BRANCH,
    ),
)
_NO_LINK_COUNTERS = _LinkCounters("none")
# nvmlDeviceArchitecture_t (nvml.h NVML_DEVICE_ARCH_*: Hopper 9, Blackwell 10,
# Rubin 13, UNKNOWN "anything else, presumably something newer").
_ARCH_HOPPER: int = pynvml.NVML_DEVICE_ARCH_HOPPER
_ARCH_BLACKWELL: int = pynvml.NVML_DEVICE_ARCH_BLACKWELL
_ARCH_UNKNOWN: int = pynvml.NVML_DEVICE_ARCH_UNKNOWN
# A link's state as a field value (nvml.h: "NVLink State - Active,Inactive",
# scope = link), as NCCL reads it on SM90 and newer (NVIDIA/nccl
# src/graph/xml.cc, ncclTopoGetXmlFromGpu): one field of the batch instead of
# a call a link; the call where the field gives nothing.
_STATE_FIELD = "NVML_FI_DEV_NVLINK_GET_STATE"
# The DL fields whose values move when the error-counter call's do: the
# device's totals before R575 (DCGM reads them at scope 0 as the "Total"),
# each link's from R575 (nvml.h 12.9: "Link ID needs to be specified in the
# scopeId field"). They only say when to read the counters, never what the
# counters are: a link's counts are what the call answers for it.
_COUNTER_SIGN_FIELDS = (
    "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
    "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
)


def _interfaces(architecture: int | None) -> tuple[_LinkCounters, ...]:
    """The counter interfaces of the GPU's generation: NVLink5's COUNT fields
    from Blackwell on (nvml.h documents them "in NVLink5"; NVML's change log,
    v560 to v565, removes the error-counter call and the DL fields on
    Blackwell), the error-counter call and Hopper's DL fields before; all of
    them, in order, where the architecture is not known."""
    if architecture is None or architecture == _ARCH_UNKNOWN:
        return _LINK_COUNTER_INTERFACES
    nvlink5 = architecture >= _ARCH_BLACKWELL
    return tuple(i for i in _LINK_COUNTER_INTERFACES if i.nvlink5 == nvlink5)


class _Availability:
    """What each GPU does not provide: logged once per (GPU, value); not asked
    again when the refusal is permanent, and asked again after REASK_REFUSED_S
    when it is NotSupported. The refusals of one poll are logged together by
    `flush()`, one line a level: a node's GPUs refuse the same values, and 24
    lines at start-up bury the ones that matter."""

    def __init__(self) -> None:
        # A reader the poll gave up on may still note what its call answered.
        self._lock = threading.Lock()
        # (GPU, value, call) -> when to ask again (infinity: never).
        self._refused: dict[tuple[int, str, str], float] = {}
        self._logged: set[tuple[int, str, str]] = set()
        # (level, source, why, then) -> value -> GPUs, not logged yet
        self._unlogged: dict[tuple[int, str, str, str], dict[str, list[int]]] = {}

    def refused(self, gpu: int, subject: str, source: str, now: float) -> bool:
        # One dict read is whole under the GIL: no lock for what every call asks.
        return self._refused.get((gpu, subject, source), -math.inf) > now

    def answered(self, gpu: int, subject: str, source: str) -> None:
        """A value answers: if it had been refused, say that it is back."""
        key = (gpu, subject, source)
        if key not in self._refused:
            return
        with self._lock:
            back = self._refused.pop(key, None) is not None and key in self._logged
            if back:
                self._logged.discard(key)
        if back:
            log.info("GPU %d: %s is read by %s again", gpu, subject, source)

    def note(
        self,
        gpu: int,
        subject: str,
        source: str,
        code: int,
        then: str,
        now: float,
        permanent: bool = False,
    ) -> None:
        """`permanent`: the refusal cannot change while the driver stays
        loaded, whatever its code says."""
        if permanent or code in _PERMANENT_REFUSALS:
            until = math.inf
        elif code == _NOT_SUPPORTED:
            until = now + REASK_REFUSED_S
        else:
            until = -math.inf
        expected = permanent or code in _REFUSALS
        level = logging.INFO if expected else logging.WARNING
        self._remember((gpu, subject, source), until, level, _error_text(code), then)

    def distrust(self, gpu: int, subject: str, source: str, why: str, then: str) -> None:
        """A value that answers but cannot be what it is read as: never asked
        again (it cannot change while the driver stays loaded), said once."""
        self._remember((gpu, subject, source), math.inf, logging.WARNING, why, then)

    def _remember(
        self, key: tuple[int, str, str], until: float, level: int, why: str, then: str
    ) -> None:
        gpu, subject, source = key
        with self._lock:
            if until > -math.inf:
                self._refused[key] = until
            if key in self._logged:
                return
            self._logged.add(key)
            unlogged = self._unlogged.setdefault((level, source, why, then), {})
            unlogged.setdefault(subject, []).append(gpu)

    def flush(self) -> None:
        """Log what was refused since the last flush: one line for the
        expected refusals (info), one for the errors (warning)."""
        by_level: dict[int, list[str]] = {}
        with self._lock:
            unlogged, self._unlogged = self._unlogged, {}
        for (level, source, why, then), values in unlogged.items():
            for subject, gpus in values.items():
                by_level.setdefault(level, []).append(
                    f"{subject} on GPU {_ranges(gpus)} ({source}: {why}; {then})"
                )
        for level, parts in sorted(by_level.items()):
            log.log(level, "values not read: %s", "; ".join(parts))


def _ranges(numbers: list[int]) -> str:
    """`0-3, 5` for [0, 1, 2, 3, 5]."""
    spans: list[list[int]] = []
    for number in sorted(set(numbers)):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


class _FieldRequest(NamedTuple):
    """One field value wanted in this poll's batch, where its value goes, and
    what reads it instead when the field gives none. A tuple: a poll makes
    hundreds, and a frozen dataclass costs several times as much to make."""

    subject: str
    field_name: str
    field_id: int
    scope: int
    target: dict[Any, Any]
    key: Any
    convert: Callable[[float | int], float | int]
    otherwise: Callable[[], None] | None


class _FieldBatch:
    """A GPU's nvmlDeviceGetFieldValues request for one list of (field id,
    scope id), made once and reused while the poll asks the same list:
    pynvml's wrapper builds the array anew at every call, member by member
    through its structs' Python hooks."""

    def __init__(self, ids: tuple[tuple[int, int], ...]) -> None:
        self.ids = ids
        self.values: ctypes.Array[Any] = (_FIELD_VALUE * len(ids))()
        for value, (field_id, scope) in zip(self.values, ids, strict=True):
            value.fieldId, value.scopeId = field_id, scope
        self._request = bytes(self.values)

    def get(self, handle: Any) -> ctypes.Array[Any]:
        """The driver's answers, each field as fresh as pynvml's own array
        (the request alone: nothing of the last answers is left in it)."""
        ctypes.memmove(self.values, self._request, len(self._request))
        function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        code = function(handle, len(self.ids), self.values)
        if code != _SUCCESS:
            raise pynvml.NVMLError(code)
        return self.values


@dataclass
class _CallCounts:
    """The NVLink error counters a GPU gives one call a link and counter
    (`nvmlDeviceGetNvLinkErrorCounter`), as last read, and what says when
    to read them again: the DL fields' values then (`sign`), and whether
    those fields have followed the counters."""

    errors: dict[int, dict[str, int]] = field(default_factory=dict)
    read_at: float | None = None
    sign: dict[tuple[str, int], int] | None = None
    sign_followed: bool = True

    def due(self, sign: dict[tuple[str, int], int] | None, now: float, every: float) -> bool:
        """Whether to read the counters now: never read, a sign that moved
        since, or `every` seconds gone by."""
        if self.read_at is None:
            return True
        if sign and self.sign is not None and sign != self.sign:
            return True
        return now - self.read_at >= every


class _Gpu:
    """What the source keeps about one GPU between polls."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.identity: dict[str, str] = {}
        self.links: tuple[int, ...] | None = None
        self.links_settled = False
        # nvmlDeviceGetArchitecture's answer (NVML_DEVICE_ARCH_*), once read.
        self.architecture: int | None = None
        self.link_counters: _LinkCounters | None = None
        self.counts = _CallCounts()
        self.field_batch: _FieldBatch | None = None
        # The last sample read of the GPU, whose unchanged parts the next shares.
        self.last: GpuSample | None = None
        # The values a GPU keeps (`_read_static`) as last read, and when.
        self.static: dict[str, Any] = {}
        self.static_read_at: float | None = None
        self.counter_watches: dict[str, _CounterWatch] = {}
        self.polls_since_probe = 0
        self.xid_counts: Counter[int] = Counter()
        self.up = True
        # Whether the last read gave values (False after a lost or unanswered one).
        self.answering = True
        # The NVML function the GPU's read is in, and the read the poll gave
        # up on while its call has not returned.
        self.calling: str | None = None
        self.stuck: _Job | None = None

    def down_sample(self) -> GpuSample:
        return self._unread_sample(up=False)

    def hung_sample(self, reason: str) -> GpuSample:
        return self._unread_sample(up=True, responsive=False, read_hung=reason)

    def unanswered_sample(self, unanswered: _Unanswered) -> GpuSample:
        return self._unread_sample(
            up=True,
            responsive=False,
            unanswered=unanswered.reason,
            no_permission=unanswered.code == _NO_PERMISSION,
        )

    def _unread_sample(self, **state: Any) -> GpuSample:
        identity = self.identity
        return GpuSample(
            index=self.index,
            uuid=identity.get("uuid"),
            name=identity.get("name"),
            pci_bus_id=identity.get("pci_bus_id"),
            serial=identity.get("serial"),
            board_part_number=identity.get("board_part_number"),
            xid_counts=dict(self.xid_counts),
            **state,
        )


class _Job:
    """One read of one GPU, done by a reader thread for the poll."""

    def __init__(self, gpu: _Gpu, read: Callable[[], GpuSample], started: float) -> None:
        self.gpu = gpu
        self.started = started
        # When the reader began the read, on the daemon's clock: its deadline
        # counts from there, not from the reads queued before it.
        self.began: float | None = None
        self.done = threading.Event()
        self.sample: GpuSample | None = None
        # The reader it was handed to, and the call the poll gave up in, once it has.
        self.reader: _Reader | None = None
        self.given_up_in: str | None = None
        self.lost: str | None = None
        self.unanswered: _Unanswered | None = None
        self.error: Exception | None = None
        self._read = read
        # Taken for good by whichever comes first: the reader that runs the
        # read, or the poll that takes it back from a reader stuck before it
        # (`cancel`). So a read is never run twice, nor by a stuck reader
        # once it returns.
        self._claim = threading.Lock()

    def cancel(self) -> bool:
        """Take the read from its reader; False when the reader has begun it."""
        return self._claim.acquire(blocking=False)

    def again(self) -> _Job:
        """The same read, for another reader (this one cancelled)."""
        return _Job(self.gpu, self._read, self.started)

    def run(self, clock: Clock) -> None:
        if not self._claim.acquire(blocking=False):
            return  # taken back by the poll
        self.began = clock.now()
        try:
            self.sample = self._read()
        except _GpuLost as lost:
            self.lost = lost.reason
        except _Unanswered as unanswered:
            self.unanswered = unanswered
        except Exception as error:  # re-raised in the poll's thread
            self.error = error
        finally:
            if self.gpu.stuck is self:
                log.warning(
                    "GPU %d: %s returned after the read was given up; reading it again",
                    self.gpu.index,
                    self.given_up_in,
                )
                self.gpu.stuck = None
            self.done.set()


class _Reader:
    """A thread that does the reads it is given, one at a time in the order
    given, until it is closed or given up (it then ends after the read it is
    stuck in, skipping those taken back)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gpuwatchd-nvml", daemon=True)
        self._thread.start()

    def read(self, jobs: Sequence[_Job]) -> None:
        for job in jobs:
            job.reader = self
            self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job.run(self._clock)


class _GpuRead:
    """One poll of one GPU: every call goes through `call`, every field value
    through `want` and one `fetch_fields` batch."""

    def __init__(
        self,
        gpu: _Gpu,
        availability: _Availability,
        now: float,
        field_id_limit: int | None = None,
    ) -> None:
        """`field_id_limit`: one past the largest field id the driver's NVML
        defines (`field_id_limit()`), None where not known."""
        self.gpu = gpu
        self.index = gpu.index
        self.now = now
        self._availability = availability
        self._field_id_limit = field_id_limit
        self._requests: list[_FieldRequest] = []
        # What reads the values whose field gave none, once the batch is in.
        self._instead: list[Callable[[], None]] = []
        self._unknown: list[tuple[str, str]] = []
        self.answered = False
        self.reset_required = False

    def refused(self, subject: str, source: str) -> bool:
        """Whether `source` (a function or a field) is not to be asked for `subject` now."""
        return self._availability.refused(self.index, subject, source, self.now)

    def call(self, subject: str, function: str, *args: Any, then: str = "left absent") -> Any:
        """`pynvml.<function>(handle, *args)`, or None when the GPU does not answer it."""
        # `refused`, inline: a poll asks it of every call and field.
        if self._availability.refused(self.index, subject, function, self.now):
            return None
        # `_binding`, inline likewise.
        return self._invoke(subject, function, getattr(pynvml, function, None), args, then)

    def _invoke(
        self,
        subject: str,
        function: str,
        wrapper: Callable[..., Any] | None,
        args: tuple[Any, ...],
        then: str = "left absent",
    ) -> Any:
        """`wrapper(handle, *args)` as `call` makes it of `function`."""
        if wrapper is None:
            self._refused(subject, function, _FUNCTION_NOT_FOUND, then)
            return None
        self.gpu.calling = function
        try:
            value = wrapper(self.gpu.handle, *args)
        except pynvml.NVMLError as error:
            self._refused(subject, function, error.value, then)
            return None
        self._answered(subject, function)
        return value

    def _answered(self, subject: str, source: str) -> None:
        self.answered = True
        self._availability.answered(self.index, subject, source)

    def _refused(self, subject: str, source: str, code: int, then: str) -> None:
        if code == _GPU_IS_LOST:
            raise _GpuLost(f"{source}: {_error_text(code)}")
        if code == _UNKNOWN:
            # Judged after the poll: Unknown from every call means a lost GPU.
            self._unknown.append((subject, source))
            return
        if code == _RESET_REQUIRED:
            # The GPU answers, and says it needs a reset: that is the reading.
            self.answered = True
            self.reset_required = True
            then = "the GPU needs a reset"
        self._availability.note(self.index, subject, source, code, then, self.now)

    def want(
        self,
        subject: str,
        field_name: str,
        target: dict[Any, Any],
        key: Any,
        convert: Callable[[float | int], float | int] = float,
        scope: int = 0,
        field_id: int | None = None,
        otherwise: Callable[[], None] | None = None,
    ) -> None:
        """Ask for a field value in the poll's batch; `otherwise` runs after
        the batch when the field gives no value (refused now or before)."""
        if self._availability.refused(self.index, subject, field_name, self.now):
            self._later(otherwise)
            return
        if field_id is None:
            field_id = getattr(pynvml, field_name, None)  # `_binding`, inline
        if field_id is None:
            self._refused(subject, field_name, _FUNCTION_NOT_FOUND, "left absent")
            self._later(otherwise)
            return
        self._requests.append(
            _FieldRequest(subject, field_name, field_id, scope, target, key, convert, otherwise)
        )

    def _later(self, instead: Callable[[], None] | None) -> None:
        if instead is not None:
            self._instead.append(instead)

    def fetch_fields(self) -> None:
        """Read the wanted fields in one batch, then what reads the values
        they did not give."""
        requests, self._requests = self._requests, []
        if requests:
            self._fetch(requests)
        instead, self._instead = self._instead, []
        for read in instead:
            read()

    def _fetch(self, requests: list[_FieldRequest]) -> None:
        gpu = self.gpu
        ids = tuple([(r.field_id, r.scope) for r in requests])
        if gpu.field_batch is None or gpu.field_batch.ids != ids:
            gpu.field_batch = _FieldBatch(ids)
        # The batch answers SUCCESS whatever each field says (nvml.h): only a
        # field's own answer shows that the GPU answers.
        answered = self.answered
        values = None
        if not self.refused("field values", "nvmlDeviceGetFieldValues"):
            batch = gpu.field_batch.get
            values = self._invoke("field values", "nvmlDeviceGetFieldValues", batch, ())
        self.answered = answered
        if values is not None:
            self._decode(requests, values)
        self._instead.extend(
            request.otherwise
            for request in requests
            if request.otherwise is not None and request.key not in request.target
        )

    def _decode(self, requests: list[_FieldRequest], values: ctypes.Array[Any]) -> None:
        at = 0
        for request in requests:
            (code,) = _RETURN.unpack_from(values, at + _RETURN_AT)
            if code != _SUCCESS:
                self._refused_field(request, code)
            else:
                (value_type,) = _VALUE_TYPE.unpack_from(values, at + _VALUE_TYPE_AT)
                reader = _VALUE_READERS.get(value_type)
                if reader is not None:
                    (number,) = reader.unpack_from(values, at + _VALUE_AT)
                    request.target[request.key] = request.convert(number)
                    self._answered(request.subject, request.field_name)
            at += _FIELD_VALUE_SIZE

    def distrust(self, subject: str, source: str, why: str, then: str) -> None:
        """A value that answered but is not what it is read as (see _Availability.distrust)."""
        self._availability.distrust(self.index, subject, source, why, then)

    def _refused_field(self, request: _FieldRequest, code: int) -> None:
        """A field's own refusal. INVALID_ARGUMENT for an id past what the
        driver's NVML defines is the library saying it has no such field:
        remembered for the process, since the loaded driver does not change."""
        limit, field_id = self._field_id_limit, request.field_id
        if code == _INVALID_ARGUMENT and limit is not None and field_id >= limit:
            then = f"not asked again: field {field_id} is past the {limit - 1} this driver defines"
            self._availability.note(
                self.index, request.subject, request.field_name, code, then, self.now, True
            )
            return
        self._refused(request.subject, request.field_name, code, "left absent")

    def finish(self) -> None:
        """Raise _Unanswered when no call answered and some said Unknown; else
        note the Unknowns."""
        if self._unknown and not self.answered:
            raise _Unanswered(f"{_error_text(_UNKNOWN)} from every call", _UNKNOWN)
        for subject, source in self._unknown:
            self._availability.note(self.index, subject, source, _UNKNOWN, "left absent", self.now)


def _read_scalars(read: _GpuRead, scalars: Sequence[_Scalar], into: dict[str, Any]) -> None:
    for scalar in scalars:
        value = read.call(scalar.attr, scalar.function, *scalar.args)
        if value is not None:
            into[scalar.attr] = scalar.convert(value)


def _read_identity(read: _GpuRead) -> None:
    """Identity does not change: read once, and kept for the samples of a lost GPU."""
    identity = read.gpu.identity
    _read_scalars(read, [s for s in _IDENTITY if s.attr not in identity], identity)


def _read_field_scalars(read: _GpuRead, sample: dict[str, Any]) -> None:
    """The counters that are field values too: in the batch, else by their call."""
    for scalar in _FIELD_SCALARS:
        attr = scalar.call.attr
        instead = partial(_read_scalars, read, (scalar.call,), sample)
        read.want(attr, scalar.field_name, sample, attr, scalar.convert, otherwise=instead)


def _read_static(read: _GpuRead, temperature: int | None) -> dict[str, Any]:
    """The values a GPU keeps (`_STATIC_SCALARS`, the temperature thresholds),
    read anew; the thresholds that come from field values arrive with the batch."""
    static: dict[str, Any] = {}
    _read_scalars(read, _STATIC_SCALARS, static)
    _read_thresholds(read, static, temperature)
    return static


def _read_temperatures(read: _GpuRead, sample: dict[str, Any]) -> int | None:
    """The GPU's and HBM's temperatures; returns the GPU's, as NVML gave it."""
    temperature = read.call(
        "temperature_gpu_celsius",
        "nvmlDeviceGetTemperatureV",
        pynvml.NVML_TEMPERATURE_GPU,
        then="trying nvmlDeviceGetTemperature",
    )
    if temperature is None:
        temperature = read.call(
            "temperature_gpu_celsius", "nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU
        )
    if temperature is not None:
        sample["temperature_gpu_celsius"] = float(temperature)
    read.want(
        "temperature_memory_celsius",
        "NVML_FI_DEV_MEMORY_TEMP",
        sample,
        "temperature_memory_celsius",
    )
    return None if temperature is None else int(temperature)


def _read_thresholds(read: _GpuRead, sample: dict[str, Any], temperature: int | None) -> None:
    refused: list[tuple[str, str]] = []  # (attr, TLIMIT field)
    for threshold in _THRESHOLDS:
        value = read.call(
            threshold.attr,
            "nvmlDeviceGetTemperatureThreshold",
            threshold.kind,
            then=(
                f"reading {threshold.tlimit_field} instead"
                if threshold.tlimit_field
                else "left absent (checks use their configured limit)"
            ),
        )
        if value is not None:
            sample[threshold.attr] = float(value)
        elif threshold.tlimit_field is not None:
            refused.append((threshold.attr, threshold.tlimit_field))
    if not refused or temperature is None:
        return
    margin = read.call(
        "temperature_margin", "nvmlDeviceGetMarginTemperature", then="thresholds left absent"
    )
    if margin is None:
        return
    t_limit = float(temperature) + float(margin)
    for attr, tlimit_field in refused:
        read.want(attr, tlimit_field, sample, attr, lambda past_t_limit: t_limit - past_t_limit)


def _read_framebuffer(read: _GpuRead, sample: dict[str, Any]) -> None:
    """Used, free and reserved device memory: nvmlDeviceGetMemoryInfo_v2,
    which reports the driver's reservation apart, or v1 where a driver or
    binding lacks it (v1's used includes the reservation: nvml.h, nvmlMemory_t)."""
    version = _binding("nvmlMemory_v2")
    memory = None
    if version is not None:
        memory = read.call(
            "framebuffer (v2)",
            "nvmlDeviceGetMemoryInfo",
            version,
            then="trying nvmlDeviceGetMemoryInfo (v1)",
        )
    if memory is not None:
        sample["memory_reserved_bytes"] = int(memory.reserved)
    else:
        memory = read.call("framebuffer", "nvmlDeviceGetMemoryInfo")
    if memory is not None:
        sample["memory_used_bytes"] = int(memory.used)
        sample["memory_free_bytes"] = int(memory.free)


def _read_fabric(read: _GpuRead, sample: dict[str, Any]) -> None:
    """The GPU's registration with the NVSwitch fabric: the versioned
    nvmlDeviceGetGpuFabricInfoV (R550 on), with the fabric's health mask, or
    the unversioned call nvml.h deprecates in 13.0 where a driver or binding
    lacks it (no mask there). Pre-Hopper GPUs answer NotSupported (nvml.h:
    "Hopper or newer")."""
    info = None
    versioned = _binding("c_nvmlGpuFabricInfoV_t")
    if versioned is not None:
        info = versioned()  # its constructor sets the struct version
        if (
            read.call(
                "fabric",
                "nvmlDeviceGetGpuFabricInfoV",
                ctypes.byref(info),
                then="trying nvmlDeviceGetGpuFabricInfo",
            )
            is None
        ):
            info = None
        else:
            sample["fabric_health_mask"] = int(info.healthMask)
    if info is None:
        info = pynvml.c_nvmlGpuFabricInfo_t()
        if read.call("fabric (v1)", "nvmlDeviceGetGpuFabricInfo", ctypes.byref(info)) is None:
            return
    sample["fabric_state"] = int(info.state)
    sample["fabric_status"] = int(info.status)


def _read_utilization(read: _GpuRead, sample: dict[str, Any]) -> None:
    utilization = read.call("utilization", "nvmlDeviceGetUtilizationRates")
    if utilization is not None:
        sample["utilization_gpu_ratio"] = utilization.gpu / 100
        sample["utilization_memory_ratio"] = utilization.memory / 100


def _read_throttle(
    read: _GpuRead, sample: dict[str, Any], counters: Mapping[str, int]
) -> dict[str, str]:
    """Violation time per perf policy, and the HW slowdown counters where the
    driver's branch has them (`counters`, from `counter_ids`). Returns the
    reasons asked of a counter id, with the field's name, for `_check_counters`."""
    seconds: dict[str, float] = {}
    counted: dict[str, str] = {}
    for reason, (policy, field_name) in _THROTTLE.items():
        subject = f"throttle_seconds[{reason}]"
        counter = _counter_field(reason, counters)
        unanswered = read.refused(subject, field_name) and read.refused(subject, _VIOLATION_CALL)
        if counter is not None and unanswered:
            # Neither the perf-policy field nor the call answers: the driver's
            # counter of the same time (nvml.h's translation table for the
            # deprecated call), checked by behaviour.
            name, field_id = counter
            read.want(subject, name, seconds, reason, _scaled(_NANO), field_id=field_id)
            counted[reason] = name
            continue
        then = f"reading {counter[0]} instead" if counter is not None else "left absent"
        instead = partial(_read_violation, read, subject, (policy, then), seconds, reason)
        read.want(subject, field_name, seconds, reason, _scaled(_NANO), otherwise=instead)
    for reason in _COUNTED_ONLY:
        counter = _counter_field(reason, counters)
        if counter is not None:
            name, field_id = counter
            subject = f"throttle_seconds[{reason}]"
            read.want(subject, name, seconds, reason, _scaled(_NANO), field_id=field_id)
            counted[reason] = name
    sample["throttle_seconds"] = seconds
    return counted


def _read_violation(
    read: _GpuRead,
    subject: str,
    asked: tuple[int, str],
    seconds: dict[str, float],
    reason: str,
) -> None:
    """The call's violation time for `asked` (perf policy, what follows a refusal)."""
    policy, then = asked
    violation = read.call(subject, _VIOLATION_CALL, policy, then=then)
    if violation is not None:
        seconds[reason] = violation.violationTime * _NANO


def _counter_field(reason: str, counters: Mapping[str, int]) -> tuple[str, int | None] | None:
    """(name with id, id) of the counter of `reason`, where the driver has one."""
    field_id = counters.get(reason)
    if field_id is None:
        return None
    return f"{_COUNTER_NAMES[reason]} ({field_id})", field_id


@dataclass
class _CounterWatch:
    """What one clocks-event counter id has answered on one GPU: enough to
    tell a cumulative nanosecond counter from another field at that id."""

    last_ns: int | None = None
    # Whether the counter's reason bit was set at the last read.
    slowed: bool = False
    # It grew by _COUNTER_TRUSTED_GROWTH_NS once: a counter, trusted from then on.
    grown: bool = False
    # Reads in a row of exactly 1, and poll intervals that began and ended
    # with the reason bit set while the value did not grow.
    ones: int = 0
    stuck: int = 0

    def verdict(self, ns: int, slowed: bool) -> str | None:
        """Why the value cannot be a counter of slowdown time, or None."""
        last = self.last_ns
        self.last_ns, was_slowed, self.slowed = ns, self.slowed, slowed
        if last is not None and ns - last >= _COUNTER_TRUSTED_GROWTH_NS:
            self.grown = True
        if self.grown:
            return None
        self.ones = self.ones + 1 if ns == 1 else 0
        if last is not None and was_slowed and slowed and ns <= last:
            self.stuck += 1
        if self.ones >= _COUNTER_ONES:
            return "reads 1 poll after poll, which no nanosecond counter does"
        if self.stuck >= _COUNTER_STUCK_INTERVALS:
            return (
                f"did not grow over {self.stuck} poll intervals with its reason bit set, "
                "which a counter of that slowdown must"
            )
        return None


def _check_counters(read: _GpuRead, sample: dict[str, Any], counted: Mapping[str, str]) -> None:
    """Leave out a clocks-event counter whose id answers something else (the
    headers and NVML's change log disagree on the R580 ids: see _COUNTER_IDS):
    a field that reads 1 poll after poll, or does not grow while its reason
    bit is set. Such a value is never read again; the slowdown is judged from
    the reason bits instead. It raises nothing by itself."""
    seconds: dict[str, float] = sample["throttle_seconds"]
    reasons = sample.get("clocks_event_reasons")
    watches = read.gpu.counter_watches
    for reason, name in counted.items():
        value = seconds.get(reason)
        if value is None:
            continue
        slowed = reasons is not None and bool(reasons & _COUNTER_REASON_BITS[reason])
        why = watches.setdefault(reason, _CounterWatch()).verdict(round(value / _NANO), slowed)
        if why is not None:
            del seconds[reason]
            read.distrust(
                f"throttle_seconds[{reason}]",
                name,
                f"not a counter: {why}",
                "left absent; slowdown judged from the reason bits",
            )


def _read_memory_errors(read: _GpuRead, sample: dict[str, Any]) -> None:
    ecc: dict[tuple[str, str], int] = {}
    for kind, kind_id in _ECC_TYPES.items():
        for scope, scope_id in _ECC_SCOPES.items():
            count = read.call(
                f"ecc_errors[{kind}, {scope}]", "nvmlDeviceGetTotalEccErrors", kind_id, scope_id
            )
            if count is not None:
                ecc[kind, scope] = int(count)
    sample["ecc_errors"] = ecc
    rows = read.call("remapped_rows", "nvmlDeviceGetRemappedRows")
    if rows is not None:
        correctable, uncorrectable, pending, failed = rows
        sample["remapped_rows_correctable"] = int(correctable)
        sample["remapped_rows_uncorrectable"] = int(uncorrectable)
        sample["row_remap_pending"] = bool(pending)
        sample["row_remap_failed"] = bool(failed)
    retired: dict[str, int] = {}
    for cause, cause_id in _RETIREMENT_CAUSES.items():
        pages = read.call(f"retired_pages[{cause}]", "nvmlDeviceGetRetiredPages", cause_id)
        if pages is not None:
            retired[cause] = len(pages)
    sample["retired_pages"] = retired
    pending_pages = read.call("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus")
    if pending_pages is not None:
        sample["retired_pages_pending"] = bool(pending_pages)
    _read_repair_limits(read, sample)


def _read_repair_limits(read: _GpuRead, sample: dict[str, Any]) -> None:
    """What NVIDIA's RMA policy reads: the SRAM error threshold and the spare
    rows left in each bank of the row remapper."""
    histogram = read.call("row_remapper_banks", "nvmlDeviceGetRowRemapperHistogram")
    if histogram is not None:
        sample["row_remapper_banks"] = {
            bucket: int(getattr(histogram, bucket)) for bucket in ROW_REMAPPER_BUCKETS
        }
    status_type = _binding("c_nvmlEccSramErrorStatus_v1_t")
    if status_type is None:
        return
    status = status_type()  # its constructor sets the struct version
    # The binding passes its argument through as it is: a pointer is ours to make.
    pointer = ctypes.byref(status)
    if read.call("sram_threshold_exceeded", "nvmlDeviceGetSramEccErrorStatus", pointer) is not None:
        sample["sram_threshold_exceeded"] = bool(status.bThresholdExceeded)


# R560's reset verdicts, by the recovery action each stands for: nvml.h 12.6
# (7ec3ff8:2126-2127) has NVML_FI_DEV_RESET_STATUS (226, "GPU reset status")
# and NVML_FI_DEV_DRAIN_AND_RESET_STATUS (227, "GPU drain and reset status"),
# added in v560 "which correspond to the nvidia-smi output" (NVML's change
# log), where a nonzero value is the driver's "yes"; R565 adds
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230, the change log, v560 to v565) and
# 12.8 deprecates both for it. The larger verdict first: drain and reset
# includes the reset.
_RESET_STATUS_FIELDS = {
    "drain_and_reset": "NVML_FI_DEV_DRAIN_AND_RESET_STATUS",
    "gpu_reset": "NVML_FI_DEV_RESET_STATUS",
}
_RESET_STATUS_BRANCHES = range(560, 565)
_RECOVERY_ACTION_CODES = {name: code for code, name in GPU_RECOVERY_ACTIONS.items()}


def _read_recovery_action(
    read: _GpuRead, sample: dict[str, Any], driver_branch: int
) -> dict[str, int]:
    """The driver's verdict on what the GPU needs, each poll: it is state the
    driver holds, so a restarted daemon reads it again. The recovery action
    field goes straight to the sample; on R560 its two reset fields are
    returned, for `_settle_reset_status` once the batch is read. Asked of an
    older branch, the field is past what its NVML defines: refused once and
    remembered."""
    statuses: dict[str, int] = {}
    if driver_branch not in _RESET_STATUS_BRANCHES:
        read.want(
            "recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", sample, "recovery_action", int
        )
        return statuses
    for action, name in _RESET_STATUS_FIELDS.items():
        read.want("recovery_action", name, statuses, action, int)
    return statuses


def _settle_reset_status(statuses: Mapping[str, int], sample: dict[str, Any]) -> None:
    """R560's reset fields as the recovery action they stand for (0: none)."""
    if not statuses:
        return
    asked = [action for action in _RESET_STATUS_FIELDS if statuses.get(action)]
    sample["recovery_action"] = _RECOVERY_ACTION_CODES[asked[0]] if asked else 0


def _probe_code(call: Callable[[], int]) -> int:
    """The NVML return code of a probing call; GPU_IS_LOST ends the poll of the GPU."""
    try:
        code = call()
    except pynvml.NVMLError as error:
        code = int(error.value)
    if code == _GPU_IS_LOST:
        raise _GpuLost(f"probing NVLinks: {_error_text(code)}")
    return code


def _succeeds(gpu: _Gpu, function: str, *args: Any) -> Callable[[], int]:
    def call() -> int:
        gpu.calling = function
        getattr(pynvml, function)(gpu.handle, *args)
        return _SUCCESS

    return call


def _discover_links(gpu: _Gpu) -> None:
    """The links this GPU has: those whose state NVML reports. Every index is
    asked (gpud stops at the first "no such link", which would hide the links
    after one that refuses). A link that answers anything but its state or
    "no such link" (a Timeout during the first polls, say) leaves the
    discovery open, to be done again at the next poll."""
    links, settled = [], True
    for link in range(NVLINK_MAX_LINKS):
        code = _probe_code(_succeeds(gpu, "nvmlDeviceGetNvLinkState", link))
        if code in _NO_SUCH_LINK:
            continue
        if code == _SUCCESS:
            links.append(link)
        else:
            settled = False
    gpu.links = tuple(links)
    gpu.links_settled = settled
    if settled and not links:
        log.info("GPU %d: NVML reports no NVLinks", gpu.index)


def _field_codes(gpu: _Gpu, names: Mapping[str, str], links: Sequence[int]) -> dict[str, set[int]]:
    """kind -> the return codes of its field on `links`, in one batch."""
    wanted = [
        (kind, field_id, link)
        for kind, name in names.items()
        if (field_id := getattr(pynvml, name, None)) is not None
        for link in links
    ]
    codes: dict[str, set[int]] = {kind: set() for kind, _, _ in wanted}
    if not wanted:
        return codes
    gpu.calling = "nvmlDeviceGetFieldValues"
    try:
        values = pynvml.nvmlDeviceGetFieldValues(gpu.handle, [(f, link) for _, f, link in wanted])
        answers = [int(value.nvmlReturn) for value in values]
    except pynvml.NVMLError as error:
        answers = [int(error.value)] * len(wanted)
    for (kind, _, _), code in zip(wanted, answers, strict=True):
        if code == _GPU_IS_LOST:
            raise _GpuLost(f"probing NVLinks: {_error_text(code)}")
        codes[kind].add(code)
    return codes


def _counter_codes(
    gpu: _Gpu, counters: Mapping[str, int], links: Sequence[int]
) -> dict[str, set[int]]:
    return {
        kind: {
            _probe_code(_succeeds(gpu, "nvmlDeviceGetNvLinkErrorCounter", link, counter))
            for link in links
        }
        for kind, counter in counters.items()
    }


def _probe_link_counters(
    gpu: _Gpu, driver_branch: int, interfaces: Sequence[_LinkCounters]
) -> _LinkCounters | None:
    """The first of `interfaces` that answers on any of the GPU's links,
    keeping the kinds it answered; None when undecided (some link answered
    neither yes nor "not here"), so that the next poll asks again."""
    links = gpu.links or ()
    for interface in interfaces:
        if driver_branch < interface.min_driver_branch:
            continue
        codes = _field_codes(gpu, {**interface.fields, **interface.ber_fields}, links)
        codes |= _counter_codes(gpu, interface.counters, links)
        answered = {kind for kind, kind_codes in codes.items() if _SUCCESS in kind_codes}
        if answered:
            log.info(
                "GPU %d: NVLink counters through %s (%s)",
                gpu.index,
                interface.name,
                ", ".join(sorted(answered)),
            )
            return interface.keeping(answered)
        if any(code not in _ABSENT for kind_codes in codes.values() for code in kind_codes):
            return None
    log.info(
        "GPU %d: no NVLink error counter interface answers; asking again in %d polls",
        gpu.index,
        LINK_REPROBE_POLLS,
    )
    return _NO_LINK_COUNTERS


def _link_counters(read: _GpuRead, driver_branch: int) -> _LinkCounters:
    """The GPU's counter interface, probing it while undecided, and again now
    and then when none answered (a driver that came up late, links that were down)."""
    gpu = read.gpu
    gpu.polls_since_probe += 1
    undecided = gpu.link_counters is None
    if undecided or (
        gpu.link_counters is _NO_LINK_COUNTERS and gpu.polls_since_probe >= LINK_REPROBE_POLLS
    ):
        gpu.polls_since_probe = 0
        gpu.link_counters = None
        gpu.counts = _CallCounts()
        if gpu.links:
            interfaces = _interfaces(_architecture(read))
            gpu.link_counters = _probe_link_counters(gpu, driver_branch, interfaces)
    return gpu.link_counters or _NO_LINK_COUNTERS


def _architecture(read: _GpuRead) -> int | None:
    """The GPU's architecture, asked only while its NVLink interface is being
    chosen, and kept once answered: it does not change."""
    gpu = read.gpu
    if gpu.architecture is None:
        architecture = read.call(
            "architecture",
            "nvmlDeviceGetArchitecture",
            then="NVLink counter interfaces probed in order",
        )
        gpu.architecture = None if architecture is None else int(architecture)
    return gpu.architecture


def _decode_ber(value: float | int) -> float:
    """An NVLink BER field: mantissa in bits 8-11, exponent in bits 0-7, BER =
    mantissa x 10^-exponent (nvml.h NVML_NVLINK_ERROR_COUNTER_BER_GET; DCGM's
    NvmlBerParser). Mantissa 0, and DCGM's sentinel 15 x 10^-255, are zero."""
    encoded = int(value)
    mantissa = (encoded >> _BER_MANTISSA_SHIFT) & _BER_MANTISSA_MASK
    exponent = encoded & _BER_EXPONENT_MASK
    if mantissa == 0 or (mantissa, exponent) == _BER_ZERO:
        return 0.0
    return float(mantissa * 10.0**-exponent)


class _LinkRead(NamedTuple):
    """One link's read this poll (a tuple: a poll makes one a link)."""

    link: int
    # Filled by the calls, or after the field-value batch: "up" once the
    # state is read.
    state: dict[str, bool]
    errors: dict[str, int]
    ber: dict[str, float]


@dataclass(frozen=True)
class _Links:
    """One poll's read of a GPU's links, and what it asked of the batch to
    tell whether their per-call counters moved."""

    reads: list[_LinkRead]
    interface: _LinkCounters
    sign: dict[tuple[str, int], int] | None


def _read_links(read: _GpuRead, driver_branch: int) -> _Links:
    """Every link's state and field-value counters, asked of the batch.
    Refusals are the link's own: the subject names the link, so one link
    refusing a counter leaves the others read. The counters read one call a
    link come after the batch (`_read_counter_calls`)."""
    gpu = read.gpu
    if not gpu.links_settled:
        _discover_links(gpu)
    interface = _link_counters(read, driver_branch)
    by_field = _states_by_field(gpu.architecture)
    links = []
    for link in gpu.links or ():
        state: dict[str, bool] = {}
        subject = f"nvlink {link} state"
        by_call = partial(_read_state, read, link, state)
        if by_field:
            read.want(subject, _STATE_FIELD, state, "up", bool, scope=link, otherwise=by_call)
        else:
            by_call()
        errors: dict[str, int] = {}
        ber: dict[str, float] = {}
        for kind, name in interface.fields.items():
            read.want(f"nvlink {link} {kind}", name, errors, kind, int, scope=link)
        for kind, name in interface.ber_fields.items():
            read.want(f"nvlink {link} {kind} ber", name, ber, kind, _decode_ber, scope=link)
        links.append(_LinkRead(link, state, errors, ber))
    return _Links(links, interface, _want_counter_sign(read, interface, driver_branch))


def _states_by_field(architecture: int | None) -> bool:
    """Whether the links' states are read as field values: on Hopper and
    newer, as NCCL reads them (SM90 on)."""
    known = architecture is not None and architecture != _ARCH_UNKNOWN
    return known and architecture is not None and architecture >= _ARCH_HOPPER


def _read_state(read: _GpuRead, link: int, state: dict[str, bool]) -> None:
    value = read.call(f"nvlink {link} state", "nvmlDeviceGetNvLinkState", link)
    if value is not None:
        state["up"] = bool(value)


def _want_counter_sign(
    read: _GpuRead, interface: _LinkCounters, driver_branch: int
) -> dict[tuple[str, int], int] | None:
    """Ask the batch for the DL fields that move when any link's per-call
    counters do; None when the counters are not read by call, or the fields
    were found not to follow them. Before R575 each field answers the
    device's total at any scope (`_LinkCounters` of the scoped fields), so
    scope 0 says it all; from R575 each link's scope answers that link."""
    gpu = read.gpu
    if not interface.counters or not gpu.counts.sign_followed:
        return None
    scopes = gpu.links or () if driver_branch >= _SCOPED_DL_BRANCH else (0,)
    sign: dict[tuple[str, int], int] = {}
    for name in _COUNTER_SIGN_FIELDS:
        for scope in scopes:
            read.want("nvlink counters moved", name, sign, (name, scope), int, scope=scope)
    return sign


def _read_counter_calls(read: _GpuRead, links: _Links, config: NvmlSourceConfig) -> None:
    """The counters read one call a link and counter, after the batch: when
    the DL fields say a count moved (or they were never read, or the GPU
    answers again), and every `link_counter_interval` otherwise, or every
    `static_refresh` where the fields have followed the counters. Between
    reads each link carries the counts last read."""
    gpu, counters = read.gpu, links.interface.counters
    if not counters:
        return
    counts, sign = gpu.counts, links.sign
    signed = bool(sign) and counts.sign is not None
    every = config.static_refresh if signed else config.link_counter_interval
    new_link = any(r.link not in counts.errors for r in links.reads)
    if not (new_link or not gpu.answering or counts.due(sign, read.now, every)):
        for r in links.reads:
            r.errors.update(counts.errors[r.link])
        return
    for r in links.reads:
        for kind, counter in counters.items():
            value = read.call(
                f"nvlink {r.link} {kind}", "nvmlDeviceGetNvLinkErrorCounter", r.link, counter
            )
            if value is not None:
                r.errors[kind] = int(value)
    if signed and sign == counts.sign and _moved(counts.errors, links.reads):
        counts.sign_followed = False
        log.warning(
            "GPU %d: NVLink error counters moved while the DL fields did not; the counters "
            "are read every %gs from now on",
            gpu.index,
            config.link_counter_interval,
        )
    counts.errors = {r.link: dict(r.errors) for r in links.reads}
    counts.read_at = read.now
    counts.sign = sign or None


def _link_samples(gpu: _Gpu, reads: Sequence[_LinkRead]) -> tuple[LinkSample, ...]:
    """The links' samples, each link that reads as it did at the last poll as
    that poll's own object (and the whole tuple, when every link does): what
    did not change is held once, however many polls History keeps whole."""
    before = gpu.last.nvlinks if gpu.last is not None else ()
    by_link = {link.link: link for link in before}
    links = []
    for r in reads:
        up = r.state.get("up")
        old = by_link.get(r.link)
        if old is not None and old.up == up and old.errors == r.errors and old.ber == r.ber:
            links.append(old)
        else:
            links.append(LinkSample(gpu.index, r.link, up, r.errors, r.ber))
    same = len(links) == len(before) and all(a is b for a, b in zip(links, before, strict=False))
    return before if same else tuple(links)


def _reusing(last: GpuSample | None, sample: dict[str, Any]) -> dict[str, Any]:
    """`sample`'s fields, each mapping that equals the last sample's as that
    sample's own object (as `_link_samples` does for links)."""
    if last is None:
        return sample
    for name, value in sample.items():
        if isinstance(value, dict) and (old := getattr(last, name)) == value:
            sample[name] = old
    return sample


def _moved(before: Mapping[int, Mapping[str, int]], reads: Sequence[_LinkRead]) -> bool:
    """Whether any count read now differs from the one read before it."""
    return any(
        kind in before.get(r.link, {}) and before[r.link][kind] != value
        for r in reads
        for kind, value in r.errors.items()
    )


class _XidListener:
    """Counts XID critical errors through one NVML event set.

    With a thread, it loops on `nvmlEventSetWait_v2(set, XID_WAIT_MS)` and
    registers again with backoff when a wait fails with anything but Timeout;
    without one (tests, deterministic simulation), `drain()` waits with a zero
    timeout until Timeout. Events carry no time: each is stamped on receipt.

    A wait answers GPU_IS_LOST when a GPU of the set has fallen off the bus
    (nvml.h, nvmlEventSetWait_v2): the set is made again at once, without the
    lost GPU (it cannot be registered), so the other GPUs' XIDs keep coming.
    A GPU that answers again is registered again (`register_again`). Only the
    thread that waits on the set replaces it: freeing a set another thread is
    waiting on would pull it from under the driver.
    """

    def __init__(self, clock: Clock, gpus: Sequence[_Gpu], threaded: bool) -> None:
        self._clock = clock
        self._gpus = gpus
        self._events: queue.SimpleQueue[XidEvent] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._stale = threading.Event()
        # GPUs that report no XID events at all, and whether the last wait failed.
        self._unsupported: set[int] = set()
        self._failing = False
        self._by_address: dict[int | None, _Gpu] = {}
        self._event_set: Any = self._register()
        self._thread: threading.Thread | None = None
        if threaded and self._event_set is not None:
            self._thread = threading.Thread(target=self._run, name="gpuwatchd-xid", daemon=True)
            self._thread.start()

    def _register(self) -> Any:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as error:
            log.warning("XID events not counted: nvmlEventSetCreate: %s", error)
            return None
        self._by_address = {
            _address(gpu.handle): gpu for gpu in self._gpus if self._register_gpu(gpu, event_set)
        }
        if not self._by_address:
            log.warning("XID events not counted: no GPU could be registered for them")
            _free(event_set)
            return None
        return event_set

    def _register_gpu(self, gpu: _Gpu, event_set: Any) -> bool:
        if gpu.handle is None:
            return False
        try:
            if not pynvml.nvmlDeviceGetSupportedEventTypes(gpu.handle) & _XID:
                if gpu.index not in self._unsupported:
                    log.info("GPU %d does not report XID events", gpu.index)
                self._unsupported.add(gpu.index)
                return False
            pynvml.nvmlDeviceRegisterEvents(gpu.handle, _XID, event_set)
        except pynvml.NVMLError as error:
            log.warning("GPU %d: XID events not registered: %s", gpu.index, error)
            return False
        return True

    def _register_again(self) -> None:
        self._stale.clear()
        _free(self._event_set)
        self._event_set = self._register()

    def receiving(self, gpu: _Gpu) -> bool | None:
        """Whether this GPU's XIDs are being received; None when it reports none."""
        if gpu.index in self._unsupported:
            return None
        return not self._failing and any(g is gpu for g in self._by_address.values())

    def register_again(self) -> None:
        """Make the event set again (a lost GPU answers again): at once without a
        thread, else by the thread before its next wait."""
        if self._thread is None:
            self._register_again()
        else:
            self._stale.set()

    def _receive(self, timeout_ms: int) -> None:
        """Wait for one event and queue it; raises NVMLError_Timeout when none came."""
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            self._failing = False
            raise
        except pynvml.NVMLError:
            self._failing = True
            raise
        self._failing = False
        gpu = self._by_address.get(_address(data.device))
        if data.eventType != _XID or gpu is None:
            return
        uuid = gpu.identity.get("uuid")
        self._events.put(XidEvent(gpu.index, int(data.eventData), self._clock.now(), uuid))

    def _run(self) -> None:
        backoff = REREGISTER_BACKOFF_S
        lost_handled = False
        while not self._stop.is_set():
            if self._stale.is_set():
                self._register_again()
            if self._event_set is None:
                # No GPU could be registered: try again after the backoff.
                if self._clock.wait(self._stop, backoff):
                    return
                self._register_again()
                backoff = min(2 * backoff, REREGISTER_BACKOFF_MAX_S)
                continue
            try:
                self._receive(XID_WAIT_MS)
            except pynvml.NVMLError_Timeout:
                pass  # no XID this second: wait again
            except pynvml.NVMLError as error:
                if error.value == _GPU_IS_LOST and not lost_handled:
                    log.warning("XID event wait: a GPU is lost; registering the others again")
                    self._register_again()
                    lost_handled = True
                    continue
                log.warning("XID event wait failed (%s); registering again in %gs", error, backoff)
                if self._clock.wait(self._stop, backoff):
                    return
                self._register_again()
                backoff = min(2 * backoff, REREGISTER_BACKOFF_MAX_S)
                continue
            backoff = REREGISTER_BACKOFF_S
            lost_handled = False

    def _pump(self) -> None:
        for attempt in range(2):
            if self._event_set is None:
                return
            try:
                while True:
                    self._receive(0)
            except pynvml.NVMLError_Timeout:
                return
            except pynvml.NVMLError as error:
                if error.value == _GPU_IS_LOST and attempt == 0:
                    log.warning("XID event wait: a GPU is lost; registering the others again")
                    self._register_again()
                    continue
                # The next poll is the backoff.
                log.warning("XID event wait failed (%s); registering again", error)
                self._register_again()
                return

    def drain(self) -> tuple[XidEvent, ...]:
        if self._thread is None and self._event_set is not None:
            self._pump()
        events = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return tuple(events)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * XID_WAIT_MS / 1000)
            if self._thread.is_alive():
                log.warning("XID thread still waiting in NVML; leaving its event set")
                return
        _free(self._event_set)
        self._event_set = None


def _address(handle: Any) -> int | None:
    """A device handle's pointer value: how an event names its GPU."""
    return ctypes.cast(handle, ctypes.c_void_p).value if handle is not None else None


def _free(event_set: Any) -> None:
    if event_set is None:
        return
    try:
        pynvml.nvmlEventSetFree(event_set)
    except pynvml.NVMLError as error:
        log.debug("nvmlEventSetFree: %s", error)


class _NvmlDown(Exception):
    """NVML could not start: its return code and text."""

    def __init__(self, code: int, error: str) -> None:
        super().__init__(error)
        self.code = code
        self.error = error


def _start_nvml() -> int:
    """Start NVML; the number of GPUs it enumerates. _NvmlDown when it cannot."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise _NvmlDown(error.value, str(error)) from error
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as error:
        pynvml.nvmlShutdown()
        raise _NvmlDown(error.value, f"NVML started but cannot count the GPUs: {error}") from error


class NvmlSource:
    """The `nvml` source. Construction starts NVML and registers for XIDs;
    `poll()` reads every GPU.

    Where NVML cannot start (no library, the driver not loaded, a driver and
    library of different versions after an upgrade without a reboot, no
    permission), construction raises SourceUnavailable on a node with no
    NVIDIA GPU on its PCI bus (under `sysfs_root`): a node without GPUs. On
    one that has them the source stays: each poll tries NVML again, and
    until it starts the reading says why (`Reading.nvml_unavailable`, judged
    by checks/driver.py), so the node is unhealthy and recovers by itself
    once NVML works."""

    name = NVML_SOURCE

    def __init__(
        self,
        clock: Clock,
        config: NvmlSourceConfig,
        xid_thread: bool = True,
        uptime: Callable[[], float] = system_uptime,
        sysfs_root: str = "/sys",
    ) -> None:
        """`uptime`: seconds since boot on the kernel log's clock, to stamp the
        records from before the start (injected by the simulator, whose node
        booted when its scenario says)."""
        self._clock = clock
        self._config = config
        self._uvm_module = os.path.join(sysfs_root, "module", "nvidia_uvm")
        self._xid_thread = xid_thread
        self._uptime = uptime
        self._read_timeout = config.read_timeout
        self._reader: _Reader | None = None
        self._closed = False
        self._driver_version: str | None = None
        self._gpus: tuple[_Gpu, ...] = ()
        self._xids: _XidListener | None = None
        self._kernel: KernelXids | None = None
        self._unavailable: NvmlUnavailable | None = None
        try:
            self._start()
        except _NvmlDown as down:
            gpus = nvidia_gpus_on_bus(sysfs_root)
            if not gpus:
                raise SourceUnavailable(
                    f"NVML could not be loaded ({down.error}): is the NVIDIA driver installed "
                    "and loaded?",
                    "To run without GPUs use `gpuwatchd run --simulate`, or leave NVML out "
                    "with `--source infiniband`.",
                ) from down
            self._unavailable = NvmlUnavailable(down.code, down.error, gpus)
            log.error(
                "NVML cannot start (%s) with %d NVIDIA GPU(s) on the PCI bus (%s): the node "
                "is unhealthy; NVML is tried again every poll",
                down.error,
                len(gpus),
                ", ".join(gpus),
            )

    def _start(self) -> None:
        count = _start_nvml()
        self._driver_version = self._read_driver_version()
        self._driver_branch = _driver_branch(self._driver_version)
        self._counter_ids = counter_ids(self._driver_version)
        self._availability = _Availability()
        self._gpus = tuple(_Gpu(index) for index in range(count))
        for gpu in self._gpus:
            self._identify(gpu)
        self._availability.flush()
        config = self._config
        # Before registering: what the kernel log holds now, NVML never reports.
        if config.kernel_log:
            self._kernel = KernelXids(config.kernel_log, self._clock, self._uptime)
        if config.xid_events:
            self._xids = _XidListener(self._clock, self._gpus, self._xid_thread)
        log.info("NVML: %d GPU(s), driver %s", count, self._driver_version or "unknown")
        log.info(
            "clocks-event counters: %s",
            ", ".join(f"{r} field {i}" for r, i in self._counter_ids.items())
            or "none on this driver branch (HW slowdown judged from reason bits only)",
        )

    def _still_unavailable(self, now: float) -> Reading | None:
        """While NVML could not start: try again; the reading that says so
        when it still cannot, None once it has started."""
        unavailable = self._unavailable
        if unavailable is None:
            return None
        try:
            self._start()
        except _NvmlDown as down:
            if down.code != unavailable.code:
                log.error("NVML still cannot start: %s", down.error)
            self._unavailable = replace(unavailable, code=down.code, error=down.error)
            error = f"NVML cannot start: {down.error}"
            return Reading(self.name, now, error=error, nvml_unavailable=self._unavailable)
        log.warning("NVML works again")
        self._unavailable = None
        return None

    @staticmethod
    def _read_driver_version() -> str | None:
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as error:
            log.info("driver version not read (%s)", error)
            return None

    @staticmethod
    def _acquire(gpu: _Gpu) -> None:
        """Get the GPU a handle when it has none yet; _GpuLost or _Unanswered
        when it cannot."""
        if gpu.handle is None:
            gpu.calling = "nvmlDeviceGetHandleByIndex"
            try:
                gpu.handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
            except pynvml.NVMLError as error:
                reason = f"nvmlDeviceGetHandleByIndex: {error}"
                if error.value == _GPU_IS_LOST:
                    raise _GpuLost(reason) from error
                raise _Unanswered(reason, error.value) from error

    def _identify(self, gpu: _Gpu) -> None:
        """Read identity up front, so that the first XIDs carry the UUID. A GPU
        that does not answer now is read again, and judged, at the first poll."""
        try:
            self._acquire(gpu)
            read = _GpuRead(gpu, self._availability, self._clock.now())
            _read_identity(read)
            read.finish()
        except _GpuLost as lost:
            self._mark_down(gpu, lost.reason)
        except _Unanswered as unanswered:
            log.warning("GPU %d does not answer yet: %s", gpu.index, unanswered.reason)

    def poll(self, now: float) -> Reading:
        unavailable = self._still_unavailable(now)
        if unavailable is not None:
            return unavailable
        events = self._xids.drain() if self._xids is not None else ()
        sxids: tuple[SxidEvent, ...] = ()
        if self._kernel is not None:
            logged = self._kernel.merge(events, self._addresses())
            events, sxids = logged.xids, logged.sxids
        for event in events:
            self._gpus[event.gpu].xid_counts[event.code] += 1
        gpus = self._sample_gpus(now)
        self._availability.flush()
        return Reading(
            source=self.name,
            time=now,
            gpus=gpus,
            xid_events=events,
            sxid_events=sxids,
            driver_version=self._driver_version,
            # CUDA's module: without it no CUDA program (a canary) starts.
            nvidia_uvm_loaded=os.path.isdir(self._uvm_module) if gpus else None,
        )

    def _addresses(self) -> dict[str, tuple[int, str | None]]:
        """Each GPU's PCI address as the kernel log writes it, to its index and UUID."""
        found = {}
        for gpu in self._gpus:
            address = nvml_address(gpu.identity.get("pci_bus_id", ""))
            if address is not None:
                found[address] = (gpu.index, gpu.identity.get("uuid"))
        return found

    def _sample_gpus(self, now: float) -> tuple[GpuSample, ...]:
        """Every GPU's sample: the reads are handed to the reader all at once
        and waited for together, each to its own deadline (a hand-over and a
        wake-up a GPU cost thread switches)."""
        samples: dict[int, GpuSample] = {}
        waiting: list[_Job] = []
        for gpu in self._gpus:
            hung = self._still_stuck(gpu, now)
            if hung is not None:
                samples[gpu.index] = hung
            else:
                waiting.append(_Job(gpu, partial(self._read, gpu, now), now))
        if waiting:
            self._hand_over(waiting)
            # Woken once for the whole batch, not at each read (a wake-up
            # takes the interpreter from the reader): this wait ends by the
            # first read's deadline, and `_await` keeps each read's own.
            self._clock.wait_until(waiting[-1].done, self._deadline(waiting[0]))
        try:
            while waiting:
                job = waiting.pop(0)
                samples[job.gpu.index] = self._await(job, waiting)
        finally:
            for job in waiting:  # a read that raised: the others are not read either
                job.cancel()
        return tuple(samples[gpu.index] for gpu in self._gpus)

    @staticmethod
    def _still_stuck(gpu: _Gpu, now: float) -> GpuSample | None:
        """The sample of a GPU whose given-up call has not returned yet."""
        stuck = gpu.stuck
        if stuck is not None:
            if not stuck.done.is_set():
                return gpu.hung_sample(
                    f"{stuck.given_up_in} has not returned for {now - stuck.started:.0f}s; "
                    "not read again until it does"
                )
            gpu.stuck = None
        return None

    def _await(self, job: _Job, behind: list[_Job]) -> GpuSample:
        """`job`'s sample once read, or the GPU reported unreadable when the
        read has not returned `read_timeout` after it began; the reads
        `behind` it then go to a new reader."""
        gpu = job.gpu
        if not self._clock.wait_until(job.done, self._deadline(job)):
            return self._give_up(job, behind)
        if job.error is not None:
            raise job.error
        if job.lost is not None:
            self._mark_down(gpu, job.lost)
            return gpu.down_sample()
        if job.unanswered is not None:
            return self._unanswered(gpu, job.unanswered)
        assert job.sample is not None
        if not gpu.answering:
            log.warning("GPU %d (%s) answers again", gpu.index, gpu.identity.get("uuid"))
            gpu.up = gpu.answering = True
            if self._xids is not None:
                self._xids.register_again()
        return job.sample

    def _unanswered(self, gpu: _Gpu, unanswered: _Unanswered) -> GpuSample:
        """A GPU that gave nothing: lost when the driver logged that it fell
        off the bus (XID 79 on its bus, this boot), else unanswered."""
        if not gpu.up or gpu.xid_counts[_FALLEN_OFF_BUS]:
            self._mark_down(gpu, f"{unanswered.reason}, after XID 79 (fallen off the bus)")
            return gpu.down_sample()
        if gpu.answering:
            log.warning(
                "GPU %d (%s) gives no value: %s; asked again every poll",
                gpu.index,
                gpu.identity.get("uuid", "uuid unknown"),
                unanswered.reason,
            )
            gpu.answering = False
        return gpu.unanswered_sample(unanswered)

    def _deadline(self, job: _Job) -> float:
        """`read_timeout` after the read began; a read not begun yet begins
        after now, so a deadline from now is not later."""
        began = job.began
        return (self._clock.now() if began is None else began) + self._read_timeout

    def _give_up(self, job: _Job, behind: list[_Job]) -> GpuSample:
        """Leave the reader stuck in `job` to return when the driver lets it,
        take back the reads queued behind it for a new reader, and report
        its GPU unreadable."""
        gpu = job.gpu
        job.given_up_in = gpu.calling
        gpu.stuck = job
        stuck = job.reader
        if stuck is not None:
            stuck.close()
        if self._reader is stuck:
            self._reader = None
        self._take_back(stuck, behind)
        log.warning(
            "GPU %d (%s): %s has not returned after %gs; reporting the GPU unreadable "
            "and reading the others",
            gpu.index,
            gpu.identity.get("uuid", "uuid unknown"),
            job.given_up_in,
            self._read_timeout,
        )
        return gpu.hung_sample(f"{job.given_up_in} has not returned within {self._read_timeout:g}s")

    def _take_back(self, stuck: _Reader | None, behind: list[_Job]) -> None:
        """Hand the reads queued on the `stuck` reader to a new one, in their
        order, in place in `behind`; one that reader has begun already (its
        last read returned at the deadline) stays where it runs."""
        again: list[_Job] = []
        for at, job in enumerate(behind):
            if job.reader is stuck and job.cancel():
                behind[at] = job.again()
                again.append(behind[at])
        if again:
            self._hand_over(again)

    def _hand_over(self, jobs: list[_Job]) -> None:
        if self._reader is None:
            self._reader = _Reader(self._clock)
        self._reader.read(jobs)

    def _read(self, gpu: _Gpu, now: float) -> GpuSample:
        self._acquire(gpu)
        branch = self._driver_branch
        read = _GpuRead(gpu, self._availability, now, field_id_limit(branch))
        _read_identity(read)
        sample: dict[str, Any] = dict(gpu.identity)
        _read_scalars(read, _SCALARS, sample)
        _read_field_scalars(read, sample)
        temperature = _read_temperatures(read, sample)
        static = _read_static(read, temperature) if self._static_due(gpu, now) else None
        _read_utilization(read, sample)
        _read_framebuffer(read, sample)
        _read_fabric(read, sample)
        counted = _read_throttle(read, sample, self._counter_ids)
        _read_memory_errors(read, sample)
        reset_status = _read_recovery_action(read, sample, branch)
        links = _read_links(read, branch)
        read.fetch_fields()
        _read_counter_calls(read, links, self._config)
        read.finish()
        if static is not None:
            gpu.static, gpu.static_read_at = static, now
        _check_counters(read, sample, counted)
        _settle_reset_status(reset_status, sample)
        sample["xid_counts"] = dict(gpu.xid_counts)
        gpu.last = GpuSample(
            index=gpu.index,
            up=True,
            nvlinks=_link_samples(gpu, links.reads),
            reset_required=read.reset_required,
            responsive=read.answered,
            xid_events_received=None if self._xids is None else self._xids.receiving(gpu),
            **_reusing(gpu.last, sample),
            **gpu.static,
        )
        return gpu.last

    def _static_due(self, gpu: _Gpu, now: float) -> bool:
        """Whether to read the values a GPU keeps: never read, a GPU that
        answers again (it may have been reset), or `static_refresh` gone by."""
        read_at = gpu.static_read_at
        return read_at is None or not gpu.answering or now - read_at >= self._config.static_refresh

    def _mark_down(self, gpu: _Gpu, reason: str) -> None:
        if gpu.up:
            log.warning(
                "GPU %d (%s) is lost (%s); reporting it down and reading the others",
                gpu.index,
                gpu.identity.get("uuid", "uuid unknown"),
                reason,
            )
            gpu.up = gpu.answering = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.close()
        if self._xids is not None:
            self._xids.close()
        if self._kernel is not None:
            self._kernel.close()
        stuck = [gpu.index for gpu in self._gpus if gpu.stuck and not gpu.stuck.done.is_set()]
        if stuck:
            # Shutting NVML down under a call in progress could pull its state
            # from under the driver; the process ends anyway.
            log.warning(
                "NVML calls on GPU(s) %s have not returned; NVML is left as it is", _ranges(stuck)
            )
            return
        if self._unavailable is not None:
            return  # never started
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.debug("nvmlShutdown: %s", error)


@contextlib.contextmanager
def binding(replacement: Any) -> Iterator[None]:
    """Make this module call NVML through `replacement` instead of the
    `pynvml` module, for the block: the seam `gpuwatchd capture` records
    every call, value and return code through, whatever this module calls.
    `replacement` must offer what pynvml offers (functions, constants, error
    classes); sources made inside the block must be closed inside it."""
    global pynvml
    previous = pynvml
    pynvml = replacement
    try:
        yield
    finally:
        pynvml = previous
