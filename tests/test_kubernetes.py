"""Kubernetes: cordon, taint and conditions through a fake API server of the
test's own (plain HTTP on loopback, a kubeconfig pointing at it), which
applies merge and strategic-merge patches as the real one does for nodes and
refuses a stale resourceVersion; only what gpuwatchd did is undone."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatchd.actions.fleet import FleetSafety, FleetSafetyConfig
from gpuwatchd.actions.kubernetes import (
    CORDONED,
    TAINT_KEY,
    Kubernetes,
    KubernetesConfig,
    condition_type,
    from_kubeconfig,
)
from gpuwatchd.actions.scheduler import ActionFailed, SchedulerWorker
from gpuwatchd.clock import FakeClock
from gpuwatchd.model import Finding, Health, Quarantine, Severity
from gpuwatchd.snapshot import Snapshot
from gpuwatchd.store import Store

TOKEN = "k8s-test-token"
NODE = "gpu-node-7"
T0 = FakeClock().now()
NODE_Q = Quarantine("node", "gpu_quarantine_ratio", "auto", T0, code="gpu_quarantine_ratio")
GPU_Q = Quarantine("gpu:1", "ecc_uncorrectable", "auto", T0, hardware=True)
FLEET_ALLOWS = FleetSafety(FleetSafetyConfig(enabled=False))
KUBELET_READY = {"type": "Ready", "status": "True", "reason": "KubeletReady"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


@dataclass
class FakeApiServer:
    server: ThreadingHTTPServer
    node: dict[str, Any]
    requests: list[tuple[str, str, str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Another client writes the node right after this many of our reads.
    writes_after_next_read: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def patches(self) -> list[tuple[str, str, Any]]:
        return [
            (path, kind, body) for method, path, kind, body in self.requests if method == "PATCH"
        ]

    def conditions(self) -> dict[str, dict[str, Any]]:
        return {c["type"]: c for c in self.node["status"]["conditions"]}


@contextlib.contextmanager
def api_server(spec: dict[str, Any] | None = None) -> Iterator[FakeApiServer]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, document: Any) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _status(self, code: int, message: str) -> None:
            self._reply(code, {"kind": "Status", "status": "Failure", "message": message})

        def do_GET(self) -> None:
            fake.requests.append(("GET", self.path, "", None))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._status(401, "Unauthorized")
            elif self.path != f"/api/v1/nodes/{NODE}":
                self._status(404, f"nodes {self.path.rsplit('/', 1)[-1]!r} not found")
            else:
                with fake.lock:
                    self._reply(200, fake.node)
                    if fake.writes_after_next_read:
                        fake.writes_after_next_read -= 1
                        version = int(fake.node["metadata"]["resourceVersion"])
                        fake.node["metadata"]["resourceVersion"] = str(version + 1)

        def do_PATCH(self) -> None:
            kind = self.headers.get("Content-Type", "")
            patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append(("PATCH", self.path, kind, patch))
            with fake.lock:
                node = fake.node
                if self.path == f"/api/v1/nodes/{NODE}/status":
                    conditions = {c["type"]: c for c in node["status"]["conditions"]}
                    for condition in patch["status"]["conditions"]:
                        conditions[condition["type"]] = condition
                    node["status"]["conditions"] = list(conditions.values())
                else:
                    version = (patch.get("metadata") or {}).get("resourceVersion")
                    if version is not None and version != node["metadata"]["resourceVersion"]:
                        self._status(409, "the object has been modified")
                        return
                    fake.node = node = merge_patch(node, patch)
                node["metadata"]["resourceVersion"] = str(
                    int(node["metadata"]["resourceVersion"]) + 1
                )
                self._reply(200, node)

    node = {
        "metadata": {"name": NODE, "resourceVersion": "100", "annotations": {}},
        "spec": dict(spec or {}),
        "status": {"conditions": [dict(KUBELET_READY)]},
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    fake = FakeApiServer(server, node)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def kubeconfig(path: Path, server: str, user: dict[str, Any] | None = None) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "gpu",
        "contexts": [{"name": "gpu", "context": {"cluster": "c1", "user": "agent"}}],
        "clusters": [{"name": "c1", "cluster": {"server": server}}],
        "users": [{"name": "agent", "user": user if user is not None else {"token": TOKEN}}],
    }
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with api_server() as fake:
        yield fake


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(str(tmp_path / "state"))


def worker(api: FakeApiServer, tmp_path: Path, store: Store, **settings: Any) -> SchedulerWorker:
    config = KubernetesConfig(
        enabled=True,
        node_name=NODE,
        kubeconfig=str(kubeconfig(tmp_path / "kubeconfig", api.url)),
        **settings,
    )
    return SchedulerWorker(Kubernetes(config, FakeClock()), FLEET_ALLOWS, store, FakeClock(), False)


def snapshot(*quarantines: Quarantine, unhealthy: tuple[str, ...] = ()) -> Snapshot:
    health = {q.subject: Health.QUARANTINED for q in quarantines}
    health.update({subject: Health.UNHEALTHY for subject in unhealthy})
    findings = tuple(
        Finding(s, "nvlink", "nvlink_crc_storm", Severity.CRITICAL, f"CRC storm on {s}")
        for s in unhealthy
    )
    return Snapshot(time=T0, quarantines=quarantines, health=health, findings=findings)


def test_a_quarantine_cordons_taints_and_sets_conditions_and_the_release_undoes_them(
    api: FakeApiServer, tmp_path: Path, store: Store
) -> None:
    kube = worker(api, tmp_path, store)
    kube.update(snapshot(NODE_Q, GPU_Q, unhealthy=("nvlink:2/7",)))
    kube.run_once(T0)
    node = api.node
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [{"key": TAINT_KEY, "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"][CORDONED] == "true"
    (cordon, conditions) = api.patches()
    assert cordon[1] == "application/merge-patch+json"
    assert cordon[2]["metadata"]["resourceVersion"] == "100"
    assert conditions[0].endswith("/status")
    assert conditions[1] == "application/strategic-merge-patch+json"
    held = api.conditions()
    assert held[condition_type("gpu:1")]["status"] == "True"
    assert held[condition_type("gpu:1")]["reason"] == "Quarantined"
    assert held["gpuwatchd.io/nvlink-2-7"]["reason"] == "Unhealthy"
    assert held["gpuwatchd.io/nvlink-2-7"]["message"] == "nvlink:2/7: CRC storm on nvlink:2/7"
    assert held["Ready"] == KUBELET_READY  # the kubelet's own are left alone
    assert kube.status().drained

    kube.update(snapshot())
    kube.run_once(T0 + 10)
    node = api.node
    assert node["spec"]["unschedulable"] is False and node["spec"]["taints"] == []
    assert CORDONED not in node["metadata"]["annotations"]
    held = api.conditions()
    assert {held[t]["status"] for t in held if t.startswith("gpuwatchd.io/")} == {"False"}
    assert held[condition_type("node")]["reason"] == "Healthy"
    assert not kube.status().drained


def test_a_node_someone_else_cordoned_keeps_its_cordon_and_taints(
    tmp_path: Path, store: Store
) -> None:
    theirs = {"key": "maintenance", "effect": "NoSchedule"}
    with api_server({"unschedulable": True, "taints": [theirs]}) as api:
        kube = worker(api, tmp_path, store)
        kube.update(snapshot(NODE_Q))
        kube.run_once(T0)
        assert api.node["spec"]["taints"] == [theirs, {"key": TAINT_KEY, "effect": "NoSchedule"}]
        assert CORDONED not in api.node["metadata"]["annotations"]
        kube.update(snapshot())
        kube.run_once(T0 + 10)
        assert api.node["spec"]["unschedulable"] is True
        assert api.node["spec"]["taints"] == [theirs]


def test_a_gpu_quarantine_with_mark_sets_only_its_condition(
    api: FakeApiServer, tmp_path: Path, store: Store
) -> None:
    kube = worker(api, tmp_path, store, gpu_quarantine="mark")
    kube.update(snapshot(GPU_Q))
    kube.run_once(T0)
    assert "unschedulable" not in api.node["spec"]
    assert api.conditions()[condition_type("gpu:1")]["status"] == "True"


def test_a_conflicting_change_is_a_finding_and_is_retried(
    api: FakeApiServer, tmp_path: Path, store: Store
) -> None:
    kube = worker(api, tmp_path, store, retry_interval=30.0)
    kube.update(snapshot(NODE_Q))
    api.writes_after_next_read = 1
    due = kube.run_once(T0)
    (finding,) = kube.findings()
    assert finding.code == "kubernetes_cordon_failed" and "HTTP 409" in finding.message
    assert due == T0 + 30 and "unschedulable" not in api.node["spec"]
    kube.run_once(T0 + 30)
    assert kube.findings() == () and api.node["spec"]["unschedulable"] is True


def test_dry_run_patches_nothing(api: FakeApiServer, tmp_path: Path, store: Store) -> None:
    kube = worker(api, tmp_path, store, dry_run=True)
    kube.update(snapshot(NODE_Q))
    kube.run_once(T0)
    assert api.requests == []
    (entry, conditions) = [e for e in store.journal.entries() if e.kind == "action"]
    assert entry.dry_run and "would cordon gpu-node-7" in entry.message
    assert "gpuwatchd.io/node=quarantined" in conditions.message


def test_kubeconfig_token_file_and_embedded_ca_are_read(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    path = kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1", {"tokenFile": "token"})
    assert from_kubeconfig(path).token() == TOKEN
    bad_ca = base64.b64encode(b"not a certificate").decode()
    document = yaml.safe_load(path.read_text())
    document["clusters"][0]["cluster"] = {
        "server": "https://127.0.0.1:1",
        "certificate-authority-data": bad_ca,
    }
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ActionFailed, match="cannot use its TLS settings"):
        from_kubeconfig(path)


def test_an_exec_plugin_kubeconfig_is_refused_with_a_finding(
    api: FakeApiServer, tmp_path: Path, store: Store
) -> None:
    path = kubeconfig(tmp_path / "kubeconfig", api.url, {"exec": {"command": "aws"}})
    with pytest.raises(ActionFailed, match="exec and auth-provider credentials"):
        from_kubeconfig(path)
    config = KubernetesConfig(enabled=True, node_name=NODE, kubeconfig=str(path))
    kube = SchedulerWorker(Kubernetes(config, FakeClock()), FLEET_ALLOWS, store, FakeClock(), False)
    kube.update(snapshot(NODE_Q))
    kube.run_once(T0)
    assert kube.findings()[0].code == "kubernetes_config_failed" and api.requests == []
