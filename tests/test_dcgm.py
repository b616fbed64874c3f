"""The offline tier through DCGM: `gpuwatchd canary --dcgm LEVEL` against a
fake `dcgmi` (tests/dcgm_support.py) whose every answer DCGM's published
schema accepts, on a simulated node's NVML (the boards' UUIDs and serials
through the fake libnvidia-ml). Pass, fail and could-not-run, judged by the
JSON whatever dcgmi's exit status, mapped to boards by serial, recorded by
board in the state database, or through the daemon's API while it runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from actions_support import free_port
from api_support import serve
from click.testing import CliRunner, Result
from daemon_support import simulated_daemon
from dcgm_support import FakeDcgmi, fake_dcgmi

from gpuwatchd.cli import main
from gpuwatchd.dcgm import OutputError, parse_output
from gpuwatchd.dcgm.output import results_of
from gpuwatchd.store import Store
from gpuwatchd.store.dcgm import KEPT_PER_BOARD

# The schema names no draft ("http://json-schema.org/schema#"): it uses
# nothing draft 7 lacks.
SCHEMA = jsonschema.Draft7Validator(
    json.loads((Path(__file__).parent / "fixtures" / "dcgm" / "dcgm_diag_schema.json").read_text())
)
NODE = "node: {gpus: 4, nvlinks: 4, hcas: 1}\nfaults: []\n"


def _config(tmp_path: Path, fake: FakeDcgmi | Path, extra: str = "") -> Path:
    # A listener nothing answers on: the daemon is down, the database is used.
    path = tmp_path / "gpuwatchd.yaml"
    dcgmi = fake.path if isinstance(fake, FakeDcgmi) else fake
    path.write_text(
        f"daemon:\n  listen: 127.0.0.1:{free_port()}\n  state_dir: {tmp_path / 'state'}\n"
        f"canary:\n  dcgm:\n    dcgmi: {dcgmi}\n{extra}"
    )
    return path


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(NODE)
    return path


def _dcgm(tmp_path: Path, config: Path, *args: str) -> tuple[Result, dict[str, Any]]:
    command = ["canary", "--dcgm", "2", "--json", "--config", str(config), *args]
    if "--simulate" not in args:
        command += ["--simulate", str(_scenario(tmp_path))]
    result = CliRunner().invoke(main, command, catch_exceptions=False)
    return result, json.loads(result.stdout)


def _boards(tmp_path: Path) -> list[dict[str, Any]]:
    """The simulated node's boards as a passing run names them (UUID, index, serial)."""
    fake = fake_dcgmi(tmp_path / "probe")
    _, document = _dcgm(tmp_path / "probe", _config(tmp_path / "probe", fake))
    boards: list[dict[str, Any]] = document["run"]["boards"]
    return boards


@pytest.mark.parametrize(
    "state",
    [{}, {"fail": {"1": "memory"}}, {"serials": {"0": "1650000000001"}}, {"mode": "runtime_error"}],
    ids=["pass", "fail", "serials", "runtime_error"],
)
@pytest.mark.parametrize("level", [1, 2, 3])
def test_the_fake_dcgmi_answers_what_dcgms_schema_accepts(
    tmp_path: Path, state: dict[str, Any], level: int
) -> None:
    fake = fake_dcgmi(tmp_path, **state)
    command = [str(fake.path), "diag", "-r", str(level), "-i", "0,1", "-j"]
    output = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    document = json.loads(output)
    SCHEMA.validate(document)
    assert parse_output(output) == document


def test_a_passing_diagnostic_exits_0_and_is_recorded_for_every_board(tmp_path: Path) -> None:
    fake = fake_dcgmi(tmp_path / "bin")
    result, document = _dcgm(tmp_path, _config(tmp_path, fake), "--gpu", "all")
    assert result.exit_code == 0
    assert fake.calls() == [["diag", "-r", "2", "-i", "0,1,2,3", "-j"]]
    run = document["run"]
    assert run["outcome"] == "pass" and document["findings"] == []
    assert {board["outcome"] for board in run["boards"]} == {"pass"}
    store = Store.open(str(tmp_path / "state"))
    try:
        for board in run["boards"]:
            (recorded,) = store.dcgm.of_board(board["uuid"])
            assert recorded["outcome"] == "pass" and recorded["level"] == 2
    finally:
        store.close()


def test_a_failed_test_is_a_finding_on_the_board_dcgms_serial_names_whatever_dcgmis_exit(
    tmp_path: Path,
) -> None:
    boards = _boards(tmp_path)
    # DCGM's GPU id 1 is the board NVML has at index 2 (its serial says so),
    # and dcgmi exits 0: the JSON's "Fail" decides.
    serials = {"0": boards[0]["serial"], "1": boards[2]["serial"], "2": boards[1]["serial"]}
    fake = fake_dcgmi(tmp_path / "bin", fail={"1": "memory"}, serials=serials, exit=0)
    result, document = _dcgm(tmp_path, _config(tmp_path, fake), "--gpu", "all")
    assert result.exit_code == 1
    (finding,) = document["findings"]
    assert (finding["subject"], finding["code"], finding["severity"]) == (
        "gpu:2",
        "dcgm_diag_failed",
        "critical",
    )
    assert finding["evidence"]["uuid"] == boards[2]["uuid"]
    assert finding["evidence"]["matched_by"] == "serial"
    assert finding["evidence"]["dcgm_error_ids"] == "52"
    assert "Found 3 faulty memory elements" in finding["message"]
    outcomes = {board["index"]: board["outcome"] for board in document["run"]["boards"]}
    assert outcomes == {0: "pass", 1: "pass", 2: "fail", 3: "pass"}


def test_without_serials_dcgms_gpu_ids_are_the_nvml_indices(tmp_path: Path) -> None:
    fake = fake_dcgmi(tmp_path / "bin", fail={"3": "software"})
    result, document = _dcgm(tmp_path, _config(tmp_path, fake), "--gpu", "3")
    assert result.exit_code == 1
    assert fake.calls() == [["diag", "-r", "2", "-i", "3", "-j"]]
    (finding,) = document["findings"]
    assert finding["subject"] == "gpu:3" and finding["evidence"]["matched_by"] == "index"


def test_a_failure_on_a_gpu_id_no_board_has_is_the_nodes(tmp_path: Path) -> None:
    # DCGM lists a serial none of the node's boards has: it is no board here.
    fake = fake_dcgmi(tmp_path / "bin", fail={"0": "pcie"}, serials={"0": "0000000000000"})
    result, document = _dcgm(tmp_path, _config(tmp_path, fake), "--gpu", "0")
    assert result.exit_code == 1
    (finding,) = document["findings"]
    assert finding["subject"] == "node" and "DCGM GPU id(s) 0" in finding["message"]
    assert document["run"]["boards"][0]["outcome"] == "cannot_run"


@pytest.mark.parametrize(
    ("state", "said", "recorded"),
    [
        ({"mode": "no_host_engine"}, "Unable to connect to host engine", True),
        ({"mode": "runtime_error", "exit": 0}, "GPU 0 is in use by another process", True),
        ({"mode": "garbage"}, "no JSON object", True),
        ({"mode": "hang"}, "did not finish within 1s", True),
        (None, "is not installed", False),
    ],
    ids=["no_host_engine", "runtime_error", "garbage", "timeout", "no_dcgmi"],
)
def test_a_diagnostic_that_could_not_run_exits_2_and_says_why(
    tmp_path: Path, state: dict[str, Any] | None, said: str, recorded: bool
) -> None:
    fake: FakeDcgmi | Path = (
        fake_dcgmi(tmp_path / "bin", **state) if state is not None else tmp_path / "no-dcgmi"
    )
    config = _config(tmp_path, fake, "    level_2_timeout: 1s\n")
    result, document = _dcgm(tmp_path, config, "--gpu", "all")
    assert result.exit_code == 2
    assert document["run"]["outcome"] == "cannot_run" and said in document["run"]["reason"]
    (finding,) = document["findings"]
    assert (finding["subject"], finding["code"]) == ("node", "dcgm_diag_not_run")
    assert (tmp_path / "state" / "state.db").exists() is recorded


def test_nvml_without_gpus_cannot_run_the_diagnostic(tmp_path: Path) -> None:
    fake = fake_dcgmi(tmp_path / "bin")
    scenario = tmp_path / "down.yaml"
    down = "faults: [{at: 0s, kind: nvml_init_error, code: driver_not_loaded}]"
    scenario.write_text(NODE.replace("faults: []", down))
    config = _config(tmp_path, fake)
    command = ["canary", "--dcgm", "1", "--config", str(config), "--simulate", str(scenario)]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2 and "NVML shows no GPU" in result.output
    assert fake.calls() == []


def test_a_run_while_the_daemon_runs_is_recorded_through_its_api(tmp_path: Path) -> None:
    token_file = tmp_path / "api-token"
    token_file.write_text("epilog:epilog-secret\n")
    token_file.chmod(0o600)
    fake = fake_dcgmi(tmp_path / "bin", fail={"0": "memory"})
    with simulated_daemon(NODE, tmp_path) as sim:
        sim.run_until(20)
        server = serve(sim, token_file)
        try:
            port = server.url.rsplit(":", 1)[1]
            config = tmp_path / "gpuwatchd.yaml"
            config.write_text(
                f"daemon:\n  listen: 127.0.0.1:{port}\napi:\n  token_file: {token_file}\n"
                f"canary:\n  dcgm:\n    dcgmi: {fake.path}\n"
            )
            # The daemon's simulated node is the NVML this process reads.
            command = ["canary", "--dcgm", "3", "--gpu", "0", "--config", str(config)]
            result = CliRunner().invoke(main, command, catch_exceptions=False)
            uuid = next(g.uuid for g in sim.daemon.snapshot.gpus if g.index == 0)
            assert uuid is not None
            (run,) = sim.daemon.store.dcgm.of_board(uuid)
        finally:
            server.stop()
    assert result.exit_code == 1 and "recorded by the daemon" in result.stderr
    assert run["outcome"] == "fail" and run["level"] == 3


def test_the_api_refuses_a_dcgm_run_without_a_token_or_of_another_shape(tmp_path: Path) -> None:
    token_file = tmp_path / "api-token"
    token_file.write_text("secret-token\n")
    token_file.chmod(0o600)
    with simulated_daemon(NODE, tmp_path) as sim:
        sim.run_until(20)
        server = serve(sim, token_file)
        try:
            url = f"{server.url}/api/v1/dcgm-runs"
            unsigned = _post(url, {"level": 1}, None)
            wrong = _post(url, {"level": 9, "boards": []}, "secret-token")
        finally:
            server.stop()
    assert unsigned[0] == 401
    assert wrong[0] == 400 and "not a DCGM run" in wrong[1]["error"]


def _post(url: str, body: object, token: str | None) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_a_global_result_without_an_entity_is_read_as_a_summary() -> None:
    # dcgmi writes these (dcgmi/Diag.cpp) though the schema requires an entity.
    document = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "memory",
                            "results": [{"status": "Fail", "warnings": [{"warning": "global"}]}],
                            "test_summary": {"status": "Fail"},
                        }
                    ],
                }
            ]
        }
    }
    results = results_of(document)
    assert [(r.status, r.gpu_id) for r in results] == [("Fail", None), ("Fail", None)]
    # A line dcgmi printed before its JSON does not hide it.
    assert parse_output("Warning: persistence mode is off\n" + json.dumps(document)) == document


@pytest.mark.parametrize(
    "text",
    [
        '{"metadata": {}}',
        '{"DCGM Diagnostic": {"test_categories": [{"category": "x"}]}}',
        '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "t",'
        ' "results": [{"status": 1}], "test_summary": {"status": "Pass"}}]}]}}',
    ],
    ids=["no_diagnostic", "no_tests", "status_not_text"],
)
def test_output_not_in_dcgms_shape_is_refused_with_where(text: str) -> None:
    with pytest.raises(OutputError):
        parse_output(text)


def test_every_failed_run_is_kept_and_each_board_keeps_its_newest_passes(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    try:
        store.dcgm.add(1.0, 3, "fail", {"GPU-a": "fail", "GPU-b": "pass"}, {"n": 0})
        for n in range(1, KEPT_PER_BOARD + 5):
            store.dcgm.add(1.0 + n, 1, "pass", {"GPU-a": "pass", "GPU-b": "pass"}, {"n": n})
        kept_a = [run["n"] for run in store.dcgm.of_board("GPU-a")]
        kept_b = [run["n"] for run in store.dcgm.of_board("GPU-b")]
    finally:
        store.close()
    newest = list(range(5, KEPT_PER_BOARD + 5))
    assert kept_a == [0, *newest]
    assert kept_b == newest
