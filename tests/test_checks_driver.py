"""What the GPUs depend on: persistence mode, the fabric manager and CUDA's
nvidia-uvm module, each a warning on the node that names the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

from daemon_support import simulated_daemon
from gpu_history import gpu, record

from gpuwatchd.checks import driver
from gpuwatchd.history import History
from gpuwatchd.model import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_STARTED,
    FABRIC_STATE_NOT_SUPPORTED,
    Reading,
    Severity,
)

NODE = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"


def codes(history: History, canaries: bool = False) -> dict[str, str]:
    return {f.code: f.message for f in driver.run(history, canaries).findings}


def test_persistence_mode_off_warns_naming_the_gpus_and_the_service() -> None:
    history = record(
        History(3600.0), 10.0, [gpu(0, persistence_enabled=True), gpu(1, persistence_enabled=False)]
    )
    [finding] = driver.run(history).findings
    assert (finding.subject, finding.code, finding.severity) == (
        "node",
        "persistence_mode_off",
        Severity.WARN,
    )
    assert "GPU(s) 1" in finding.message and "nvidia-persistenced" in finding.message


def test_no_gpu_of_an_nvswitch_node_registering_says_the_fabric_manager_is_not_running() -> None:
    waiting = [gpu(i, fabric_state=FABRIC_STATE_NOT_STARTED) for i in range(4)]
    assert (
        "nvidia-fabricmanager"
        in codes(record(History(3600.0), 10.0, waiting))["fabric_manager_not_running"]
    )


def test_a_fabric_that_registered_some_gpus_or_none_to_register_is_no_such_finding() -> None:
    some = [
        gpu(0, fabric_state=FABRIC_STATE_COMPLETED),
        gpu(1, fabric_state=FABRIC_STATE_NOT_STARTED),
    ]
    assert codes(record(History(3600.0), 10.0, some)) == {}
    pcie = [gpu(i, fabric_state=FABRIC_STATE_NOT_SUPPORTED) for i in range(2)]
    assert codes(record(History(3600.0), 10.0, pcie)) == {}


def test_nvidia_uvm_missing_warns_only_where_canaries_run() -> None:
    history = History(3600.0)
    history.record(Reading("nvml", 10.0, gpus=(gpu(0),), nvidia_uvm_loaded=False))
    assert "nvidia-modprobe -u" in codes(history, canaries=True)["nvidia_uvm_not_loaded"]
    assert codes(history, canaries=False) == {}


def test_a_simulated_node_without_nvidia_uvm_warns_with_canaries_on(tmp_path: Path) -> None:
    with simulated_daemon(NODE + "faults: []\n", tmp_path, canary=True) as sim:
        shutil.rmtree(Path(sim.node.sysfs_root) / "module" / "nvidia_uvm")
        snapshot = sim.run_until(40)
    [finding] = [f for f in snapshot.findings if f.code == "nvidia_uvm_not_loaded"]
    assert finding.subject == "node" and finding.severity is Severity.WARN


def test_a_simulated_node_ready_for_cuda_has_no_driver_finding(tmp_path: Path) -> None:
    with simulated_daemon(NODE + "faults: []\n", tmp_path, canary=True) as sim:
        snapshot = sim.run_until(40)
    assert {f.code for f in snapshot.findings if f.check == driver.NAME} == set()
