"""`gpuwatchd capture`: every answer this node's sources get, in one file.

The NVML source polls through a recorder that stands in for the `pynvml`
module (`gpuwatchd.sources.nvml.binding`), so whatever the source calls is
recorded, with no list of calls kept here: per GPU, each call's arguments
and its value (ctypes structs as plain data, device handles as GPU indices)
or its NVML return code, and per (field id, scope id) each field value's own
return code, value type and value. The InfiniBand part is the files the IB
source reads under `<sysfs_root>/class/infiniband`, each with its text or the
errno its read failed with; never one a symlink leads to outside that root.

The file holds nothing from the environment, no host name and no time of
its own (NVML's timestamps stay as answered): driver and binding versions,
GPU names, UUIDs and PCI bus ids, HCA board ids, firmware versions and node
GUIDs besides the values. UUIDs and node GUIDs are identifiers, not
secrets; `anonymize` replaces them (everywhere they appear) with stable
pseudonyms for a capture that leaves the site. docs/capture.md describes the
format; `gpuwatchd.sim.replay` runs a simulated node from it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Any

import pynvml

from gpuwatchd import __version__
from gpuwatchd.capture_file import FORMAT, VERSION
from gpuwatchd.clock import Clock
from gpuwatchd.config import Config
from gpuwatchd.sources import NvmlSourceConfig, SourceUnavailable
from gpuwatchd.sources import nvml as nvml_source
from gpuwatchd.sources.infiniband import CLASS_PATH, DEVICE_FILES, read_attribute

DEFAULT_POLLS = 2

log = logging.getLogger(__name__)

# What the IB source reads under each port besides DEVICE_FILES per device:
# these files, and every file in these folders.
PORT_FILES = ("state", "phys_state", "rate", "link_layer")
COUNTER_FOLDERS = ("counters", "hw_counters")

_SUCCESS: int = pynvml.NVML_SUCCESS
# Field ids by name, for readers of the file. Some ids have two names (a
# field renamed between headers): the alphabetically first is kept.
_FIELD_NAMES: dict[int, str] = {
    getattr(pynvml, name): name
    for name in sorted(dir(pynvml), reverse=True)
    if name.startswith("NVML_FI_") and isinstance(getattr(pynvml, name), int)
}

Answer = dict[str, Any]


def _add(answers: list[Answer], answer: Answer) -> None:
    # A value that holds still is one answer; one that moves, one per change.
    if not answers or answers[-1] != answer:
        answers.append(answer)


@dataclass
class _Call:
    function: str
    args: list[Any]
    answers: list[Answer] = field(default_factory=list)


def _error_answer(code: int) -> Answer:
    return {"return": code, "error": str(pynvml.NVMLError(code))}


def _pointee(value: Any) -> Any:
    """What a `ctypes.byref()` argument points to; None for anything else."""
    return getattr(value, "_obj", None) if type(value).__name__ == "CArgObject" else None


class Recorder:
    """Stands where the NVML source expects the `pynvml` module: passes
    everything through, and records each `nvml*` function's answers."""

    def __init__(self, binding: Any = pynvml) -> None:
        self._binding = binding
        self._gpus: dict[int, int] = {}  # device handle address -> GPU index
        self._calls: dict[tuple[int | None, str, str], _Call] = {}
        self._fields: dict[tuple[int, int, int], list[Answer]] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._binding, name)
        if name == "_nvmlGetFunctionPointer":
            return self._recording_pointers(value)
        if name.startswith("nvml") and callable(value) and not isinstance(value, type):
            return self._recording(name, value)
        return value

    def _recording_pointers(self, lookup: Callable[[str], Any]) -> Callable[[str], Any]:
        """The binding's function-pointer lookup, whose field-value batches
        (the source calls that function by its pointer, into an array it
        keeps) are recorded as the binding's wrapper would have them."""

        def pointer(name: str) -> Any:
            if name != "nvmlDeviceGetFieldValues":
                raise NotImplementedError(f"{name} by its pointer would go unrecorded")
            return self._recording_field_values(lookup(name))

        return pointer

    def _recording_field_values(self, function: Callable[..., int]) -> Callable[..., int]:
        def call(handle: Any, count: int, values: Any) -> int:
            gpu = self._gpus.get(_address(handle))
            asked = values[:count]
            ids = [[int(value.fieldId), int(value.scopeId)] for value in asked]
            record = self._call(gpu, "nvmlDeviceGetFieldValues", [ids])
            code = function(handle, count, values)
            if code != _SUCCESS:
                _add(record.answers, _error_answer(code))
                return code
            if gpu is not None:
                self._record_fields(gpu, asked)
            _add(record.answers, {"value": f"{count} field values (see fields)"})
            return code

        return call

    def _recording(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **keywords: Any) -> Any:
            gpu = self._gpus.get(_address(args[0])) if args and _is_handle(args[0]) else None
            rest = args[1:] if gpu is not None else args
            if name == "nvmlDeviceGetHandleByIndex":
                gpu = int(args[0])
            plain = [self._plain(arg) for arg in rest]
            if keywords:
                plain.append({key: self._plain(value) for key, value in keywords.items()})
            record = self._call(gpu, name, plain)
            try:
                value = function(*args, **keywords)
            except pynvml.NVMLError as error:
                _add(record.answers, _error_answer(int(error.value)))
                raise
            if name == "nvmlDeviceGetHandleByIndex" and gpu is not None:
                self._gpus[_address(value)] = gpu
            # An answer the driver wrote through a pointer the caller passed
            # (nvmlDeviceGetSramEccErrorStatus) is that struct, not the return code.
            written = next((_pointee(arg) for arg in rest if _pointee(arg) is not None), None)
            if name == "nvmlDeviceGetFieldValues" and gpu is not None:
                self._record_fields(gpu, value)
                _add(record.answers, {"value": f"{len(value)} field values (see fields)"})
            else:
                _add(record.answers, {"value": self._plain(value if written is None else written)})
            return value

        return call

    def _call(self, gpu: int | None, function: str, args: list[Any]) -> _Call:
        key = (gpu, function, json.dumps(args, sort_keys=True))
        if key not in self._calls:
            self._calls[key] = _Call(function, args)
        return self._calls[key]

    def _record_fields(self, gpu: int, values: Any) -> None:
        for value in values:
            code = int(value.nvmlReturn)
            if code != _SUCCESS:
                answer = _error_answer(code)
            else:
                member = nvml_source.FIELD_VALUE_MEMBERS.get(int(value.valueType))
                number = getattr(value.value, member) if member else bytes(value.value).hex()
                answer = {"return": code, "type": int(value.valueType), "value": number}
            _add(self._fields.setdefault((gpu, int(value.fieldId), int(value.scopeId)), []), answer)

    def _plain(self, value: Any) -> Any:
        """JSON-ready data for a binding's value or argument."""
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, list | tuple):
            return [self._plain(item) for item in value]
        pointee = _pointee(value)
        if pointee is not None:
            return {"pointer_to": type(pointee).__name__}
        if _is_handle(value):
            gpu = self._gpus.get(_address(value))
            return {"gpu": gpu} if gpu is not None else "<handle>"
        if isinstance(value, ctypes.Structure):
            return {name: self._plain(getattr(value, name)) for name, *_ in value._fields_}
        if isinstance(value, ctypes.Array):
            return [self._plain(item) for item in value]
        if isinstance(value, ctypes._SimpleCData):
            return self._plain(value.value)
        # A union, or anything else: its bytes, which say what it held.
        return bytes(memoryview(value)).hex() if isinstance(value, ctypes.Union) else repr(value)

    def document(self) -> dict[str, Any]:
        """The `nvml` part of a capture: system calls, then each GPU's calls and fields."""
        indices = sorted({gpu for gpu, _, _ in self._calls if gpu is not None})
        return {
            "system": self._calls_of(None),
            "gpus": [
                {"index": gpu, "calls": self._calls_of(gpu), "fields": self._fields_of(gpu)}
                for gpu in indices
            ],
        }

    def _calls_of(self, gpu: int | None) -> list[dict[str, Any]]:
        chosen = sorted(
            (call for key, call in self._calls.items() if key[0] == gpu),
            key=lambda call: (call.function, [_order(arg) for arg in call.args]),
        )
        return [
            {"function": call.function, "args": call.args, "answers": call.answers}
            for call in chosen
        ]

    def _fields_of(self, gpu: int) -> list[dict[str, Any]]:
        return [
            {"id": field_id, "name": _FIELD_NAMES.get(field_id), "scope": scope, "answers": answers}
            for (on_gpu, field_id, scope), answers in sorted(self._fields.items())
            if on_gpu == gpu
        ]


def _order(arg: Any) -> tuple[int, int, str]:
    """Sorts numbers as numbers (link 2 before link 10), anything else after them."""
    if isinstance(arg, int):
        return (0, arg, "")
    return (1, 0, json.dumps(arg, sort_keys=True))


def _is_handle(value: Any) -> bool:
    return isinstance(value, ctypes._Pointer | ctypes.c_void_p)


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def capture_nvml(
    clock: Clock,
    config: NvmlSourceConfig,
    polls: int = DEFAULT_POLLS,
    before_poll: Callable[[float], None] | None = None,
    sysfs_root: str = "/sys",
) -> dict[str, Any]:
    """Poll the NVML source `polls` times through a Recorder; what it recorded.
    Not available, with the reason, when NVML did not start: on a host
    without GPUs, or beside GPUs on the PCI bus (under `sysfs_root`)."""
    recorder = Recorder()
    # A capture records NVML's answers; the kernel log is none of them.
    config = replace(config, kernel_log=None)
    unavailable = None
    with nvml_source.binding(recorder):
        try:
            source = nvml_source.NvmlSource(clock, config, xid_thread=False, sysfs_root=sysfs_root)
        except SourceUnavailable as error:
            return {"available": False, "reason": error.problem, **recorder.document()}
        try:
            for _ in range(polls):
                if before_poll is not None:
                    before_poll(clock.now())
                unavailable = source.poll(clock.now()).nvml_unavailable
        finally:
            source.close()
    if unavailable is not None:
        reason = (
            f"NVML cannot start ({unavailable.error}) with {len(unavailable.pci_addresses)} "
            f"NVIDIA GPU(s) on the PCI bus ({', '.join(unavailable.pci_addresses)})"
        )
        return {"available": False, "reason": reason, **recorder.document()}
    return {"available": True, **recorder.document()}


def _read(path: str) -> Answer:
    try:
        return {"text": read_attribute(path)}
    except OSError as error:
        code = error.errno or 0
        return {"errno": code, "error": errno.errorcode.get(code, str(code))}


def _listing(path: str, errors: dict[str, Answer], relative: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError as error:
        code = error.errno or 0
        errors[relative] = {"errno": code, "error": errno.errorcode.get(code, str(code))}
        return []


def capture_infiniband(sysfs_root: str) -> dict[str, Any]:
    """The files the IB source reads, by path under class/infiniband. A file
    or folder a symlink leads to outside `sysfs_root` is left out (and said
    once): a capture holds the tree it was asked for, nothing from elsewhere."""
    class_dir = os.path.join(sysfs_root, *CLASS_PATH)
    if not os.path.isdir(class_dir):
        return {"present": False, "files": {}, "folders": {}}
    root = os.path.realpath(sysfs_root)
    files: dict[str, Answer] = {}
    folders: dict[str, Answer] = {}
    outside: list[str] = []

    def inside(relative: str) -> bool:
        path = os.path.realpath(os.path.join(class_dir, relative))
        if os.path.commonpath([root, path]) == root:
            return True
        outside.append(relative)
        return False

    def listing(relative: str) -> list[str]:
        if not inside(relative):
            return []
        return _listing(os.path.join(class_dir, relative), folders, relative)

    def read_all(relative: str, names: Iterable[str]) -> None:
        for name in names:
            path = f"{relative}/{name}"
            if inside(path):
                files[path] = _read(os.path.join(class_dir, path))

    for device in listing("."):
        read_all(device, DEVICE_FILES)
        ports = f"{device}/ports"
        for port in listing(ports):
            if not port.isdigit():
                continue
            read_all(f"{ports}/{port}", PORT_FILES)
            for folder in COUNTER_FOLDERS:
                relative = f"{ports}/{port}/{folder}"
                read_all(relative, listing(relative))
    if outside:
        log.warning(
            "left out of the capture: %d path(s) under %s that a symlink leads out of %s: %s",
            len(outside),
            class_dir,
            sysfs_root,
            ", ".join(outside),
        )
    return {"present": True, "files": files, "folders": folders}


def capture_document(
    nvml: Mapping[str, Any] | None, infiniband: Mapping[str, Any] | None
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "gpuwatchd": __version__,
        "binding": {"package": "nvidia-ml-py", "version": _binding_version()},
        "anonymized": False,
        "nvml": nvml,
        "infiniband": infiniband,
    }


def _binding_version() -> str | None:
    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return None


# What `anonymize` replaces: the answers of these calls, by GPU index.
_GPU_IDENTIFIERS: Mapping[str, str] = {
    "nvmlDeviceGetUUID": "GPU-00000000-0000-4000-8000-{index:012x}",
    "nvmlDeviceGetSerial": "serial-{index}",
}


def anonymize(document: Mapping[str, Any]) -> dict[str, Any]:
    """The capture with each GPU UUID (and serial, if read) and HCA node GUID
    replaced, wherever it appears, by a pseudonym made from its position
    (stable across captures)."""
    replaced = _replace_strings(document, pseudonyms(document))
    assert isinstance(replaced, dict)
    replaced["anonymized"] = True
    return replaced


def pseudonyms(document: Mapping[str, Any]) -> dict[str, str]:
    """What `anonymize` replaces: each GPU UUID, serial and HCA node GUID the
    capture recorded -> its pseudonym."""
    pseudonyms: dict[str, str] = {}
    for gpu in gpu_documents(document):
        for call in gpu["calls"]:
            pattern = _GPU_IDENTIFIERS.get(call["function"])
            if pattern is None:
                continue
            for answer in call["answers"]:
                if isinstance(answer.get("value"), str):
                    pseudonyms[answer["value"]] = pattern.format(index=gpu["index"])
    guids = sorted(
        path
        for path in (document.get("infiniband") or {}).get("files", {})
        if path.endswith("/node_guid")
    )
    for position, path in enumerate(guids):
        text = document["infiniband"]["files"][path].get("text")
        if text:
            pseudonyms[text] = f"0000:0000:0000:{position:04x}"
    return pseudonyms


def _replace_strings(value: Any, pseudonyms: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return pseudonyms.get(value, value)
    if isinstance(value, list):
        return [_replace_strings(item, pseudonyms) for item in value]
    if isinstance(value, dict):
        return {key: _replace_strings(item, pseudonyms) for key, item in value.items()}
    return value


def dumps(document: Mapping[str, Any]) -> str:
    """The file's text: the same capture always gives the same bytes."""
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


# -- reading a capture ---------------------------------------------------------


def succeeded(answer: Answer) -> bool:
    return int(answer.get("return", _SUCCESS)) == _SUCCESS


def gpu_documents(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    nvml = document.get("nvml") or {}
    gpus: list[dict[str, Any]] = nvml.get("gpus", [])
    return gpus


def first_answer(gpu: Mapping[str, Any], function: str, *args: Any) -> Answer | None:
    """The first answer the GPU gave to `function(handle, *args)`, if it was asked."""
    for call in gpu["calls"]:
        if call["function"] == function and call["args"] == list(args) and call["answers"]:
            answer: Answer = call["answers"][0]
            return answer
    return None


def first_value(gpu: Mapping[str, Any], function: str, *args: Any) -> Any:
    """The first value `function(handle, *args)` returned; None when refused or not asked."""
    answer = first_answer(gpu, function, *args)
    return answer["value"] if answer is not None and succeeded(answer) else None


def first_field(gpu: Mapping[str, Any], field_id: int, scope: int = 0) -> Answer | None:
    for entry in gpu["fields"]:
        if entry["id"] == field_id and entry["scope"] == scope and entry["answers"]:
            answer: Answer = entry["answers"][0]
            return answer
    return None


def first_field_number(gpu: Mapping[str, Any], field_id: int, scope: int = 0) -> int | None:
    """A field's first value as a whole number; None when refused or not asked,
    or when it holds the bytes of a value type the binding could not read."""
    answer = first_field(gpu, field_id, scope)
    if answer is None or not succeeded(answer) or isinstance(answer["value"], str):
        return None
    return int(answer["value"])


def nvlinks(gpu: Mapping[str, Any]) -> tuple[int, ...]:
    """The links whose state the GPU reported: the links it has."""
    return tuple(
        sorted(
            call["args"][0]
            for call in gpu["calls"]
            if call["function"] == "nvmlDeviceGetNvLinkState"
            and call["answers"]
            and succeeded(call["answers"][0])
        )
    )


def hca_names(document: Mapping[str, Any]) -> tuple[str, ...]:
    files = (document.get("infiniband") or {}).get("files", {})
    return tuple(sorted({path.split("/", 1)[0] for path in files}))


def capture_node(
    config: Config,
    clock: Clock,
    polls: int = DEFAULT_POLLS,
    before_poll: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """A capture of the sources `config` enables (NVML, InfiniBand; none else
    reads hardware). `before_poll(now)` moves a simulated node before each poll."""
    sources = config.sources
    nvml = None
    if sources.nvml.enabled:
        # The PCI tree the daemon looks for GPUs in (assemble.sources).
        nvml = capture_nvml(clock, sources.nvml, polls, before_poll, sources.pcie.sysfs_root)
    infiniband = sources.infiniband
    return capture_document(
        nvml, capture_infiniband(infiniband.sysfs_root) if infiniband.enabled else None
    )


def nvml_missing(document: Mapping[str, Any]) -> str | None:
    """Why the NVML a capture was to record could not be, if it could not."""
    nvml = document.get("nvml")
    if nvml is None or nvml.get("available"):
        return None
    return str(nvml.get("reason"))


def summary(document: Mapping[str, Any]) -> str:
    """One line saying what a capture holds."""
    nvml = document.get("nvml")
    if nvml is None:
        gpus = "NVML not captured"
    elif not nvml.get("available"):
        gpus = f"NVML unavailable ({nvml.get('reason')})"
    else:
        refused = sum(
            1
            for gpu in gpu_documents(document)
            for entry in gpu["calls"] + gpu["fields"]
            if entry["answers"] and not succeeded(entry["answers"][0])
        )
        gpus = f"{len(gpu_documents(document))} GPU(s), {refused} NVML error answer(s)"
    infiniband = document.get("infiniband")
    if infiniband is None:
        hcas = "InfiniBand not captured"
    else:
        hcas = (
            f"{len(hca_names(document))} InfiniBand device(s), {len(infiniband['files'])} file(s)"
        )
    return f"{gpus}; {hcas}"
