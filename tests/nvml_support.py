"""Test support for the NVML side: a simulated node, served by the fake
libnvidia-ml under the real nvidia-ml-py, read by the NVML source."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuwatchd.clock import FakeClock
from gpuwatchd.model import GpuSample, Reading
from gpuwatchd.sim.fake_nvml import DEFAULT_DRIVER_VERSION, FakeNvml
from gpuwatchd.sim.gpu import SimulatedGpus
from gpuwatchd.sim.scenario import Scenario, parse
from gpuwatchd.sources import NvmlSourceConfig
from gpuwatchd.sources.nvml import NvmlSource

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
B200 = "NVIDIA B200"
V100 = "Tesla V100-SXM2-32GB"


def scenario(faults: str = "[]", *, model: str = H100, gpus: int = 2, seed: int = 1) -> Scenario:
    """A scenario file's text with `faults` as its YAML flow list, parsed."""
    return parse(f'node: {{gpus: {gpus}, model: "{model}"}}\nseed: {seed}\nfaults: {faults}\n')


@dataclass
class SimulatedNode:
    clock: FakeClock
    hardware: SimulatedGpus
    fake: FakeNvml
    source: NvmlSource

    def poll_at(self, seconds: float) -> Reading:
        """Move the clock and the hardware to `seconds` after start, then poll."""
        self.clock.advance(self.hardware.start + seconds - self.clock.now())
        self.hardware.advance(self.clock.now())
        return self.source.poll(self.clock.now())

    def gpu_at(self, seconds: float, index: int = 0) -> GpuSample:
        gpus = self.poll_at(seconds).gpus
        assert gpus is not None
        return gpus[index]


@contextlib.contextmanager
def simulated_node(
    faults: str = "[]",
    *,
    model: str = H100,
    gpus: int = 2,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    xid_thread: bool = False,
    config: NvmlSourceConfig | None = None,
    before_start: Callable[[FakeNvml], None] | None = None,
) -> Iterator[SimulatedNode]:
    """A node of `gpus` GPUs with the scripted `faults`, and an NVML source on it.

    `before_start` can change the fake library (remove a function, make one
    fail) before the source starts.
    """
    clock = FakeClock()
    hardware = SimulatedGpus(scenario(faults, model=model, gpus=gpus), clock.now())
    # Waits are capped so that an XID thread stops quickly when the test ends.
    with FakeNvml(hardware, driver_version=driver_version, max_wait_s=0.02) as fake:
        if before_start is not None:
            before_start(fake)
        # Not the host's /dev/kmsg: these nodes have no kernel log (tests/test_kernel_xids.py).
        config = config or NvmlSourceConfig(kernel_log=None)
        source = NvmlSource(clock, config, xid_thread=xid_thread)
        try:
            yield SimulatedNode(clock, hardware, fake, source)
        finally:
            source.close()
