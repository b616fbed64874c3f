"""The shipped Prometheus and Alertmanager configuration: it loads, every alert
is unit-tested both ways, documented, and reads only series that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PROMETHEUS = REPO / "config" / "prometheus"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
ALERTMANAGER = REPO / "config" / "alertmanager" / "alertmanager.yml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_URL = "https://github.com/gpuwatchd/gpuwatchd/blob/main/docs/runbooks.md#"

# What the daemon exports, by the names the issues fixed: rules and dashboards
# may read these, the series they record themselves, `up` and `ALERTS`.
EXPORTED_METRICS = frozenset(
    {
        # GPUs
        "gpuwatchd_gpu_up",
        "gpuwatchd_gpu_temperature_celsius",
        "gpuwatchd_gpu_temperature_threshold_celsius",
        "gpuwatchd_gpu_clock_hertz",
        "gpuwatchd_gpu_max_clock_hertz",
        "gpuwatchd_gpu_application_clock_hertz",
        "gpuwatchd_gpu_clocks_event_active",
        "gpuwatchd_gpu_throttle_seconds_total",
        "gpuwatchd_gpu_power_watts",
        "gpuwatchd_gpu_power_limit_watts",
        "gpuwatchd_gpu_pcie_link_generation",
        "gpuwatchd_gpu_pcie_link_max_generation",
        "gpuwatchd_gpu_pcie_link_width",
        "gpuwatchd_gpu_pcie_link_max_width",
        "gpuwatchd_gpu_pcie_replays_total",
        "gpuwatchd_pcie_aer_errors_total",
        "gpuwatchd_gpu_config_info",
        "gpuwatchd_gpu_fabric_state_id",
        "gpuwatchd_gpu_fabric_status",
        "gpuwatchd_gpu_framebuffer_bytes",
        "gpuwatchd_gpu_energy_joules_total",
        "gpuwatchd_gpu_utilization_ratio",
        "gpuwatchd_gpu_memory_utilization_ratio",
        "gpuwatchd_gpu_ecc_errors_total",
        "gpuwatchd_gpu_remapped_rows",
        "gpuwatchd_gpu_row_remap_pending",
        "gpuwatchd_gpu_row_remap_failed",
        "gpuwatchd_gpu_retired_pages",
        "gpuwatchd_gpu_retired_pages_pending",
        "gpuwatchd_gpu_xid_errors_total",
        "gpuwatchd_nvlink_up",
        "gpuwatchd_nvlink_errors_total",
        "gpuwatchd_gpu_nvlinks_up",
        "gpuwatchd_gpu_nvlink_errors_total",
        # The daemon
        "gpuwatchd_source_up",
        "gpuwatchd_poll_duration_seconds_bucket",
        "gpuwatchd_build_info",
        "gpuwatchd_last_poll_timestamp_seconds",
        "gpuwatchd_state_persisted",
        # InfiniBand: node_exporter 1.5's names with gpuwatchd_ for node_
        "gpuwatchd_infiniband_info",
        "gpuwatchd_infiniband_state_id",
        "gpuwatchd_infiniband_physical_state_id",
        "gpuwatchd_infiniband_rate_bytes_per_second",
        "gpuwatchd_infiniband_symbol_error_total",
        "gpuwatchd_infiniband_link_downed_total",
        "gpuwatchd_infiniband_link_error_recovery_total",
        "gpuwatchd_infiniband_local_link_integrity_errors_total",
        "gpuwatchd_infiniband_excessive_buffer_overrun_errors_total",
        "gpuwatchd_infiniband_port_errors_received_total",
        "gpuwatchd_infiniband_port_transmit_wait_total",
        "gpuwatchd_infiniband_port_data_received_bytes_total",
        "gpuwatchd_infiniband_port_data_transmitted_bytes_total",
        "gpuwatchd_infiniband_hw_counters_total",
        # Health
        "gpuwatchd_health_state",
        "gpuwatchd_node_health_state",
        "gpuwatchd_health_state_id",
        "gpuwatchd_node_health_state_id",
        "gpuwatchd_finding",
        "gpuwatchd_quarantined",
        "gpuwatchd_gpu_clock_drift_ratio",
        "gpuwatchd_gpu_throttle_ratio",
        # Canaries
        "gpuwatchd_canary_unchecked_since_timestamp_seconds",
        "gpuwatchd_canary_runs_total",
        "gpuwatchd_canary_last_pass_timestamp_seconds",
        "gpuwatchd_canary_duration_seconds",
        "gpuwatchd_canary_tflops",
        "gpuwatchd_canary_sm_coverage_ratio",
        "gpuwatchd_canary_bit_flips_total",
        "gpuwatchd_canary_gpu_runs_total",
        "gpuwatchd_canary_host_runs_total",
        # Webhooks
        "gpuwatchd_webhook_deliveries_total",
        "gpuwatchd_webhook_outbox_pending",
        "gpuwatchd_scheduler_drain_withheld",
    }
)

# Our series names: exported (gpuwatchd_...) and recorded (level:metric:operations).
SERIES_NAME = re.compile(r"\b(?:gpuwatchd|cluster_model|cluster)[:_][A-Za-z0-9_:]*")

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")


def series_names(expr: str) -> set[str]:
    """The gpuwatchd series an expression reads (label values and strings aside)."""
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return set(SERIES_NAME.findall(without_strings))


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


def recorded_series() -> set[str]:
    return {rule["record"] for rule in _rules() if "record" in rule}


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


@needs_promtool
def test_every_rule_file_passes_promtool_check_rules() -> None:
    result = _run("promtool", "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_sample_prometheus_config_passes_promtool_check_config() -> None:
    # It also loads the rule files and the file-discovery targets it names.
    result = _run("promtool", "check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(RULE_FILES)} rule files found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    result = _run("promtool", "test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("amtool") is None, reason="no amtool")
def test_alertmanager_config_passes_amtool() -> None:
    result = _run("amtool", "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("amtool") is None, reason="no amtool")
@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["alertname=GpuwatchdGpuDown", "severity=critical"], "gpuwatchd-webhook,slack-critical"),
        (["alertname=GpuwatchdSourceDown", "severity=warning"], "gpuwatchd-webhook,slack-warnings"),
        (["alertname=NodeFilesystemFull", "severity=critical"], "slack-critical"),
    ],
)
def test_alertmanager_routes_gpuwatchd_alerts_to_the_webhook_and_slack_by_severity(
    labels: list[str], receivers: str
) -> None:
    result = _run("amtool", "config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == receivers


def test_every_alert_has_a_severity_and_the_three_annotations() -> None:
    for alert in alerts():
        name = alert["alert"]
        assert alert.get("labels", {}).get("severity") in ("critical", "warning"), name
        annotations = alert.get("annotations", {})
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["runbook_url"] == RUNBOOK_URL + name.lower(), name


def _runbook_sections() -> set[str]:
    return set(re.findall(r"^#{2,3} (Gpuwatchd\w+)$", RUNBOOKS.read_text(), flags=re.M))


def test_every_alert_has_a_runbook_section_and_every_section_an_alert() -> None:
    names = {alert["alert"] for alert in alerts()}
    assert names == _runbook_sections()


def test_alert_names_are_unique() -> None:
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names))


def _unit_test_cases() -> tuple[set[str], set[str]]:
    """Alerts that some promtool test expects to fire, and ones it expects silent."""
    fires: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    return fires, silent


def test_every_alert_is_unit_tested_firing_and_staying_silent() -> None:
    names = {alert["alert"] for alert in alerts()}
    fires, silent = _unit_test_cases()
    assert names - fires == set(), "alerts no promtool test sees firing"
    assert names - silent == set(), "alerts no promtool test sees staying silent"


def test_every_unit_test_file_loads_every_rule_file() -> None:
    # Alerts read records of other files: a test file that loads fewer tests less.
    for path in RULE_TESTS:
        loaded = {
            (path.parent / f).resolve() for f in yaml.safe_load(path.read_text())["rule_files"]
        }
        assert loaded == {f.resolve() for f in RULE_FILES}, path.name


def test_rules_read_only_exported_or_recorded_series() -> None:
    known = EXPORTED_METRICS | recorded_series()
    for rule in _rules():
        unknown = series_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')} reads {unknown}"


def test_aggregations_and_joins_keep_the_cluster_label() -> None:
    # Fleet views are per cluster: an aggregation without it would merge clusters.
    for rule in _rules():
        for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", rule["expr"]):
            labels = {label.strip() for label in clause.split(",")}
            assert "cluster" in labels, f"{rule.get('alert') or rule.get('record')}: ({clause})"
