"""`gpuwatchd report SUBJECT`: the evidence bundle of a simulated node whose
GPU 2 the canaries confirmed bad (the production daemon, canaries on the CPU
backend standing in for each GPU), read from its state database with the
daemon down, or from its API while it runs. Every member is scanned for the
config's tokens and secrets and the host's names."""

from __future__ import annotations

import json
import re
import shutil
import socket
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from actions_support import free_port
from api_support import serve
from click.testing import CliRunner, Result
from daemon_support import simulated_daemon

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.cli import main
from gpuwatchd.clock import FakeClock
from gpuwatchd.config import Config
from gpuwatchd.report.held import Held, Subject
from gpuwatchd.report.members import journal_of
from gpuwatchd.store import JournalEntry, Store

NODE = "node: {gpus: 4, nvlinks: 4, hcas: 2}\n"
SDC = NODE + "faults: [{at: 0s, kind: sdc, gpu: 2}]\n"
# Bursts every minute, so that the fault is confirmed within a few polls.
CANARIES = Config(canary=CanaryConfig(interval=60.0))
SLACK_URL = "https://hooks.slack.com/services/T0AAAA/B0BBBB/k3yInTheUrlXyz"
TOKENS = ("alice-token-8c1f0e", "bare-token-77d2a9")
HMAC_KEY = "hmac-key-5e7a0c1b"
ROUTING_KEY = "routing-key-93bd4e"
NODE_NAME = "gpu-node-17"


@dataclass(frozen=True)
class Node:
    """A simulated node after its GPU 2 was confirmed bad, the daemon down."""

    root: Path
    scenario: Path
    config: Path
    uuids: dict[int, str]

    @property
    def state(self) -> Path:
        return self.root / "state"


def _config(root: Path) -> Path:
    """A config that names tokens, webhook keys and the node's name."""
    (root / "api-token").write_text(f"# tokens\nalice:{TOKENS[0]}\n{TOKENS[1]}\n")
    (root / "api-token").chmod(0o600)
    (root / "hmac.key").write_text(HMAC_KEY + "\n")
    (root / "routing.key").write_text(ROUTING_KEY + "\n")
    path = root / "gpuwatchd.yaml"
    path.write_text(
        f"""daemon:
  listen: 127.0.0.1:{free_port()}
  state_dir: {root / "state"}
api:
  token_file: {root / "api-token"}
actions:
  node_name: {NODE_NAME}
  external_url: http://{NODE_NAME}.cluster.example:9477
  webhooks:
    - {{name: chat, url: "{SLACK_URL}", format: slack, secret_file: {root / "hmac.key"}}}
    - name: pager
      url: https://events.pagerduty.com/v2/enqueue
      format: pagerduty
      routing_key_file: {root / "routing.key"}
"""
    )
    return path


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory: pytest.TempPathFactory) -> Node:
    root = tmp_path_factory.mktemp("confirmed")
    scenario = root / "node.yaml"
    scenario.write_text(SDC)
    with simulated_daemon(SDC, root, CANARIES, canary=True) as sim:
        snapshot = sim.run_until(300)
        now = sim.clock.now()
    assert any(f.code == "sdc_confirmed" and f.subject == "gpu:2" for f in snapshot.findings)
    uuids = {gpu.index: gpu.uuid for gpu in snapshot.gpus if gpu.uuid}
    # What a careless action could have journaled: every member is redacted.
    store = Store.open(str(root / "state"))
    try:
        store.journal.note(
            "webhook_failed",
            "gpu:2",
            f"POST {SLACK_URL} from {NODE_NAME} failed (signed {HMAC_KEY}, key {ROUTING_KEY})",
            now,
            data={"uuid": uuids[2], "token": TOKENS[0], "also": TOKENS[1]},
        )
    finally:
        store.close()
    return Node(root, scenario, _config(root), uuids)


def _report(node: Node, out: Path, *args: str) -> Result:
    command = ["report", *args, "--config", str(node.config), "--out", str(out)]
    command += ["--state-dir", str(node.state)]
    return CliRunner().invoke(main, command, catch_exceptions=False)


def _members(path: Path) -> dict[str, str]:
    """The archive's members by name (under its one folder), as text."""
    with tarfile.open(path) as archive:
        names = archive.getnames()
        (folder,) = {name.split("/")[0] for name in names}
        members = {}
        for info in archive.getmembers():
            handle = archive.extractfile(info)
            assert handle is not None
            members[info.name.removeprefix(folder + "/")] = handle.read().decode()
    members["(names)"] = "\n".join(names)
    return members


def _words(text: str, word: str) -> list[str]:
    return re.findall(rf"(?<![A-Za-z0-9_.-]){re.escape(word)}(?![A-Za-z0-9_-])", text, re.I)


def _hidden(members: dict[str, str]) -> Iterator[str]:
    """Every token, secret or host name found in any member."""
    secrets = (*TOKENS, SLACK_URL, HMAC_KEY, ROUTING_KEY)
    hosts = (NODE_NAME, socket.gethostname(), socket.gethostname().split(".")[0])
    for name, text in members.items():
        yield from (f"{name}: {secret}" for secret in secrets if secret in text)
        yield from (f"{name}: {host}" for host in hosts if _words(text, host))


def test_the_report_of_a_confirmed_bad_gpu_holds_its_evidence_with_the_daemon_down(
    confirmed: Node, tmp_path: Path
) -> None:
    out = tmp_path / "gpu2.tar.gz"
    result = _report(confirmed, out, "gpu:2", "--simulate", str(confirmed.scenario))
    assert result.exit_code == 0, result.output
    members = _members(out)
    assert set(members) == {
        "(names)",
        "manifest.json",
        "status.json",
        "journal.json",
        "identity.json",
        "canary.json",
        "dcgm.json",
        "capture.json",
    }
    manifest = json.loads(members["manifest.json"])
    assert manifest["status_from"] == "state database" and manifest["uuid"] == confirmed.uuids[2]
    status = json.loads(members["status.json"])
    (quarantine,) = status["quarantines"]
    assert quarantine["uuid"] == confirmed.uuids[2] and quarantine["hardware"]
    (gpu,) = [s for s in status["subjects"] if s["subject"] == "gpu:2"]
    (finding,) = gpu["findings"]
    # Every field a Finding has, as the daemon last journaled it.
    assert {"subject", "check", "code", "severity", "message", "action"} <= set(finding)
    assert {"evidence", "definitive", "immediate"} <= set(finding)
    assert finding["code"] == "sdc_confirmed" and finding["definitive"]
    canary = json.loads(members["canary.json"])
    (verdict,) = [v for v in canary["verdicts"] if v["code"] == "sdc_confirmed"]
    evidence = verdict["data"]["evidence"]
    for key in ("canary", "seed", "first_expected_bits", "first_actual_bits", "sms", "lanes"):
        assert key in evidence, key
    assert canary["mismatches"], "the mismatch records of the board"
    for record in canary["mismatches"]:
        assert record["uuid"] == confirmed.uuids[2]
        assert record["rerun"] == "mismatch" and record["sibling_result"] == "pass"
        assert record["sibling_uuid"] in set(confirmed.uuids.values()) - {confirmed.uuids[2]}
    # A digest's mismatch (a full-mantissa GEMM's) names no element; the
    # known-answer canaries' name the first wrong one.
    located = [record for record in canary["mismatches"] if record["first_expected_bits"]]
    assert located and all(r["first_expected_bits"] != r["first_actual_bits"] for r in located)
    assert any(record["mismatch_units"] and record["mismatch_lanes"] for record in located)
    identity = json.loads(members["identity.json"])
    assert identity["from"] == "nvml" and identity["uuid"] == confirmed.uuids[2]
    for key in ("serial", "vbios_version", "driver_version", "board_part_number"):
        assert identity[key], key
    journal = json.loads(members["journal.json"])
    assert {entry["matched_by"] for entry in journal} == {"uuid"}
    assert {"finding_raised", "quarantine", "webhook_failed"} <= {e["kind"] for e in journal}
    capture = json.loads(members["capture.json"])
    assert capture["format"] == "gpuwatchd-capture" and not capture["anonymized"]


def test_no_token_secret_or_host_name_is_in_any_member(confirmed: Node, tmp_path: Path) -> None:
    out = tmp_path / "gpu2.tar.gz"
    assert _report(confirmed, out, "gpu:2", "--simulate", str(confirmed.scenario)).exit_code == 0
    members = _members(out)
    assert list(_hidden(members)) == []
    # The journal note quoted all of them: they were there to take out.
    assert json.loads(members["manifest.json"])["redacted"] >= 6
    assert "<redacted>" in members["journal.json"] and "<host>" in members["journal.json"]


def test_an_anonymized_report_names_no_board_by_its_uuid_or_serial(
    confirmed: Node, tmp_path: Path
) -> None:
    plain, anonymous = tmp_path / "plain.tar.gz", tmp_path / "anonymous.tar.gz"
    _report(confirmed, plain, "gpu:2", "--simulate", str(confirmed.scenario))
    result = _report(
        confirmed, anonymous, "gpu:2", "--simulate", str(confirmed.scenario), "--anonymize"
    )
    assert result.exit_code == 0
    serial = json.loads(_members(plain)["identity.json"])["serial"]
    members = _members(anonymous)
    for name, text in members.items():
        for original in (*confirmed.uuids.values(), serial):
            assert original.lower() not in text.lower(), (name, original)
    identity = json.loads(members["identity.json"])
    # The capture's own pseudonym for the board it recorded at index 2.
    assert identity["uuid"] == "GPU-00000000-0000-4000-8000-000000000002"
    assert json.loads(members["capture.json"])["anonymized"]
    assert list(_hidden(members)) == []


def test_a_board_nvml_no_longer_shows_is_named_by_its_last_saved_sample(
    confirmed: Node, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.yaml"
    missing.write_text(NODE + "faults: [{at: 0s, kind: gpu_missing, gpu: 2}]\n")
    out = tmp_path / "gone.tar.gz"
    result = _report(confirmed, out, f"gpu:{confirmed.uuids[2]}", "--simulate", str(missing))
    assert result.exit_code == 0, result.output
    identity = json.loads(_members(out)["identity.json"])
    assert identity["from"] == "last saved sample" and identity["uuid"] == confirmed.uuids[2]
    assert identity["serial"] and identity["index"] == 2


def test_a_board_replaced_since_is_reported_by_its_uuid_with_its_own_records_only(
    confirmed: Node, tmp_path: Path
) -> None:
    # The node reboots with another board in slot 2 (an RMA); the condemned
    # board's quarantine stays under its UUID.
    replaced = NODE + "faults: [{at: 0s, kind: gpu_replaced, gpu: 2}]\n"
    root = tmp_path / "rebooted"
    shutil.copytree(confirmed.state, root / "state")
    node = Node(root, root / "node.yaml", confirmed.config, confirmed.uuids)
    node.scenario.write_text(replaced)
    # An hour after the first boot's daemon stopped.
    with simulated_daemon(replaced, root, start=FakeClock().now() + 3600) as sim:
        snapshot = sim.run_until(30)
    new = next(gpu.uuid for gpu in snapshot.gpus if gpu.index == 2)
    assert new is not None and new != confirmed.uuids[2]
    out = tmp_path / "old.tar.gz"
    old = confirmed.uuids[2]
    result = _report(node, out, f"gpu:{old.upper()}", "--simulate", str(node.scenario))
    assert result.exit_code == 0, result.output
    members = _members(out)
    manifest = json.loads(members["manifest.json"])
    assert manifest["subject"] == f"gpu:{old}" and manifest["uuid"] == old
    assert json.loads(members["identity.json"])["from"] == "last saved sample"
    journal = json.loads(members["journal.json"])
    assert journal and all(new not in json.dumps(entry) for entry in journal)
    assert json.loads(members["canary.json"])["mismatches"]


def test_the_report_through_the_running_daemon_takes_its_status_and_records(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "api-token"
    token_file.write_text("secret-of-the-api\n")
    token_file.chmod(0o600)
    config = tmp_path / "gpuwatchd.yaml"
    out = tmp_path / "live.tar.gz"
    with simulated_daemon(SDC, tmp_path, CANARIES, canary=True) as sim:
        sim.run_until(300)
        server = serve(sim, token_file)
        try:
            port = server.url.rsplit(":", 1)[1]
            config.write_text(
                f"daemon:\n  listen: 127.0.0.1:{port}\n  state_dir: {tmp_path / 'state'}\n"
                f"api:\n  token_file: {token_file}\n"
            )
            # The daemon's simulated node is the NVML this process reads.
            command = ["report", "gpu:2", "--config", str(config), "--out", str(out)]
            result = CliRunner().invoke(main, command)
        finally:
            server.stop()
    assert result.exit_code == 0, result.output
    members = _members(out)
    assert json.loads(members["manifest.json"])["status_from"] == "daemon"
    status = json.loads(members["status.json"])
    (gpu,) = [s for s in status["subjects"] if s["subject"] == "gpu:2"]
    assert [f["code"] for f in gpu["findings"]] == ["sdc_confirmed"]
    assert {"immediate", "definitive", "subject"} <= set(gpu["findings"][0])
    canary = json.loads(members["canary.json"])
    assert canary["mismatches"] and canary["verdicts"]
    assert "secret-of-the-api" not in "".join(members.values())


def test_without_daemon_or_database_there_is_nothing_to_report(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(f"daemon:\n  listen: 127.0.0.1:{free_port()}\n")
    command = ["report", "gpu:0", "--config", str(config), "--state-dir", str(tmp_path / "s")]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1 and "nothing is recorded about gpu:0" in result.output
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("subject", "said"),
    [
        ("gpu:9", "there is no GPU 9 on this node now"),
        ("gpu:GPU-00000000-1111-4222-8333-444444444444", "no board with UUID"),
        ("disk:0", "not a subject"),
    ],
)
def test_a_subject_the_node_does_not_know_is_refused(
    confirmed: Node, tmp_path: Path, subject: str, said: str
) -> None:
    out = tmp_path / "refused.tar.gz"
    result = _report(confirmed, out, subject)
    assert result.exit_code == 1 and said in result.output
    assert not out.exists()


def test_entries_that_hold_no_uuid_are_matched_by_the_boards_index_and_marked_so() -> None:
    # Journaled before entries held their board's UUID: gpu:2 then may have
    # been another board; an entry that names another board is never taken.
    def entry(number: int, subject: str, data: dict[str, object]) -> JournalEntry:
        return JournalEntry(number, 1.0, "finding_raised", subject, "m", data=data)

    entries = (
        entry(1, "gpu:2", {"evidence": {}}),
        entry(2, "gpu:2", {"uuid": "GPU-bbbb"}),
        entry(3, "nvlink:2/1", {"uuid": "GPU-AAAA"}),
        entry(4, "node", {"evidence": {"uuid": "GPU-aaaa"}}),
        entry(5, "gpu:3", {}),
    )
    held = Held(Subject("gpu:2", "GPU-aaaa", 2), "state database", {}, entries, False, {})
    matched = [(e["id"], e["matched_by"]) for e in journal_of(held)]
    assert matched == [(1, "index"), (3, "uuid"), (4, "uuid")]
