"""A whole simulated node: the GPU model behind a fake libnvidia-ml, and a
sysfs tree of InfiniBand ports and of the GPUs' and HCAs' PCIe functions,
moved together to the daemon's clock.

The production NVML and InfiniBand sources read it unchanged: they see the
fake library through nvidia-ml-py and real files under `sysfs_root`. A
scenario on a capture (`node: {capture: FILE}`) takes its GPUs, refusals and
InfiniBand tree from the capture (`gpuwatchd.sim.replay`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from gpuwatchd.clock import Clock
from gpuwatchd.sim.fake_nvml import FakeNvml
from gpuwatchd.sim.gpu import SimulatedGpus
from gpuwatchd.sim.infiniband import SimulatedFabric
from gpuwatchd.sim.kmsg import SimulatedKernelLog
from gpuwatchd.sim.pcie import SimulatedPcie
from gpuwatchd.sim.replay import CapturedFabric, CapturedNode
from gpuwatchd.sim.scenario import Scenario


class SimulatedNode:
    def __init__(
        self,
        scenario: Scenario,
        sysfs_root: Path,
        start: float,
        max_event_wait_seconds: float | None = None,
    ) -> None:
        self.scenario = scenario
        self.sysfs_root = sysfs_root
        # Not advanced here: the first poll does it, after the NVML source has
        # registered for XIDs (NVML replays nothing from before registration,
        # so an XID at 0s would otherwise be lost).
        self.fabric: SimulatedFabric | CapturedFabric
        self.captured: CapturedNode | None = None
        # A captured node has no PCIe tree: its capture holds none.
        self.pcie: SimulatedPcie | None = None
        if scenario.node.capture is None:
            self.gpus = SimulatedGpus(scenario, start)
            self.nvml = FakeNvml(self.gpus, max_wait_s=max_event_wait_seconds)
            self.fabric = SimulatedFabric(scenario, sysfs_root, start)
            bus_ids = [gpu.pci_bus_id for gpu in self.gpus.gpus]
            self.pcie = SimulatedPcie(scenario, sysfs_root, start, bus_ids)
        else:
            self.captured = CapturedNode(scenario.node.capture)
            self.gpus = SimulatedGpus(scenario, start, self.captured.gpus())
            self.nvml = self.captured.fake(self.gpus, max_event_wait_seconds)
            self.fabric = self.captured.fabric(sysfs_root)
        # Beside the sysfs tree: the kernel log the NVML source reads XIDs from,
        # and this boot's id (a node made anew is booted anew).
        self.kernel_log = SimulatedKernelLog(scenario, self.gpus, Path(sysfs_root) / "kmsg")
        self.boot_id_path = Path(sysfs_root) / "boot_id"
        self.boot_id_path.write_text(f"{uuid.uuid4()}\n", encoding="ascii")
        # The driver's modules, as loaded on a node ready for CUDA.
        for module in ("nvidia", "nvidia_uvm"):
            (Path(sysfs_root) / "module" / module).mkdir(parents=True, exist_ok=True)

    def advance(self, now: float) -> None:
        """Move the hardware to wall time `now` (called before every poll)."""
        self.gpus.advance(now)
        self.kernel_log.advance(now)
        self.fabric.advance(now)
        if self.pcie is not None:
            self.pcie.advance(now)

    def uptime(self, clock: Clock) -> Callable[[], float]:
        """The node's kernel time now, as `clock` moves."""
        return lambda: self.kernel_log.uptime(clock.now())

    def install(self) -> SimulatedNode:
        """Make nvidia-ml-py talk to this node's fake library."""
        self.nvml.install()
        return self

    def uninstall(self) -> None:
        self.nvml.uninstall()
