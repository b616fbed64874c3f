"""The NVML source: every GPU's health signals, read through nvidia-ml-py.

Reads, for every GPU: identity, GPU and HBM temperatures and their thresholds,
clocks (current, max, application), the clocks-event reasons and cumulative
throttle time, power and its limit, utilisation, ECC counts, row remapping or
page retirement, and per NVLink its state and error counters; and counts XID
critical errors from an NVML event set. Knows nothing about health.

A value the GPU or driver does not provide (NotSupported, FunctionNotFound,
NoPermission, NoData, Deprecated, a field value's own error) is absent, never
0, and logged once per (GPU, value); permanent refusals are not asked again. A
lost GPU (GPU_IS_LOST, or Unknown on every call) is reported down while the
others keep being read, and up again once it answers.

Per generation (see HARDWARE-NOTES.md): NVLink counters come from
`nvmlDeviceGetNvLinkErrorCounter` before Hopper (all five types), from the
scoped `NVML_FI_DEV_NVLINK_ERROR_DL_*` field values on Hopper (crc_flit from
DL_CRC, replay, recovery: Hopper has no data CRC or data ECC counter), and
from `NVML_FI_DEV_NVLINK_COUNT_*` on Blackwell: recovery from
LINK_RECOVERY_EVENTS, and crc_flit from EFFECTIVE_ERRORS, the errors left
after NVLink5's FEC, which is what earlier links' flit CRC caught; Blackwell
has no replay, data CRC or data ECC counterpart, so those stay absent.
Throttle time comes from `nvmlDeviceGetViolationStatus`, or from its
perf-policy field values where R580 and later deprecate it.

Hangs: an NVML call on a broken GPU can block inside the driver, and Python
cannot interrupt a C call. `poll()` makes only cheap reads (one field-value
batch per GPU, no sampling buffers), so a hang is a driver fault, contained
by the daemon's watchdog: only the poll loop feeds systemd's watchdog, so a
poll stuck in NVML stops the pings and systemd restarts the daemon. The XID
thread's waits are bounded by their one-second timeout.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuwatchd.clock import Clock
from gpuwatchd.model import GpuSample, LinkSample, Reading, XidEvent
from gpuwatchd.sources import NvmlSourceConfig, SourceUnavailable

log = logging.getLogger(__name__)

# How long the XID thread blocks in one nvmlEventSetWait_v2, and how long it
# waits before registering again after a failed wait (doubling up to the max).
XID_WAIT_MS = 1000
REREGISTER_BACKOFF_S = 1.0
REREGISTER_BACKOFF_MAX_S = 60.0

_XID: int = pynvml.nvmlEventTypeXidCriticalError
_GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN
_SUCCESS: int = pynvml.NVML_SUCCESS
# Codes meaning "this GPU or driver does not provide the value" (absent, not
# an error); the permanent ones are not asked again.
_PERMANENT_REFUSALS = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_DEPRECATED,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
_REFUSALS = _PERMANENT_REFUSALS | {pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_NO_DATA}

_MHZ = 1e6
_MILLI = 1e-3
_NANO = 1e-9


class _GpuLost(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _error_text(code: int) -> str:
    return str(pynvml.NVMLError(code))


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
)
_SCALARS = (
    _Scalar(
        "temperature_slowdown_celsius",
        "nvmlDeviceGetTemperatureThreshold",
        (pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,),
    ),
    _Scalar(
        "temperature_shutdown_celsius",
        "nvmlDeviceGetTemperatureThreshold",
        (pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,),
    ),
    _Scalar("sm_clock_hertz", "nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_SM,), _scaled(_MHZ)),
    _Scalar(
        "memory_clock_hertz", "nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_MEM,), _scaled(_MHZ)
    ),
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
    _Scalar(
        "sm_default_application_clock_hertz",
        "nvmlDeviceGetClock",
        (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT),
        _scaled(_MHZ),
    ),
    _Scalar("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", convert=int),
    _Scalar("power_watts", "nvmlDeviceGetPowerUsage", convert=_scaled(_MILLI)),
    _Scalar("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", convert=_scaled(_MILLI)),
)
# THROTTLE_REASONS -> (perf policy of nvmlDeviceGetViolationStatus, the field
# value that replaces it from R580 on, by the installed binding's name).
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
_ECC_TYPES = {
    "corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}
_ECC_SCOPES = {"volatile": pynvml.NVML_VOLATILE_ECC, "aggregate": pynvml.NVML_AGGREGATE_ECC}
_RETIREMENT_CAUSES = {
    "multiple_single_bit": pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    "double_bit": pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
}
_FIELD_VALUE_READERS: Mapping[int, Callable[[Any], float | int]] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: lambda value: float(value.dVal),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: lambda value: int(value.uiVal),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: lambda value: int(value.ulVal),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: lambda value: int(value.ullVal),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: lambda value: int(value.sllVal),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: lambda value: int(value.siVal),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: lambda value: int(value.usVal),
}


@dataclass(frozen=True)
class _LinkCounters:
    """One interface through which a GPU reports its NVLink error counters.

    `fields`: NVLINK_ERROR_TYPES -> field-value name, asked with scope id = link;
    `counters`: NVLINK_ERROR_TYPES -> counter of nvmlDeviceGetNvLinkErrorCounter.
    """

    name: str
    fields: Mapping[str, str] = field(default_factory=dict)
    counters: Mapping[str, int] = field(default_factory=dict)


_LINK_COUNTER_INTERFACES = (
    _LinkCounters(
        "scoped NVML_FI_DEV_NVLINK_ERROR_DL_* field values (Hopper)",
        fields={
            "crc_flit": "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
            "replay": "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
            "recovery": "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
        },
    ),
    _LinkCounters(
        "NVML_FI_DEV_NVLINK_COUNT_* field values (Blackwell)",
        fields={
            "crc_flit": "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS",
            "recovery": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS",
        },
    ),
    _LinkCounters(
        "nvmlDeviceGetNvLinkErrorCounter (before Hopper)",
        counters={
            "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
            "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
            "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
            "ecc_data": pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA,
        },
    ),
)
_NO_LINK_COUNTERS = _LinkCounters("none")


class _Availability:
    """What each GPU does not provide: logged once per (GPU, value), and not
    asked again when the refusal is permanent. The refusals of one poll are
    logged together by `flush()`, one line a level: a node's GPUs refuse the
    same values, and 24 lines at start-up bury the ones that matter."""

    def __init__(self) -> None:
        self._refused: set[tuple[int, str, str]] = set()
        self._logged: set[tuple[int, str, str]] = set()
        # (source, code, then) -> value -> GPUs, not logged yet
        self._unlogged: dict[tuple[str, int, str], dict[str, list[int]]] = {}

    def refused(self, gpu: int, subject: str, source: str) -> bool:
        return (gpu, subject, source) in self._refused

    def note(self, gpu: int, subject: str, source: str, code: int, then: str) -> None:
        if code in _PERMANENT_REFUSALS:
            self._refused.add((gpu, subject, source))
        if (gpu, subject, source) in self._logged:
            return
        self._logged.add((gpu, subject, source))
        self._unlogged.setdefault((source, code, then), {}).setdefault(subject, []).append(gpu)

    def flush(self) -> None:
        """Log what was refused since the last flush: one line for the
        expected refusals (info), one for the errors (warning)."""
        by_level: dict[int, list[str]] = {}
        for (source, code, then), values in self._unlogged.items():
            level = logging.INFO if code in _REFUSALS else logging.WARNING
            for subject, gpus in values.items():
                by_level.setdefault(level, []).append(
                    f"{subject} on GPU {_ranges(gpus)} ({source}: {_error_text(code)}; {then})"
                )
        self._unlogged.clear()
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


@dataclass(frozen=True)
class _FieldRequest:
    """One field value wanted in this poll's batch, and where its value goes."""

    subject: str
    field_name: str
    scope: int
    target: dict[Any, Any]
    key: Any
    convert: Callable[[float | int], float | int]


class _Gpu:
    """What the source keeps about one GPU between polls."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.identity: dict[str, str] = {}
        self.links: tuple[int, ...] | None = None
        self.link_counters: _LinkCounters | None = None
        self.xid_counts: Counter[int] = Counter()
        self.up = True

    def down_sample(self) -> GpuSample:
        return GpuSample(
            index=self.index,
            up=False,
            uuid=self.identity.get("uuid"),
            name=self.identity.get("name"),
            pci_bus_id=self.identity.get("pci_bus_id"),
            xid_counts=dict(self.xid_counts),
        )


class _GpuRead:
    """One poll of one GPU: every call goes through `call`, every field value
    through `want` and one `fetch_fields` batch."""

    def __init__(self, gpu: _Gpu, availability: _Availability) -> None:
        self.gpu = gpu
        self.index = gpu.index
        self._availability = availability
        self._requests: list[_FieldRequest] = []
        self._unknown: list[tuple[str, str]] = []
        self.answered = False

    def call(self, subject: str, function: str, *args: Any, then: str = "left absent") -> Any:
        """`pynvml.<function>(handle, *args)`, or None when the GPU does not answer it."""
        if self._availability.refused(self.index, subject, function):
            return None
        try:
            value = getattr(pynvml, function)(self.gpu.handle, *args)
        except pynvml.NVMLError as error:
            self._refused(subject, function, error.value, then)
            return None
        self.answered = True
        return value

    def _refused(self, subject: str, source: str, code: int, then: str) -> None:
        if code == _GPU_IS_LOST:
            raise _GpuLost(f"{source}: {_error_text(code)}")
        if code == _UNKNOWN:
            # Judged after the poll: Unknown from every call means a lost GPU.
            self._unknown.append((subject, source))
            return
        self._availability.note(self.index, subject, source, code, then)

    def want(
        self,
        subject: str,
        field_name: str,
        target: dict[Any, Any],
        key: Any,
        convert: Callable[[float | int], float | int] = float,
        scope: int = 0,
    ) -> None:
        if not self._availability.refused(self.index, subject, field_name):
            self._requests.append(_FieldRequest(subject, field_name, scope, target, key, convert))

    def fetch_fields(self) -> None:
        if not self._requests:
            return
        ids = [(getattr(pynvml, r.field_name), r.scope) for r in self._requests]
        values = self.call("field values", "nvmlDeviceGetFieldValues", ids)
        for request, value in zip(self._requests, values or (), strict=False):
            if value.nvmlReturn != _SUCCESS:
                self._refused(request.subject, request.field_name, value.nvmlReturn, "left absent")
                continue
            reader = _FIELD_VALUE_READERS.get(value.valueType)
            if reader is not None:
                request.target[request.key] = request.convert(reader(value.value))

    def finish(self) -> None:
        """Raise _GpuLost when no call answered and some said Unknown; else note the Unknowns."""
        if self._unknown and not self.answered:
            raise _GpuLost(f"{_error_text(_UNKNOWN)} from every call")
        for subject, source in self._unknown:
            self._availability.note(self.index, subject, source, _UNKNOWN, "left absent")


def _read_scalars(read: _GpuRead, scalars: Sequence[_Scalar], into: dict[str, Any]) -> None:
    for scalar in scalars:
        value = read.call(scalar.attr, scalar.function, *scalar.args)
        if value is not None:
            into[scalar.attr] = scalar.convert(value)


def _read_identity(read: _GpuRead) -> None:
    """Identity does not change: read once, and kept for the samples of a lost GPU."""
    identity = read.gpu.identity
    _read_scalars(read, [s for s in _IDENTITY if s.attr not in identity], identity)


def _read_temperatures(read: _GpuRead, sample: dict[str, Any]) -> None:
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


def _read_utilization(read: _GpuRead, sample: dict[str, Any]) -> None:
    utilization = read.call("utilization", "nvmlDeviceGetUtilizationRates")
    if utilization is not None:
        sample["utilization_gpu_ratio"] = utilization.gpu / 100
        sample["utilization_memory_ratio"] = utilization.memory / 100


def _read_throttle(read: _GpuRead, sample: dict[str, Any]) -> None:
    seconds: dict[str, float] = {}
    for reason, (policy, field_name) in _THROTTLE.items():
        subject = f"throttle_seconds[{reason}]"
        violation = read.call(
            subject,
            "nvmlDeviceGetViolationStatus",
            policy,
            then=f"reading {field_name} instead",
        )
        if violation is not None:
            seconds[reason] = violation.violationTime * _NANO
        else:
            read.want(subject, field_name, seconds, reason, _scaled(_NANO))
    sample["throttle_seconds"] = seconds


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


def _probe_code(call: Callable[[], int]) -> int:
    """The NVML return code of a probing call.

    GPU_IS_LOST ends the poll of the GPU; an Unknown error leaves the probe
    undecided, to be repeated at the next poll rather than cached.
    """
    try:
        code = call()
    except pynvml.NVMLError as error:
        code = int(error.value)
    if code == _GPU_IS_LOST:
        raise _GpuLost(f"probing NVLinks: {_error_text(code)}")
    return code


def _succeeds(function: str, *args: Any) -> Callable[[], int]:
    def call() -> int:
        getattr(pynvml, function)(*args)
        return _SUCCESS

    return call


def _field_answers(gpu: _Gpu, field_name: str, link: int) -> Callable[[], int]:
    def call() -> int:
        field_id = (getattr(pynvml, field_name), link)
        (value,) = pynvml.nvmlDeviceGetFieldValues(gpu.handle, [field_id])
        return int(value.nvmlReturn)

    return call


def _probe_links(gpu: _Gpu) -> tuple[int, ...] | None:
    """The links this GPU has (those whose state NVML reports); None when undecided."""
    codes = {
        link: _probe_code(_succeeds("nvmlDeviceGetNvLinkState", gpu.handle, link))
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS)
    }
    if _UNKNOWN in codes.values():
        return None
    links = tuple(link for link, code in codes.items() if code == _SUCCESS)
    if not links:
        log.info("GPU %d: NVML reports no NVLinks", gpu.index)
    return links


def _probe_interface(gpu: _Gpu, interface: _LinkCounters, link: int) -> int:
    if interface.fields:
        return _probe_code(_field_answers(gpu, next(iter(interface.fields.values())), link))
    counter = next(iter(interface.counters.values()))
    return _probe_code(_succeeds("nvmlDeviceGetNvLinkErrorCounter", gpu.handle, link, counter))


def _probe_link_counters(gpu: _Gpu, link: int) -> _LinkCounters | None:
    """The first interface that answers for `link`; None when undecided."""
    for interface in _LINK_COUNTER_INTERFACES:
        code = _probe_interface(gpu, interface, link)
        if code == _UNKNOWN:
            return None
        if code == _SUCCESS:
            log.info("GPU %d: NVLink error counters through %s", gpu.index, interface.name)
            return interface
    log.info("GPU %d: no NVLink error counter interface answers; counters left absent", gpu.index)
    return _NO_LINK_COUNTERS


@dataclass(frozen=True)
class _LinkRead:
    link: int
    up: bool | None
    errors: dict[str, int]  # filled by the calls, or after the field-value batch


def _read_links(read: _GpuRead) -> list[_LinkRead]:
    gpu = read.gpu
    if gpu.links is None:
        gpu.links = _probe_links(gpu)
    if gpu.link_counters is None and gpu.links:
        gpu.link_counters = _probe_link_counters(gpu, gpu.links[0])
    interface = gpu.link_counters or _NO_LINK_COUNTERS
    links = []
    for link in gpu.links or ():
        state = read.call("nvlink state", "nvmlDeviceGetNvLinkState", link)
        errors: dict[str, int] = {}
        for kind, name in interface.fields.items():
            read.want(f"nvlink {kind}", name, errors, kind, int, scope=link)
        for kind, counter in interface.counters.items():
            value = read.call(f"nvlink {kind}", "nvmlDeviceGetNvLinkErrorCounter", link, counter)
            if value is not None:
                errors[kind] = int(value)
        links.append(_LinkRead(link, None if state is None else bool(state), errors))
    return links


class _XidListener:
    """Counts XID critical errors through one NVML event set.

    With a thread, it loops on `nvmlEventSetWait_v2(set, XID_WAIT_MS)` and
    registers again with backoff when a wait fails with anything but Timeout;
    without one (tests, deterministic simulation), `drain()` waits with a zero
    timeout until Timeout. Events carry no time: each is stamped on receipt.
    """

    def __init__(self, clock: Clock, gpus: Sequence[_Gpu], threaded: bool) -> None:
        self._clock = clock
        self._gpus = gpus
        self._events: queue.SimpleQueue[XidEvent] = queue.SimpleQueue()
        self._stop = threading.Event()
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
                log.info("GPU %d does not report XID events", gpu.index)
                return False
            pynvml.nvmlDeviceRegisterEvents(gpu.handle, _XID, event_set)
        except pynvml.NVMLError as error:
            log.warning("GPU %d: XID events not registered: %s", gpu.index, error)
            return False
        return True

    def _register_again(self) -> None:
        _free(self._event_set)
        self._event_set = self._register()

    def _receive(self, timeout_ms: int) -> None:
        """Wait for one event and queue it; raises NVMLError_Timeout when none came."""
        data = pynvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        gpu = self._by_address.get(_address(data.device))
        if data.eventType != _XID or gpu is None:
            return
        uuid = gpu.identity.get("uuid")
        self._events.put(XidEvent(gpu.index, int(data.eventData), self._clock.now(), uuid))

    def _run(self) -> None:
        backoff = REREGISTER_BACKOFF_S
        while not self._stop.is_set():
            try:
                self._receive(XID_WAIT_MS)
            except pynvml.NVMLError_Timeout:
                pass  # no XID this second: wait again
            except pynvml.NVMLError as error:
                log.warning("XID event wait failed (%s); registering again in %gs", error, backoff)
                if self._clock.wait(self._stop, backoff):
                    return
                self._register_again()
                backoff = min(2 * backoff, REREGISTER_BACKOFF_MAX_S)
                continue
            backoff = REREGISTER_BACKOFF_S

    def _pump(self) -> None:
        try:
            while True:
                self._receive(0)
        except pynvml.NVMLError_Timeout:
            return
        except pynvml.NVMLError as error:
            # The next poll is the backoff.
            log.warning("XID event wait failed (%s); registering again", error)
            self._register_again()

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


def _start_nvml() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise SourceUnavailable(
            f"NVML could not be loaded ({error}): is the NVIDIA driver installed and loaded? "
            "To run without GPUs use `gpuwatchd run --simulate`, or leave NVML out with "
            "`--source infiniband`."
        ) from error


class NvmlSource:
    """The `nvml` source. Construction starts NVML (SourceUnavailable when it
    cannot) and registers for XIDs; `poll()` reads every GPU."""

    name = "nvml"

    def __init__(self, clock: Clock, config: NvmlSourceConfig, xid_thread: bool = True) -> None:
        self._clock = clock
        _start_nvml()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            pynvml.nvmlShutdown()
            raise SourceUnavailable(f"NVML started but cannot count the GPUs: {error}") from error
        self._driver_version = self._read_driver_version()
        self._availability = _Availability()
        self._gpus = tuple(_Gpu(index) for index in range(count))
        for gpu in self._gpus:
            self._identify(gpu)
        self._availability.flush()
        self._xids = _XidListener(clock, self._gpus, xid_thread) if config.xid_events else None
        self._closed = False
        log.info("NVML: %d GPU(s), driver %s", count, self._driver_version or "unknown")

    @staticmethod
    def _read_driver_version() -> str | None:
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as error:
            log.info("driver version not read (%s)", error)
            return None

    def _acquire(self, gpu: _Gpu) -> bool:
        """Whether the GPU has a handle, getting one when it has none yet."""
        if gpu.handle is None:
            try:
                gpu.handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
            except pynvml.NVMLError as error:
                self._mark_down(gpu, f"nvmlDeviceGetHandleByIndex: {error}")
                return False
        return True

    def _identify(self, gpu: _Gpu) -> None:
        """Read identity up front, so that the first XIDs carry the UUID."""
        if not self._acquire(gpu):
            return
        read = _GpuRead(gpu, self._availability)
        try:
            _read_identity(read)
            read.finish()
        except _GpuLost as lost:
            self._mark_down(gpu, lost.reason)

    def poll(self, now: float) -> Reading:
        events = self._xids.drain() if self._xids is not None else ()
        for event in events:
            self._gpus[event.gpu].xid_counts[event.code] += 1
        gpus = tuple(self._sample(gpu) for gpu in self._gpus)
        self._availability.flush()
        return Reading(
            source=self.name,
            time=now,
            gpus=gpus,
            xid_events=events,
            driver_version=self._driver_version,
        )

    def _sample(self, gpu: _Gpu) -> GpuSample:
        if not self._acquire(gpu):
            return gpu.down_sample()
        try:
            sample = self._read(gpu)
        except _GpuLost as lost:
            self._mark_down(gpu, lost.reason)
            return gpu.down_sample()
        if not gpu.up:
            log.warning("GPU %d (%s) answers again", gpu.index, gpu.identity.get("uuid"))
            gpu.up = True
        return sample

    def _read(self, gpu: _Gpu) -> GpuSample:
        read = _GpuRead(gpu, self._availability)
        _read_identity(read)
        sample: dict[str, Any] = dict(gpu.identity)
        _read_scalars(read, _SCALARS, sample)
        _read_temperatures(read, sample)
        _read_utilization(read, sample)
        _read_throttle(read, sample)
        _read_memory_errors(read, sample)
        links = _read_links(read)
        read.fetch_fields()
        read.finish()
        return GpuSample(
            index=gpu.index,
            up=True,
            nvlinks=tuple(LinkSample(gpu.index, r.link, r.up, r.errors) for r in links),
            xid_counts=dict(gpu.xid_counts),
            **sample,
        )

    def _mark_down(self, gpu: _Gpu, reason: str) -> None:
        if gpu.up:
            log.warning(
                "GPU %d (%s) is lost (%s); reporting it down and reading the others",
                gpu.index,
                gpu.identity.get("uuid", "uuid unknown"),
                reason,
            )
            gpu.up = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._xids is not None:
            self._xids.close()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.debug("nvmlShutdown: %s", error)
