"""The simulated node's GPUs: a deterministic hardware model driven by a scenario.

Owns what the GPUs of a simulated node report at a given moment: identity,
temperatures, clocks, power and energy, framebuffer use, utilisation, the
PCIe link, the NVSwitch fabric registration, memory errors and repairs, NVLink
state and error counters, and the XID events raised, for every GPU fault kind
of the scenario contract (`sdc` and the `ib_*` kinds belong to other models).
Reads only the scenario. `fake_nvml.FakeNvml` serves this model to the real
nvidia-ml-py binding.

Every value is a closed-form function of the seed and of the time since start,
so a run reads the same however often (or seldom) it is advanced, and the
cumulative counters never go back.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from gpuwatchd.model import (
    CLOCKS_EVENT_REASONS,
    ECC_SCOPES,
    ECC_TYPES,
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_STARTED,
    FABRIC_STATE_NOT_SUPPORTED,
    NVLINK_ERROR_TYPES,
    RETIRED_PAGE_CAUSES,
    ROW_REMAPPER_BUCKETS,
    THROTTLE_REASONS,
)
from gpuwatchd.sim.scenario import Fault, Scenario

ARCHITECTURES = ("volta", "ampere", "hopper", "blackwell")
# The CUDA compute capability of each generation's data-centre GPU (V100,
# A100, H100/H200, B200), as NVIDIA's "CUDA GPU Compute Capability" table and
# nvmlDeviceGetCudaComputeCapability give it.
COMPUTE_CAPABILITIES = {"volta": (7, 0), "ampere": (8, 0), "hopper": (9, 0), "blackwell": (10, 0)}

# The XIDs real drivers log for the scenario's memory and bus faults (NVIDIA's
# XID catalogue): 48 double-bit ECC error, 63 row-remap (or page-retirement)
# recording event, 64 row-remap recording failure, 79 GPU fallen off the bus.
XID_DOUBLE_BIT_ECC = 48
XID_ROW_REMAP_EVENT = 63
XID_ROW_REMAP_FAILURE = 64
XID_FALLEN_OFF_BUS = 79

# The driver logs XID 79 as the GPU drops off the bus, just before every call
# on it starts failing.
GPU_LOST_XID_LEAD_S = 0.001
# A GPU heating up (or cooling down) takes this long between its background
# temperature and the throttle point.
THERMAL_RAMP_S = 20.0
# Thermal faults hold the GPU this far above its slowdown threshold.
THERMAL_OVERSHOOT_C = 2.0
# HW slowdown cuts the clocks "by a factor of 2 or more" (NVML documentation).
HW_SLOWDOWN_CLOCK_RATIO = 0.5
# Power falls with the clocks under HW slowdown.
HW_SLOWDOWN_POWER_RATIO = 0.6
# A GPU held at its power limit by the SW power cap runs about a quarter slow
# and reads just under its limit.
POWER_CAP_CLOCK_RATIO = 0.75
POWER_CAP_MARGIN_W = 1.5
DEFAULT_CLOCK_DRIFT_RATIO = 0.7
# Of the flits a CRC storm corrupts, about a quarter carry data (the rest are
# control flits); every corrupted flit is replayed, and about one in a
# thousand bursts is bad enough to retrain (recover) the link.
CRC_DATA_SHARE = 0.25
RECOVERY_SHARE = 0.001
# One NVLink5 link carries 50 GB/s each way (1.8 TB/s over 18 links, both ways).
NVLINK5_LINK_BITS_PER_S = 400e9

_THERMAL_REASONS = (
    CLOCKS_EVENT_REASONS["sw_thermal_slowdown"]
    | CLOCKS_EVENT_REASONS["hw_thermal_slowdown"]
    | CLOCKS_EVENT_REASONS["hw_slowdown"]
)
_POWER_CAP_REASON = CLOCKS_EVENT_REASONS["sw_power_cap"]
_IDLE_REASON = CLOCKS_EVENT_REASONS["gpu_idle"]
# An external power brake (the system's power supply asserting it) engages HW
# slowdown, reported as both bits (nvml.h: HwSlowdown "is an indicator of ...
# External Power Brake Assertion").
_POWER_BRAKE_REASONS = (
    CLOCKS_EVENT_REASONS["hw_power_brake_slowdown"] | CLOCKS_EVENT_REASONS["hw_slowdown"]
)

K = TypeVar("K")

_SUCCESS = 0  # NVML_SUCCESS

_MIB = 1 << 20
# The energy counter integrates the power over steps this long.
ENERGY_STEP_S = 10.0

# Bus ids of the eight GPUs of an HGX H100 baseboard, in NVML index order.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass(frozen=True)
class GpuSpec:
    """What one GPU model reports: its per-generation facts.

    Thresholds and clocks are what `nvidia-smi -q` shows on the SXM boards
    (B200's thresholds are assumed equal to Hopper's: not confirmed on one).
    """

    name: str
    architecture: str
    pci_device_id: int
    nvlinks: int
    # Streaming multiprocessors, as CUDA counts them (multiProcessorCount):
    # 132 on an H100/H200 SXM5 and 108 on an A100 (NVIDIA's architecture
    # whitepapers), 80 on a V100 SXM2, 148 on a B200 (74 a die, Chips and
    # Cheese). The CPU backend standing in for the GPU places its threads on
    # that many simulated SMs.
    sm_count: int
    sm_max_mhz: int
    sm_default_application_mhz: int
    memory_mhz: int
    power_limit_watts: float
    busy_power_watts: tuple[float, float]
    shutdown_celsius: int
    slowdown_celsius: int
    gpu_max_operating_celsius: int
    memory_max_operating_celsius: int
    clock_step_mhz: int = 15
    # Banks of HBM the row remapper tracks (`nvidia-smi -q`, "Bank Remap
    # Availability Histogram": 640 on an A100 80GB; the H100's 2560 is assumed
    # for every HBM3/HBM3e board, not confirmed on one).
    memory_banks: int = 2560
    # Framebuffer as nvmlDeviceGetMemoryInfo_v2 reports it: total, and what
    # the driver and firmware reserve (`nvidia-smi -q`, "FB Memory Usage": an
    # H100 80GB shows 81559 MiB total; the reservation of a few hundred MiB
    # is assumed alike on every board, not confirmed on each).
    memory_total_mib: int = 81559
    memory_reserved_mib: int = 330
    # nvmlDeviceGetVbiosVersion, in `nvidia-smi -q`'s "VBIOS Version" form
    # (96.00.xx.00.xx on H100 boards); the number itself is assumed.
    vbios_version: str = "96.00.99.00.01"
    # nvmlDeviceGetBoardPartNumber, in the 692-xxxxx-xxxx-xxx form of NVIDIA's
    # boards (`nvidia-smi -q`, "Board Part Number"); the number itself is assumed.
    board_part_number: str = "692-2G520-0200-000"
    # The PCIe link the GPU and its HGX baseboard's switches train to
    # (`nvidia-smi -q`, "Max" under "PCIe Generation" and "Link Width"): Gen5
    # x16 on H100/H200, Gen4 on A100, Gen3 on V100. B200 is Gen6-capable, but
    # nvml.h's maximum is what "this device and system" allow and HGX B200
    # hosts are Gen5.
    pcie_max_generation: int = 5
    pcie_max_width: int = 16
    # What an idle board reads (no process running): the SM clock it falls to
    # and its power draw. `nvidia-smi` on an idle H100 SXM commonly shows
    # 345 MHz and about 70 W, an A100 SXM 210 MHz and about 55 W, a V100 SXM2
    # 135 MHz and about 40 W (figures reported by users, not captured here;
    # the B200's are assumed equal to the H100's).
    idle_sm_mhz: int = 345
    idle_power_watts: float = 70.0

    @property
    def memory_total_bytes(self) -> int:
        return self.memory_total_mib * _MIB

    @property
    def memory_reserved_bytes(self) -> int:
        return self.memory_reserved_mib * _MIB

    @property
    def compute_capability(self) -> tuple[int, int]:
        return COMPUTE_CAPABILITIES[self.architecture]

    def at_least(self, architecture: str) -> bool:
        return ARCHITECTURES.index(self.architecture) >= ARCHITECTURES.index(architecture)

    @property
    def remaps_rows(self) -> bool:
        """Ampere and newer repair memory by row remapping, older GPUs by page retirement."""
        return self.at_least("ampere")


@dataclass(frozen=True)
class GpuSettings:
    """A GPU's configuration as NVML reads it: VBIOS, ECC mode, persistence
    mode and MIG mode (NVML_FEATURE_ENABLED is 1, nvml.h), and its power limit."""

    vbios_version: str
    ecc_mode: int
    persistence_mode: int
    mig_mode: int
    power_limit_watts: float


# What a config_drift fault without `value` makes a setting read: unlike the
# defaults (ECC on, persistence on: nvidia-persistenced, MIG off).
DRIFTED = {
    "vbios_version": "96.00.74.00.11",
    "ecc_mode": "0",
    "persistence_mode": "0",
    "mig_mode": "1",
}
DRIFTED_POWER_LIMIT_WATTS = 100.0


_H100 = GpuSpec(
    name="NVIDIA H100 80GB HBM3",
    architecture="hopper",
    pci_device_id=0x233010DE,
    nvlinks=18,
    sm_count=132,
    sm_max_mhz=1980,
    sm_default_application_mhz=1980,
    memory_mhz=2619,
    power_limit_watts=700.0,
    busy_power_watts=(500.0, 690.0),
    shutdown_celsius=92,
    slowdown_celsius=89,
    gpu_max_operating_celsius=87,
    memory_max_operating_celsius=95,
)

SPECS: Mapping[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        _H100,
        # The H200 is an H100 with faster, larger HBM3e.
        replace(
            _H100,
            name="NVIDIA H200",
            pci_device_id=0x233510DE,
            memory_mhz=3201,
            memory_total_mib=143771,
        ),
        GpuSpec(
            name="NVIDIA A100-SXM4-80GB",
            architecture="ampere",
            pci_device_id=0x20B210DE,
            nvlinks=12,
            sm_count=108,
            sm_max_mhz=1410,
            sm_default_application_mhz=1140,
            memory_mhz=1593,
            power_limit_watts=400.0,
            busy_power_watts=(280.0, 395.0),
            shutdown_celsius=92,
            slowdown_celsius=89,
            gpu_max_operating_celsius=85,
            memory_max_operating_celsius=95,
            memory_banks=640,
            memory_total_mib=81920,
            pcie_max_generation=4,
            idle_sm_mhz=210,
            idle_power_watts=55.0,
        ),
        GpuSpec(
            name="NVIDIA B200",
            architecture="blackwell",
            pci_device_id=0x290110DE,
            nvlinks=18,
            sm_count=148,
            sm_max_mhz=1965,
            sm_default_application_mhz=1965,
            memory_mhz=3996,
            power_limit_watts=1000.0,
            busy_power_watts=(700.0, 985.0),
            memory_total_mib=183359,
            shutdown_celsius=92,
            slowdown_celsius=89,
            gpu_max_operating_celsius=87,
            memory_max_operating_celsius=95,
        ),
        GpuSpec(
            name="Tesla V100-SXM2-32GB",
            architecture="volta",
            pci_device_id=0x1DB510DE,
            nvlinks=6,
            sm_count=80,
            sm_max_mhz=1530,
            sm_default_application_mhz=1290,
            memory_mhz=877,
            power_limit_watts=300.0,
            busy_power_watts=(210.0, 295.0),
            memory_total_mib=32768,
            pcie_max_generation=3,
            idle_sm_mhz=135,
            idle_power_watts=40.0,
            shutdown_celsius=90,
            slowdown_celsius=87,
            gpu_max_operating_celsius=83,
            memory_max_operating_celsius=85,
        ),
    )
}


def spec_for(name: str) -> GpuSpec:
    try:
        return SPECS[name]
    except KeyError:
        known = ", ".join(sorted(SPECS))
        raise ValueError(f"no simulated hardware for GPU {name!r} (known: {known})") from None


@dataclass(frozen=True)
class SimulatedGpu:
    """The static facts of one simulated GPU."""

    index: int
    spec: GpuSpec
    uuid: str
    pci_bus_id: str
    nvlinks: int
    baseline: Baseline | None = None

    @property
    def serial(self) -> str:
        """The board's serial number (nvmlDeviceGetSerial): 13 digits, as
        `nvidia-smi -q` shows a data-centre board's, drawn from its UUID
        (any text: a replayed capture's may be a pseudonym) so that a
        replaced board has its own."""
        digest = hashlib.sha256(self.uuid.encode()).digest()
        return f"{int.from_bytes(digest[:8]) % 10**13:013d}"


@dataclass(frozen=True)
class LinkState:
    active: bool
    counters: Mapping[str, int]  # NVLINK_ERROR_TYPES -> cumulative count
    ber: Mapping[str, float]  # NVLINK_BER_TYPES -> errors per bit (NVLink5)


@dataclass(frozen=True)
class MemoryRepairs:
    """Row remapping (Ampere and newer) or page retirement (older GPUs)."""

    remapped_rows_correctable: int = 0
    remapped_rows_uncorrectable: int = 0
    row_remap_pending: bool = False
    row_remap_failed: bool = False
    retired_pages: Mapping[str, int] = field(default_factory=dict)  # RETIRED_PAGE_CAUSES
    retired_pages_pending: bool = False
    # Row-remapper banks by spare rows left (ROW_REMAPPER_BUCKETS); empty before Ampere.
    remapper_banks: Mapping[str, int] = field(default_factory=dict)
    sram_threshold_exceeded: bool = False


@dataclass(frozen=True)
class Baseline:
    """Where a captured GPU's counters and links stood when it was captured:
    its simulation starts there (the model's own counts are added on top)."""

    ecc_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    violation_ns: Mapping[str, int] = field(default_factory=dict)
    link_counters: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    links_down: frozenset[int] = frozenset()
    repairs: MemoryRepairs | None = None


@dataclass(frozen=True)
class GpuState:
    """What one GPU reports at one moment, in NVML's units."""

    lost: bool
    temperature_celsius: int
    memory_temperature_celsius: int
    sm_clock_mhz: int
    memory_clock_mhz: int
    power_milliwatts: int
    # Energy since the driver was loaded (NVML's unit, millijoules).
    energy_millijoules: int
    # Device memory allocated by processes (nvmlMemory_v2_t.used).
    memory_used_bytes: int
    pcie_generation: int
    pcie_width: int
    pcie_replays: int  # cumulative
    # (nvmlGpuFabricState_t, status): registered (COMPLETED, SUCCESS) on a
    # node with NVLinks, NOT_SUPPORTED on one without.
    fabric: tuple[int, int]
    # The fabric health mask's fields a `fabric_health` fault sets (as nvml.h
    # packs them, FABRIC_HEALTH_FIELDS); 0: none, every field reads healthy.
    fabric_health: int
    utilization_gpu_percent: int
    utilization_memory_percent: int
    clocks_event_reasons: int
    violation_ns: Mapping[str, int]  # THROTTLE_REASONS -> cumulative nanoseconds
    ecc_errors: Mapping[tuple[str, str], int]  # (ECC_TYPES, ECC_SCOPES) -> count
    repairs: MemoryRepairs
    links: tuple[LinkState, ...]
    recovery_action: int = 0  # nvmlDeviceGpuRecoveryAction_t
    # Every call on the GPU answers NVML_ERROR_RESET_REQUIRED.
    reset_required: bool = False


@dataclass(frozen=True)
class _OperatingPoint:
    temperature: float
    reasons: int
    sm_clock: float
    power: float


@dataclass(frozen=True)
class XidRecord:
    gpu: int
    code: int
    time: float  # seconds since start


@dataclass(frozen=True)
class _Wave:
    """A slow sinusoid, so that background values drift instead of jumping."""

    amplitude: float
    period_s: float
    phase: float

    def at(self, t: float) -> float:
        return self.amplitude * math.sin(2 * math.pi * t / self.period_s + self.phase)


def _waves(rng: random.Random, amplitude: float) -> tuple[_Wave, _Wave]:
    return (
        _Wave(amplitude, rng.uniform(600, 1800), rng.uniform(0, 2 * math.pi)),
        _Wave(amplitude / 3, rng.uniform(90, 240), rng.uniform(0, 2 * math.pi)),
    )


def _sum(waves: tuple[_Wave, _Wave], t: float) -> float:
    return waves[0].at(t) + waves[1].at(t)


class _Background:
    """One GPU's healthy behaviour under a busy training load, drawn from the seed."""

    def __init__(self, rng: random.Random, spec: GpuSpec) -> None:
        low, high = spec.busy_power_watts
        self.temperature_base = rng.uniform(59.0, 66.0)
        self.temperature = _waves(rng, 4.0)
        self.memory_offset = rng.uniform(3.0, 6.0)
        self.utilization = _waves(rng, 4.0)
        self.memory_utilization_base = rng.uniform(40.0, 55.0)
        self.memory_utilization = _waves(rng, 5.0)
        self.power_low, self.power_high = low, high
        self.power = _waves(rng, (high - low) / 3)
        # Busy GPUs brush their power limit now and then: a small share of
        # time counted as power violation.
        self.power_violation_share = rng.uniform(0.001, 0.006)
        # Most GPUs count no corrected ECC errors; a few count one now and then.
        self.corrected_ecc_per_s = rng.choice((0.0, 0.0, 0.0, rng.uniform(1 / 7200, 1 / 900)))
        self.corrected_ecc_history = rng.choice((0, 0, rng.randint(1, 40)))
        # A training job holds most of the framebuffer, its share moving a
        # little. Drawn last, so that the values drawn before stay what each
        # seed gave before the framebuffer was modelled.
        self.memory_used_share_base = rng.uniform(0.78, 0.9)
        self.memory_used_share = _waves(rng, 0.03)

    def temperature_at(self, t: float) -> float:
        return min(72.0, max(55.0, self.temperature_base + _sum(self.temperature, t)))

    def utilization_at(self, t: float) -> int:
        return round(min(100.0, max(85.0, 94.0 + _sum(self.utilization, t))))

    def memory_utilization_at(self, t: float) -> int:
        return round(self.memory_utilization_base + _sum(self.memory_utilization, t))

    def memory_used_share_at(self, t: float) -> float:
        return min(0.97, max(0.5, self.memory_used_share_base + _sum(self.memory_used_share, t)))

    def power_at(self, t: float) -> float:
        middle = (self.power_low + self.power_high) / 2
        return min(self.power_high, max(self.power_low, middle + _sum(self.power, t)))

    def sm_clock_at(self, t: float, spec: GpuSpec) -> float:
        # At the top of its power swing a GPU drops a clock step or two.
        over = (self.power_at(t) - self.power_high + 40.0) / 20.0
        return spec.sm_max_mhz - spec.clock_step_mhz * math.floor(min(2.0, max(0.0, over)))


def _envelope(fault: Fault, t: float, ramp: float) -> float:
    """0..1: rises over `ramp` seconds from the fault's start, falls as long after its end."""
    if t < fault.at:
        return 0.0
    rise = min(1.0, (t - fault.at) / ramp)
    if t < fault.until:
        return rise
    peak = min(1.0, (fault.until - fault.at) / ramp)
    return max(0.0, peak - (t - fault.until) / ramp)


def _count(faults: tuple[Fault, ...], t: float) -> int:
    """How many of these one-shot faults have happened by time t."""
    return sum(1 for fault in faults if fault.at <= t)


def _any_active(faults: tuple[Fault, ...], t: float) -> bool:
    return any(fault.active(t) for fault in faults)


def _grown(faults: tuple[Fault, ...], t: float, share: float = 1.0) -> int:
    """Events counted by rate faults (rate x active time) by time t."""
    return sum(math.floor((fault.rate or 0.0) * share * fault.elapsed(t)) for fault in faults)


def _quantize(mhz: float, spec: GpuSpec) -> int:
    return int(round(mhz / spec.clock_step_mhz) * spec.clock_step_mhz)


def _shifted(now: Mapping[K, int], start: Mapping[K, int], base: Mapping[K, int]) -> dict[K, int]:
    """Counts moved so that they stood at `base` where they stood at `start`."""
    return {
        key: value + base[key] - start[key] if key in base else value for key, value in now.items()
    }


def _from_baseline(state: GpuState, start: GpuState, baseline: Baseline) -> GpuState:
    """`state` as it reads on a GPU whose counters stood at `baseline` at 0 s."""
    links = tuple(
        LinkState(
            active=link.active and index not in baseline.links_down,
            counters=_shifted(
                link.counters, start.links[index].counters, baseline.link_counters.get(index, {})
            ),
            ber=link.ber,
        )
        for index, link in enumerate(state.links)
    )
    repairs, base = state.repairs, baseline.repairs
    if base is not None:
        repairs = MemoryRepairs(
            remapped_rows_correctable=base.remapped_rows_correctable
            + repairs.remapped_rows_correctable
            - start.repairs.remapped_rows_correctable,
            remapped_rows_uncorrectable=base.remapped_rows_uncorrectable
            + repairs.remapped_rows_uncorrectable
            - start.repairs.remapped_rows_uncorrectable,
            row_remap_pending=base.row_remap_pending or repairs.row_remap_pending,
            row_remap_failed=base.row_remap_failed or repairs.row_remap_failed,
            retired_pages=_shifted(
                repairs.retired_pages, start.repairs.retired_pages, base.retired_pages
            ),
            retired_pages_pending=base.retired_pages_pending or repairs.retired_pages_pending,
            remapper_banks=base.remapper_banks or repairs.remapper_banks,
            sram_threshold_exceeded=base.sram_threshold_exceeded or repairs.sram_threshold_exceeded,
        )
    return replace(
        state,
        violation_ns=_shifted(state.violation_ns, start.violation_ns, baseline.violation_ns),
        ecc_errors=_shifted(state.ecc_errors, start.ecc_errors, baseline.ecc_errors),
        repairs=repairs,
        links=links,
    )


class _GpuModel:
    """One GPU: its background and the scenario's faults on it."""

    def __init__(self, gpu: SimulatedGpu, faults: tuple[Fault, ...], seed: int) -> None:
        self.gpu = gpu
        self._faults = faults
        self._background = _Background(random.Random(f"{seed}/gpu/{gpu.index}"), gpu.spec)
        # Energy at the end of each ENERGY_STEP_S step: [0] is time 0.
        self._energy_steps = [0.0]
        for fault in faults:
            if fault.link is not None and fault.link >= gpu.nvlinks:
                raise ValueError(
                    f"{fault.kind} at {fault.at:g}s: GPU {gpu.index} ({gpu.spec.name}) has "
                    f"{gpu.nvlinks} NVLinks, no link {fault.link}"
                )
            if fault.kind == "row_remap_exhausted" and not gpu.spec.remaps_rows:
                raise ValueError(
                    f"{fault.kind} at {fault.at:g}s: GPU {gpu.index} ({gpu.spec.name}) retires "
                    "pages; it has no row remapper"
                )
            if (fault.bank or 0) >= gpu.spec.memory_banks:
                raise ValueError(
                    f"{fault.kind} at {fault.at:g}s: GPU {gpu.index} ({gpu.spec.name}) has "
                    f"{gpu.spec.memory_banks} memory banks, no bank {fault.bank}"
                )
        self._start = self._own_state_at(0.0)

    def _of(self, kind: str, link: int | None = None) -> tuple[Fault, ...]:
        return tuple(f for f in self._faults if f.kind == kind and (link is None or f.link == link))

    def xids(self) -> list[XidRecord]:
        index = self.gpu.index
        records = [XidRecord(index, f.code or 0, f.at) for f in self._of("xid")]
        records += [
            XidRecord(index, f.code or XID_DOUBLE_BIT_ECC, f.at)
            for f in self._of("ecc_uncorrectable")
        ]
        records += [
            XidRecord(index, XID_ROW_REMAP_EVENT, f.at) for f in self._of("row_remap_pending")
        ]
        records += [
            XidRecord(index, XID_ROW_REMAP_FAILURE, f.at) for f in self._of("row_remap_failure")
        ]
        records += [
            XidRecord(index, XID_FALLEN_OFF_BUS, f.at - GPU_LOST_XID_LEAD_S)
            for f in self._of("gpu_lost")
        ]
        return records

    def state_at(self, t: float) -> GpuState:
        state, baseline = self._own_state_at(t), self.gpu.baseline
        return state if baseline is None else _from_baseline(state, self._start, baseline)

    def _operating_point(self, t: float) -> _OperatingPoint:
        """Temperature, clocks-event reasons, SM clock and power at time t."""
        spec, background = self.gpu.spec, self._background
        heat = max(
            (_envelope(f, t, THERMAL_RAMP_S) for f in self._of("thermal_throttle")), default=0.0
        )
        temperature = background.temperature_at(t)
        temperature += (spec.slowdown_celsius + THERMAL_OVERSHOOT_C - temperature) * heat
        reasons, sm_clock, power = 0, background.sm_clock_at(t, spec), background.power_at(t)
        # A lock (nvidia-smi -lgc) caps the clock and sets no reason bit.
        for fault in self._of("clocks_locked"):
            if fault.active(t) and fault.mhz is not None:
                sm_clock = min(sm_clock, fault.mhz)
        if heat >= 1.0:
            reasons |= _THERMAL_REASONS
            sm_clock = spec.sm_max_mhz * HW_SLOWDOWN_CLOCK_RATIO
            power *= HW_SLOWDOWN_POWER_RATIO
        if _any_active(self._of("power_brake"), t):
            reasons |= _POWER_BRAKE_REASONS
            sm_clock = min(sm_clock, spec.sm_max_mhz * HW_SLOWDOWN_CLOCK_RATIO)
            power *= HW_SLOWDOWN_POWER_RATIO
        if _any_active(self._of("power_cap"), t):
            reasons |= _POWER_CAP_REASON
            sm_clock = min(sm_clock, spec.sm_max_mhz * POWER_CAP_CLOCK_RATIO)
            power = spec.power_limit_watts - POWER_CAP_MARGIN_W
        for fault in self._of("clock_drift"):
            if fault.active(t):
                sm_clock *= fault.ratio or DEFAULT_CLOCK_DRIFT_RATIO
        # With nothing to run, the driver drops the clocks and says why.
        if self._idle(t):
            reasons |= _IDLE_REASON
            sm_clock = min(sm_clock, spec.idle_sm_mhz)
            power = min(power, spec.idle_power_watts)
        return _OperatingPoint(temperature, reasons, sm_clock, power)

    def _idle(self, t: float) -> bool:
        return _any_active(self._of("gpu_idle"), t)

    def _energy_joules(self, t: float) -> float:
        """Energy drawn by time t: the power integrated over ENERGY_STEP_S
        steps (midpoint rule), the steps before t summed once and kept, so the
        counter reads the same however often the model is advanced."""
        steps, rest = divmod(t, ENERGY_STEP_S)
        energy = self._energy_steps
        while len(energy) <= steps:
            middle = (len(energy) - 0.5) * ENERGY_STEP_S
            energy.append(energy[-1] + self._operating_point(middle).power * ENERGY_STEP_S)
        whole = int(steps)
        return energy[whole] + self._operating_point(t - rest / 2).power * rest

    def _pcie_link(self, t: float) -> tuple[int, int]:
        """(generation, width) the link runs at: the maxima on a busy GPU, or
        what a `pcie_downtrained` fault trained it to (half the lanes unless
        it says)."""
        spec = self.gpu.spec
        generation, width = spec.pcie_max_generation, spec.pcie_max_width
        for fault in self._of("pcie_downtrained"):
            if fault.active(t):
                generation = min(generation, fault.generation or generation)
                fallback = width if fault.generation else width // 2
                width = min(width, fault.width or fallback)
        return generation, width

    def _fabric(self, t: float) -> tuple[int, int]:
        """The GPU's fabric registration: an HGX board's GPUs reach the
        NVSwitches over NVLink and are registered by the time the node runs
        jobs; `fabric_unregistered` leaves one not started (the fabric
        manager never took it), or completed with the NVML error `code`."""
        if self.gpu.nvlinks == 0:
            return FABRIC_STATE_NOT_SUPPORTED, _SUCCESS
        for fault in self._of("fabric_unregistered"):
            if fault.active(t):
                if fault.code is None:
                    return FABRIC_STATE_NOT_STARTED, _SUCCESS
                return FABRIC_STATE_COMPLETED, fault.code
        return FABRIC_STATE_COMPLETED, _SUCCESS

    def _fabric_health(self, t: float) -> int:
        """The health mask fields the active `fabric_health` faults set."""
        mask = 0
        for fault in self._of("fabric_health"):
            if fault.active(t):
                mask |= fault.mask or 0
        return mask

    def _memory_used_bytes(self, t: float) -> int:
        spec = self.gpu.spec
        available = spec.memory_total_bytes - spec.memory_reserved_bytes
        share = self._background.memory_used_share_at(t)
        return round(available * share / _MIB) * _MIB

    def _own_state_at(self, t: float) -> GpuState:
        spec, background = self.gpu.spec, self._background
        point = self._operating_point(t)
        temperature = point.temperature
        generation, width = self._pcie_link(t)
        idle = self._idle(t)
        return GpuState(
            lost=_any_active(self._of("gpu_lost"), t),
            temperature_celsius=round(temperature),
            memory_temperature_celsius=round(temperature + background.memory_offset),
            sm_clock_mhz=_quantize(point.sm_clock, spec),
            memory_clock_mhz=spec.memory_mhz,
            power_milliwatts=round(point.power * 1000),
            energy_millijoules=round(self._energy_joules(t) * 1000),
            memory_used_bytes=self._memory_used_bytes(t),
            pcie_generation=generation,
            pcie_width=width,
            pcie_replays=_grown(self._of("pcie_replay_storm"), t),
            fabric=self._fabric(t),
            fabric_health=self._fabric_health(t),
            utilization_gpu_percent=0 if idle else background.utilization_at(t),
            utilization_memory_percent=0 if idle else background.memory_utilization_at(t),
            clocks_event_reasons=point.reasons,
            violation_ns=self._violation_ns(t),
            ecc_errors=self._ecc_errors(t),
            repairs=self._memory_repairs(t),
            links=tuple(self._link(link, t) for link in range(self.gpu.nvlinks)),
            recovery_action=self._recovery_action(t),
            reset_required=_any_active(self._of("reset_required"), t),
        )

    def _recovery_action(self, t: float) -> int:
        """The latest announced action that is still in force (0: none)."""
        active = [f for f in self._of("recovery_action") if f.active(t)]
        return max(active, key=lambda f: f.at).code or 0 if active else 0

    def nvml_errors(self, t: float) -> tuple[Fault, ...]:
        return tuple(f for f in self._of("nvml_error") if f.active(t))

    def _violation_ns(self, t: float) -> dict[str, int]:
        # Only a busy GPU brushes its power limit.
        idle_s = sum(f.elapsed(t) for f in self._of("gpu_idle"))
        power_s = self._background.power_violation_share * max(0.0, t - idle_s)
        power_s += sum(f.elapsed(t) for f in self._of("power_cap"))
        # Thermal violation time runs while the GPU sits at its throttle point,
        # from the end of the ramp up to the end of the fault.
        thermal_s = sum(
            max(0.0, min(t, f.until) - f.at - THERMAL_RAMP_S) for f in self._of("thermal_throttle")
        )
        # The thermal fault holds HW thermal slowdown as long as SW thermal.
        seconds = dict.fromkeys(THROTTLE_REASONS, 0.0) | {
            "power": power_s,
            "thermal": thermal_s,
            "hw_thermal_slowdown": thermal_s,
            "hw_power_brake_slowdown": sum(f.elapsed(t) for f in self._of("power_brake")),
        }
        return {reason: int(value * 1e9) for reason, value in seconds.items()}

    def _ecc_errors(self, t: float) -> dict[tuple[str, str], int]:
        corrected = math.floor(self._background.corrected_ecc_per_s * t)
        corrected += _grown(self._of("ecc_sbe_storm"), t)
        uncorrected = _count(self._of("ecc_uncorrectable"), t)
        volatile = dict(zip(ECC_TYPES, (corrected, uncorrected), strict=True))
        history = {"corrected": self._background.corrected_ecc_history, "uncorrected": 0}
        return {
            (kind, scope): volatile[kind] + (history[kind] if scope == "aggregate" else 0)
            for kind in ECC_TYPES
            for scope in ECC_SCOPES
        }

    def _memory_repairs(self, t: float) -> MemoryRepairs:
        uncorrectable = self._of("ecc_uncorrectable")
        remap_pending = self._of("row_remap_pending")
        pending = _any_active(uncorrectable + remap_pending, t)
        # A pending repair of a correctable row and an uncorrectable error each
        # take one more spare row, or retire one more page on older GPUs.
        correctable_repairs = _count(remap_pending, t)
        uncorrectable_repairs = _count(uncorrectable, t)
        if self.gpu.spec.remaps_rows:
            failed = _any_active(self._of("row_remap_failure"), t)
            # A remap fails when the row's bank (bank 0, say) has no spare row left.
            out = {f.bank or 0 for f in self._of("row_remap_exhausted") if f.active(t)}
            exhausted = len(out | ({0} if failed else set()))
            banks = dict.fromkeys(ROW_REMAPPER_BUCKETS, 0) | {
                "max": self.gpu.spec.memory_banks - exhausted,
                "none": exhausted,
            }
            return MemoryRepairs(
                remapped_rows_correctable=correctable_repairs,
                remapped_rows_uncorrectable=uncorrectable_repairs,
                row_remap_pending=pending,
                row_remap_failed=failed,
                remapper_banks=banks,
            )
        retired = (correctable_repairs, uncorrectable_repairs)
        return MemoryRepairs(
            retired_pages=dict(zip(RETIRED_PAGE_CAUSES, retired, strict=True)),
            retired_pages_pending=pending,
        )

    def _link(self, link: int, t: float) -> LinkState:
        storms = self._of("nvlink_crc_storm", link)
        # A healthy link counts no errors at all: every replay is worth a
        # warning (DCGM fails on any), so the calm node has none. On NVLink5
        # the storm's errors are those FEC could not correct (effective errors).
        counters = dict.fromkeys(NVLINK_ERROR_TYPES, 0) | {
            "crc_flit": _grown(storms, t),
            "crc_data": _grown(storms, t, CRC_DATA_SHARE),
            "replay": _grown(storms, t),
            "recovery": _grown(storms, t, RECOVERY_SHARE),
            "effective_errors": _grown(storms, t),
        }
        rate = sum(fault.rate or 0.0 for fault in storms if fault.active(t))
        # Symbol BER is not modelled: a calm link reports NVML's zero.
        ber = {"effective": rate / NVLINK5_LINK_BITS_PER_S, "symbol": 0.0}
        inactive = tuple(f for f in self._of("nvlink_inactive") if f.link is None or f.link == link)
        down = _any_active(self._of("nvlink_down", link) + inactive, t)
        return LinkState(active=not down, counters=counters, ber=ber)


def _pci_bus_id(index: int) -> str:
    # Past an HGX board's eight, buses between its own (0x60 on) that no
    # simulated HCA (0xC0 on) uses either, and below 0x100.
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0x60 + index - len(_HGX_BUSES)
    return f"00000000:{bus:02X}:00.0"


def _board_uuid(rng: random.Random) -> str:
    return f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}"


def _scenario_gpus(scenario: Scenario) -> tuple[SimulatedGpu, ...]:
    node = scenario.node
    specs = [spec_for(node.model_of(index)) for index in range(node.gpus)]
    rng = random.Random(f"{scenario.seed}/node")
    return tuple(
        SimulatedGpu(
            index=index,
            spec=spec,
            uuid=_board_uuid(rng),
            pci_bus_id=_pci_bus_id(index),
            nvlinks=min(node.nvlinks, spec.nvlinks),
        )
        for index, spec in enumerate(specs)
    )


def _replaced(gpus: tuple[SimulatedGpu, ...], scenario: Scenario) -> tuple[SimulatedGpu, ...]:
    """The node's GPUs with another board in each slot a `gpu_replaced` names
    (its UUID drawn apart, so the other boards keep theirs)."""
    slots = {fault.gpu for fault in scenario.faults_of("gpu_replaced")}
    return tuple(
        replace(gpu, uuid=_board_uuid(random.Random(f"{scenario.seed}/replaced/{gpu.index}")))
        if gpu.index in slots
        else gpu
        for gpu in gpus
    )


_GPU_FAULT_KINDS = frozenset(
    {
        "thermal_throttle",
        "power_cap",
        "power_brake",
        "clock_drift",
        "clocks_locked",
        "gpu_idle",
        "nvlink_crc_storm",
        "nvlink_down",
        "nvlink_inactive",
        "gpu_missing",
        "ecc_sbe_storm",
        "ecc_uncorrectable",
        "row_remap_pending",
        "row_remap_failure",
        "row_remap_exhausted",
        "gpu_replaced",
        "xid",
        "gpu_lost",
        "nvml_error",
        "reset_required",
        "recovery_action",
        "pcie_downtrained",
        "pcie_replay_storm",
        "fabric_unregistered",
        "fabric_health",
    }
)


def _present(scenario: Scenario) -> tuple[int, ...]:
    """The GPUs NVML enumerates, in index order: all but the `gpu_missing` ones.
    As on a real node, the GPUs after a missing one take lower NVML indices."""
    missing = set()
    for fault in scenario.faults_of("gpu_missing"):
        if fault.gpu is not None:
            missing.add(fault.gpu)
        else:
            missing.update(range(scenario.node.gpus - (fault.count or 1), scenario.node.gpus))
    return tuple(index for index in range(scenario.node.gpus) if index not in missing)


class SimulatedGpus:
    """The GPUs of a simulated node, moved through time by `advance(now)`.

    `gpus` are every GPU of the node by its physical index; `present` those
    NVML enumerates (its index i is `present[i]`).

    `now` is wall time; the scenario's fault times are relative to `start`.
    XIDs are queued for the NVML event sets once the model has advanced past
    their time (the first advance queues those at or before it).
    """

    def __init__(
        self, scenario: Scenario, start: float, gpus: tuple[SimulatedGpu, ...] | None = None
    ) -> None:
        """`gpus`: the static facts of each GPU, where they do not come from
        `scenario.node` (a captured node's)."""
        self.start = start
        self.gpus = _replaced(gpus if gpus is not None else _scenario_gpus(scenario), scenario)
        faults = tuple(f for f in scenario.faults if f.kind in _GPU_FAULT_KINDS)
        self._models = tuple(
            # A fault without a GPU (clocks_locked) is on every GPU.
            _GpuModel(gpu, tuple(f for f in faults if f.gpu in (None, gpu.index)), scenario.seed)
            for gpu in self.gpus
        )
        self.present = _present(scenario)
        self._drift = scenario.faults_of("config_drift")
        self._init_errors = scenario.faults_of("nvml_init_error")
        self._schedule = sorted(
            (record for model in self._models for record in model.xids()), key=lambda r: r.time
        )
        self._changed = threading.Condition()
        self._xid_log: list[XidRecord] = []
        self._xids_until = -math.inf
        self.now = start
        self._t = 0.0
        self._states = self._states_at(0.0)

    def _states_at(self, t: float) -> tuple[GpuState, ...]:
        return tuple(model.state_at(t) for model in self._models)

    def advance(self, now: float) -> None:
        t = max(0.0, now - self.start)
        states = self._states_at(t)
        with self._changed:
            self.now = now
            self._t = t
            self._states = states
            due = [r for r in self._schedule if self._xids_until < r.time <= t]
            self._xid_log.extend(due)
            self._xids_until = max(self._xids_until, t)
            self._changed.notify_all()

    def state(self, index: int) -> GpuState:
        return self._states[index]

    def settings(self, index: int) -> GpuSettings:
        """The GPU's configuration now, with the scenario's config_drift faults."""
        spec = self.gpus[index].spec
        values: dict[str, str] = {}
        for fault in self._drift:
            if fault.gpu == index and fault.active(self._t) and fault.setting is not None:
                default = DRIFTED.get(fault.setting)
                if default is None:  # power_limit
                    default = f"{spec.power_limit_watts - DRIFTED_POWER_LIMIT_WATTS:g}"
                values[fault.setting] = fault.value if fault.value is not None else default
        return GpuSettings(
            vbios_version=values.get("vbios_version", spec.vbios_version),
            ecc_mode=int(values.get("ecc_mode", "1")),
            persistence_mode=int(values.get("persistence_mode", "1")),
            mig_mode=int(values.get("mig_mode", "0")),
            power_limit_watts=float(values.get("power_limit", spec.power_limit_watts)),
        )

    def nvml_errors(self, index: int) -> tuple[Fault, ...]:
        """The scenario's `nvml_error` faults in force on this GPU now."""
        return self._models[index].nvml_errors(self._t)

    def nvml_init_error(self) -> int | None:
        """The NVML error nvmlInit answers now (the scenario's nvml_init_error)."""
        return next((f.code for f in self._init_errors if f.active(self._t)), None)

    @property
    def xid_count(self) -> int:
        """How many XIDs were raised so far: a cursor for `xids_from`."""
        with self._changed:
            return len(self._xid_log)

    def xids_from(self, cursor: int) -> tuple[XidRecord, ...]:
        with self._changed:
            return tuple(self._xid_log[cursor:])

    def wait_for_xid(self, cursor: int, timeout_s: float) -> None:
        """Block until an XID past `cursor` is raised or `timeout_s` passed (real time)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._xid_log) > cursor, timeout_s)
