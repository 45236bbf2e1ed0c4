"""Route 2 and 5 through the real apiserver: the GPU environment by envFrom/valueFrom, over time, and
the cGPU/gpushare isolation variables.

The pod's environment is applied after the device plugin's, so a ConfigMap or Secret that reaches a
GPU container's envFrom after admission could still hand it NVIDIA_VISIBLE_DEVICES=all. GPU007 keeps
such keys out of every source at write time; GPU001 refuses what a pod spec can compose itself.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Cluster
from tests.e2e.test_audit import audit, webhook_unregistered

pytestmark = pytest.mark.e2e

SOURCES_WEBHOOK = 'admission webhook "validate-env-sources.gpu-admission.io" denied the request'
PODS_WEBHOOK = 'admission webhook "validate.gpu-admission.io" denied the request'


def gpu_pod(
    name: str, *, env: list[dict[str, Any]] | None = None, env_from: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.example/app:1",
        "resources": {"limits": {"aliyun.com/gpu-mem": 1}},
    }
    if env is not None:
        container["env"] = env
    if env_from is not None:
        container["envFrom"] = env_from
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container]}}


def config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque", "stringData": data}


def webhook_log(cluster: Cluster) -> str:
    return (Path(cluster.state.directory) / "logs" / "webhook.log").read_text(errors="replace")


def test_a_config_map_created_after_the_pod_cannot_bring_the_visible_devices_key(cluster: Cluster) -> None:
    ns = cluster.namespace()
    # The ConfigMap does not exist yet: the kubelet would wait for it. The pod is admitted.
    admitted = cluster.apply(gpu_pod("trainer", env_from=[{"configMapRef": {"name": "late"}}]), namespace=ns)
    assert admitted.returncode == 0, admitted.stderr

    refused = cluster.apply(config_map("late", {"NVIDIA_VISIBLE_DEVICES": "all"}), namespace=ns)

    assert refused.returncode != 0
    assert SOURCES_WEBHOOK in refused.stderr
    assert "GPU007" in refused.stderr and "has the key NVIDIA_VISIBLE_DEVICES" in refused.stderr
    assert cluster.kubectl("get", "configmap", "late", "-n", ns).returncode != 0


def test_a_source_the_pod_already_takes_cannot_be_edited_to_carry_the_key_later(cluster: Cluster) -> None:
    ns = cluster.namespace()
    assert cluster.apply(config_map("settings", {"LOG_LEVEL": "debug"}), namespace=ns).returncode == 0
    admitted = cluster.apply(gpu_pod("trainer", env_from=[{"configMapRef": {"name": "settings"}}]), namespace=ns)
    assert admitted.returncode == 0, admitted.stderr

    for value in ("void", "all"):  # a void today could be edited to all before the container restarts
        patch = json.dumps({"data": {"NVIDIA_VISIBLE_DEVICES": value}})
        edited = cluster.kubectl("patch", "configmap", "settings", "-n", ns, "--type", "merge", "-p", patch)
        assert edited.returncode != 0
        assert SOURCES_WEBHOOK in edited.stderr and "GPU007" in edited.stderr

    assert cluster.get("configmap", "settings", namespace=ns)["data"] == {"LOG_LEVEL": "debug"}


def test_creating_a_config_map_with_the_key_is_refused_even_when_it_says_void(cluster: Cluster) -> None:
    ns = cluster.namespace()

    refused = cluster.apply(config_map("gpus", {"NVIDIA_VISIBLE_DEVICES": "void"}), namespace=ns)

    assert refused.returncode != 0
    assert SOURCES_WEBHOOK in refused.stderr and "(values are not read)" in refused.stderr


def test_a_secret_with_an_isolation_key_is_refused_and_its_values_never_echoed(cluster: Cluster) -> None:
    ns = cluster.namespace()
    value = "e2e-secret-value-7f3a"

    refused = cluster.apply(secret("creds", {"CGPU_DISABLE": "true", "TOKEN": value}), namespace=ns)

    assert refused.returncode != 0
    assert SOURCES_WEBHOOK in refused.stderr and "Secret 'creds' has the key CGPU_DISABLE" in refused.stderr
    encoded = base64.b64encode(value.encode()).decode()
    log = webhook_log(cluster)
    for shown in (value, encoded):
        assert shown not in refused.stderr
        assert shown not in log
    assert f"Secret/creds ns={ns}" in log  # the review did reach the webhook (and was logged by name only)


def test_env_from_with_a_prefix_composing_the_variable_is_refused(cluster: Cluster) -> None:
    ns = cluster.namespace()
    # An ordinary key: nothing for GPU007 to refuse; the prefix is what composes the name.
    assert cluster.apply(config_map("devices", {"VISIBLE_DEVICES": "all"}), namespace=ns).returncode == 0

    refused = cluster.apply(
        gpu_pod("composer", env_from=[{"prefix": "NVIDIA_", "configMapRef": {"name": "devices"}}]), namespace=ns
    )

    assert refused.returncode != 0
    assert PODS_WEBHOOK in refused.stderr
    assert "GPU001" in refused.stderr and "with prefix 'NVIDIA_', which composes NVIDIA_VISIBLE_DEVICES" in refused.stderr
    assert cluster.pods(namespace=ns) == []


@pytest.mark.parametrize(("name", "value"), [("CGPU_DISABLE", "true"), ("ALIYUN_COM_GPU_MEM_CONTAINER", "15")])
def test_a_gpu_mem_container_setting_an_isolation_variable_is_refused(cluster: Cluster, name: str, value: str) -> None:
    ns = cluster.namespace()

    refused = cluster.apply(gpu_pod("greedy", env=[{"name": name, "value": value}]), namespace=ns)

    assert refused.returncode != 0
    assert PODS_WEBHOOK in refused.stderr
    assert "GPU001" in refused.stderr and f'container "main" sets {name}={value}' in refused.stderr
    assert cluster.pods(namespace=ns) == []


def test_ordinary_sources_and_their_gpu_consumers_pass_and_never_reach_the_webhook(cluster: Cluster) -> None:
    ns = cluster.namespace()
    marker = f"ordinary-{ns}"

    created = cluster.apply([config_map(marker, {"LOG_LEVEL": "debug"}), secret(marker, {"password": "x"})], namespace=ns)
    assert created.returncode == 0, created.stderr
    updated = cluster.apply(
        [config_map(marker, {"LOG_LEVEL": "info", "CUDA_VISIBLE_DEVICES": "0"}), secret(marker, {"password": "y"})], namespace=ns
    )
    assert updated.returncode == 0, updated.stderr
    pod = gpu_pod(
        "app",
        env_from=[
            {"configMapRef": {"name": marker}},
            {"secretRef": {"name": marker}},
            {"prefix": "APP_", "configMapRef": {"name": marker}},
        ],
    )
    admitted = cluster.apply(pod, namespace=ns)
    assert admitted.returncode == 0, admitted.stderr
    assert cluster.get("pod", "app", namespace=ns)["spec"]["containers"][0]["envFrom"][0] == {"configMapRef": {"name": marker}}

    # The match condition runs in kube-apiserver: ordinary writes are never sent to the webhook.
    log = webhook_log(cluster)
    assert f"ConfigMap/{marker}" not in log and f"Secret/{marker}" not in log
    assert f"Pod/app ns={ns}" in log


def test_a_source_that_predates_the_webhook_is_reported_by_the_audit_and_cannot_be_edited(cluster: Cluster) -> None:
    ns = cluster.namespace()
    value = "legacy-secret-value-91c2"
    with webhook_unregistered(cluster):  # as if made before gpu-admission was installed
        made = cluster.apply(
            [
                config_map("legacy", {"NVIDIA_VISIBLE_DEVICES": "void"}),
                secret("legacy-creds", {"CGPU_DISABLE": "true", "TOKEN": value}),
                gpu_pod("taker", env_from=[{"secretRef": {"name": "legacy-creds"}}]),
            ],
            namespace=ns,
        )
        assert made.returncode == 0, made.stderr
    try:
        completed = audit(cluster, "-n", ns, "-o", "json")
        assert completed.returncode == 1, completed.stderr  # an enforce-level failure exists
        results = json.loads(completed.stdout)
        found = {
            (r["resources"][0]["kind"], r["resources"][0]["name"]): r
            for report in results["items"]  # a v1 List of PolicyReports
            for r in report.get("results", [])
            if r["policy"] == "GPU211"
        }
        assert found[("Secret", "legacy-creds")]["result"] == "fail"
        assert 'Pod/taker container "main" gets CGPU_DISABLE' in found[("Secret", "legacy-creds")]["message"]
        assert found[("ConfigMap", "legacy")]["result"] == "warn"
        encoded = base64.b64encode(value.encode()).decode()
        assert value not in completed.stdout + completed.stderr and encoded not in completed.stdout + completed.stderr

        # Back under the webhook: the void ConfigMap cannot be edited while it keeps the key, not even
        # to another harmless value; removing the key is the way out.
        edited = cluster.kubectl(
            "patch",
            "configmap",
            "legacy",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            json.dumps({"data": {"NVIDIA_VISIBLE_DEVICES": "none"}}),
        )
        assert edited.returncode != 0 and SOURCES_WEBHOOK in edited.stderr
        removed = cluster.kubectl(
            "patch",
            "configmap",
            "legacy",
            "-n",
            ns,
            "--type",
            "json",
            "-p",
            json.dumps([{"op": "remove", "path": "/data/NVIDIA_VISIBLE_DEVICES"}]),
        )
        assert removed.returncode == 0, removed.stderr
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
