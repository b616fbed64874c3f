"""The foundation end to end: the simulated 8-GPU node read by the production
sources, rendered by the exporter, parsed back and checked with promtool."""

from __future__ import annotations

from pathlib import Path

from daemon_support import simulated_daemon
from metrics_support import promtool_check
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

FULL_NODE = 'node: {gpus: 8, model: "NVIDIA H100 80GB HBM3", nvlinks: 18, hcas: 8}\nfaults: []\n'

GPU_FAMILIES = {
    "gpuwatchd_gpu_up": 8,
    "gpuwatchd_gpu_temperature_celsius": 16,
    "gpuwatchd_gpu_temperature_threshold_celsius": 24,
    "gpuwatchd_gpu_clock_hertz": 16,
    "gpuwatchd_gpu_max_clock_hertz": 16,
    "gpuwatchd_gpu_clocks_event_active": 8 * 9,
    "gpuwatchd_gpu_throttle_seconds": 8 * 6,
    "gpuwatchd_gpu_power_watts": 8,
    "gpuwatchd_gpu_power_limit_watts": 8,
    "gpuwatchd_gpu_energy_joules": 8,
    "gpuwatchd_gpu_framebuffer_bytes": 8 * 3,
    "gpuwatchd_gpu_pcie_link_generation": 8,
    "gpuwatchd_gpu_pcie_link_max_generation": 8,
    "gpuwatchd_gpu_pcie_link_width": 8,
    "gpuwatchd_gpu_pcie_link_max_width": 8,
    "gpuwatchd_gpu_pcie_replays": 8,
    "gpuwatchd_gpu_pcie_replays_per_minute": 8,
    "gpuwatchd_gpu_fabric_state_id": 8,
    "gpuwatchd_gpu_fabric_status": 8,
    "gpuwatchd_gpu_utilization_ratio": 8,
    "gpuwatchd_gpu_ecc_errors": 8 * 4,
    "gpuwatchd_gpu_remapped_rows": 16,
    "gpuwatchd_gpu_row_remap_pending": 8,
    "gpuwatchd_gpu_row_remap_failed": 8,
    "gpuwatchd_nvlink_up": 8 * 18,
    "gpuwatchd_source_up": 3,
    "gpuwatchd_build_info": 1,
    "gpuwatchd_infiniband_info": 8,
    "gpuwatchd_infiniband_state_id": 8,
    "gpuwatchd_infiniband_physical_state_id": 8,
    "gpuwatchd_infiniband_rate_bytes_per_second": 8,
    "gpuwatchd_infiniband_symbol_error": 8,
    "gpuwatchd_infiniband_port_data_received_bytes": 8,
    # Each GPU's and HCA's PCIe function, by severity.
    "gpuwatchd_pcie_aer_errors": (8 + 8) * 3,
    "gpuwatchd_gpu_config_info": 8,
}


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    families: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return families


def _render(tmp_path: Path, scenario: str = FULL_NODE, until: float = 30.0) -> str:
    with simulated_daemon(scenario, tmp_path) as sim:
        sim.run_until(until)
        return generate_latest(sim.daemon.registry).decode()


def test_full_node_exports_every_family_for_8_gpus_18_links_and_8_hcas(tmp_path: Path) -> None:
    families = _families(_render(tmp_path))
    for name, count in GPU_FAMILIES.items():
        assert name in families, f"{name} missing"
        assert len(families[name]) == count, f"{name}: {len(families[name])} series"
    # Hopper reports CRC, replay and recovery per link through nvmlDeviceGetNvLinkErrorCounter.
    link_types = {labels["type"] for _, labels, _ in families["gpuwatchd_nvlink_errors"]}
    assert link_types == {"crc_flit", "replay", "recovery"}
    assert len(families["gpuwatchd_nvlink_errors"]) == 8 * 18 * 3
    assert "gpuwatchd_poll_duration_seconds" in families
    for _, labels, _ in families["gpuwatchd_gpu_power_watts"]:
        assert set(labels) == {"gpu", "uuid", "model"}
        assert labels["model"] == "NVIDIA H100 80GB HBM3" and labels["uuid"].startswith("GPU-")


def test_absent_readings_are_absent_series_not_zeros(tmp_path: Path) -> None:
    families = _families(_render(tmp_path))
    # H100 has no page retirement (remapping replaced it): no retired-pages series at all.
    assert "gpuwatchd_gpu_retired_pages" not in families
    assert "gpuwatchd_gpu_retired_pages_pending" not in families


def test_exposition_passes_promtool_check_metrics(tmp_path: Path) -> None:
    text = _render(
        tmp_path,
        "faults: [{at: 5s, kind: xid, gpu: 1, code: 79}, {at: 6s, kind: gpu_lost, gpu: 1}]\n",
    )
    assert promtool_check(text) == (0, "")


def test_lost_gpu_is_down_while_the_others_keep_reporting(tmp_path: Path) -> None:
    families = _families(
        _render(tmp_path, "faults: [{at: 5s, kind: gpu_lost, gpu: 2}]\n", until=20.0)
    )
    up = {labels["gpu"]: value for _, labels, value in families["gpuwatchd_gpu_up"]}
    assert up["2"] == 0.0
    assert all(value == 1.0 for gpu, value in up.items() if gpu != "2")
    temperatures = {labels["gpu"] for _, labels, _ in families["gpuwatchd_gpu_temperature_celsius"]}
    assert "2" not in temperatures and len(temperatures) == 7
    xids = {
        (labels["gpu"], labels["xid"]): v for _, labels, v in families["gpuwatchd_gpu_xid_errors"]
    }
    assert xids[("2", "79")] == 1.0


def test_repeated_xids_are_counted_not_overwritten(tmp_path: Path) -> None:
    scenario = (
        "faults:\n"
        "  - {at: 2s, kind: xid, gpu: 0, code: 13}\n"
        "  - {at: 12s, kind: xid, gpu: 0, code: 13}\n"
        "  - {at: 22s, kind: xid, gpu: 0, code: 31}\n"
    )
    families = _families(_render(tmp_path, scenario))
    xids = {
        (labels["gpu"], labels["xid"]): v for _, labels, v in families["gpuwatchd_gpu_xid_errors"]
    }
    assert xids == {("0", "13"): 2.0, ("0", "31"): 1.0}


def test_a_node_that_mixes_models_expects_the_nvlinks_its_smallest_model_has(
    tmp_path: Path,
) -> None:
    # An H100 has 18 NVLinks, an A100 12: expecting 18 of every GPU would
    # call the A100 short of six links and quarantine it.
    scenario = 'node: {models: ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]}\nfaults: []\n'
    with simulated_daemon(scenario, tmp_path) as sim:
        assert sim.daemon.config.checks.nvlink.expected_links == 12
        snapshot = sim.run_until(600)
    assert [g.name for g in snapshot.gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
    assert [f.code for f in snapshot.findings if f.check == "nvlink"] == []
    assert snapshot.quarantines == ()
