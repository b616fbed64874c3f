"""An NVML call that hangs on one GPU (the fake's `hang`, as calls into a
driver in trouble do): the poll gives up on that GPU's read at its deadline,
reads the others, never stacks a second read on the stuck GPU, and judges
the hang as what it is: a GPU that cannot be read, not a faulty one.

The deadline runs on the injected clock: a test moves the clock past it once
the read is stuck, so no test waits for a real timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from daemon_support import simulated_daemon
from nvml_support import SimulatedNode, simulated_node
from prometheus_client import generate_latest

from gpuwatchd.model import Reading, Severity
from gpuwatchd.sim.fake_nvml import Hang
from gpuwatchd.snapshot import Snapshot

READ_TIMEOUT = 5.0  # NvmlSourceConfig's default
# Real seconds a test waits, at most, for a thread it depends on.
BOUND_S = 30.0


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpuwatchd-nvml"]


def _past_the_deadline(
    hang: Hang, advance: Callable[[float], None], poll: Callable[[], object]
) -> object:
    """Run `poll` in a thread, and once it is stuck in `hang`, move the clock
    past the read's deadline; what `poll` returned."""
    result: list[object] = []
    poller = threading.Thread(target=lambda: result.append(poll()))
    poller.start()
    assert hang.entered.wait(BOUND_S)
    advance(READ_TIMEOUT + 1)
    poller.join(BOUND_S)
    assert not poller.is_alive()
    return result[0]


def _hung_poll(node: SimulatedNode, at: float) -> Reading:
    hang = node.fake.hang("nvmlDeviceGetPowerUsage", gpu=1)
    reading = _past_the_deadline(hang, node.clock.advance, lambda: node.poll_at(at))
    assert isinstance(reading, Reading)
    return reading


def test_a_call_hung_on_one_gpu_leaves_the_others_read_and_that_gpu_unreadable() -> None:
    with simulated_node(gpus=3) as node:
        node.poll_at(0)
        reading = _hung_poll(node, 10)
        node.fake.clear_failures()
    assert reading.gpus is not None
    first, hung, last = reading.gpus
    assert first.power_watts is not None and last.power_watts is not None
    assert first.read and last.read
    assert hung.up and not hung.read
    assert hung.read_hung == "nvmlDeviceGetPowerUsage has not returned within 5s"
    # Absent, not zero, and the GPU still named.
    assert hung.power_watts is None and hung.temperature_gpu_celsius is None
    assert hung.uuid is not None and hung.uuid not in (first.uuid, last.uuid)


def test_a_stuck_gpu_is_not_read_again_until_its_call_returns() -> None:
    with simulated_node(gpus=3) as node:
        node.poll_at(0)
        hang = node.fake.hang("nvmlDeviceGetPowerUsage", gpu=1)
        _past_the_deadline(hang, node.clock.advance, lambda: node.poll_at(10))
        # Later polls do not wait for the stuck GPU, nor start another read on it.
        later = [node.poll_at(20 + 10 * n) for n in range(5)]
        assert len(hang.callers) == 1
        assert len(_reader_threads()) == 2  # the stuck reader and the working one
        gpus = later[-1].gpus
        assert gpus is not None
        assert gpus[1].read_hung is not None
        assert gpus[1].read_hung.startswith("nvmlDeviceGetPowerUsage has not returned for ")
        assert gpus[0].read and gpus[2].read
        # Once the driver lets the call go, its reader ends and the GPU is read again.
        hang.release()
        hang.callers[0].join(BOUND_S)
        assert not hang.callers[0].is_alive()
        again = node.poll_at(80).gpus
        assert again is not None
    assert again[1].read and again[1].power_watts is not None


def test_a_gpu_hung_for_half_an_hour_warns_and_is_never_quarantined(tmp_path: Path) -> None:
    scenario = 'node: {gpus: 2, model: "NVIDIA H100 80GB HBM3", hcas: 0}\n'
    with simulated_daemon(scenario, tmp_path) as sim:
        sim.run_until(60)
        fake = sim.node.nvml
        hang = fake.hang("nvmlDeviceGetPowerUsage", gpu=1)
        try:
            snapshot = _past_the_deadline(hang, sim.clock.advance, sim.daemon.step)
            assert isinstance(snapshot, Snapshot)
            snapshot = sim.run_until(60 + 1800)
            metrics = generate_latest(sim.daemon.registry).decode()
        finally:
            fake.clear_failures()
    findings = {(f.subject, f.code): f for f in snapshot.findings if f.severity is not Severity.OK}
    assert set(findings) == {("gpu:1", "gpu_read_hung")}
    assert findings["gpu:1", "gpu_read_hung"].severity is Severity.WARN
    assert snapshot.quarantines == ()
    # /metrics renders: the GPU is up, its readings absent, the hang a finding.
    assert 'gpuwatchd_gpu_up{gpu="1"' in metrics
    assert 'gpuwatchd_gpu_power_watts{gpu="0"' in metrics
    assert 'gpuwatchd_gpu_power_watts{gpu="1"' not in metrics
    assert 'code="gpu_read_hung"' in metrics


def test_the_watchdog_is_fed_by_polls_that_complete_around_a_hung_gpu(tmp_path: Path) -> None:
    scenario = 'node: {gpus: 2, model: "NVIDIA H100 80GB HBM3", hcas: 0}\n'
    with simulated_daemon(scenario, tmp_path) as sim:
        daemon = sim.daemon
        fake = sim.node.nvml
        hang = fake.hang("nvmlDeviceGetPowerUsage", gpu=0)
        pings: list[int] = []

        class Watchdog:
            """Counts pings with the polls done at each; stops after ten."""

            watchdog_seconds = 60.0

            def ready(self, status: str) -> None:
                pass

            def watchdog(self) -> None:
                pings.append(daemon.snapshot.polls)
                if len(pings) == 10:
                    daemon.stop()

            def stopping(self) -> None:
                pass

        try:
            _past_the_deadline(hang, sim.clock.advance, lambda: daemon.run(Watchdog()))  # type: ignore[arg-type]
        finally:
            fake.clear_failures()
    # Every ping follows a poll that completed; none was sent while the
    # first poll waited for the hung read.
    assert pings[0] == 1 and pings == sorted(pings) and pings[-1] >= 5
    hung = [gpu for gpu in daemon.snapshot.gpus if gpu.read_hung]
    assert [gpu.index for gpu in hung] == [0]


def test_the_reads_queued_behind_a_hung_gpu_are_read_once_and_not_by_its_stuck_reader() -> None:
    with simulated_node(gpus=4) as node:
        node.poll_at(0)
        before = node.fake.calls["nvmlDeviceGetPowerUsage"]
        hang = node.fake.hang("nvmlDeviceGetPowerUsage", gpu=1)
        reading = _past_the_deadline(hang, node.clock.advance, lambda: node.poll_at(10))
        assert isinstance(reading, Reading) and reading.gpus is not None
        assert [gpu.read for gpu in reading.gpus] == [True, False, True, True]
        # Once its call returns, the stuck reader ends without reading GPUs 2
        # and 3, which a new reader read in that poll: each GPU was asked once.
        hang.release()
        hang.callers[0].join(BOUND_S)
        assert not hang.callers[0].is_alive()
        assert node.fake.calls["nvmlDeviceGetPowerUsage"] - before == 4
        assert len(_reader_threads()) == 1
