"""The control API on the daemon's listener, over real HTTP on loopback: the
production daemon over a simulated node (fake clock), its StatusServer, and
requests as any client makes them. Writes need the token; a manual change is
on /metrics when the request returns; bodies are validated; TLS works."""

from __future__ import annotations

import os
import re
import ssl
import stat
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_support import SCENARIO, Api, api_on, serve
from daemon_support import simulated_daemon
from hypothesis import given
from hypothesis import strategies as st

from gpuwatchd.actions.kubernetes import condition_type
from gpuwatchd.config import ApiConfig
from gpuwatchd.model import port_of_subject, port_subject
from gpuwatchd.policy import validate_subject
from gpuwatchd.server import ensure_token_file, read_tokens


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with api_on(tmp_path) as api:
        yield api


def test_a_quarantine_through_the_api_is_on_metrics_when_the_request_returns(api: Api) -> None:
    status, document = api.request(
        "POST", "/api/v1/quarantines", {"subject": "gpu:2", "reason": "fan noise"}
    )
    assert status == 201
    assert document["decision"]["kind"] == "quarantine"
    assert document["quarantine"]["operator"] == "alice"  # the token's name
    metrics = api.metrics()
    # The operator's words are the API's and the journal's, not a label's.
    assert (
        'gpuwatchd_quarantined{fault_code="",reason="operator",source="manual",'
        'subject="gpu:2"} 1.0' in metrics
    )
    # What follows from it follows at once: one GPU of four quarantines the node.
    assert 'source="auto",subject="node"} 1.0' in metrics
    _, listed = api.request("GET", "/api/v1/quarantines", token=None)
    assert {q["subject"] for q in listed["quarantines"]} == {"gpu:2", "node"}

    status, document = api.request("DELETE", "/api/v1/quarantines/gpu:2", {"reason": "quiet now"})
    assert status == 200 and document["decision"]["reason"] == "quiet now"
    quarantined = [m for m in api.metrics().splitlines() if m.startswith("gpuwatchd_quarantined{")]
    assert quarantined == []
    _, journal = api.request("GET", "/api/v1/journal?since=1h&subject=gpu:2", token=None)
    manual = [(e["kind"], e["operator"]) for e in journal["entries"] if e["source"] == "manual"]
    assert manual == [
        ("quarantine", "alice"),
        ("health_changed", "alice"),
        ("release", "alice"),
        ("health_changed", "alice"),
    ]


def test_findings_quarantines_and_journal_entries_carry_their_fault_code(api: Api) -> None:
    api.request("POST", "/api/v1/quarantines", {"subject": "gpu:2", "reason": "fan noise"})
    # One GPU of four quarantines the node, for its own finding.
    _, status = api.request("GET", "/api/v1/status", token=None)
    [node] = [s for s in status["subjects"] if s["subject"] == "node"]
    assert ("gpu_quarantine_ratio", "GW-1901") in {
        (f["code"], f["fault_code"]) for f in node["findings"]
    }
    _, listed = api.request("GET", "/api/v1/quarantines", token=None)
    held = {q["subject"]: q["fault_code"] for q in listed["quarantines"]}
    assert held == {"gpu:2": None, "node": "GW-1901"}  # a manual quarantine names no fault
    _, journal = api.request("GET", "/api/v1/journal?since=1h&subject=node", token=None)
    assert ("quarantine", "GW-1901") in {(e["kind"], e["fault_code"]) for e in journal["entries"]}


def test_a_bare_token_takes_the_operator_the_client_names(api: Api) -> None:
    body = {"subject": "node", "reason": "maintenance", "operator": "bob"}
    status, document = api.request("POST", "/api/v1/quarantines", body, token="bare-secret")
    assert status == 201 and document["quarantine"]["operator"] == "bob"


def test_a_gpu_named_by_uuid_and_a_link_with_a_slash_are_understood(api: Api) -> None:
    uuid = next(g.uuid for g in api.sim.daemon.snapshot.gpus if g.index == 3)
    status, document = api.request(
        "POST", "/api/v1/quarantines", {"subject": f"gpu:{uuid}", "reason": "suspect"}
    )
    assert status == 201 and document["decision"]["subject"] == "gpu:3"
    body = {"subject": "nvlink:1/2", "reason": "flaky"}
    assert api.request("POST", "/api/v1/quarantines", body)[0] == 201
    assert api.request("DELETE", "/api/v1/quarantines/nvlink%3A1%2F2")[0] == 200
    status, document = api.request("DELETE", "/api/v1/quarantines/nvlink:1/2")
    assert (status, document["error"]) == (404, "nvlink:1/2 is not quarantined")


@pytest.mark.parametrize("token", [None, "wrong", "alice"])
def test_a_write_without_a_valid_token_is_401_and_journaled(api: Api, token: str | None) -> None:
    body = {"subject": "gpu:1", "reason": "x"}
    status, document = api.request("POST", "/api/v1/quarantines", body, token=token)
    assert status == 401
    assert api.sim.daemon.store.quarantines() == ()
    (refused,) = [e for e in api.sim.daemon.store.journal.entries() if e.kind == "api_refused"]
    assert refused.message.startswith("POST /api/v1/quarantines from 127.0.0.1 refused")
    assert refused.message.endswith(document["error"])


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"subject": "gpu3", "reason": "x"}, 400, "not a subject: 'gpu3'"),
        ({"subject": "gpu:9", "reason": "x"}, 400, "gpu:9 is not on this node"),
        ({"subject": "ib:mlx5_7/1", "reason": "x"}, 400, "ib:mlx5_7/1 is not on this node"),
        ({"subject": "gpu:GPU-nope", "reason": "x"}, 400, "no GPU with UUID GPU-nope"),
        ({"subject": "gpu:1", "reason": "  "}, 400, "a reason is required"),
        ({"subject": "gpu:1"}, 400, "a reason is required"),
        ({"subject": "gpu:1", "reason": "a\nb"}, 400, "one line"),
        ({"subject": "gpu:1", "reason": "x" * 501}, 400, "longer than 500"),
        ({"subject": 3, "reason": "x"}, 400, "subject must be text"),
        (["gpu:1"], 400, "a JSON object"),
    ],
)
def test_a_body_that_makes_no_sense_is_a_4xx_with_a_message(
    api: Api, body: Any, status: int, message: str
) -> None:
    answer, document = api.request("POST", "/api/v1/quarantines", body)
    assert answer == status and message in document["error"]
    assert api.sim.daemon.store.quarantines() == ()


def test_an_oversized_or_unparsable_body_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "api-token"
    token_file.write_text("alice:s\n")
    token_file.chmod(0o600)
    with simulated_daemon(SCENARIO, tmp_path) as sim:
        sim.run_until(10)
        server = serve(sim, token_file, ApiConfig(max_body_bytes=64))
        try:
            api = Api(sim, server, "s")
            big = {"subject": "gpu:1", "reason": "x" * 100}
            status, document = api.request("POST", "/api/v1/quarantines", big)
            assert status == 413 and "larger than 64 bytes" in document["error"]
            status, document = api.request("POST", "/api/v1/quarantines", raw=b"{nope")
            assert status == 400 and "not JSON" in document["error"]
        finally:
            server.stop()


def test_the_journal_is_filtered_by_time_and_subject(api: Api) -> None:
    api.request("POST", "/api/v1/quarantines", {"subject": "gpu:0", "reason": "a"})
    now = api.sim.clock.now()
    _, recent = api.request("GET", f"/api/v1/journal?since={now - 1}", token=None)
    assert [e["subject"] for e in recent["entries"] if e["kind"] == "quarantine"] == [
        "gpu:0",
        "node",
    ]
    _, later = api.request("GET", f"/api/v1/journal?since={now + 1}", token=None)
    assert later["entries"] == []
    status, document = api.request("GET", "/api/v1/journal?since=yesterday", token=None)
    assert status == 400 and "since" in document["error"]


def test_the_token_file_is_created_private_with_one_random_secret(tmp_path: Path) -> None:
    path = tmp_path / "api-token"
    assert ensure_token_file(str(path)) is True
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    (token,) = read_tokens(str(path))
    assert token.operator is None and len(token.secret) >= 40
    assert ensure_token_file(str(path)) is False and read_tokens(str(path)) == (token,)


def test_tls_serves_the_api_with_the_configured_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    token_file = tmp_path / "api-token"
    token_file.write_text("alice:s\n")
    token_file.chmod(0o600)
    tls = ApiConfig(tls_cert_file=str(cert), tls_key_file=str(key))
    with simulated_daemon(SCENARIO, tmp_path) as sim:
        sim.run_until(10)
        server = serve(sim, token_file, tls)
        try:
            api = Api(sim, server, "s")
            assert api.url.startswith("https://127.0.0.1:")
            trusted = ssl.create_default_context(cafile=str(cert))
            body = {"subject": "gpu:1", "reason": "over TLS"}
            status, _ = api.request("POST", "/api/v1/quarantines", body, context=trusted)
            assert status == 201
            with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
                urllib.request.urlopen(f"{api.url}/healthz", timeout=5)
            plain = api.url.replace("https://", "http://")
            with pytest.raises((urllib.error.URLError, ConnectionError)):
                urllib.request.urlopen(f"{plain}/healthz", timeout=5)
        finally:
            server.stop()


# What the kernel may name an InfiniBand device (a rename takes any bytes but
# '/' and NUL, up to 63), as os.listdir gives it: undecodable bytes escaped.
DEVICE_NAMES = st.binary(min_size=1, max_size=63).filter(
    lambda name: b"/" not in name and b"\0" not in name
).map(os.fsdecode) | st.text(
    st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1
)
QUALIFIED = re.compile(r"^gpuwatchd\.io/[A-Za-z0-9_.-]+$")


@given(device=DEVICE_NAMES, port=st.integers(1, 255))
def test_any_infiniband_device_makes_a_subject_the_api_and_schedulers_take(
    device: str, port: int
) -> None:
    # Review adversarial-2, row 101: 'mlx5 x' made `ib:mlx5 x/1`, which the
    # API refused. Escaped, each name is a subject of its own that names it back.
    subject = port_subject(device, port)
    assert validate_subject(subject) == subject
    assert port_of_subject(subject) == (device, port)
    assert QUALIFIED.match(condition_type(subject))


def test_a_device_name_of_plain_characters_is_its_subject_as_it_was() -> None:
    assert port_subject("mlx5_0", 1) == "ib:mlx5_0/1"
    assert port_subject("hfi1-0.a", 2) == "ib:hfi1-0.a/2"
    assert port_subject("mlx5 x", 1) == "ib:mlx5%20x/1"
    assert port_subject("50%", 1) == "ib:50%25/1"
