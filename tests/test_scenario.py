"""The scenario file contract: the documented format parses, and every error
names the fault that is wrong."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpuwatchd.sim import scenario
from gpuwatchd.sim.scenario import FAULT_FIELDS, FROM_BOOT, ScenarioError, parse
from gpuwatchd.units import parse_duration, parse_rate

H100, A100 = '"NVIDIA H100 80GB HBM3"', '"NVIDIA A100-SXM4-80GB"'
CONTRACT_EXAMPLE = """
node: {gpus: 8, model: "NVIDIA H100 80GB HBM3", nvlinks: 18, hcas: 8}   # all optional
seed: 1                                                                 # optional
faults:
  - {at: 10s, kind: thermal_throttle, gpu: 3, for: 120s}
  - {at: 15s, kind: nvlink_crc_storm, gpu: 5, link: 7, rate: 2000/s}
  - {at: 20s, kind: ecc_uncorrectable, gpu: 1}
  - {at: 0s,  kind: ib_symbol_errors, hca: mlx5_2, port: 1, rate: 50/s}
  - {at: 30s, kind: xid, gpu: 4, code: 79}
"""


def test_the_documented_example_parses() -> None:
    parsed = parse(CONTRACT_EXAMPLE)
    assert parsed.node.gpus == 8 and parsed.node.nvlinks == 18
    assert parsed.node.hca_names[2] == "mlx5_2"
    throttle, storm, ecc, ib, xid = parsed.faults
    assert (throttle.at, throttle.until) == (10.0, 130.0)
    assert storm.rate == 2000.0 and storm.until == math.inf
    assert ecc.gpu == 1
    assert ib.hca == "mlx5_2" and ib.rate == 50.0
    assert xid.code == 79


def test_every_builtin_scenario_parses() -> None:
    for name in scenario.builtin_names():
        assert scenario.load(name).name == name
    assert scenario.load(None).faults, "the default scenario must have faults to show"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("faults: [{at: 1s, kind: meltdown, gpu: 1}]", r"fault 1 \(meltdown\): unknown kind"),
        (
            "faults: [{at: 1s, kind: nvlink_down, gpu: 1}]",
            r"fault 1 \(nvlink_down\): missing field\(s\) link",
        ),
        ("faults: [{kind: xid, gpu: 1, code: 79}]", r"fault 1 \(xid\): missing field\(s\) at"),
        ("faults: [{at: 1s, kind: gpu_lost, gpu: 8}]", r"fault 1 \(gpu_lost\): gpu 8 out of range"),
        ("faults: [{at: 1s, kind: nvlink_down, gpu: 0, link: 18}]", "link 18 out of range"),
        ("faults: [{at: 1s, kind: ib_port_down, hca: mlx5_9, port: 1}]", "hca 'mlx5_9' is not on"),
        ("faults: [{at: 1s, kind: ib_port_down, hca: mlx5_0, port: 2}]", "port 2 out of range"),
        ("faults: [{at: soon, kind: gpu_lost, gpu: 0}]", "expected a duration"),
        ("faults: [{at: 1s, kind: ecc_sbe_storm, gpu: 0, rate: fast}]", "expected a rate"),
        ("faults: [{at: 1s, kind: gpu_lost, gpu: 0, link: 3}]", r"unknown field\(s\) link"),
        ("faults: [{at: 1s, kind: clock_drift, gpu: 0, ratio: 1.5}]", "ratio must be between"),
        ("faults: [{at: 1s, kind: clocks_locked, mhz: 0}]", "mhz must be a clock in MHz"),
        ("faults: [{at: 1s, kind: clocks_locked, mhz: 1.5}]", "mhz must be a whole number"),
        ("faults: [{at: 1s, kind: gpu_idle}]", r"fault 1 \(gpu_idle\): missing field\(s\) gpu"),
        ("node: {gpus: 2}\nfaults: [{at: 1s, kind: xid, gpu: 2, code: 79}]", "node has 2 GPUs"),
        ("nodes: {}", r"unknown key\(s\) nodes"),
        (
            "faults: [{at: 1s, kind: sdc, gpu: 0, mode: melt}]",
            r"fault 1 \(sdc\): unknown mode 'melt'",
        ),
        ("faults: {at: 1s}", "faults must be a list"),
        (f"node: {{model: {H100}, models: [{H100}]}}", "either model .* or models"),
        (f"node: {{gpus: 3, models: [{H100}, {A100}]}}", "gpus is 3 but models names 2"),
        ("node: {models: []}", "models must be a list of GPU names"),
        ("node: {models: [1, 2]}", "models must be a list of GPU names"),
        (
            f"node: {{models: [{H100}, {A100}]}}\nfaults: [{{at: 1s, kind: sdc, gpu: 2}}]",
            "node has 2 GPUs",
        ),
        (
            "faults: [{at: 0s, kind: ib_counter_pinned, hca: mlx5_0, port: 1, "
            "counter: port_rcv_data}]",
            r"counter 'port_rcv_data' has no IBTA maximum",
        ),
        (
            "faults: [{at: 0s, kind: ib_counter_einval, hca: mlx5_0, port: 1, counter: ../state}]",
            r"counter '../state' is not a counter file name",
        ),
    ],
)
def test_bad_scenarios_are_rejected_naming_the_fault(text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse(text, "bad.yaml")


def test_a_node_that_mixes_models_has_one_model_a_gpu() -> None:
    node = parse(f"node: {{models: [{H100}, {H100}, {A100}]}}").node
    assert node.gpus == 3
    assert [node.model_of(gpu) for gpu in range(3)] == [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-80GB",
    ]
    assert node.distinct_models == ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
    assert parse(f"node: {{gpus: 2, models: [{A100}, {H100}]}}").node.model_of(1) == H100[1:-1]
    single = parse(f"node: {{gpus: 2, model: {A100}}}").node
    assert single.model_of(1) == A100[1:-1] and single.distinct_models == (A100[1:-1],)


def test_an_sdc_fault_takes_every_mode() -> None:
    for mode in scenario.SDC_MODES:
        [fault] = parse(f"faults: [{{at: 1s, kind: sdc, gpu: 0, mode: {mode}}}]").faults
        assert fault.mode == mode
    assert "once" in scenario.SDC_MODES


def test_the_second_fault_is_named_by_its_position() -> None:
    text = "faults:\n  - {at: 1s, kind: xid, gpu: 0, code: 13}\n  - {at: 2s, kind: xid, gpu: 0}\n"
    with pytest.raises(ScenarioError, match=r"bad.yaml: fault 2 \(xid\): missing field\(s\) code"):
        parse(text, "bad.yaml")


def test_every_kind_is_accepted_with_its_required_fields() -> None:
    values = {
        "gpu": 0,
        "link": 0,
        "rate": "1/s",
        "hca": "mlx5_0",
        "port": 1,
        "code": 79,
        "call": "nvmlDeviceGetRemappedRows",
        "action": "gpu_reset",
        "mhz": 1410,
        "width": 8,
        "generation": 4,
        "severity": "fatal",
        "setting": "ecc_mode",
        "mask": 0x10,
        "text": "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    }
    values["counter"] = "link_downed"
    for kind, (required, _) in FAULT_FIELDS.items():
        at = "0s" if kind in FROM_BOOT else "1s"
        fault = {"at": at, "kind": kind, **{name: values[name] for name in required}}
        if kind in ("nvml_error", "nvml_init_error"):
            fault["code"] = "not_supported"
        if kind == "aer_errors":
            fault["gpu"] = 0  # or hca: one of the two names the function
        assert parse(f"faults: [{fault}]".replace("'", '"')).faults[0].kind == kind


def test_a_scenario_file_path_and_an_unknown_name(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("faults: [{at: 5s, kind: gpu_lost, gpu: 2}]\n")
    assert scenario.load(str(path)).faults[0].gpu == 2
    with pytest.raises(ScenarioError, match="no such file and no built-in scenario"):
        scenario.load("no-such-scenario")


def test_fault_activity_window() -> None:
    fault = parse("faults: [{at: 10s, kind: power_cap, gpu: 0, for: 5s}]").faults[0]
    assert not fault.active(9.9) and fault.active(10) and not fault.active(15)
    assert fault.elapsed(12) == 2 and fault.elapsed(100) == 5


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("10s", 10), ("5m", 300), ("2h", 7200), ("1d", 86400), (3, 3.0)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "per_second"), [("50/s", 50), ("6/min", 0.1), ("36/h", 0.01)])
def test_rates(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


def test_an_nvml_error_fault_takes_the_code_by_name_or_number() -> None:
    text = (
        "faults:\n"
        "  - {at: 1s, kind: nvml_error, gpu: 0, call: NVML_FI_DEV_MEMORY_TEMP, code: TIMEOUT}\n"
        "  - {at: 1s, kind: nvml_error, gpu: 0, call: nvmlDeviceGetNvLinkState, code: 3, link: 2}\n"
    )
    first, second = parse(text).faults
    assert (first.call, first.code) == ("NVML_FI_DEV_MEMORY_TEMP", 10)
    assert (second.call, second.code, second.link) == ("nvmlDeviceGetNvLinkState", 3, 2)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("{kind: nvml_error, gpu: 0, call: nvmlDeviceGetFoo, code: 3}", "no NVML device function"),
        ("{kind: nvml_error, gpu: 0, call: nvmlDeviceGetName, code: BOGUS}", "unknown code"),
        ("{kind: recovery_action, gpu: 0, action: reformat}", "unknown action"),
    ],
)
def test_nvml_faults_that_name_nothing_real_are_refused(fault: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse(f"faults: [{fault[:-1]}, at: 1s}}]")


def test_a_kernel_xid_is_logged_before_the_start_by_ago() -> None:
    fault = parse("faults: [{at: 0s, kind: kernel_xid, gpu: 1, code: 79, ago: 5m}]").faults[0]
    assert (fault.gpu, fault.code, fault.ago) == (1, 79, 300)
    with pytest.raises(ScenarioError, match="must be 0s"):
        parse("faults: [{at: 5s, kind: kernel_xid, gpu: 1, code: 79}]")
    with pytest.raises(ScenarioError, match="ago must be more than 0s and under 50m"):
        parse("faults: [{at: 0s, kind: kernel_xid, gpu: 1, code: 79, ago: 2h}]")


def test_a_kernel_line_is_one_record_at_its_time_or_logged_before_the_start() -> None:
    text = """faults:
      - {at: 20s, kind: kernel_line, text: "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."}
      - {at: 0s, kind: kernel_line, text: "<4>two\\nlines", ago: 90s}
    """
    later, before = parse(text).faults
    assert (later.at, later.ago, later.text) == (
        20,
        None,
        "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    )
    assert (before.ago, before.text) == (90, "<4>two\nlines")
    with pytest.raises(ScenarioError, match="logged `ago` before the daemon started"):
        parse('faults: [{at: 5s, kind: kernel_line, text: "x", ago: 1m}]')
    with pytest.raises(ScenarioError, match="text must be one kernel record"):
        parse('faults: [{at: 5s, kind: kernel_line, text: ""}]')
    with pytest.raises(ScenarioError, match="text must be text"):
        parse("faults: [{at: 5s, kind: kernel_line, text: [1, 2]}]")


def test_config_drift_names_a_known_setting_and_a_value_it_can_take() -> None:
    text = "faults: [{at: 1s, kind: config_drift, gpu: 0, setting: power_limit, value: 500}]"
    fault = parse(text).faults[0]
    assert (fault.setting, fault.value) == ("power_limit", "500")
    with pytest.raises(ScenarioError, match="unknown setting 'clocks'"):
        parse("faults: [{at: 1s, kind: config_drift, gpu: 0, setting: clocks}]")
    with pytest.raises(ScenarioError, match=r"ecc_mode is 0 \(disabled\) or 1"):
        parse("faults: [{at: 1s, kind: config_drift, gpu: 0, setting: ecc_mode, value: on}]")


def test_aer_errors_name_one_function_and_a_known_severity() -> None:
    fault = parse("faults: [{at: 1s, kind: aer_errors, hca: mlx5_0, severity: nonfatal}]")
    assert (fault.faults[0].hca, fault.faults[0].severity) == ("mlx5_0", "nonfatal")
    with pytest.raises(ScenarioError, match="give either gpu or hca"):
        parse("faults: [{at: 1s, kind: aer_errors, gpu: 0, hca: mlx5_0, severity: fatal}]")
    with pytest.raises(ScenarioError, match="unknown severity 'uncorrectable'"):
        parse("faults: [{at: 1s, kind: aer_errors, gpu: 0, severity: uncorrectable}]")
    with pytest.raises(ScenarioError, match="give either count"):
        parse("faults: [{at: 1s, kind: aer_errors, gpu: 0, severity: fatal, count: 2, rate: 1/s}]")


def test_pcie_downtrained_takes_a_link_width_and_generation() -> None:
    fault = parse("faults: [{at: 1s, kind: pcie_downtrained, gpu: 0, width: 4, generation: 3}]")
    assert (fault.faults[0].width, fault.faults[0].generation) == (4, 3)
    with pytest.raises(ScenarioError, match="width must be a PCIe link width"):
        parse("faults: [{at: 1s, kind: pcie_downtrained, gpu: 0, width: 12}]")
    with pytest.raises(ScenarioError, match="generation must be 1-6"):
        parse("faults: [{at: 1s, kind: pcie_downtrained, gpu: 0, generation: 9}]")
