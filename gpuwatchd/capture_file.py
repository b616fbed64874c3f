"""A capture file read back (`gpuwatchd capture` writes it; docs/capture.md):
bounded before it is read, and checked whole before anything uses it.

Captures are made to be shared (`--anonymize` is for one that leaves the
site), so a capture is data from elsewhere: a regular file of at most
MAX_BYTES, its JSON at most MAX_DEPTH deep (counted before the parser
recurses), every number finite and within 64 bits, every part of the shape
its readers take for granted (`gpuwatchd.sim.replay`, the scenario's node
shape), and every InfiniBand path a plain relative path under
class/infiniband. Anything else is one CaptureError naming the file and the
place: `node.json: nvml.gpus[3].calls[7].answers[0].value: expected ...`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import pynvml

from gpuwatchd.settings import SettingsError, read_text, shown
from gpuwatchd.sources.nvml import NVLINK_MAX_LINKS

FORMAT = "gpuwatchd-capture"
VERSION = 1

# The simulated 8-GPU H100 node's capture is 0.6 MiB at 10 polls (the most
# `--polls` takes); a real node with more HCAs and fields stays within a few
# MiB. 32 MiB is fifty times that, and bounds what parsing a file can cost.
MAX_BYTES = 32 << 20
# The format nests 10 levels (a struct in an answer in a call in a GPU ...).
MAX_DEPTH = 32
# HGX and DGX boards have 8 GPUs a node; 64 leaves room for any to come, and
# keeps a hostile capture from building thousands of simulated GPUs.
MAX_GPUS = 64
# A GPU's calls (173 on the simulated H100) or fields (128), a node's system calls.
MAX_ENTRIES = 8192
MAX_ARGS = 16
# One per change, and a capture polls at most 10 times.
MAX_ANSWERS = 1024
# A node of 8 HCAs has about 400 files; 64 dual-port HCAs with every
# hw_counter stay under this.
MAX_IB_FILES = 16384
MAX_HCAS = 64
# Linux's NAME_MAX and more levels than class/infiniband has (5).
MAX_NAME_BYTES = 255
MAX_PATH_PARTS = 8
# nvmlReturn_t: nvml.h's codes run to about 30, and NVML_ERROR_UNKNOWN is 999.
MAX_RETURN = 999

_FUNCTION = re.compile(r"nvml[A-Za-z0-9_]{1,96}")
# As NVML writes them; a driver version starts with its branch (the fake
# answers by branch), and an empty bus id is one the replay makes up.
_BUS_ID = re.compile(r"(([0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])?")
_DRIVER_VERSION = re.compile(r"[0-9]{1,6}(\.[0-9A-Za-z]{1,16}){0,4}")
# JSON strings, so that the brackets inside them are not counted as nesting.
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


class CaptureError(ValueError):
    """A capture file that cannot be used; the message names the file."""


class _Invalid(Exception):
    """A part of the capture that is not what its reader needs."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A capture file, checked to be one this version reads, whole."""
    try:
        text = read_text(str(path), MAX_BYTES, regular_file=True)
    except SettingsError as error:
        raise CaptureError(f"{path}: {error.problem}") from error
    document = _parse(text, str(path))
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CaptureError(f'{path}: not a gpuwatchd capture (no "format": "{FORMAT}")')
    if document.get("version") != VERSION:
        raise CaptureError(
            f"{path}: capture format version {shown(document.get('version'))}; "
            f"this gpuwatchd reads version {VERSION}"
        )
    try:
        _check_document(document)
    except _Invalid as error:
        raise CaptureError(f"{path}: {error}") from error
    return document


def is_capture(text: str) -> bool:
    """Whether a file's text is a capture (of any version)."""
    try:
        document = _parse(text, "")
    except CaptureError:
        return False
    return isinstance(document, dict) and document.get("format") == FORMAT


def _parse(text: str, path: str) -> Any:
    if _depth(text) > MAX_DEPTH:
        raise CaptureError(f"{path}: not a capture (nested deeper than {MAX_DEPTH} levels)")
    try:
        return json.loads(
            text, parse_constant=_no_constant, parse_float=_finite, parse_int=_in_64_bits
        )
    except _Invalid as error:
        raise CaptureError(f"{path}: {error}") from error
    except ValueError as error:
        raise CaptureError(f"{path}: not a capture (not JSON: {error})") from error


def _depth(text: str) -> int:
    """How deep the text's brackets nest outside its strings: what json.loads
    would recurse to (CPython's decoder raises RecursionError past ~1000)."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
    return deepest


def _no_constant(name: str) -> NoReturn:
    raise _Invalid("(a number)", f"{name} is not a value a capture holds")


def _finite(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise _Invalid("(a number)", f"{shown(text)} is too large for a double")
    return number


def _in_64_bits(text: str) -> int:
    number = int(text)
    if not -(2**63) <= number < 2**64:
        raise _Invalid("(a number)", f"{shown(text)} does not fit in 64 bits")
    return number


# -- the shape of a capture ----------------------------------------------------

Shape = Callable[[Any, str], None]


def _object(value: Any, where: str, most: int | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(where, f"expected an object, got {shown(value)}")
    if most is not None and len(value) > most:
        raise _Invalid(where, f"more than {most} entries")
    return value


def _list(value: Any, where: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise _Invalid(where, f"expected a list, got {shown(value)}")
    if len(value) > most:
        raise _Invalid(where, f"more than {most} entries")
    return value


def _whole(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _Invalid(where, f"expected a whole number {low} to {high}, got {shown(value)}")
    return value


def _flag(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise _Invalid(where, f"expected true or false, got {shown(value)}")


def _text(most: int) -> Shape:
    """Printable text of at most `most` characters (an NVML char buffer's size)."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, str) or not value.isprintable() or len(value) > most:
            raise _Invalid(where, f"expected text of at most {most} characters, got {shown(value)}")

    return check


def _matching(pattern: re.Pattern[str], example: str) -> Shape:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise _Invalid(where, f"expected text such as {example}, got {shown(value)}")

    return check


def _unsigned(bits: int) -> Shape:
    def check(value: Any, where: str) -> None:
        _whole(value, where, 0, 2**bits - 1)

    return check


_U32, _U64 = _unsigned(32), _unsigned(64)


def _struct(keys: Mapping[str, Shape], required: tuple[str, ...] = ()) -> Shape:
    """An object whose `keys`, where present, have their shape."""

    def check(value: Any, where: str) -> None:
        _object(value, where)
        for key in required:
            if key not in value:
                raise _Invalid(where, f"{key} is missing")
        for key, shape in keys.items():
            if key in value:
                shape(value[key], f"{where}.{key}")

    return check


def _each(shape: Shape, length: int | None = None) -> Shape:
    """A list of values of one shape (of exactly `length` of them, if given)."""

    def check(value: Any, where: str) -> None:
        items = _list(value, where, MAX_ENTRIES)
        if length is not None and len(items) != length:
            raise _Invalid(where, f"expected {length} values, got {len(items)}")
        for position, item in enumerate(items):
            shape(item, f"{where}[{position}]")

    return check


def _values_of(shape: Shape) -> Shape:
    def check(value: Any, where: str) -> None:
        for key, item in _object(value, where).items():
            shape(item, f"{where}.{key}")

    return check


# The values gpuwatchd reads back from a capture (gpuwatchd.sim.replay and
# the scenario's node shape), as nvml.h types them; the others are only
# compared by their return code. Text is at most the binding's buffer.
VALUE_SHAPES: Mapping[str, Shape] = {
    "nvmlSystemGetDriverVersion": _matching(_DRIVER_VERSION, "550.54.15"),
    "nvmlDeviceGetName": _text(pynvml.NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    "nvmlDeviceGetUUID": _text(pynvml.NVML_DEVICE_UUID_V2_BUFFER_SIZE),
    "nvmlDeviceGetPciInfo_v3": _struct(
        {"busId": _matching(_BUS_ID, "00000000:18:00.0"), "pciDeviceId": _U32}
    ),
    "nvmlDeviceGetTemperatureThreshold": _U32,
    "nvmlDeviceGetEnforcedPowerLimit": _U32,
    "nvmlDeviceGetMaxClockInfo": _U32,
    "nvmlDeviceGetClock": _U32,
    "nvmlDeviceGetNvLinkState": _U32,
    "nvmlDeviceGetNvLinkErrorCounter": _U64,
    "nvmlDeviceGetTotalEccErrors": _U64,
    "nvmlDeviceGetViolationStatus": _struct({"violationTime": _U64}, required=("violationTime",)),
    "nvmlDeviceGetRemappedRows": _each(_U32, length=4),
    "nvmlDeviceGetRetiredPages": _each(_U64),
    "nvmlDeviceGetRetiredPagesPendingStatus": _U32,
    "nvmlDeviceGetRowRemapperHistogram": _values_of(_U32),
    "nvmlDeviceGetSramEccErrorStatus": _struct({"bThresholdExceeded": _U32}),
}
# The links the source asks, whatever the installed binding's header says: a
# capture made under a newer binding names links an older one does not know.
_MAX_LINKS: int = NVLINK_MAX_LINKS
_SUCCESS: int = pynvml.NVML_SUCCESS


def _check_document(document: Mapping[str, Any]) -> None:
    if document.get("nvml") is not None:
        _check_nvml(_object(document["nvml"], "nvml"))
    if document.get("infiniband") is not None:
        _check_infiniband(_object(document["infiniband"], "infiniband"))


def _check_nvml(nvml: Mapping[str, Any]) -> None:
    if "available" in nvml:
        _flag(nvml["available"], "nvml.available")
    for position, call in enumerate(_list(nvml.get("system", []), "nvml.system", MAX_ENTRIES)):
        _check_call(call, f"nvml.system[{position}]")
    gpus = _list(nvml.get("gpus", []), "nvml.gpus", MAX_GPUS)
    for position, gpu in enumerate(gpus):
        _check_gpu(gpu, f"nvml.gpus[{position}]")
    if sorted(gpu["index"] for gpu in gpus) != list(range(len(gpus))):
        raise _Invalid("nvml.gpus", "the indices must be 0 to N-1, each once, as NVML numbers GPUs")


def _check_gpu(gpu: Any, where: str) -> None:
    _object(gpu, where)
    _whole(gpu.get("index"), f"{where}.index", 0, MAX_GPUS - 1)
    for position, call in enumerate(_list(gpu.get("calls"), f"{where}.calls", MAX_ENTRIES)):
        _check_call(call, f"{where}.calls[{position}]")
    for position, entry in enumerate(_list(gpu.get("fields"), f"{where}.fields", MAX_ENTRIES)):
        _check_field(entry, f"{where}.fields[{position}]")


def _check_call(call: Any, where: str) -> None:
    _object(call, where)
    function = call.get("function")
    if not isinstance(function, str) or not _FUNCTION.fullmatch(function):
        raise _Invalid(
            f"{where}.function", f"expected an NVML function's name, got {shown(function)}"
        )
    args = _list(call.get("args"), f"{where}.args", MAX_ARGS)
    for position, arg in enumerate(args):
        # NVML's arguments after the handle are enums, indices and versions
        # (C ints); replay asks the binding with them, and a size of 2^63
        # would be an array of that many.
        if isinstance(arg, int) and not isinstance(arg, bool):
            _whole(arg, f"{where}.args[{position}]", -(2**31), 2**32 - 1)
    if function == "nvmlDeviceGetNvLinkState":
        if len(args) != 1:
            raise _Invalid(f"{where}.args", "expected [link]")
        _whole(args[0], f"{where}.args[0]", 0, _MAX_LINKS - 1)
    shape = VALUE_SHAPES.get(function)
    for position, answer in enumerate(_list(call.get("answers"), f"{where}.answers", MAX_ANSWERS)):
        _check_answer(answer, f"{where}.answers[{position}]", shape)


def _check_answer(answer: Any, where: str, shape: Shape | None) -> None:
    """`{"value": V}`, or `{"return": CODE, "error": TEXT}`."""
    _object(answer, where)
    code = _whole(answer.get("return", _SUCCESS), f"{where}.return", 0, MAX_RETURN)
    if code != _SUCCESS:
        return
    if "value" not in answer:
        raise _Invalid(where, "an answer is a value or a return code")
    if shape is not None:
        shape(answer["value"], f"{where}.value")


def _check_field(entry: Any, where: str) -> None:
    _object(entry, where)
    _whole(entry.get("id"), f"{where}.id", 0, 2**32 - 1)
    _whole(entry.get("scope"), f"{where}.scope", 0, 2**32 - 1)
    if entry.get("name") is not None:
        _text(MAX_NAME_BYTES)(entry["name"], f"{where}.name")
    for position, answer in enumerate(_list(entry.get("answers"), f"{where}.answers", MAX_ANSWERS)):
        _check_answer(answer, f"{where}.answers[{position}]", _field_value)


def _field_value(value: Any, where: str) -> None:
    """A number, or the hex of a union whose type the binding has no member for."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _Invalid(where, f"expected a number, got {shown(value)}")


def _check_infiniband(infiniband: Mapping[str, Any]) -> None:
    if "present" in infiniband:
        _flag(infiniband["present"], "infiniband.present")
    files = _object(infiniband.get("files", {}), "infiniband.files", MAX_IB_FILES)
    for relative, answer in files.items():
        where = f"infiniband.files[{shown(relative)}]"
        _check_relative(relative, where)
        _check_file_answer(answer, where)
    _check_no_file_is_a_folder(files)
    hcas = {relative.split("/", 1)[0] for relative in files}
    if len(hcas) > MAX_HCAS:
        raise _Invalid("infiniband.files", f"more than {MAX_HCAS} HCAs")
    folders = _object(infiniband.get("folders", {}), "infiniband.folders", MAX_IB_FILES)
    for relative, answer in folders.items():
        where = f"infiniband.folders[{shown(relative)}]"
        if relative != ".":  # class/infiniband itself
            _check_relative(relative, where)
        _check_file_answer(answer, where)


def _check_relative(relative: str, where: str) -> None:
    """A path under class/infiniband, made of plain names: no `..`, nothing absolute."""
    if relative.startswith("/"):
        raise _Invalid(where, "an absolute path: a capture's paths are under class/infiniband")
    parts = relative.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            shown = repr(part) if part else "an empty name"
            raise _Invalid(where, f"{shown} in a path: names only")
        if not part.isprintable() or len(part.encode("utf-8", "replace")) > MAX_NAME_BYTES:
            raise _Invalid(where, "a name must be printable text of at most 255 bytes")
    if len(parts) > MAX_PATH_PARTS:
        raise _Invalid(where, f"more than {MAX_PATH_PARTS} levels")


def _check_file_answer(answer: Any, where: str) -> None:
    """`{"text": TEXT}`, or `{"errno": N, "error": NAME}`."""
    _object(answer, where)
    if "text" in answer:
        if not isinstance(answer["text"], str):
            raise _Invalid(f"{where}.text", f"expected text, got {shown(answer['text'])}")
        return
    _whole(answer.get("errno"), f"{where}.errno", 0, 4095)
    if "error" in answer:
        _text(MAX_NAME_BYTES)(answer["error"], f"{where}.error")


def _check_no_file_is_a_folder(files: Mapping[str, Any]) -> None:
    folders = {relative.rsplit("/", 1)[0] for relative in files if "/" in relative}
    above = {folder.rsplit("/", i)[0] for folder in folders for i in range(folder.count("/") + 1)}
    both = sorted(above & set(files))
    if both:
        raise _Invalid(
            f"infiniband.files[{shown(both[0])}]", "both a file and a folder of other files"
        )
