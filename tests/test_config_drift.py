"""Config drift: GPUs of one node that disagree on VBIOS, ECC, persistence,
MIG, power limit or application clocks, read through the fake NVML library,
judged on the node (a warning, never a quarantine) and exported as info."""

from __future__ import annotations

import pytest
from gpu_history import T0, gpu
from nvml_support import simulated_node

from gpuwatchd.checks import config_drift
from gpuwatchd.export import config as config_export
from gpuwatchd.history import History
from gpuwatchd.model import Action, GpuSample, Reading, Severity
from gpuwatchd.sim.scenario import CONFIG_SETTINGS
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.sources import NvmlSourceConfig

ALIKE = {
    "name": "NVIDIA H100 80GB HBM3",
    "vbios_version": "96.00.99.00.01",
    "ecc_enabled": True,
    "persistence_enabled": True,
    "mig_enabled": False,
    "power_limit_watts": 700.0,
    "sm_application_clock_hertz": 1755e6,
    "memory_application_clock_hertz": 2619e6,
}


def judged(gpus: list[GpuSample]) -> list[tuple[str, str, Severity, str]]:
    history = History(max_age_seconds=3600.0)
    history.record(Reading(source="nvml", time=T0, gpus=tuple(gpus)))
    output = config_drift.run(history)
    return [(f.subject, f.code, f.severity, str(f.evidence["settings"])) for f in output.findings]


def node(**changed: object) -> list[GpuSample]:
    """Four alike GPUs, GPU 2 with `changed`."""
    return [gpu(i, **{**ALIKE, **(changed if i == 2 else {})}) for i in range(4)]


def test_gpus_configured_alike_raise_nothing() -> None:
    assert judged(node()) == []


def test_one_gpu_with_ecc_off_is_a_node_warning_naming_the_setting_and_gpus() -> None:
    history = History(max_age_seconds=3600.0)
    history.record(Reading(source="nvml", time=T0, gpus=tuple(node(ecc_enabled=False))))
    (finding,) = config_drift.run(history).findings
    assert (finding.subject, finding.severity, finding.action) == (
        "node",
        Severity.WARN,
        Action.NONE,
    )
    assert not finding.definitive and not finding.immediate
    assert "ecc_mode: enabled on GPU 0,1,3, disabled on GPU 2" in finding.message


def test_every_setting_that_disagrees_is_named_in_one_finding() -> None:
    changed = node(vbios_version="96.00.74.00.11", power_limit_watts=600.0)
    assert judged(changed) == [("node", "config_drift", Severity.WARN, "vbios_version,power_limit")]


def test_a_setting_one_gpu_does_not_report_is_no_disagreement() -> None:
    assert judged(node(vbios_version=None, mig_enabled=None)) == []


def test_milliwatts_of_difference_in_the_power_limit_are_not_drift() -> None:
    assert judged(node(power_limit_watts=700.0004)) == []


def test_gpus_of_different_models_are_not_compared() -> None:
    gpus = node()
    gpus[3] = gpu(3, **{**ALIKE, "name": "NVIDIA A100-SXM4-80GB", "power_limit_watts": 400.0})
    assert judged(gpus) == []


def test_a_lost_gpu_is_not_compared() -> None:
    gpus = node()
    gpus[2] = gpu(2, up=False, ecc_enabled=False)
    assert judged(gpus) == []


@pytest.mark.parametrize("setting", CONFIG_SETTINGS)
def test_a_drifted_setting_of_the_simulator_is_read_through_nvml_and_found(setting: str) -> None:
    # Persistence is read every poll (nvidia-smi -pm changes it while the
    # driver runs); the other settings with the GPU's static values, every
    # static_refresh, so the drift is found there.
    faults = f"[{{at: 5s, kind: config_drift, gpu: 1, setting: {setting}}}]"
    refresh = NvmlSourceConfig().static_refresh
    with simulated_node(faults, gpus=3) as sim:
        before = sim.poll_at(1)
        after = sim.poll_at(10 if setting == "persistence_mode" else 1 + refresh)
    history = History(max_age_seconds=3600.0)
    history.record(before)
    assert config_drift.run(history).findings == ()
    history.record(after)
    (finding,) = config_drift.run(history).findings
    assert finding.evidence["settings"] == setting


def test_the_config_info_series_has_one_series_per_gpu_with_its_settings() -> None:
    with simulated_node("[{at: 0s, kind: config_drift, gpu: 1, setting: mig_mode}]") as sim:
        reading = sim.poll_at(1)
    snapshot = Snapshot(time=T0, gpus=reading.gpus or (), driver_version="570.172.08")
    (family,) = config_export.families(snapshot)
    samples = {s.labels["gpu"]: s.labels for s in family.samples}
    assert family.name == "gpuwatchd_gpu_config" and set(samples) == {"0", "1"}
    assert samples["0"]["mig_mode"] == "disabled" and samples["1"]["mig_mode"] == "enabled"
    assert samples["0"]["ecc_mode"] == "enabled" and samples["0"]["persistence_mode"] == "enabled"
    assert samples["0"]["vbios_version"] == "96.00.99.00.01"
    assert samples["0"]["driver_version"] == "570.172.08"
