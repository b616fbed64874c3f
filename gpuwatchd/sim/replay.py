"""A simulated node made from a capture (`gpuwatchd capture`): a real node's
answers as a test fixture.

What comes from the capture: each GPU's static facts (name, UUID, PCI bus id
and device id, NVLink count, max and default application clocks, power
limit, temperature thresholds; the rest of its GPU model's spec by name, or
by the generation its answers show), its counters as they stood (ECC counts,
throttle time, NVLink error counters, remapped rows or retired pages), the
links that were down, the driver version, and every refusal: each call, with
its arguments, and each field value, per scope, that answered an NVML error
is served by the fake libnvidia-ml with that code. What moves (temperatures,
clocks, power, utilisation, new errors) is the simulator's model from 0 s,
with the scenario's faults on top.

The InfiniBand part is the captured tree, written under the sysfs root as
plain files and left as it was: its counters do not move, and `ib_*` faults
are refused on a captured node. A file whose read failed with an errno
cannot be a plain file: it is left out and listed in `differences`.

After the fake is built, each captured call and field value is asked once
through nvidia-ml-py; any whose return code differs from the capture's (a
function this fake does not export, an argument it reads inside a struct) is
listed in `differences` and logged, so a replay never differs silently.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml

from gpuwatchd import capture, capture_file
from gpuwatchd.sim.fake_nvml import (
    _ARCHITECTURES,
    _ECC_SCOPES,
    _ECC_TYPES,
    _ERROR_COUNTERS,
    _NVLINK5_COUNT_FIELDS,
    _PERF_POLICIES,
    _PERF_POLICY_FIELDS,
    _RETIREMENT_CAUSES,
    _SCOPED_DL_FIELDS,
    DEFAULT_DRIVER_VERSION,
    FakeNvml,
)
from gpuwatchd.sim.gpu import SPECS, Baseline, GpuSpec, MemoryRepairs, SimulatedGpu, SimulatedGpus
from gpuwatchd.sim.scenario import DEFAULT_MODEL, ScenarioError
from gpuwatchd.sources.infiniband import CLASS_PATH

log = logging.getLogger(__name__)

_SUCCESS: int = pynvml.NVML_SUCCESS
_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN
# Calls whose arguments the fake cannot match (an event set of the capturing
# process; a batch of field values, whose fields are refused one by one):
# their refusals are replayed for every argument, and they are not asked back.
_WHOLE_CALLS = frozenset({"nvmlDeviceRegisterEvents", "nvmlDeviceGetFieldValues"})
_ARCHITECTURE_NAMES = {code: name for name, code in _ARCHITECTURES.items()}

# The functions the NVML source calls with whole-number arguments, each of
# which the binding passes by value. A capture's call of any other with
# arguments is not asked back: the binding passes some arguments through as
# pointers (a struct the caller fills), and a number there would be an
# address the library writes to.
_VALUE_ARGUMENTS = frozenset(
    {
        "nvmlDeviceGetClock",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetViolationStatus",
    }
)


class CapturedFabric:
    """The captured InfiniBand tree under `<sysfs_root>/class/infiniband`, as plain files.

    `infiniband` is a capture's part as `capture_file.load` checked it (plain
    relative paths); each file is still written through `_write_under`, which
    follows no symlink and writes nothing outside class/infiniband."""

    def __init__(
        self, infiniband: Mapping[str, Any] | None, sysfs_root: Path, name: str = "capture"
    ) -> None:
        self.root = Path(sysfs_root)
        self.differences: list[str] = []
        infiniband = infiniband or {}
        if not infiniband.get("present"):
            return
        class_dir = self.root.joinpath(*CLASS_PATH)
        class_dir.mkdir(parents=True, exist_ok=True)
        for relative, answer in sorted(infiniband.get("files", {}).items()):
            if "text" not in answer:
                self.differences.append(
                    f"ib: {relative}: read failed with {answer.get('error')} in the capture; "
                    "left out (a plain file cannot fail a read)"
                )
                continue
            if not _write_under(class_dir, relative, answer["text"] + "\n"):
                raise ScenarioError(
                    f"{name}: infiniband.files[{relative!r}]: leads out of the simulated "
                    f"sysfs tree {class_dir}; nothing written there"
                )
        for relative, answer in sorted(infiniband.get("folders", {}).items()):
            self.differences.append(
                f"ib: {relative}/: listing failed with {answer.get('error')} in the capture; "
                "served as listed"
            )

    def advance(self, now: float) -> None:
        """A captured tree holds still."""


def _write_under(base: Path, relative: str, text: str) -> bool:
    """Write `text` at `relative` under `base`, making its folders; False, and
    nothing made, for a path that could lead out of `base`: a `..`, empty or
    absolute part, or a symlink on the way (none is followed)."""
    *folders, name = relative.split("/")
    if any(part in ("", ".", "..") for part in relative.split("/")):
        return False
    folder = base
    for part in folders:
        folder = folder / part
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
        if folder.is_symlink() or not folder.is_dir():
            return False
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(folder / name, flags, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:  # the file itself is a symlink
            return False
        raise
    with open(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    return True


def _architecture(gpu: Mapping[str, Any]) -> str:
    """The generation a GPU's answers show, for a model the simulator does not
    know: its nvmlDeviceGetArchitecture where the capture has it, else what
    its NVLink and memory calls answered."""
    captured = capture.first_value(gpu, "nvmlDeviceGetArchitecture")
    if captured in _ARCHITECTURE_NAMES:
        return _ARCHITECTURE_NAMES[captured]

    def answers(fields: Mapping[int, str]) -> bool:
        return any(
            (answer := capture.first_field(gpu, field_id, link)) is not None
            and capture.succeeded(answer)
            for field_id in fields
            for link in capture.nvlinks(gpu)
        )

    if answers(_NVLINK5_COUNT_FIELDS):
        return "blackwell"
    if answers(_SCOPED_DL_FIELDS):
        return "hopper"
    if capture.first_value(gpu, "nvmlDeviceGetRemappedRows") is not None:
        return "ampere"
    return "volta"


def _spec(gpu: Mapping[str, Any]) -> GpuSpec:
    def value(function: str, *args: Any) -> Any:
        return capture.first_value(gpu, function, *args)

    name = value("nvmlDeviceGetName") or DEFAULT_MODEL
    base = SPECS.get(name) or replace(
        SPECS[DEFAULT_MODEL], name=name, architecture=_architecture(gpu)
    )
    pci = value("nvmlDeviceGetPciInfo_v3") or {}
    thresholds = {
        key: value("nvmlDeviceGetTemperatureThreshold", getattr(pynvml, constant))
        for key, constant in (
            ("shutdown_celsius", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
            ("slowdown_celsius", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
            ("gpu_max_operating_celsius", "NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
            ("memory_max_operating_celsius", "NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
        )
    }
    limit_mw = value("nvmlDeviceGetEnforcedPowerLimit")
    limit = limit_mw / 1000 if limit_mw else base.power_limit_watts
    # A busy GPU draws the same share of its limit as the model's does of its own.
    low, high = (watts * limit / base.power_limit_watts for watts in base.busy_power_watts)
    facts: dict[str, Any] = {
        "pci_device_id": pci.get("pciDeviceId"),
        # Links are numbered from 0; one that refused its state is served so.
        "nvlinks": max(capture.nvlinks(gpu), default=-1) + 1,
        "sm_max_mhz": value("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM),
        "memory_mhz": value("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_MEM),
        "sm_default_application_mhz": value(
            "nvmlDeviceGetClock", pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT
        ),
        **thresholds,
    }
    known = {key: fact for key, fact in facts.items() if fact is not None}
    return replace(base, power_limit_watts=limit, busy_power_watts=(low, high), **known)


def _link_counters(gpu: Mapping[str, Any], link: int) -> dict[str, int]:
    counters: dict[str, int] = {}
    for fields in (_SCOPED_DL_FIELDS, _NVLINK5_COUNT_FIELDS):
        for field_id, kind in fields.items():
            count = capture.first_field_number(gpu, field_id, link)
            if count is not None:
                counters.setdefault(kind, count)
    for counter, kind in _ERROR_COUNTERS.items():
        value = capture.first_value(gpu, "nvmlDeviceGetNvLinkErrorCounter", link, counter)
        if value is not None:
            counters[kind] = int(value)
    return counters


def _violation_ns(gpu: Mapping[str, Any]) -> dict[str, int]:
    seconds: dict[str, int] = {}
    for policy, reason in _PERF_POLICIES.items():
        status = capture.first_value(gpu, "nvmlDeviceGetViolationStatus", policy)
        if status is not None:
            seconds[reason] = int(status["violationTime"])
    for field_id, reason in _PERF_POLICY_FIELDS.items():
        nanoseconds = capture.first_field_number(gpu, field_id)
        if reason not in seconds and nanoseconds is not None:
            seconds[reason] = nanoseconds
    return seconds


def _repairs(gpu: Mapping[str, Any]) -> MemoryRepairs | None:
    rows = capture.first_value(gpu, "nvmlDeviceGetRemappedRows")
    pages = {
        cause: len(value)
        for cause_id, cause in _RETIREMENT_CAUSES.items()
        if (value := capture.first_value(gpu, "nvmlDeviceGetRetiredPages", cause_id)) is not None
    }
    if rows is None and not pages:
        return None
    correctable, uncorrectable, pending, failed = rows or (0, 0, 0, 0)
    return MemoryRepairs(
        remapped_rows_correctable=int(correctable),
        remapped_rows_uncorrectable=int(uncorrectable),
        row_remap_pending=bool(pending),
        row_remap_failed=bool(failed),
        retired_pages=pages,
        retired_pages_pending=bool(
            capture.first_value(gpu, "nvmlDeviceGetRetiredPagesPendingStatus")
        ),
        remapper_banks={
            bucket: int(count)
            for bucket, count in (
                capture.first_value(gpu, "nvmlDeviceGetRowRemapperHistogram") or {}
            ).items()
        },
        sram_threshold_exceeded=bool(
            (capture.first_value(gpu, "nvmlDeviceGetSramEccErrorStatus") or {}).get(
                "bThresholdExceeded"
            )
        ),
    )


def _baseline(gpu: Mapping[str, Any]) -> Baseline:
    ecc = {
        (kind, scope): int(value)
        for kind_id, kind in _ECC_TYPES.items()
        for scope_id, scope in _ECC_SCOPES.items()
        if (value := capture.first_value(gpu, "nvmlDeviceGetTotalEccErrors", kind_id, scope_id))
        is not None
    }
    links = capture.nvlinks(gpu)
    return Baseline(
        ecc_errors=ecc,
        violation_ns=_violation_ns(gpu),
        link_counters={link: _link_counters(gpu, link) for link in links},
        links_down=frozenset(
            link for link in links if not capture.first_value(gpu, "nvmlDeviceGetNvLinkState", link)
        ),
        repairs=_repairs(gpu),
    )


def captured_gpus(document: Mapping[str, Any]) -> tuple[SimulatedGpu, ...]:
    """Each captured GPU's static facts and counters, by index."""
    gpus = []
    for gpu in capture.gpu_documents(document):
        index = int(gpu["index"])
        pci = capture.first_value(gpu, "nvmlDeviceGetPciInfo_v3") or {}
        spec = _spec(gpu)
        gpus.append(
            SimulatedGpu(
                index=index,
                spec=spec,
                uuid=capture.first_value(gpu, "nvmlDeviceGetUUID") or f"GPU-unknown-{index}",
                pci_bus_id=pci.get("busId") or f"00000000:{index + 1:02X}:00.0",
                nvlinks=spec.nvlinks,
                baseline=_baseline(gpu),
            )
        )
    return tuple(gpus)


def _driver_version(document: Mapping[str, Any]) -> str:
    for call in (document.get("nvml") or {}).get("system", ()):
        if call["function"] == "nvmlSystemGetDriverVersion" and call["answers"]:
            answer = call["answers"][0]
            if capture.succeeded(answer):
                return str(answer["value"])
    return DEFAULT_DRIVER_VERSION


def _refuse(*args: Any) -> int:
    return _UNKNOWN


class _SymbolProbe:
    """Stands where nvidia-ml-py expects libnvidia-ml, and notes each symbol it looks up."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        self.names.append(name)
        # A fresh function each time: the binding sets restype on some.
        return lambda *args: _refuse(*args)


def _symbols(function: str, args: tuple[Any, ...], device: bool) -> tuple[str, ...]:
    """The libnvidia-ml symbols a binding function calls (nvmlDeviceGetCount:
    nvmlDeviceGetCount_v2), learnt by calling it once against a probe."""
    probe = _SymbolProbe()
    previous, cached = pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = probe
    pynvml._nvmlGetFunctionPointer_cache.clear()
    handle = (ctypes.c_void_p(1),) if device else ()
    try:
        getattr(pynvml, function)(*handle, *args)
    except Exception:  # any binding function, with a capture's arguments
        pass  # the probe refuses every call: only the names matter
    finally:
        pynvml.nvmlLib = previous
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(cached)
    return tuple(dict.fromkeys(name for name in probe.names if name != "nvmlErrorString"))


def _probe_arg(arg: Any) -> Any:
    if isinstance(arg, int):
        return arg
    return [] if isinstance(arg, list) else ctypes.c_void_p()


def _int_args(args: list[Any]) -> tuple[int, ...] | None:
    if all(isinstance(arg, int) and not isinstance(arg, bool) for arg in args):
        return tuple(args)
    return None


def _install_refusals(fake: FakeNvml, document: Mapping[str, Any]) -> None:
    nvml = document.get("nvml") or {}
    for call in nvml.get("system", ()):
        _refuse_call(fake, call, None)
    for gpu in capture.gpu_documents(document):
        index = int(gpu["index"])
        for call in gpu["calls"]:
            _refuse_call(fake, call, index)
        for entry in gpu["fields"]:
            answer = entry["answers"][0] if entry["answers"] else None
            if answer is not None and not capture.succeeded(answer):
                fake.fail_field(entry["id"], int(answer["return"]), index, scope=entry["scope"])


def _refuse_call(fake: FakeNvml, call: Mapping[str, Any], gpu: int | None) -> None:
    answer = call["answers"][0] if call["answers"] else None
    if answer is None or capture.succeeded(answer):
        return
    function, args = call["function"], call["args"]
    if function == "nvmlDeviceGetHandleByIndex":
        gpu = None  # a system call: its argument is the index
    device = gpu is not None
    int_args = _int_args(args) if function not in _WHOLE_CALLS else None
    if not device and int_args is None:
        return  # an event set's wait or free: the capturing process's own
    probe_args = tuple(_probe_arg(arg) for arg in args)
    for symbol in _symbols(function, probe_args, device):
        if device and int_args is None:
            fake.fail(int(answer["return"]), symbol, gpu)
        else:
            fake.fail(int(answer["return"]), symbol, gpu, args=int_args or ())


@contextmanager
def _started(fake: FakeNvml) -> Iterator[bool]:
    """The fake installed and NVML started on it; False when it does not start."""
    with fake:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            yield False
            return
        try:
            yield True
        finally:
            pynvml.nvmlShutdown()


def _served(function: str, *args: Any) -> int | str:
    """The code the installed library answers, or why this binding cannot ask."""
    try:
        getattr(pynvml, function)(*args)
    except pynvml.NVMLError as error:
        return int(error.value)
    except Exception as error:  # any binding function, with a capture's arguments
        # A capture made with another nvidia-ml-py (a function it lacks, or
        # other arguments), or arguments the binding refuses.
        return f"not asked ({error})"
    return _SUCCESS


def _served_with(function: str, handle: Any, args: tuple[int, ...]) -> int | str:
    if args and function not in _VALUE_ARGUMENTS:
        return "not asked (its arguments may be pointers, not values)"
    return _served(function, handle, *args)


def _code(answer: Mapping[str, Any]) -> int:
    return int(answer.get("return", _SUCCESS))


def _differences(fake: FakeNvml, document: Mapping[str, Any]) -> list[str]:
    """Each captured call and field value whose code the fake serves differently."""
    differences: list[str] = []
    with _started(fake) as started:
        for gpu in capture.gpu_documents(document) if started else ():
            index = int(gpu["index"])
            if _served("nvmlDeviceGetHandleByIndex", index) != _SUCCESS:
                continue
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for call in gpu["calls"]:
                args = _int_args(call["args"])
                if call["function"] in _WHOLE_CALLS or args is None or not call["answers"]:
                    continue
                if call["function"] == "nvmlDeviceGetHandleByIndex":
                    continue
                captured = _code(call["answers"][0])
                served = _served_with(call["function"], handle, args)
                if served != captured:
                    differences.append(
                        f"GPU {index}: {call['function']}{tuple(args)}: captured {captured}, "
                        f"served {served}"
                    )
            for entry in gpu["fields"]:
                if not entry["answers"]:
                    continue
                (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [(entry["id"], entry["scope"])])
                captured = _code(entry["answers"][0])
                if int(value.nvmlReturn) != captured:
                    differences.append(
                        f"GPU {index}: field {entry['name'] or entry['id']} scope "
                        f"{entry['scope']}: captured {captured}, served {value.nvmlReturn}"
                    )
    return differences


class CapturedNode:
    """The parts of a simulated node that a capture supplies."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        try:
            self.document = capture_file.load(path)
        except capture_file.CaptureError as error:  # changed since the scenario read it
            raise ScenarioError(str(error)) from error
        self.differences: list[str] = []

    def gpus(self) -> tuple[SimulatedGpu, ...]:
        return captured_gpus(self.document)

    def fake(self, model: SimulatedGpus, max_wait_s: float | None = None) -> FakeNvml:
        """The fake libnvidia-ml serving `model` with the captured driver and refusals."""
        fake = FakeNvml(model, driver_version=_driver_version(self.document), max_wait_s=max_wait_s)
        _install_refusals(fake, self.document)
        self._note(_differences(fake, self.document))
        return fake

    def fabric(self, sysfs_root: Path) -> CapturedFabric:
        fabric = CapturedFabric(self.document.get("infiniband"), sysfs_root, self.path)
        self._note(fabric.differences)
        return fabric

    def _note(self, differences: list[str]) -> None:
        for difference in differences:
            log.warning("replaying %s: %s", self.path, difference)
        self.differences.extend(differences)
