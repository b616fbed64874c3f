"""Capture and replay: `gpuwatchd capture` records what the sources get from
a node, and a scenario on that capture (`node: {capture: FILE}`) serves the
same answers through the fake libnvidia-ml and a sysfs tree.

No machine with an NVIDIA GPU is at hand: every capture here is made from
the simulated node (the fake library under the real nvidia-ml-py, and the
simulated InfiniBand tree).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner
from daemon_support import simulated_daemon
from test_cli_run import _free_port, _wait_for_poll

from gpuwatchd import capture, capture_file
from gpuwatchd.assemble import simulate
from gpuwatchd.cli import main
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config
from gpuwatchd.model import Health, Reading
from gpuwatchd.sim import scenario as scenarios
from gpuwatchd.sim.fake_nvml import DEFAULT_DRIVER_VERSION, FakeNvml
from gpuwatchd.sim.infiniband import SimulatedFabric
from gpuwatchd.sim.node import SimulatedNode
from gpuwatchd.sim.replay import CapturedFabric, captured_gpus
from gpuwatchd.sim.scenario import ScenarioError
from gpuwatchd.sources import InfinibandSourceConfig, NvmlSourceConfig
from gpuwatchd.sources.infiniband import InfinibandSource
from gpuwatchd.sources.nvml import NvmlSource

H100_NODE = "node: {gpus: 2, nvlinks: 18, hcas: 2}\nseed: 7\n"
FIXTURE = Path(__file__).parent / "fixtures" / "h100-2gpu-fake.capture.json"

CRC_FLIT: int = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
MEMORY_TEMP: int = pynvml.NVML_FI_DEV_MEMORY_TEMP
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
APP_CLOCK = (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET)


@contextlib.contextmanager
def _node(
    scenario_text: str, root: Path, name: str = "test"
) -> Iterator[tuple[FakeClock, SimulatedNode, Config]]:
    """A simulated node installed under nvidia-ml-py, and the config that reads it."""
    clock = FakeClock()
    scenario = scenarios.parse(scenario_text, name)
    config, node = simulate(Config(), clock, scenario, root)
    try:
        yield clock, node, config
    finally:
        node.uninstall()


def _capture_of(
    tmp_path: Path, refuse: Callable[[FakeNvml], None] | None = None, name: str = "node"
) -> Path:
    """A capture of the simulated H100 node, with `refuse` applied to its fake first."""
    with _node(H100_NODE, tmp_path / f"{name}-sysfs") as (clock, node, config):
        if refuse is not None:
            refuse(node.nvml)
        document = capture.capture_node(config, clock, before_poll=node.advance)
    path = tmp_path / f"{name}.capture.json"
    path.write_text(capture.dumps(document), encoding="utf-8")
    return path


def _poll(node: SimulatedNode, clock: FakeClock) -> Reading:
    source = NvmlSource(clock, NvmlSourceConfig(kernel_log=None), xid_thread=False)
    try:
        node.advance(clock.now())
        return source.poll(clock.now())
    finally:
        source.close()


def _original_and_replayed(
    tmp_path: Path, refuse: Callable[[FakeNvml], None] | None = None
) -> tuple[Reading, Reading, SimulatedNode]:
    """One poll of the original node and one of the node replayed from its capture."""
    path = _capture_of(tmp_path, refuse)
    with _node(H100_NODE, tmp_path / "original") as (clock, node, _):
        if refuse is not None:
            refuse(node.nvml)
        original = _poll(node, clock)
    replay_text = f"node: {{capture: {path.name}}}\nseed: 7\n"
    replayed, node = _replay_poll(scenarios.parse(replay_text, "replay", str(tmp_path)), tmp_path)
    return original, replayed, node


def _replay_poll(scenario: scenarios.Scenario, tmp_path: Path) -> tuple[Reading, SimulatedNode]:
    """One poll of the node a scenario on a capture simulates."""
    clock = FakeClock()
    node = SimulatedNode(scenario, tmp_path / "replayed", clock.now()).install()
    try:
        return _poll(node, clock), node
    finally:
        node.uninstall()


def test_capture_records_the_batch_the_source_makes_by_its_pointer_as_the_wrappers_call(
    tmp_path: Path,
) -> None:
    document = capture_file.load(_capture_of(tmp_path))
    for gpu in capture.gpu_documents(document):
        batches = [c for c in gpu["calls"] if c["function"] == "nvmlDeviceGetFieldValues"]
        poll_batch = max(batches, key=lambda call: len(call["args"][0]))
        (ids,) = poll_batch["args"]
        assert [MEMORY_TEMP, 0] in ids
        assert poll_batch["answers"] == [{"value": f"{len(ids)} field values (see fields)"}]
        recorded = {(entry["id"], entry["scope"]) for entry in gpu["fields"]}
        assert {(field_id, scope) for field_id, scope in ids} <= recorded


def test_recorder_refuses_a_function_pointer_it_would_not_record() -> None:
    with pytest.raises(NotImplementedError, match="nvmlDeviceGetPowerUsage"):
        capture.Recorder()._nvmlGetFunctionPointer("nvmlDeviceGetPowerUsage")


def test_capture_asks_every_link_any_nvml_header_allows_whatever_the_binding(
    tmp_path: Path,
) -> None:
    gpu = capture.gpu_documents(capture_file.load(_capture_of(tmp_path)))[0]
    assert capture.first_answer(gpu, "nvmlDeviceGetNvLinkState", 35) is not None


def test_capture_of_the_simulated_h100_records_calls_fields_refusals_and_versions(
    tmp_path: Path,
) -> None:
    document = capture_file.load(_capture_of(tmp_path))
    assert document["format"] == "gpuwatchd-capture" and document["version"] == 1
    assert document["binding"]["version"] == metadata.version("nvidia-ml-py")
    nvml = document["nvml"]
    assert nvml["available"] is True
    driver = next(c for c in nvml["system"] if c["function"] == "nvmlSystemGetDriverVersion")
    assert driver["answers"] == [{"value": DEFAULT_DRIVER_VERSION}]
    gpu = capture.gpu_documents(document)[1]
    assert gpu["index"] == 1
    assert capture.first_value(gpu, "nvmlDeviceGetName") == "NVIDIA H100 80GB HBM3"
    assert capture.first_value(gpu, "nvmlDeviceGetUUID").startswith("GPU-")
    assert capture.first_value(gpu, "nvmlDeviceGetPciInfo_v3")["busId"] == "00000000:2A:00.0"
    assert capture.nvlinks(gpu) == tuple(range(18))
    # A refusal is its NVML return code: Hopper has no retired pages, and no link 18.
    assert capture.first_answer(gpu, "nvmlDeviceGetRetiredPages", 0) == {
        "return": NOT_SUPPORTED,
        "error": "Not Supported",
    }
    # Link 18 is asked whatever the binding; the fake answers it as a driver
    # whose header allows as many links as the binding's does.
    no_link_18 = NOT_SUPPORTED if pynvml.NVML_NVLINK_MAX_LINKS > 18 else INVALID_ARGUMENT
    assert capture.first_answer(gpu, "nvmlDeviceGetNvLinkState", 18)["return"] == no_link_18
    # Hopper's per-link counters, as nvidia-smi reads them: link 17's CRC flits.
    assert capture.first_value(gpu, "nvmlDeviceGetNvLinkErrorCounter", 17, CRC_FLIT) == 0
    # Field values per (field id, scope id): the HBM temperature.
    assert capture.first_field(gpu, MEMORY_TEMP, 0)["return"] == 0
    assert "NVML_FI_DEV_MEMORY_TEMP" in {f["name"] for f in gpu["fields"]}
    infiniband = document["infiniband"]
    assert infiniband["present"] is True
    assert capture.hca_names(document) == ("mlx5_0", "mlx5_1")
    assert infiniband["files"]["mlx5_1/ports/1/state"] == {"text": "4: ACTIVE"}


def test_the_same_node_captured_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    first = _capture_of(tmp_path, name="first").read_bytes()
    second = _capture_of(tmp_path, name="second").read_bytes()
    assert first == second


def test_a_scenario_on_a_capture_polls_the_same_samples_as_the_captured_node(
    tmp_path: Path,
) -> None:
    original, replayed, node = _original_and_replayed(tmp_path)
    assert node.captured is not None and node.captured.differences == []
    assert replayed.driver_version == original.driver_version == DEFAULT_DRIVER_VERSION
    # Same seed, same facts: every value of every GPU, links included.
    assert replayed.gpus == original.gpus


def test_a_captured_refused_link_field_and_call_replay_with_their_codes(tmp_path: Path) -> None:
    def refuse(fake: FakeNvml) -> None:
        fake.fail_field(MEMORY_TEMP, NOT_SUPPORTED, gpu=1)
        fake.fail(NOT_SUPPORTED, "nvmlDeviceGetNvLinkErrorCounter", gpu=1, args=(5, CRC_FLIT))
        fake.fail(NO_PERMISSION, "nvmlDeviceGetClock", gpu=0, args=APP_CLOCK)
        fake.fail(NOT_SUPPORTED, "nvmlDeviceGetNvLinkState", gpu=1, args=(3,))

    original, replayed, node = _original_and_replayed(tmp_path, refuse)
    assert node.captured is not None and node.captured.differences == []
    assert replayed.gpus == original.gpus
    assert replayed.gpus is not None
    gpu0, gpu1 = replayed.gpus
    assert gpu0.sm_application_clock_hertz is None
    assert gpu1.sm_application_clock_hertz is not None
    links = {link.link: link for link in gpu1.nvlinks}
    assert 3 not in links and len(links) == 17
    assert "crc_flit" not in links[5].errors and links[6].errors["crc_flit"] == 0
    assert all("crc_flit" in link.errors for link in gpu0.nvlinks)
    assert gpu1.temperature_memory_celsius is None and gpu0.temperature_memory_celsius is not None


def test_captured_counters_are_where_the_replay_starts(tmp_path: Path) -> None:
    path = _capture_of(tmp_path)
    document = json.loads(path.read_text())
    gpu = capture.gpu_documents(document)[0]
    for call in gpu["calls"]:
        if call["function"] == "nvmlDeviceGetTotalEccErrors" and call["args"] == [0, 1]:
            call["answers"] = [{"value": 12}]  # corrected, aggregate
        if call["function"] == "nvmlDeviceGetRemappedRows":
            call["answers"] = [{"value": [2, 1, 0, 0]}]
        if call["function"] == "nvmlDeviceGetNvLinkState" and call["args"] == [4]:
            call["answers"] = [{"value": 0}]
        if call["function"] == "nvmlDeviceGetNvLinkErrorCounter" and call["args"] == [9, CRC_FLIT]:
            call["answers"] = [{"value": 4242}]
    path.write_text(capture.dumps(document))
    reading, _ = _replay_poll(scenarios.parse(f"node: {{capture: {path}}}\n", "counters"), tmp_path)
    assert reading.gpus is not None
    gpu0 = reading.gpus[0]
    assert gpu0.ecc_errors["corrected", "aggregate"] == 12
    assert (gpu0.remapped_rows_correctable, gpu0.remapped_rows_uncorrectable) == (2, 1)
    links = {link.link: link for link in gpu0.nvlinks}
    assert links[9].errors["crc_flit"] == 4242 and links[4].up is False and links[5].up is True


def test_a_model_unknown_to_the_simulator_replays_as_the_architecture_it_answered(
    tmp_path: Path,
) -> None:
    # An H100 reads its NVLinks through the error-counter call, which says
    # nothing of its generation; its captured nvmlDeviceGetArchitecture does.
    document = json.loads(_capture_of(tmp_path).read_text())
    for gpu in capture.gpu_documents(document):
        for call in gpu["calls"]:
            if call["function"] == "nvmlDeviceGetName":
                call["answers"] = [{"value": "NVIDIA H100 NVL"}]
    first, second = captured_gpus(document)
    assert first.spec.name == "NVIDIA H100 NVL"
    assert first.spec.architecture == second.spec.architecture == "hopper"


def test_a_refusal_the_fake_cannot_serve_is_listed_not_hidden(tmp_path: Path) -> None:
    path = _capture_of(tmp_path)
    document = json.loads(path.read_text())
    gpu = capture.gpu_documents(document)[0]
    for call in gpu["calls"]:
        # The sensor of nvmlDeviceGetTemperatureV travels inside a struct, so
        # the fake cannot refuse it by argument; the replay must say so.
        if call["function"] == "nvmlDeviceGetTemperatureV":
            call["answers"] = [{"return": NO_PERMISSION, "error": "Insufficient Permissions"}]
    gpu["calls"].append({"function": "nvmlDeviceGetPowerUsage", "args": [7], "answers": []})
    gpu["calls"].append(
        {"function": "nvmlDeviceGetNoSuchThing", "args": [], "answers": [{"value": 1}]}
    )
    path.write_text(capture.dumps(document))
    scenario = scenarios.parse(f"node: {{capture: {path}}}\n", "odd")
    node = SimulatedNode(scenario, tmp_path / "replayed", FakeClock().now())
    assert node.captured is not None
    differences = node.captured.differences
    assert [d for d in differences if "nvmlDeviceGetTemperatureV(0,): captured 4, served 0" in d]
    assert [
        d for d in differences if "nvmlDeviceGetNoSuchThing(): captured 0, served not asked" in d
    ]
    assert len(differences) == 2


def test_faults_on_a_capture_are_decided_as_on_the_captured_node(tmp_path: Path) -> None:
    path = _capture_of(tmp_path)
    faults = (
        "faults: [{at: 10s, kind: thermal_throttle, gpu: 1},"
        " {at: 10s, kind: nvlink_down, gpu: 0, link: 2}]\n"
    )
    decided = []
    for node in (H100_NODE, f"node: {{capture: {path}}}\nseed: 7\n"):
        with simulated_daemon(node + faults, tmp_path / str(len(decided))) as sim:
            snapshot = sim.run_until(330)
        decided.append(snapshot)
    original, replayed = decided
    assert replayed.health["gpu:1"] is Health.DEGRADED
    assert replayed.health["nvlink:0/2"] is Health.QUARANTINED
    assert {q.subject for q in replayed.quarantines} == {"nvlink:0/2", "node"}
    assert replayed.health == original.health
    assert [(f.subject, f.code, f.severity) for f in replayed.findings] == [
        (f.subject, f.code, f.severity) for f in original.findings
    ]


@pytest.mark.parametrize(
    ("node", "fault", "message"),
    [
        ("{capture: CAPTURE}", "{at: 1s, kind: thermal_throttle, gpu: 2}", "node has 2 GPUs"),
        ("{capture: CAPTURE}", "{at: 1s, kind: nvlink_down, gpu: 0, link: 18}", "18 NVLinks"),
        ("{capture: CAPTURE}", "{at: 1s, kind: ib_port_down, hca: mlx5_0, port: 1}", "ib faults"),
        ("{capture: CAPTURE, gpus: 4}", "{at: 1s, kind: xid, gpu: 0, code: 79}", "alone"),
        ("{capture: missing.json}", "{at: 1s, kind: xid, gpu: 0, code: 79}", "cannot read"),
    ],
)
def test_a_scenario_on_a_capture_is_checked_against_the_captured_node(
    tmp_path: Path, node: str, fault: str, message: str
) -> None:
    path = _capture_of(tmp_path)
    text = f"node: {node.replace('CAPTURE', path.name)}\nfaults: [{fault}]\n"
    with pytest.raises(ScenarioError, match=message):
        scenarios.parse(text, "checked", str(tmp_path))


def test_a_captured_infiniband_tree_replays_with_its_unreadable_files_listed(
    tmp_path: Path,
) -> None:
    scenario = scenarios.parse(H100_NODE, "ib")
    original = tmp_path / "original"
    SimulatedFabric(scenario, original, FakeClock().now())
    # A counter whose read fails (here EISDIR: a plain tree cannot make EINVAL).
    (original / "class/infiniband/mlx5_1/ports/1/hw_counters/broken").mkdir()
    captured = capture.capture_infiniband(str(original))
    broken = captured["files"]["mlx5_1/ports/1/hw_counters/broken"]
    assert broken == {"errno": 21, "error": "EISDIR"}
    fabric = CapturedFabric(json.loads(json.dumps(captured)), tmp_path / "replayed")
    assert [text for text in fabric.differences if "hw_counters/broken" in text]

    def read(root: Path) -> Reading:
        return InfinibandSource(InfinibandSourceConfig(sysfs_root=str(root))).poll(0.0)

    before, after = read(original), read(tmp_path / "replayed")
    assert after.error is None and len(after.ports) == 2
    assert after.infiniband_devices == before.infiniband_devices
    assert after.ports == before.ports


def test_a_node_without_infiniband_is_captured_as_such(tmp_path: Path) -> None:
    assert capture.capture_infiniband(str(tmp_path)) == {
        "present": False,
        "files": {},
        "folders": {},
    }


def test_anonymized_capture_keeps_no_uuid_or_guid_and_still_replays(tmp_path: Path) -> None:
    document = capture_file.load(_capture_of(tmp_path))
    uuids = [
        capture.first_value(gpu, "nvmlDeviceGetUUID") for gpu in capture.gpu_documents(document)
    ]
    guids = [
        entry["text"]
        for path, entry in document["infiniband"]["files"].items()
        if path.endswith("node_guid")
    ]
    anonymous = capture.anonymize(document)
    text = capture.dumps(anonymous)
    assert anonymous["anonymized"] is True
    assert not [secret for secret in uuids + guids if secret in text]
    assert "GPU-00000000-0000-4000-8000-000000000001" in text and "0000:0000:0000:0001" in text
    assert capture.anonymize(document) == anonymous
    path = tmp_path / "anonymous.json"
    path.write_text(text)
    node = SimulatedNode(scenarios.load(str(path)), tmp_path / "replayed", FakeClock().now())
    assert node.captured is not None and node.captured.differences == []
    assert node.gpus.gpus[1].uuid == "GPU-00000000-0000-4000-8000-000000000001"


def test_capture_of_a_node_without_nvml_says_why(tmp_path: Path) -> None:
    clock = FakeClock()
    config = Config()
    sources = replace(
        config.sources,
        infiniband=replace(config.sources.infiniband, sysfs_root=str(tmp_path)),
    )
    # No fake installed and no driver on this machine: NVML does not load.
    document = capture.capture_node(replace(config, sources=sources), clock)
    assert document["nvml"]["available"] is False
    assert "NVML could not be loaded" in document["nvml"]["reason"]
    assert "NVML unavailable" in capture.summary(document)


def test_cli_capture_writes_a_file_a_scenario_runs_on(tmp_path: Path) -> None:
    scenario_file = tmp_path / "node.yaml"
    scenario_file.write_text(H100_NODE)
    out = tmp_path / "node.capture.json"
    result = CliRunner().invoke(
        main, ["capture", "--simulate", str(scenario_file), "--out", str(out), "--anonymize"]
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"captured 2 GPU\(s\), \d+ NVML error answer\(s\)", result.stderr)
    assert "2 InfiniBand device(s)" in result.stderr
    document = capture_file.load(out)
    assert document["anonymized"] is True
    shape = scenarios.load(str(out)).node
    assert (shape.gpus, shape.nvlinks, shape.hca_names) == (2, 18, ("mlx5_0", "mlx5_1"))


def test_cli_capture_of_an_unknown_scenario_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["capture", "--simulate", "no-such-scenario"])
    assert result.exit_code != 0 and "no such file and no built-in scenario" in result.output


def test_the_committed_fixture_polls_fully_and_its_node_is_healthy(tmp_path: Path) -> None:
    text = f"node: {{capture: {FIXTURE}}}\n"
    with simulated_daemon(text, tmp_path) as sim:
        assert sim.node.captured is not None and sim.node.captured.differences == []
        snapshot = sim.run_until(60)
    assert [gpu.name for gpu in snapshot.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert all(gpu.up and len(gpu.nvlinks) == 18 for gpu in snapshot.gpus)
    assert snapshot.gpus[0].uuid == "GPU-00000000-0000-4000-8000-000000000000"
    assert [device.device for device in snapshot.infiniband_devices] == ["mlx5_0", "mlx5_1"]
    assert snapshot.source_up == {"nvml": True, "infiniband": True}
    assert snapshot.node_health is Health.HEALTHY and snapshot.findings == ()


def test_gpuwatchd_run_on_the_fixture_answers_status(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "gpuwatchd", "run", "--simulate", str(FIXTURE)]
    options = ["--interval", "200ms", "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(
        [*command, *options, "--state-dir", str(tmp_path / "state")],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_poll(url, process)
        table = CliRunner().invoke(main, ["status", "--node", url])
        as_json = CliRunner().invoke(main, ["status", "--json", "--node", url])
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=10)
    assert table.exit_code == 0, table.output
    assert "NVIDIA H100 80GB HBM3" in table.output
    document = json.loads(as_json.output)
    assert [gpu["uuid"] for gpu in document["gpus"]] == [
        f"GPU-00000000-0000-4000-8000-00000000000{index}" for index in range(2)
    ]
    assert document["node"]["health"] == "healthy"
    assert document["sources"]["nvml"]["up"] and document["sources"]["infiniband"]["up"]


def test_a_gpu_lost_when_captured_is_lost_in_the_replay(tmp_path: Path) -> None:
    lost_node = H100_NODE + "faults: [{at: 0s, kind: gpu_lost, gpu: 1}]\n"
    with _node(lost_node, tmp_path / "sysfs") as (clock, node, config):
        document = capture.capture_node(config, clock, before_poll=node.advance)
    gpu1 = capture.gpu_documents(document)[1]
    assert capture.first_answer(gpu1, "nvmlDeviceGetHandleByIndex", 1) == {
        "return": pynvml.NVML_ERROR_GPU_IS_LOST,
        "error": "GPU is lost",
    }
    path = tmp_path / "lost.capture.json"
    path.write_text(capture.dumps(document))
    reading, node = _replay_poll(scenarios.load(str(path)), tmp_path)
    assert node.captured is not None and node.captured.differences == []
    assert reading.gpus is not None
    assert [gpu.up for gpu in reading.gpus] == [True, False]
    assert reading.gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_a_scenario_written_in_json_is_still_a_scenario(tmp_path: Path) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"node": {"gpus": 3}, "faults": []}))
    scenario = scenarios.load(str(path))
    assert scenario.node.gpus == 3 and scenario.node.capture is None
