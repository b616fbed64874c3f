"""The Kubernetes manifests: every object valid against the Kubernetes
OpenAPI schema (kubernetes-validate's JSON schemas, strict: no unknown
field), offline, for the oldest and newest Kubernetes it knows; and what
they say agrees with gpuwatchd: its config loads, the RBAC grants what the
Kubernetes action uses, the pod survives our own taint."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from actions_support import REPO
from kubernetes_validate.utils import all_versions

from gpuwatchd.actions.kubernetes import TAINT_KEY
from gpuwatchd.config import parse_config, parse_listen

MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
VERSIONS = sorted({all_versions()[0], all_versions()[-1]})


def _objects() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def _one(kind: str) -> dict[str, Any]:
    [found] = [doc for doc in _objects() if doc["kind"] == kind]
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schema(version: str) -> None:
    objects = _objects()
    assert {doc["kind"] for doc in objects} >= {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
    }
    for doc in objects:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_would_catch_a_misspelt_field() -> None:
    daemonset = _one("DaemonSet")
    daemonset["spec"]["template"]["spec"]["tolerations"][0]["efect"] = "NoSchedule"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[-1], strict=True)


def test_the_configmap_is_a_config_gpuwatchd_accepts_with_the_kubernetes_action_on() -> None:
    config = parse_config(_one("ConfigMap")["data"]["gpuwatchd.yaml"], "ConfigMap gpuwatchd")
    assert config.actions.kubernetes.enabled and not config.actions.kubernetes.dry_run
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["ports"][0]["containerPort"] == parse_listen(config.daemon.listen)[1]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert config.daemon.state_dir in mounts
    assert config.sources.infiniband.sysfs_root in mounts


def test_the_role_grants_what_the_kubernetes_action_uses_and_no_more() -> None:
    rules = {
        (resource, verb)
        for rule in _one("ClusterRole")["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert rules == {("nodes", "get"), ("nodes", "patch"), ("nodes/status", "patch")}
    binding = _one("ClusterRoleBinding")
    [subject] = binding["subjects"]
    account = _one("ServiceAccount")["metadata"]
    assert (subject["name"], subject["namespace"]) == (account["name"], account["namespace"])
    assert _one("DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]


def test_the_daemon_keeps_running_on_a_node_it_quarantined() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    assert any(t["key"] == TAINT_KEY and t["operator"] == "Exists" for t in pod["tolerations"])
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
