"""Scenario files: a simulated node and the faults scripted on it.

The format is a contract that users and tests write to:

    node: {gpus: 8, model: "NVIDIA H100 80GB HBM3", nvlinks: 18, hcas: 8}
    seed: 1
    faults:
      - {at: 10s, kind: thermal_throttle, gpu: 3, for: 120s}
      - {at: 15s, kind: nvlink_crc_storm, gpu: 5, link: 7, rate: 2000/s}

`at` and `for` are durations; without `for` a fault lasts to the end; `rate`
is `N/s`, `N/min` or `N/h`. A file with an unknown kind, a missing field or an
index out of range is rejected with a message that names the fault.

`nvlink_inactive` (links never up: `link`, or every link of the GPU) and
`gpu_missing` (`gpu`, or the last `count` GPUs, one without either, not
enumerated by NVML) describe the node from boot and start at 0s.
`nvml_error` makes one NVML call (a function such as
`nvmlDeviceGetRemappedRows`, or a field such as `NVML_FI_DEV_MEMORY_TEMP`)
answer an NVML error `code` (`NOT_SUPPORTED`, `TIMEOUT`, `GPU_IS_LOST`... or
its number) on one GPU, optionally on one NVLink only; `recovery_action` sets
the driver's GPU recovery action (`gpu_reset`, `node_reboot`, `drain_p2p`,
`drain_and_reset`...). `gpu_idle` leaves one GPU without a job while the
others stay busy (utilisation 0, its idle clock and power, NVML's `gpu_idle`
clocks-event reason); one fault per idle GPU.
`node: {models: [MODEL, ...]}` (instead of `model`) mixes models, one a GPU
in index order; `gpus` is then their number.
`node: {capture: FILE}` runs on a node captured by `gpuwatchd capture` (a
relative FILE is found beside the scenario file): its shape is the capture's,
and the faults are checked against it (docs/capture.md).

Every run of a scenario is a boot of its node: the boards are the seed's (so
a run on the state directory of an earlier run with the same seed is the
next boot of the same node, its GPUs keeping their UUIDs), and the node gets
a boot id of its own (`gpu_replaced` puts another board in a slot).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pynvml
import yaml

from gpuwatchd import capture as captures
from gpuwatchd import capture_file
from gpuwatchd.canary.faults import FAULT_MODES, FaultMode
from gpuwatchd.model import AER_SEVERITIES, COUNTER_BITS, GPU_RECOVERY_ACTIONS
from gpuwatchd.settings import SettingsError, check_yaml_limits, read_text, shown
from gpuwatchd.units import parse_duration, parse_rate

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
BUILTIN_DEFAULT = "default"

# For each fault kind: the fields it must have and the ones it may have
# (besides `at`, `kind` and `for`, which every fault may have).
FAULT_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "thermal_throttle": (frozenset({"gpu"}), frozenset()),
    "power_cap": (frozenset({"gpu"}), frozenset()),
    "power_brake": (frozenset({"gpu"}), frozenset()),
    "clock_drift": (frozenset({"gpu"}), frozenset({"ratio"})),
    # An operator's `nvidia-smi -lgc <mhz>` on one GPU, or on all without `gpu`.
    "clocks_locked": (frozenset({"mhz"}), frozenset({"gpu"})),
    # A GPU with no job while the others stay busy: utilisation 0, its clocks
    # and power at idle, NVML's gpu_idle clocks-event reason set.
    "gpu_idle": (frozenset({"gpu"}), frozenset()),
    "nvlink_crc_storm": (frozenset({"gpu", "link", "rate"}), frozenset()),
    "nvlink_down": (frozenset({"gpu", "link"}), frozenset()),
    "nvlink_inactive": (frozenset({"gpu"}), frozenset({"link"})),
    "gpu_missing": (frozenset(), frozenset({"gpu", "count"})),
    "ecc_sbe_storm": (frozenset({"gpu", "rate"}), frozenset()),
    "ecc_uncorrectable": (frozenset({"gpu"}), frozenset({"code"})),
    "row_remap_pending": (frozenset({"gpu"}), frozenset()),
    "row_remap_failure": (frozenset({"gpu"}), frozenset()),
    # One memory bank (`bank`, 0 without it) with no spare rows left: the
    # row remapper's histogram counts it under "none" (Ampere and newer).
    "row_remap_exhausted": (frozenset({"gpu"}), frozenset({"bank"})),
    # The board at this index is another one than the seed's (an RMA): a new
    # UUID, from boot, in the same slot (the same PCI bus).
    "gpu_replaced": (frozenset({"gpu"}), frozenset()),
    "xid": (frozenset({"gpu", "code"}), frozenset()),
    # An XID the driver logged `ago` (60s) before the daemon started: in the
    # kernel log only, since NVML replays nothing from before its registration.
    "kernel_xid": (frozenset({"gpu", "code"}), frozenset({"ago"})),
    # One raw kernel-log record (`text`, as the driver writes it: the lines of
    # one printk are one record) with the kernel's facility, at the level of
    # a leading `<0>`..`<7>` (KERN_ERR without one); at `at`, or `ago` before
    # the daemon started (`at: 0s`). NVML does not report it.
    "kernel_line": (frozenset({"text"}), frozenset({"ago"})),
    "gpu_lost": (frozenset({"gpu"}), frozenset()),
    "nvml_error": (frozenset({"gpu", "call", "code"}), frozenset({"link"})),
    # nvmlInit answers the NVML error `code` (DRIVER_NOT_LOADED,
    # LIB_RM_VERSION_MISMATCH, LIBRARY_NOT_FOUND...) from boot while it lasts.
    "nvml_init_error": (frozenset({"code"}), frozenset()),
    "reset_required": (frozenset({"gpu"}), frozenset()),
    "recovery_action": (frozenset({"gpu", "action"}), frozenset()),
    # A GPU's PCIe link trained below its maximum: `width` lanes and/or
    # `generation` (half the lanes when neither is given).
    "pcie_downtrained": (frozenset({"gpu"}), frozenset({"width", "generation"})),
    "pcie_replay_storm": (frozenset({"gpu", "rate"}), frozenset()),
    # A GPU the NVSwitch fabric manager has not registered: not started, or
    # completed with the NVML error `code` (NOT_READY, ...).
    "fabric_unregistered": (frozenset({"gpu"}), frozenset({"code"})),
    # The fabric's health mask on a GPU: `mask` sets fields of
    # nvmlGpuFabricInfo_v2_t.healthMask as nvml.h packs them (0x1 degraded
    # bandwidth, 0x4 route recovery, 0x10 route unhealthy, 0x40 access timeout
    # recovery, 0x500 incorrect configuration: insufficient NVLinks); the
    # fields it leaves 0 read healthy.
    "fabric_health": (frozenset({"gpu", "mask"}), frozenset()),
    # PCIe AER errors of one GPU's or one HCA's function: `count` at `at`
    # (1 without it), or `rate` while the fault lasts.
    "aer_errors": (frozenset({"severity"}), frozenset({"gpu", "hca", "count", "rate"})),
    # One GPU's configuration unlike its siblings': `setting` (CONFIG_SETTINGS)
    # with `value`, or a default unlike the others (ECC, persistence off, MIG
    # on, an older VBIOS, a power limit 100 W lower).
    "config_drift": (frozenset({"gpu", "setting"}), frozenset({"value"})),
    "ib_symbol_errors": (frozenset({"hca", "port", "rate"}), frozenset()),
    "ib_link_flap": (frozenset({"hca", "port", "rate"}), frozenset()),
    "ib_port_down": (frozenset({"hca", "port"}), frozenset()),
    "ib_congestion": (frozenset({"hca", "port", "rate"}), frozenset()),
    "ib_counter_pinned": (frozenset({"hca", "port", "counter"}), frozenset()),
    "ib_counter_einval": (frozenset({"hca", "port", "counter"}), frozenset()),
    "sdc": (frozenset({"gpu"}), frozenset({"mode"})),
}
COMMON_FIELDS = frozenset({"at", "kind", "for"})
# The settings a config_drift fault changes (checks/config_drift.py compares
# these and the application clocks).
CONFIG_SETTINGS = ("vbios_version", "ecc_mode", "persistence_mode", "mig_mode", "power_limit")
# The longest message one kernel record holds (printk keeps at most 1 KiB).
KERNEL_RECORD_CHARS = 1024
# Kinds that describe the node as it booted: they must start at 0s.
FROM_BOOT = frozenset(
    {"nvlink_inactive", "gpu_missing", "kernel_xid", "gpu_replaced", "nvml_init_error"}
)

# NVML's error codes by name, as nvidia-ml-py spells them without NVML_ERROR_.
NVML_ERRORS: Mapping[int, str] = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_").lower()
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_")
}
# A file under a port's counters/ or hw_counters/ (port_xmit_wait, out_of_buffer).
_COUNTER_NAME = re.compile(r"^[A-Za-z0-9_]+$")

# What an `sdc` fault makes the GPU's canary backend do: the canaries' own
# fault modes (gpuwatchd.canary.faults says what each is); `consistent` when
# no mode is given.
SDC_MODES: tuple[FaultMode, ...] = FAULT_MODES


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the fault."""


@dataclass(frozen=True)
class NodeShape:
    gpus: int = 8
    model: str = DEFAULT_MODEL
    nvlinks: int = 18
    hcas: int = 8
    capture: str | None = None  # the capture file this node replays
    captured_hcas: tuple[str, ...] | None = None
    # A node that mixes models: each GPU's, in index order (`model` is then
    # the first's). Empty: every GPU is `model`.
    models: tuple[str, ...] = ()

    def model_of(self, gpu: int) -> str:
        return self.models[gpu] if self.models else self.model

    @property
    def distinct_models(self) -> tuple[str, ...]:
        """The node's models, in the order of their first GPU."""
        return tuple(dict.fromkeys(self.models or (self.model,)))

    @property
    def hca_names(self) -> tuple[str, ...]:
        if self.captured_hcas is not None:
            return self.captured_hcas
        return tuple(f"mlx5_{index}" for index in range(self.hcas))


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    until: float = math.inf
    gpu: int | None = None
    link: int | None = None
    hca: str | None = None
    port: int | None = None
    rate: float | None = None  # per second
    code: int | None = None
    ratio: float | None = None
    mode: str | None = None
    call: str | None = None  # nvml_error: the NVML function or field that fails
    count: int | None = None
    mhz: int | None = None
    counter: str | None = None  # an InfiniBand counter file's name
    width: int | None = None  # pcie_downtrained: lanes
    generation: int | None = None  # pcie_downtrained: PCIe generation
    severity: str | None = None  # aer_errors: correctable, nonfatal or fatal
    ago: float | None = None  # kernel_xid, kernel_line: seconds before the start it was logged
    text: str | None = None  # kernel_line: the record's message
    setting: str | None = None  # config_drift: one of CONFIG_SETTINGS
    value: str | None = None  # config_drift: what the setting reads (text)
    bank: int | None = None  # row_remap_exhausted: the memory bank
    mask: int | None = None  # fabric_health: the health mask's fields it sets

    def active(self, t: float) -> bool:
        return self.at <= t < self.until

    def elapsed(self, t: float) -> float:
        """Seconds this fault has been active by time t (0 before it starts)."""
        return max(0.0, min(t, self.until) - self.at)


@dataclass(frozen=True)
class Scenario:
    node: NodeShape = field(default_factory=NodeShape)
    seed: int = 1
    faults: tuple[Fault, ...] = ()
    name: str = "scenario"

    def faults_of(self, kind: str) -> tuple[Fault, ...]:
        return tuple(fault for fault in self.faults if fault.kind == kind)


def _require_int(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: {what} must be a whole number, got {value!r}")
    return value


def captured_shape(path: str, name: str) -> NodeShape:
    """The shape of the node a capture file holds."""
    try:
        document = capture_file.load(path)
    except capture_file.CaptureError as error:
        raise ScenarioError(f"{name}: node: {error}") from error
    gpus = captures.gpu_documents(document)
    models = [captures.first_value(gpu, "nvmlDeviceGetName") for gpu in gpus]
    hcas = captures.hca_names(document)
    return NodeShape(
        gpus=len(gpus),
        model=next((model for model in models if model), DEFAULT_MODEL),
        nvlinks=max((max(captures.nvlinks(gpu), default=-1) + 1 for gpu in gpus), default=0),
        hcas=len(hcas),
        capture=path,
        captured_hcas=hcas,
    )


def _require_text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"{where}: {what} must be text, got {shown(value)}")
    return value


def _require_number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: {what} must be a number, got {shown(value)}")
    if isinstance(value, int) and abs(value) > 2**53:
        raise ScenarioError(f"{where}: {what} is out of range, got {shown(value)}")
    return float(value)


def _parse_node(raw: Any, name: str, directory: str | None = None) -> NodeShape:
    if raw is None:
        return NodeShape()
    if not isinstance(raw, dict):
        raise ScenarioError(f"{name}: node must be a mapping such as {{gpus: 8}}")
    if "capture" in raw:
        if set(raw) != {"capture"} or not isinstance(raw["capture"], str):
            raise ScenarioError(
                f"{name}: node: a captured node is {{capture: FILE}} alone "
                "(its GPUs, model, NVLinks and HCAs come from the capture)"
            )
        return captured_shape(os.path.join(directory or "", raw["capture"]), name)
    unknown = set(raw) - {"gpus", "model", "models", "nvlinks", "hcas"}
    if unknown:
        raise ScenarioError(f"{name}: node: unknown key(s) {', '.join(sorted(unknown))}")
    where = f"{name}: node"
    models = _parse_models(raw, where)
    gpus = _require_int(raw.get("gpus", len(models) or 8), "gpus", where)
    nvlinks = _require_int(raw.get("nvlinks", 18), "nvlinks", where)
    hcas = _require_int(raw.get("hcas", 8), "hcas", where)
    model = raw.get("model", models[0] if models else DEFAULT_MODEL)
    if not _is_model(model):
        raise ScenarioError(f"{where}: model must be a GPU name such as {DEFAULT_MODEL!r}")
    if not 0 <= gpus <= 64 or not 0 <= nvlinks <= 18 or not 0 <= hcas <= 32:
        raise ScenarioError(f"{where}: gpus must be 0-64, nvlinks 0-18, hcas 0-32")
    if models and gpus != len(models):
        raise ScenarioError(
            f"{where}: gpus is {gpus} but models names {len(models)} (one model a GPU)"
        )
    return NodeShape(gpus=gpus, model=model, nvlinks=nvlinks, hcas=hcas, models=models)


def _is_model(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _parse_models(raw: dict[str, Any], where: str) -> tuple[str, ...]:
    """`models`: one GPU name a GPU, for a node that mixes models."""
    if "models" not in raw:
        return ()
    if "model" in raw:
        raise ScenarioError(f"{where}: give either model (every GPU) or models (one a GPU)")
    models = raw["models"]
    if not isinstance(models, list) or not models or not all(map(_is_model, models)):
        raise ScenarioError(
            f"{where}: models must be a list of GPU names, one a GPU, such as "
            f"[{DEFAULT_MODEL!r}, ...]"
        )
    return tuple(models)


def _parse_fault(raw: Any, position: int, node: NodeShape, name: str) -> Fault:
    label = f"{name}: fault {position + 1}"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{label}: expected a mapping such as {{at: 10s, kind: xid, ...}}")
    kind = raw.get("kind")
    if not isinstance(kind, str):
        raise ScenarioError(f"{label}: kind must be text such as xid, got {shown(kind)}")
    label = f"{label} ({kind})" if kind else label
    if kind not in FAULT_FIELDS:
        known = ", ".join(sorted(FAULT_FIELDS))
        raise ScenarioError(f"{label}: unknown kind {kind!r} (known kinds: {known})")
    required, optional = FAULT_FIELDS[kind]
    missing = ({"at"} | required) - set(raw)
    if missing:
        raise ScenarioError(f"{label}: missing field(s) {', '.join(sorted(missing))}")
    unknown = set(raw) - required - optional - COMMON_FIELDS
    if unknown:
        raise ScenarioError(f"{label}: unknown field(s) {', '.join(sorted(unknown))}")
    code = _parse_code(kind, raw, label)
    try:
        at = parse_duration(raw["at"])
        until = at + parse_duration(raw["for"]) if "for" in raw else math.inf
        rate = parse_rate(raw["rate"]) if "rate" in raw else None
        ago = parse_duration(raw["ago"]) if "ago" in raw else None
    except ValueError as error:
        raise ScenarioError(f"{label}: {error}") from error
    fault = Fault(
        kind=kind,
        at=at,
        until=until,
        gpu=_require_int(raw["gpu"], "gpu", label) if "gpu" in raw else None,
        link=_require_int(raw["link"], "link", label) if "link" in raw else None,
        hca=_require_text(raw["hca"], "hca", label) if "hca" in raw else None,
        port=_require_int(raw["port"], "port", label) if "port" in raw else None,
        rate=rate,
        code=code,
        ratio=_require_number(raw["ratio"], "ratio", label) if "ratio" in raw else None,
        mode=_require_text(raw["mode"], "mode", label) if "mode" in raw else None,
        call=_require_text(raw["call"], "call", label) if "call" in raw else None,
        count=_require_int(raw["count"], "count", label) if "count" in raw else None,
        mhz=_require_int(raw["mhz"], "mhz", label) if "mhz" in raw else None,
        counter=_require_text(raw["counter"], "counter", label) if "counter" in raw else None,
        width=_require_int(raw["width"], "width", label) if "width" in raw else None,
        generation=(
            _require_int(raw["generation"], "generation", label) if "generation" in raw else None
        ),
        severity=_require_text(raw["severity"], "severity", label) if "severity" in raw else None,
        ago=ago,
        setting=_require_text(raw["setting"], "setting", label) if "setting" in raw else None,
        value=str(raw["value"]) if "value" in raw else None,
        bank=_require_int(raw["bank"], "bank", label) if "bank" in raw else None,
        mask=_require_int(raw["mask"], "mask", label) if "mask" in raw else None,
        text=_require_text(raw["text"], "text", label) if "text" in raw else None,
    )
    _check_ranges(fault, node, label)
    return fault


def _parse_code(kind: str, raw: dict[str, Any], label: str) -> int | None:
    """An XID's number, an NVML error code (by name or number), or a recovery action."""
    if kind == "recovery_action":
        return _named(raw["action"], GPU_RECOVERY_ACTIONS, "action", label)
    if "code" not in raw:
        return None
    if kind in ("nvml_error", "fabric_unregistered", "nvml_init_error"):
        return _named(raw["code"], NVML_ERRORS, "code", label)
    return _require_int(raw["code"], "code", label)


def _named(value: Any, names: Mapping[int, str], what: str, label: str) -> int:
    by_name = {name: number for number, name in names.items()}
    if isinstance(value, str) and value.lower() in by_name:
        return by_name[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value in names:
        return value
    known = ", ".join(sorted(by_name))
    raise ScenarioError(f"{label}: unknown {what} {value!r} (known: {known})")


def _check_ranges(fault: Fault, node: NodeShape, label: str) -> None:
    if fault.gpu is not None and not 0 <= fault.gpu < node.gpus:
        raise ScenarioError(f"{label}: gpu {fault.gpu} out of range (node has {node.gpus} GPUs)")
    if fault.link is not None and not 0 <= fault.link < node.nvlinks:
        raise ScenarioError(
            f"{label}: link {fault.link} out of range (each GPU has {node.nvlinks} NVLinks)"
        )
    if fault.hca is not None and fault.hca not in node.hca_names:
        raise ScenarioError(
            f"{label}: hca {fault.hca!r} is not on the node (it has {', '.join(node.hca_names)})"
        )
    if node.capture is not None and (fault.kind.startswith("ib_") or fault.kind == "aer_errors"):
        raise ScenarioError(
            f"{label}: a captured node's sysfs tree is replayed as captured; "
            "ib faults (and aer faults) need a simulated node (one without `capture`)"
        )
    if fault.port is not None and fault.port != 1:
        raise ScenarioError(f"{label}: port {fault.port} out of range (each HCA has port 1)")
    if fault.ratio is not None and not 0 < fault.ratio < 1:
        raise ScenarioError(f"{label}: ratio must be between 0 and 1, got {fault.ratio}")
    if fault.mode is not None and fault.mode not in SDC_MODES:
        known = ", ".join(SDC_MODES)
        raise ScenarioError(f"{label}: unknown mode {fault.mode!r} (known modes: {known})")
    if fault.call is not None and not (
        fault.call.startswith(("nvmlDevice", "NVML_FI_")) and hasattr(pynvml, fault.call)
    ):
        raise ScenarioError(
            f"{label}: call {fault.call!r} is no NVML device function or field id "
            "(such as nvmlDeviceGetRemappedRows or NVML_FI_DEV_MEMORY_TEMP)"
        )
    xid_code = fault.kind in ("xid", "ecc_uncorrectable", "kernel_xid")
    if xid_code and fault.code is not None and not 0 < fault.code < 1000:
        raise ScenarioError(f"{label}: code must be an XID number, got {fault.code}")
    if fault.ago is not None and not 0 < fault.ago < 3000:
        raise ScenarioError(f"{label}: ago must be more than 0s and under 50m, got {fault.ago:g}s")
    if fault.bank is not None and not 0 <= fault.bank < 65536:
        raise ScenarioError(f"{label}: bank must be a memory bank's number, got {fault.bank}")
    if fault.mask is not None and not 0 < fault.mask < 0x1000:
        raise ScenarioError(
            f"{label}: mask must set fields of the fabric health mask (bits 0-11), "
            f"got {fault.mask:#x}"
        )
    if fault.mhz is not None and not 0 < fault.mhz < 10000:
        raise ScenarioError(f"{label}: mhz must be a clock in MHz, got {fault.mhz}")
    if fault.kind in FROM_BOOT and fault.at != 0:
        raise ScenarioError(f"{label}: describes the node from boot, so `at` must be 0s")
    if fault.ago is not None and fault.at != 0:
        raise ScenarioError(f"{label}: logged `ago` before the daemon started, so `at` must be 0s")
    if fault.text is not None and not 0 < len(fault.text) <= KERNEL_RECORD_CHARS:
        raise ScenarioError(
            f"{label}: text must be one kernel record: 1 to {KERNEL_RECORD_CHARS} characters"
        )
    if fault.kind == "gpu_missing" and fault.gpu is not None and fault.count is not None:
        raise ScenarioError(f"{label}: give either gpu (which one) or count (how many)")
    if fault.setting is not None and fault.setting not in CONFIG_SETTINGS:
        known = ", ".join(CONFIG_SETTINGS)
        raise ScenarioError(f"{label}: unknown setting {fault.setting!r} (known: {known})")
    if fault.setting is not None and fault.value is not None:
        _check_setting_value(fault.setting, fault.value, label)
    if fault.kind == "aer_errors":
        _check_aer(fault, label)
    elif fault.count is not None and not 0 < fault.count <= node.gpus:
        raise ScenarioError(f"{label}: count must be 1-{node.gpus}, got {fault.count}")
    if fault.kind == "ib_counter_pinned" and fault.counter not in COUNTER_BITS:
        known = ", ".join(sorted(COUNTER_BITS))
        raise ScenarioError(
            f"{label}: counter {fault.counter!r} has no IBTA maximum to pin at (known: {known})"
        )
    if fault.width is not None and fault.width not in (1, 2, 4, 8, 16):
        raise ScenarioError(
            f"{label}: width must be a PCIe link width (1-16 lanes), got {fault.width}"
        )
    if fault.generation is not None and not 1 <= fault.generation <= 6:
        raise ScenarioError(f"{label}: generation must be 1-6, got {fault.generation}")
    if fault.counter is not None and not _COUNTER_NAME.match(fault.counter):
        raise ScenarioError(f"{label}: counter {fault.counter!r} is not a counter file name")


def _check_setting_value(setting: str, value: str, label: str) -> None:
    if setting in ("ecc_mode", "persistence_mode", "mig_mode") and value not in ("0", "1"):
        raise ScenarioError(f"{label}: {setting} is 0 (disabled) or 1 (enabled), got {value!r}")
    if setting == "power_limit":
        try:
            watts = float(value)
        except ValueError:
            watts = math.nan
        if not 0 < watts < 10_000:
            raise ScenarioError(f"{label}: power_limit is watts (1-9999), got {value!r}")
    if setting == "vbios_version" and not 0 < len(value) < 32:
        raise ScenarioError(f"{label}: vbios_version must be 1-31 characters")


def _check_aer(fault: Fault, label: str) -> None:
    if fault.severity not in AER_SEVERITIES:
        known = ", ".join(AER_SEVERITIES)
        raise ScenarioError(f"{label}: unknown severity {fault.severity!r} (known: {known})")
    if (fault.gpu is None) == (fault.hca is None):
        raise ScenarioError(f"{label}: give either gpu or hca (whose PCIe function errs)")
    if fault.count is not None and fault.rate is not None:
        raise ScenarioError(f"{label}: give either count (at once) or rate (while it lasts)")
    if fault.count is not None and not 0 < fault.count <= 1_000_000:
        raise ScenarioError(f"{label}: count must be 1-1000000, got {fault.count}")


def parse(text: str, name: str = "scenario", directory: str | None = None) -> Scenario:
    """`directory`: where a relative capture file is (the scenario file's folder)."""
    try:
        check_yaml_limits(text, name)
    except SettingsError as error:
        raise ScenarioError(str(error)) from error
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ScenarioError(f"{name}: not valid YAML: {error}") from error
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{name}: expected a mapping with node, seed and faults")
    unknown = set(raw) - {"node", "seed", "faults"}
    if unknown:
        raise ScenarioError(f"{name}: unknown key(s) {', '.join(sorted(unknown))}")
    node = _parse_node(raw.get("node"), name, directory)
    seed = _require_int(raw.get("seed", 1), "seed", name)
    if not 0 <= seed < 2**64:
        raise ScenarioError(f"{name}: seed must be 0 to 2^64-1, got {shown(seed)}")
    faults_raw = raw.get("faults") or []
    if not isinstance(faults_raw, list):
        raise ScenarioError(f"{name}: faults must be a list")
    faults = tuple(
        _parse_fault(item, position, node, name) for position, item in enumerate(faults_raw)
    )
    return Scenario(node=node, seed=seed, faults=faults, name=name)


def builtin_names() -> list[str]:
    folder = resources.files("gpuwatchd.sim") / "scenarios"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load(name_or_path: str | None) -> Scenario:
    """A scenario from a file path, a capture file (run with no faults), or a
    built-in by name (`default` when None)."""
    name = name_or_path or BUILTIN_DEFAULT
    path = Path(name)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        try:
            # A capture is run as it is, and may be larger than a scenario
            # (parse refuses a scenario past its own limit).
            text = read_text(str(path), capture_file.MAX_BYTES)
        except SettingsError as error:
            known = ", ".join(builtin_names())
            raise ScenarioError(f"{name}: {error.problem} (built-in scenarios: {known})") from error
        if capture_file.is_capture(text):
            return Scenario(node=captured_shape(name, name), name=name)
        return parse(text, str(path), str(path.parent))
    builtin = resources.files("gpuwatchd.sim") / "scenarios" / f"{name}.yaml"
    if not builtin.is_file():
        known = ", ".join(builtin_names())
        raise ScenarioError(f"{name}: no such file and no built-in scenario (built-in: {known})")
    return parse(builtin.read_text(encoding="utf-8"), name)
