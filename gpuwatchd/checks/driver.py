"""Driver check: what the GPUs depend on, as the node has it set up.

Reads what the NVML source said of NVML itself (History.nvml_unavailable:
NVML cannot start on a node whose PCI bus has NVIDIA GPUs) and of the
nvidia-uvm module, and each GPU's persistence mode and fabric state. Each
finding is on the node and names the fix:

- `nvml_unavailable`, critical (never definitive: the node is fine once the
  driver is): no GPU of the node can be watched or used. A driver and NVML
  library of different versions (LIB_RM_VERSION_MISMATCH, the classic state
  after a driver upgrade without a reboot) needs a reboot; a driver not
  loaded, a library not found or refused permission needs the driver's
  install looked at.
- `nvidia_uvm_not_loaded`, a warning while canaries run: CUDA needs the
  nvidia-uvm module and the daemon's unit may not load modules itself, so
  its canaries cannot start (systemd/gpuwatchd.service loads it before the
  daemon starts).
- `persistence_mode_off`, a warning: without nvidia-persistenced the driver
  tears each idle GPU down, and the next NVML or CUDA call waits for it to
  come up again (NVIDIA's driver persistence documentation).
- `fabric_manager_not_running`, a warning: on an NVSwitch system (GPUs that
  report a fabric state) no GPU's registration has started, which is what a
  node without nvidia-fabricmanager running shows; each GPU's own
  registration is the fabric check's (`fabric_unregistered`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gpuwatchd.checks import CheckOutput
from gpuwatchd.checks.common import NODE
from gpuwatchd.history import History
from gpuwatchd.model import (
    FABRIC_STATE_NOT_STARTED,
    FABRIC_STATE_NOT_SUPPORTED,
    Action,
    Finding,
    GpuSample,
    NvmlUnavailable,
    Severity,
)

NAME = "driver"

# nvml.h NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM detects a driver/library
# version mismatch"; the kernel module and the library are of two installs.
LIB_RM_VERSION_MISMATCH = 18


def run(history: History, canaries: bool = False) -> CheckOutput:
    """`canaries`: whether the daemon runs canaries (they need nvidia-uvm)."""
    findings: list[Finding] = []
    if history.nvml_unavailable is not None:
        findings.append(_unavailable(history.nvml_unavailable))
    if canaries and history.nvidia_uvm_loaded is False:
        findings.append(_no_uvm())
    samples = [s for index in history.gpu_indices() if (s := history.latest_gpu(index))]
    findings.extend(_persistence(samples))
    findings.extend(_fabric_manager(samples))
    return CheckOutput(findings=tuple(findings))


def _unavailable(down: NvmlUnavailable) -> Finding:
    gpus = ", ".join(down.pci_addresses)
    if down.code == LIB_RM_VERSION_MISMATCH:
        what = (
            "the NVIDIA kernel module and its NVML library are of different versions (a "
            "driver upgrade without a reboot): reboot the node"
        )
        action = Action.REBOOT
    else:
        what = (
            "check the NVIDIA driver's install: the kernel module loaded (`lsmod | grep "
            "nvidia`, `dmesg`), DKMS built for this kernel, libnvidia-ml.so.1 installed, "
            "/dev/nvidia* readable by the daemon"
        )
        action = Action.CHECK_DRIVER
    return Finding(
        subject=NODE,
        check=NAME,
        code="nvml_unavailable",
        severity=Severity.CRITICAL,
        message=(
            f"NVML cannot start ({down.error}) on a node with {len(down.pci_addresses)} "
            f"NVIDIA GPU(s) on the PCI bus ({gpus}): no GPU can be watched, and CUDA cannot "
            f"run either; {what}"
        ),
        action=action,
        evidence={"nvml_error": down.error, "nvml_return": down.code or 0, "pci": gpus},
    )


def _no_uvm() -> Finding:
    return Finding(
        subject=NODE,
        check=NAME,
        code="nvidia_uvm_not_loaded",
        severity=Severity.WARN,
        message=(
            "the nvidia-uvm kernel module is not loaded: CUDA cannot start, so the canaries "
            "cannot run; load it before the daemon starts (`nvidia-modprobe -u -c=0`, as "
            "systemd/gpuwatchd.service's ExecStartPre does)"
        ),
        action=Action.CHECK_DRIVER,
    )


def _persistence(samples: Sequence[GpuSample]) -> Iterator[Finding]:
    off = [s.index for s in samples if s.read and s.persistence_enabled is False]
    if not off:
        return
    gpus = ",".join(map(str, off))
    yield Finding(
        subject=NODE,
        check=NAME,
        code="persistence_mode_off",
        severity=Severity.WARN,
        message=(
            f"persistence mode is off on GPU(s) {gpus}: the driver tears an idle GPU down and "
            "the next call waits for it to come up again; run nvidia-persistenced "
            "(`systemctl enable --now nvidia-persistenced`)"
        ),
        action=Action.CHECK_DRIVER,
        evidence={"gpus": gpus},
    )


def _fabric_manager(samples: Sequence[GpuSample]) -> Iterator[Finding]:
    states = [s.fabric_state for s in samples if s.read and s.fabric_state is not None]
    fabric = [state for state in states if state != FABRIC_STATE_NOT_SUPPORTED]
    if not fabric or any(state != FABRIC_STATE_NOT_STARTED for state in fabric):
        return
    yield Finding(
        subject=NODE,
        check=NAME,
        code="fabric_manager_not_running",
        severity=Severity.WARN,
        message=(
            f"no GPU's NVSwitch fabric registration has started ({len(fabric)} GPU(s) with a "
            "fabric): nvidia-fabricmanager is not running; start it "
            "(`systemctl enable --now nvidia-fabricmanager`) before jobs use NVLink"
        ),
        action=Action.CHECK_DRIVER,
        evidence={"gpus": len(fabric)},
    )
