"""PCIe metric families of the GPUs' and HCAs' functions, rendered fresh from a Snapshot.

`gpuwatchd_pcie_aer_errors_total{device,kind,name,severity}`: the kernel's AER
totals since boot (the `TOTAL_ERR_*` line of each `aer_dev_*` file), one
series per function and severity; the per-cause lines are left to the
finding's message, since node_exporter's one-series-per-cause layout costs 44
series per function. `device` is the PCI address as sysfs names it (as
node_exporter's pcidevice collector), `kind` is `gpu` or `hca`, `name` the
GPU's index (from its NVML PCI bus id) or the HCA's InfiniBand device, empty
where unknown. An absent file is an absent series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from gpuwatchd.export.held import held_series
from gpuwatchd.model import AER_SEVERITIES, PcieFunctionSample, canonical_address
from gpuwatchd.snapshot import Snapshot


def _name(function: PcieFunctionSample, gpus: dict[str, str]) -> str:
    if function.name is not None:
        return function.name
    return gpus.get(function.address, "")


def families(snapshot: Snapshot) -> Iterator[Metric]:
    gpus = {
        address: str(gpu.index)
        for gpu in snapshot.gpus
        if gpu.pci_bus_id and (address := canonical_address(gpu.pci_bus_id))
    }
    errors = CounterMetricFamily(
        "gpuwatchd_pcie_aer_errors",
        "PCIe AER errors the function reported since boot, by severity "
        "(correctable, nonfatal, fatal; the kernel's aer_dev_* totals).",
        labels=("device", "kind", "name", "severity"),
    )
    series = [
        ((function.address, function.kind, _name(function, gpus), severity), float(count))
        for function in snapshot.pcie_functions
        for severity in AER_SEVERITIES
        if (count := function.aer_errors.get(severity)) is not None
    ]
    # AER counts stand still on a healthy bus: encoded again only when one moved.
    yield held_series(errors, series)
