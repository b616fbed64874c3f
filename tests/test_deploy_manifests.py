"""The Kubernetes kustomize base (deploy/kubernetes/base) and its Prometheus
Operator overlay, rendered by `kubectl kustomize` as `kubectl apply -k`
would: every Kubernetes object valid against the Kubernetes OpenAPI schema
(kubernetes-validate's JSON schemas, strict: no unknown field), offline, for
the oldest and newest Kubernetes it knows; and what they say agrees with
gpuwatchd: its config loads, the pod keeps the features (CUDA for the
canaries, the kernel log, the control API on a host socket off the pod
network), Prometheus finds the pods with the labels the rules assume, the
RBAC grants what the Kubernetes action uses, the pod survives our own taint.

The PodMonitor is a Prometheus Operator resource, not Kubernetes': no
Kubernetes schema has it, so it is held to the DaemonSet it scrapes."""

from __future__ import annotations

import functools
import posixpath
import shutil
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml
from actions_support import REPO
from kubernetes_validate.utils import all_versions

from gpuwatchd import __version__
from gpuwatchd.actions.kubernetes import TAINT_KEY
from gpuwatchd.config import Config, parse_config, parse_listen, unix_socket_path

BASE = REPO / "deploy" / "kubernetes" / "base"
OPERATOR = REPO / "deploy" / "kubernetes" / "prometheus-operator"
VERSIONS = sorted({all_versions()[0], all_versions()[-1]})
# The job the shipped rules select (config/prometheus/rules/).
RULES_JOB = "gpuwatchd"

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl is not installed (it renders the kustomize base, as `kubectl apply -k` does)",
)


@functools.cache
def _render(directory: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        ["kubectl", "kustomize", directory], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def _objects(directory: str = str(BASE)) -> list[dict[str, Any]]:
    # A copy each time: a test may change what it is given.
    return [dict(yaml.safe_load(yaml.safe_dump(doc))) for doc in _render(directory)]


def _one(kind: str, directory: str = str(BASE)) -> dict[str, Any]:
    [found] = [doc for doc in _objects(directory) if doc["kind"] == kind]
    return found


def _pod() -> dict[str, Any]:
    pod: dict[str, Any] = _one("DaemonSet")["spec"]["template"]
    return pod


def _container() -> dict[str, Any]:
    [container] = _pod()["spec"]["containers"]
    return dict(container)


def _config() -> Config:
    return parse_config(_one("ConfigMap")["data"]["gpuwatchd.yaml"], "ConfigMap gpuwatchd")


def _host_path_at(mount_path: str) -> dict[str, Any]:
    """The hostPath volume mounted at `mount_path` (the mount and the volume)."""
    [mount] = [m for m in _container()["volumeMounts"] if m["mountPath"] == mount_path]
    [volume] = [v for v in _pod()["spec"]["volumes"] if v["name"] == mount["name"]]
    return {**mount, **volume["hostPath"]}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_kubernetes_object_of_the_base_and_overlay_is_valid_against_the_schema(
    version: str,
) -> None:
    objects = [doc for doc in _objects(str(OPERATOR)) if doc["kind"] != "PodMonitor"]
    assert {doc["kind"] for doc in objects} == {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Service",
        "DaemonSet",
    }
    for doc in objects:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_would_catch_a_misspelt_field() -> None:
    daemonset = _one("DaemonSet")
    daemonset["spec"]["template"]["spec"]["tolerations"][0]["efect"] = "NoSchedule"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[-1], strict=True)


def test_the_overlay_is_the_base_and_a_podmonitor() -> None:
    base = [doc for doc in _objects() if doc["kind"] != "PodMonitor"]
    overlay = _objects(str(OPERATOR))
    assert [doc for doc in overlay if doc["kind"] != "PodMonitor"] == base
    assert [doc["kind"] for doc in overlay].count("PodMonitor") == 1


def test_the_configmap_is_a_config_gpuwatchd_accepts_with_the_kubernetes_action_on() -> None:
    config = _config()
    assert config.actions.kubernetes.enabled and not config.actions.kubernetes.dry_run
    assert _container()["ports"][0]["containerPort"] == parse_listen(config.daemon.listen)[1]
    assert _host_path_at(config.daemon.state_dir)["type"] == "DirectoryOrCreate"
    assert _host_path_at(config.sources.infiniband.sysfs_root)["readOnly"]
    # The pods take the generated ConfigMap, whose name changes with its content.
    [volume] = [v for v in _pod()["spec"]["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == _one("ConfigMap")["metadata"]["name"]


def test_the_control_api_is_on_a_socket_in_a_host_directory_not_on_the_pod_network() -> None:
    config = _config()
    assert config.api.listen is not None
    socket_path = unix_socket_path(config.api.listen)
    assert socket_path is not None, config.api.listen
    directory = posixpath.dirname(socket_path)
    assert _host_path_at(directory)["path"] == directory
    # The pod's address serves /metrics and /healthz only: with api.listen
    # set, the control API (reads too) is not served there.
    assert parse_listen(config.daemon.listen)[0] == "0.0.0.0"


def test_the_gpu_canaries_get_cuda_and_nvml_from_the_container_toolkit() -> None:
    env = {e["name"]: e.get("value") for e in _container()["env"]}
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) >= {"compute", "utility"}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert _config().canary.enabled


def test_the_kernel_log_is_mounted_read_only_where_the_daemon_reads_it() -> None:
    kernel_log = _config().sources.nvml.kernel_log
    assert kernel_log is not None
    mounted = _host_path_at(kernel_log)
    assert mounted["readOnly"] and mounted["type"] == "CharDevice"
    assert mounted["path"] == "/dev/kmsg"
    # The device cgroup admits /dev/kmsg only to a privileged container;
    # nothing else of the image is writable.
    context = _container()["securityContext"]
    assert context["privileged"] and context["readOnlyRootFilesystem"]


def test_prometheus_finds_the_pods_by_annotation_and_through_a_headless_service() -> None:
    annotations = _pod()["metadata"]["annotations"]
    [port] = _container()["ports"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.io/path"] == "/metrics"
    service = _one("Service")["spec"]
    assert service["clusterIP"] == "None"
    assert service["selector"].items() <= _pod()["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["ports"]] == [port["name"]]


def test_the_podmonitor_scrapes_the_pods_as_the_rules_expect_them() -> None:
    monitor = _one("PodMonitor", str(OPERATOR))
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    labels = _pod()["metadata"]["labels"]
    assert monitor["metadata"]["namespace"] == _one("DaemonSet")["metadata"]["namespace"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert labels[spec["jobLabel"]] == RULES_JOB
    [endpoint] = spec["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in _container()["ports"]}
    assert endpoint["path"] == "/metrics"
    # One instance per node, kept across rollouts (the pod's address is not).
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"} in (
        endpoint["relabelings"]
    )


def test_the_image_is_this_version() -> None:
    assert _container()["image"].rsplit(":", 1)[1] == __version__


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
    assert _pod()["spec"]["serviceAccountName"] == account["name"]


def test_the_daemon_keeps_running_on_a_node_it_quarantined() -> None:
    pod = _pod()["spec"]
    assert any(t["key"] == TAINT_KEY and t["operator"] == "Exists" for t in pod["tolerations"])
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
