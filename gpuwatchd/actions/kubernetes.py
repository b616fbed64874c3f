"""Kubernetes: cordon and taint the node on quarantine, undo only our own,
and a node condition for every unhealthy or quarantined subject.

- A node quarantine (and, with `gpu_quarantine: drain`, a GPU's or NVLink's)
  adds the `gpuwatchd.io/quarantined:NoSchedule` taint and cordons the node
  (`spec.unschedulable`). A cordon gpuwatchd made is recorded in the
  annotation `gpuwatchd.io/cordoned: "true"`; the reason goes in
  `gpuwatchd.io/quarantine-reason`.
- On release the taint is removed, and the node is uncordoned only if that
  annotation says gpuwatchd cordoned it: a node someone else cordoned stays
  cordoned. The patches carry the node's resourceVersion, so a change made
  meanwhile by someone else is a conflict (retried), never overwritten.
- Conditions `gpuwatchd.io/<subject>` (`gpuwatchd.io/gpu-3`) are True with
  reason Quarantined or Unhealthy while a subject is so, and False (Healthy)
  once it is well again; set with a strategic-merge patch of the node's
  status, which merges conditions by type and leaves the kubelet's alone.

Plain HTTPS with urllib and ssl: three endpoints do not need the official
client and its dependencies. Credentials come from the in-cluster service
account (its token re-read at every request, as projected tokens rotate),
or from a kubeconfig's current context: server, certificate-authority(-data),
insecure-skip-tls-verify, and a token, tokenFile or client certificate.
Exec and auth-provider plugins are not supported.

RBAC: get and patch on `nodes`, patch on `nodes/status`.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import socket
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuwatchd.actions.scheduler import (
    ActionFailed,
    Gate,
    Journaled,
    Outcome,
    SchedulerConfig,
    Unwell,
    Want,
    want_of,
)
from gpuwatchd.clock import Clock
from gpuwatchd.model import Health
from gpuwatchd.settings import Seconds
from gpuwatchd.snapshot import Snapshot

DOMAIN = "gpuwatchd.io"
TAINT_KEY = f"{DOMAIN}/quarantined"
CORDONED = f"{DOMAIN}/cordoned"
REASON = f"{DOMAIN}/quarantine-reason"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
# A node condition's reason by the health behind it (the others: Unhealthy).
_CONDITION_REASONS = {Health.QUARANTINED: "Quarantined", Health.UNKNOWN: "Unknown"}


@dataclass(frozen=True)
class KubernetesConfig(SchedulerConfig):
    # A kubeconfig; null: the in-cluster service account when running in a
    # pod, else $KUBECONFIG or ~/.kube/config.
    kubeconfig: str | None = None
    timeout: Seconds = 10.0


@dataclass(frozen=True)
class ApiServer:
    url: str
    token: Callable[[], str | None]
    context: ssl.SSLContext | None  # None for plain http


def condition_type(subject: str) -> str:
    """`gpu:3` -> `gpuwatchd.io/gpu-3`: a qualified name, as condition types
    are (so the `%` of an escaped port subject, `ib:mlx5%20x/1`, goes too)."""
    return f"{DOMAIN}/{_UNQUALIFIED.sub('-', subject)}"


_UNQUALIFIED = re.compile(r"[^A-Za-z0-9_.-]")


def in_cluster(root: Path = SERVICE_ACCOUNT) -> ApiServer:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    context = ssl.create_default_context(cafile=str(root / "ca.crt"))
    return ApiServer(f"https://{host}:{port}", lambda: _read(root / "token"), context)


def from_kubeconfig(path: Path) -> ApiServer:
    try:
        document = yaml.safe_load(path.read_text())
        context_name = document["current-context"]
        context = _named(document, "contexts", context_name)["context"]
        cluster = _named(document, "clusters", context["cluster"])["cluster"]
        user = _named(document, "users", context["user"]).get("user") or {}
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise ActionFailed("kubernetes_config_failed", f"kubeconfig {path}: {error}") from error
    if "exec" in user or "auth-provider" in user:
        raise ActionFailed(
            "kubernetes_config_failed",
            f"kubeconfig {path}: exec and auth-provider credentials are not supported; "
            "use a token, tokenFile or client certificate",
        )
    base = path.parent
    server = str(cluster["server"]).rstrip("/")
    try:
        ssl_context = _ssl_context(cluster, user, base) if server.startswith("https:") else None
    except (ssl.SSLError, OSError, ValueError) as error:
        raise ActionFailed(
            "kubernetes_config_failed", f"kubeconfig {path}: cannot use its TLS settings: {error}"
        ) from error
    return ApiServer(server, _token_source(user, base), ssl_context)


def _named(document: Mapping[str, Any], section: str, name: str) -> Mapping[str, Any]:
    for entry in document.get(section) or ():
        if entry.get("name") == name:
            found: Mapping[str, Any] = entry
            return found
    raise KeyError(f"no {section[:-1]} named {name!r}")


def _read(path: Path) -> str:
    return path.read_text().strip()


def _token_source(user: Mapping[str, Any], base: Path) -> Callable[[], str | None]:
    if "tokenFile" in user:
        token_file = base / user["tokenFile"]
        return lambda: _read(token_file)
    token = user.get("token")
    return lambda: token


def _ssl_context(cluster: Mapping[str, Any], user: Mapping[str, Any], base: Path) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif "certificate-authority-data" in cluster:
        context.load_verify_locations(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif "certificate-authority" in cluster:
        context.load_verify_locations(cafile=str(base / cluster["certificate-authority"]))
    if "client-certificate-data" in user or "client-certificate" in user:
        with tempfile.TemporaryDirectory(prefix="gpuwatchd-kube-") as scratch:
            certificate = _pem_file(user, "client-certificate", base, Path(scratch))
            key = _pem_file(user, "client-key", base, Path(scratch))
            context.load_cert_chain(certificate, key)
    return context


def _pem_file(user: Mapping[str, Any], field: str, base: Path, scratch: Path) -> str:
    """The path of a PEM the kubeconfig names or embeds; ssl loads only files."""
    if f"{field}-data" not in user:
        return str(base / user[field])
    path = scratch / field
    path.touch(mode=0o600)
    path.write_bytes(base64.b64decode(user[f"{field}-data"]))
    return str(path)


def node_tainted(node: Mapping[str, Any]) -> bool:
    """Whether the node carries gpuwatchd's taint."""
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") == TAINT_KEY for t in taints)


def node_name_default() -> str:
    """The downward API's NODE_NAME in a pod, else the hostname (the kubelet's
    default node name; a DaemonSet with hostNetwork sees the node's)."""
    return os.environ.get("NODE_NAME") or socket.gethostname().lower()


class Kubernetes:
    name = "kubernetes"

    def __init__(self, config: KubernetesConfig, clock: Clock) -> None:
        self.config = config
        self.node = config.node_name or node_name_default()
        self._clock = clock

    def want(self, snapshot: Snapshot) -> Want:
        return want_of(snapshot, self.config.gpu_quarantine, conditions=True)

    def plan(self, before: Want, after: Want) -> list[str]:
        lines = []
        if after.drain and not before.drain:
            lines.append(f"cordon {self.node} and taint it {TAINT_KEY}:NoSchedule")
        elif before.drain and not after.drain:
            lines.append(
                f"remove the {TAINT_KEY} taint of {self.node} (and uncordon it "
                "if gpuwatchd cordoned it)"
            )
        if after.unwell != before.unwell:
            lines.append(f"set the conditions of {self.node}: {_describe(after.unwell) or 'none'}")
        return lines

    def apply(self, want: Want, gate: Gate, journaled: Journaled, done: list[str]) -> Outcome:
        api = self._api()
        path = f"/api/v1/nodes/{urllib.parse.quote(self.node)}"
        node = self._request(api, "GET", path, "kubernetes_read_failed")
        drained, withheld = self._cordon(api, path, node, want, gate, journaled, done)
        self._conditions(api, path, node, want.unwell, done)
        drained_for = want.drain_reason if drained and not node_tainted(node) else None
        return Outcome(drained=drained, withheld=withheld, drained_for=drained_for)

    def _api(self) -> ApiServer:
        if self.config.kubeconfig:
            return from_kubeconfig(Path(self.config.kubeconfig))
        if "KUBERNETES_SERVICE_HOST" in os.environ:
            return in_cluster()
        default = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        return from_kubeconfig(Path(default or Path.home() / ".kube" / "config"))

    def _cordon(
        self,
        api: ApiServer,
        path: str,
        node: Mapping[str, Any],
        want: Want,
        gate: Gate,
        journaled: Journaled,
        done: list[str],
    ) -> tuple[bool, str | None]:
        metadata = node.get("metadata") or {}
        spec = node.get("spec") or {}
        taints = list(spec.get("taints") or [])
        tainted = node_tainted(node)
        cordoned_by_us = (metadata.get("annotations") or {}).get(CORDONED) == "true"
        version = metadata.get("resourceVersion")
        if want.drain and not tainted:
            verdict = gate() if want.automatic else None
            if verdict is not None and not verdict.allowed:
                return False, verdict.reason
            cordon = not spec.get("unschedulable", False)
            annotations = {REASON: want.drain_reason, **({CORDONED: "true"} if cordon else {})}
            patch: dict[str, Any] = {
                "metadata": {"resourceVersion": version, "annotations": annotations},
                "spec": {"taints": [*taints, {"key": TAINT_KEY, "effect": "NoSchedule"}]},
            }
            if cordon:
                patch["spec"]["unschedulable"] = True
            self._request(api, "PATCH", path, "kubernetes_cordon_failed", patch, MERGE_PATCH)
            done.append(
                f"{'cordoned and ' if cordon else ''}tainted {self.node}: {want.drain_reason}"
            )
            return True, None
        if not want.drain and (tainted or cordoned_by_us):
            reason = str((metadata.get("annotations") or {}).get(REASON) or "")
            if not journaled(reason):
                raise ActionFailed(
                    "kubernetes_drain_unexplained",
                    f"{self.node} carries gpuwatchd's taint ({reason}) but the journal does "
                    "not say why (state lost?): left in place; remove it by hand once the "
                    "fault is ruled out",
                )
            patch = {
                "metadata": {
                    "resourceVersion": version,
                    "annotations": {CORDONED: None, REASON: None},
                },
                "spec": {"taints": [t for t in taints if t.get("key") != TAINT_KEY]},
            }
            if cordoned_by_us:
                patch["spec"]["unschedulable"] = False
            self._request(api, "PATCH", path, "kubernetes_uncordon_failed", patch, MERGE_PATCH)
            done.append(
                f"removed gpuwatchd's taint{' and cordon' if cordoned_by_us else ''} "
                f"from {self.node}"
            )
            return False, None
        return tainted, None

    def _conditions(
        self,
        api: ApiServer,
        path: str,
        node: Mapping[str, Any],
        unwell: tuple[Unwell, ...],
        done: list[str],
    ) -> None:
        now = _rfc3339(self._clock.now())
        existing = {
            c["type"]: c
            for c in (node.get("status") or {}).get("conditions") or []
            if str(c.get("type", "")).startswith(f"{DOMAIN}/")
        }
        wanted = {
            condition_type(u.subject): (
                "True",
                _CONDITION_REASONS.get(u.health, "Unhealthy"),
                f"{u.subject}: {u.reason}",
            )
            for u in unwell
        }
        for kind, condition in existing.items():
            if kind not in wanted and condition.get("status") == "True":
                wanted[kind] = ("False", "Healthy", "healthy again")
        changed = []
        for kind, (status, reason, message) in sorted(wanted.items()):
            held = existing.get(kind, {})
            if (held.get("status"), held.get("reason"), held.get("message")) == (
                status,
                reason,
                message,
            ):
                continue
            moved = held.get("status") != status
            changed.append(
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now if moved else held.get("lastTransitionTime", now),
                }
            )
        if changed:
            patch = {"status": {"conditions": changed}}
            self._request(
                api,
                "PATCH",
                f"{path}/status",
                "kubernetes_condition_failed",
                patch,
                STRATEGIC_PATCH,
            )
            done.append(
                f"set conditions on {self.node}: "
                + ", ".join(f"{c['type']}={c['reason']}" for c in changed)
            )

    def _request(
        self,
        api: ApiServer,
        method: str,
        path: str,
        code: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        try:
            token = api.token()
        except OSError as error:
            raise ActionFailed(code, f"cannot read the API token: {error}") from error
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        request = urllib.request.Request(api.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(
                request, timeout=self.config.timeout, context=api.context
            ) as response:
                document: dict[str, Any] = json.load(response)
                return document
        except urllib.error.HTTPError as error:
            raise ActionFailed(
                code, f"{method} {path}: HTTP {error.code}: {_status_message(error)}"
            ) from error
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise ActionFailed(
                code, f"{method} {api.url}{path}: {getattr(error, 'reason', error)}"
            ) from error


def _status_message(error: urllib.error.HTTPError) -> str:
    """The message of the API server's Status object, or the HTTP reason."""
    try:
        return str(json.loads(error.read()).get("message") or error.reason)
    except (ValueError, OSError, AttributeError):
        return str(error.reason)


def _describe(unwell: tuple[Unwell, ...]) -> str:
    return ", ".join(f"{condition_type(u.subject)}={u.health.label}" for u in unwell)


def _rfc3339(timestamp: float) -> str:
    moment = datetime.datetime.fromtimestamp(int(timestamp), tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
