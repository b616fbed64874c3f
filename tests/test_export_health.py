"""Health metric families: states, findings, quarantines and measurements,
rendered from a Snapshot and checked by promtool."""

from __future__ import annotations

from dataclasses import replace

import metrics_support
from gpu_history import T0
from metrics_support import promtool_check

from gpuwatchd.export.detail import ExportConfig
from gpuwatchd.export.health import families
from gpuwatchd.model import Finding, Health, Measurement, Quarantine, Severity
from gpuwatchd.snapshot import Snapshot

SNAPSHOT = Snapshot(
    time=T0,
    findings=(
        Finding("nvlink:5/7", "nvlink", "nvlink_crc_storm", Severity.CRITICAL, "storm"),
        Finding("gpu:1", "thermal", "thermal_throttling", Severity.WARN, "hot"),
        Finding("gpu:4", "xid", "xid_application", Severity.OK, "XID 13"),
    ),
    measurements=(
        Measurement("gpu_clock_drift_ratio", {"gpu": "0", "uuid": "GPU-0000"}, 1.01),
        Measurement("gpu_clock_drift_ratio", {"gpu": "5"}, 0.72),
        Measurement(
            "gpu_throttle_ratio", {"gpu": "1", "uuid": "GPU-0001", "reason": "thermal"}, 0.4
        ),
    ),
    health={
        "gpu:1": Health.DEGRADED,
        "gpu:3": Health.QUARANTINED,
        "nvlink:5/7": Health.UNHEALTHY,
        "node": Health.DEGRADED,
    },
    node_health=Health.DEGRADED,
    quarantines=(
        Quarantine(
            "gpu:3", "row_remap_failure", "auto", T0, hardware=True, code="row_remap_failure"
        ),
        Quarantine("gpu:6", "fan noise", "manual", T0, operator="alice"),
        Quarantine("nvlink:5/7", "nvlink_crc_storm", "auto", T0, dry_run=True),
    ),
)


def render(snapshot: Snapshot) -> str:
    return metrics_support.render(lambda: families(snapshot))


def lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_each_subject_has_one_series_per_state_with_1_for_the_current_one() -> None:
    text = render(SNAPSHOT)
    gpu3 = [line for line in lines(text, "gpuwatchd_health_state") if 'subject="gpu:3"' in line]
    # `unknown` is the node's alone (every source down): a GPU has the other four.
    assert len(gpu3) == len(Health) - 1
    assert not any('state="unknown"' in line for line in gpu3)
    assert 'gpuwatchd_health_state{state="quarantined",subject="gpu:3"} 1.0' in gpu3
    assert 'gpuwatchd_health_state{state="healthy",subject="gpu:3"} 0.0' in gpu3
    assert 'gpuwatchd_node_health_state{state="degraded"} 1.0' in text


def test_only_active_findings_are_exported() -> None:
    text = render(SNAPSHOT)
    assert lines(text, "gpuwatchd_finding") == [
        'gpuwatchd_finding{check="thermal",code="thermal_throttling",fault_code="GW-1001",'
        'severity="warn",subject="gpu:1"} 1.0',
        'gpuwatchd_finding{check="nvlink",code="nvlink_crc_storm",fault_code="GW-1305",'
        'severity="critical",subject="nvlink:5/7"} 1.0',
    ]


def test_dry_run_quarantines_have_a_family_of_their_own_and_an_operators_words_no_label() -> None:
    text = render(SNAPSHOT)
    assert lines(text, "gpuwatchd_quarantined") == [
        'gpuwatchd_quarantined{fault_code="GW-1103",reason="row_remap_failure",source="auto",'
        'subject="gpu:3"} 1.0',
        # A manual quarantine names no finding: the fault code is empty (absent to
        # Prometheus), and the operator's words are no label.
        'gpuwatchd_quarantined{fault_code="",reason="operator",source="manual",'
        'subject="gpu:6"} 1.0',
    ]
    assert lines(text, "gpuwatchd_quarantined_dry_run") == [
        'gpuwatchd_quarantined_dry_run{fault_code="",reason="nvlink_crc_storm",source="auto",'
        'subject="nvlink:5/7"} 1.0'
    ]


def test_measurements_become_gauges_with_a_common_label_set() -> None:
    text = render(SNAPSHOT)
    assert lines(text, "gpuwatchd_gpu_clock_drift_ratio") == [
        'gpuwatchd_gpu_clock_drift_ratio{gpu="0",uuid="GPU-0000"} 1.01',
        'gpuwatchd_gpu_clock_drift_ratio{gpu="5",uuid=""} 0.72',
    ]
    assert lines(text, "gpuwatchd_gpu_throttle_ratio") == [
        'gpuwatchd_gpu_throttle_ratio{gpu="1",reason="thermal",uuid="GPU-0001"} 0.4'
    ]


def test_an_empty_snapshot_exports_only_the_node_state() -> None:
    text = render(Snapshot(time=T0))
    names = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    assert names == {"gpuwatchd_node_health_state"}


def test_the_rendered_families_pass_promtool() -> None:
    assert promtool_check(render(SNAPSHOT)) == (0, "")


def test_compact_health_is_one_code_per_subject_and_a_healthy_link_has_none() -> None:
    snapshot = replace(
        SNAPSHOT,
        health={**SNAPSHOT.health, "nvlink:0/1": Health.HEALTHY, "gpu:0": Health.HEALTHY},
        export=ExportConfig(detail="compact"),
    )
    text = render(snapshot)
    assert lines(text, "gpuwatchd_health_state_id") == [
        'gpuwatchd_health_state_id{subject="gpu:0"} 0.0',
        'gpuwatchd_health_state_id{subject="gpu:1"} 1.0',
        'gpuwatchd_health_state_id{subject="gpu:3"} 3.0',
        'gpuwatchd_health_state_id{subject="node"} 1.0',
        'gpuwatchd_health_state_id{subject="nvlink:5/7"} 2.0',
    ]
    assert "gpuwatchd_node_health_state_id 1.0" in text
    assert "gpuwatchd_health_state{" not in text and "gpuwatchd_node_health_state{" not in text
    # The checks' values only for the subjects that are not healthy (gpu:1),
    # or have an active finding; gpu:0's and gpu:5's drift are left out.
    assert lines(text, "gpuwatchd_gpu_clock_drift_ratio") == []
    assert len(lines(text, "gpuwatchd_gpu_throttle_ratio")) == 1
    assert promtool_check(text) == (0, "")
