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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from gpuwatchd.settings import SettingsError, check_yaml_limits, read_text
from gpuwatchd.units import parse_duration, parse_rate

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
BUILTIN_DEFAULT = "default"

# For each fault kind: the fields it must have and the ones it may have
# (besides `at`, `kind` and `for`, which every fault may have).
FAULT_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "thermal_throttle": (frozenset({"gpu"}), frozenset()),
    "power_cap": (frozenset({"gpu"}), frozenset()),
    "clock_drift": (frozenset({"gpu"}), frozenset({"ratio"})),
    "nvlink_crc_storm": (frozenset({"gpu", "link", "rate"}), frozenset()),
    "nvlink_down": (frozenset({"gpu", "link"}), frozenset()),
    "ecc_sbe_storm": (frozenset({"gpu", "rate"}), frozenset()),
    "ecc_uncorrectable": (frozenset({"gpu"}), frozenset({"code"})),
    "row_remap_pending": (frozenset({"gpu"}), frozenset()),
    "row_remap_failure": (frozenset({"gpu"}), frozenset()),
    "xid": (frozenset({"gpu", "code"}), frozenset()),
    "gpu_lost": (frozenset({"gpu"}), frozenset()),
    "ib_symbol_errors": (frozenset({"hca", "port", "rate"}), frozenset()),
    "ib_link_flap": (frozenset({"hca", "port", "rate"}), frozenset()),
    "ib_port_down": (frozenset({"hca", "port"}), frozenset()),
    "ib_congestion": (frozenset({"hca", "port", "rate"}), frozenset()),
    "sdc": (frozenset({"gpu"}), frozenset({"mode"})),
}
COMMON_FIELDS = frozenset({"at", "kind", "for"})

# What an `sdc` fault makes the GPU's canary backend do (gpuwatchd.canary.faults
# says what each mode is); `consistent` when no mode is given.
SdcMode = Literal[
    "lane",
    "sm",
    "consistent",
    "data",
    "intermittent",
    "lsb",
    "stuck_bit",
    "address_alias",
    "hang",
    "crash",
    "error",
]
SDC_MODES: tuple[SdcMode, ...] = get_args(SdcMode)


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the fault."""


@dataclass(frozen=True)
class NodeShape:
    gpus: int = 8
    model: str = DEFAULT_MODEL
    nvlinks: int = 18
    hcas: int = 8

    @property
    def hca_names(self) -> tuple[str, ...]:
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


def _short(value: Any) -> str:
    """A value for a message: the start of its repr, never the whole of a big one."""
    if isinstance(value, list | dict):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


def _require_text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"{where}: {what} must be text, got {_short(value)}")
    return value


def _require_number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: {what} must be a number, got {_short(value)}")
    if isinstance(value, int) and abs(value) > 2**53:
        raise ScenarioError(f"{where}: {what} is out of range, got {_short(value)}")
    return float(value)


def _parse_node(raw: Any, name: str) -> NodeShape:
    if raw is None:
        return NodeShape()
    if not isinstance(raw, dict):
        raise ScenarioError(f"{name}: node must be a mapping such as {{gpus: 8}}")
    unknown = set(raw) - {"gpus", "model", "nvlinks", "hcas"}
    if unknown:
        raise ScenarioError(f"{name}: node: unknown key(s) {', '.join(sorted(unknown))}")
    where = f"{name}: node"
    gpus = _require_int(raw.get("gpus", 8), "gpus", where)
    nvlinks = _require_int(raw.get("nvlinks", 18), "nvlinks", where)
    hcas = _require_int(raw.get("hcas", 8), "hcas", where)
    model = raw.get("model", DEFAULT_MODEL)
    if not isinstance(model, str) or not model:
        raise ScenarioError(f"{where}: model must be a GPU name such as {DEFAULT_MODEL!r}")
    if not 0 <= gpus <= 64 or not 0 <= nvlinks <= 18 or not 0 <= hcas <= 32:
        raise ScenarioError(f"{where}: gpus must be 0-64, nvlinks 0-18, hcas 0-32")
    return NodeShape(gpus=gpus, model=model, nvlinks=nvlinks, hcas=hcas)


def _parse_fault(raw: Any, position: int, node: NodeShape, name: str) -> Fault:
    label = f"{name}: fault {position + 1}"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{label}: expected a mapping such as {{at: 10s, kind: xid, ...}}")
    kind = raw.get("kind")
    if not isinstance(kind, str):
        raise ScenarioError(f"{label}: kind must be text such as xid, got {_short(kind)}")
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
    try:
        at = parse_duration(raw["at"])
        until = at + parse_duration(raw["for"]) if "for" in raw else math.inf
        rate = parse_rate(raw["rate"]) if "rate" in raw else None
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
        code=_require_int(raw["code"], "code", label) if "code" in raw else None,
        ratio=_require_number(raw["ratio"], "ratio", label) if "ratio" in raw else None,
        mode=_require_text(raw["mode"], "mode", label) if "mode" in raw else None,
    )
    _check_ranges(fault, node, label)
    return fault


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
    if fault.port is not None and fault.port != 1:
        raise ScenarioError(f"{label}: port {fault.port} out of range (each HCA has port 1)")
    if fault.ratio is not None and not 0 < fault.ratio < 1:
        raise ScenarioError(f"{label}: ratio must be between 0 and 1, got {fault.ratio}")
    if fault.mode is not None and fault.mode not in SDC_MODES:
        known = ", ".join(SDC_MODES)
        raise ScenarioError(f"{label}: unknown mode {fault.mode!r} (known modes: {known})")
    if fault.code is not None and not 0 < fault.code < 1000:
        raise ScenarioError(f"{label}: code must be an XID number, got {fault.code}")


def parse(text: str, name: str = "scenario") -> Scenario:
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
    node = _parse_node(raw.get("node"), name)
    seed = _require_int(raw.get("seed", 1), "seed", name)
    if not 0 <= seed < 2**64:
        raise ScenarioError(f"{name}: seed must be 0 to 2^64-1, got {_short(seed)}")
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
    """A scenario from a file path, or a built-in by name (`default` when None)."""
    name = name_or_path or BUILTIN_DEFAULT
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = read_text(str(path))
        except SettingsError as error:
            raise ScenarioError(str(error)) from error
        return parse(text, str(path))
    builtin = resources.files("gpuwatchd.sim") / "scenarios" / f"{name}.yaml"
    if not builtin.is_file():
        known = ", ".join(builtin_names())
        raise ScenarioError(f"{name}: no such file and no built-in scenario (built-in: {known})")
    return parse(builtin.read_text(encoding="utf-8"), name)
