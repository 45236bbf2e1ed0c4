"""Host paths and the toolkit's device-list volume, through the real apiserver: in a pod that can reach a
GPU node the runtime socket (GPU003) and `/var/run/nvidia-container-devices` (GPU006) are refused; a
log agent without GPUs keeps its hostPath and is kept off GPU nodes (GPU103).
"""

from __future__ import annotations

from typing import Any

import pytest

from policies.trustzone import DEFAULT_ZONE
from tests.e2e.harness import Cluster, deployment

pytestmark = pytest.mark.e2e


def pod(
    name: str,
    *,
    volume: dict[str, Any],
    mount_path: str,
    limits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.example/app:1",
        "volumeMounts": [{"name": volume["name"], "mountPath": mount_path}],
    }
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "volumes": [volume]},
    }


def test_the_container_runtime_socket_by_host_path_is_refused_with_gpu003(cluster: Cluster) -> None:
    ns = cluster.namespace()
    socket = {"name": "containerd", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}}
    attack = pod("runtime-socket", volume=socket, mount_path="/run/containerd/containerd.sock", limits={"aliyun.com/gpu-mem": 1})

    completed = cluster.apply(attack, namespace=ns)

    assert completed.returncode != 0
    assert 'admission webhook "validate.gpu-admission.io" denied the request' in completed.stderr
    assert (
        "GPU003: a pod that can reach a GPU node may mount only the host paths and volume types GPU nodes allow: "
        'volume "containerd" mounts hostPath /run/containerd/containerd.sock, which is not an allowed host path (lies in /run'
    ) in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_the_docker_socket_through_var_run_is_refused_in_a_deployment(cluster: Cluster) -> None:
    ns = cluster.namespace()
    template = pod(
        "x",
        volume={"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}},
        mount_path="/var/run/docker.sock",
        limits={"nvidia.com/gpu": 1},
    )

    completed = cluster.apply(deployment("docker-in-docker", template["spec"], app="dind"), namespace=ns)

    assert completed.returncode != 0
    assert "GPU003" in completed.stderr
    assert "mounts hostPath /run/docker.sock (written '/var/run/docker.sock')" in completed.stderr
    assert cluster.kubectl("get", "deployment", "docker-in-docker", "-n", ns).returncode != 0


def test_the_device_list_volume_in_a_gpu_mem_pod_is_refused_with_gpu006(cluster: Cluster) -> None:
    ns = cluster.namespace()
    # An emptyDir, so that only GPU006 speaks (a /dev/null hostPath is GPU003's too).
    devices = {"name": "devices", "emptyDir": {}}
    attack = pod(
        "device-list", volume=devices, mount_path="/var/run/nvidia-container-devices/all", limits={"aliyun.com/gpu-mem": 1}
    )

    completed = cluster.apply(attack, namespace=ns)

    assert completed.returncode != 0
    assert (
        "GPU006: no container may mount anything at the NVIDIA device-list path /var/run/nvidia-container-devices: "
        'container "main" mounts volume "devices" at /var/run/nvidia-container-devices/all, which the NVIDIA container '
        'toolkit reads as a request for GPU "all"; request GPUs as resources'
    ) in completed.stderr
    assert "GPU003" not in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_the_dev_null_host_path_at_the_device_list_path_is_refused_by_both_policies(cluster: Cluster) -> None:
    ns = cluster.namespace()
    dev_null = {"name": "devices", "hostPath": {"path": "/dev/null"}}
    attack = pod(
        "dev-null", volume=dev_null, mount_path="/var/run/nvidia-container-devices/all", limits={"aliyun.com/gpu-mem": 1}
    )

    completed = cluster.apply(attack, namespace=ns)

    assert completed.returncode != 0
    assert "GPU006" in completed.stderr and "GPU003" in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_a_log_agent_with_a_var_log_host_path_is_admitted_off_gpu_nodes(cluster: Cluster) -> None:
    ns = cluster.namespace()
    logs = {"name": "varlog", "hostPath": {"path": "/var/log", "type": "Directory"}}

    agent = pod("log-agent", volume=logs, mount_path="/var/log")

    completed = cluster.apply(agent, namespace=ns)

    assert completed.returncode == 0, completed.stderr
    assert "GPU103: pods that use no GPU but have node power are kept off GPU nodes" in completed.stderr  # the warning
    stored = cluster.get("pod", "log-agent", namespace=ns)
    assert stored["spec"]["volumes"][0]["hostPath"]["path"] == "/var/log"
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [dict(e) for e in DEFAULT_ZONE.keep_off]}]
    placed = cluster.pod_once(
        "log-agent", namespace=ns, condition=lambda found: bool(found["spec"].get("nodeName")), what="log-agent scheduled"
    )
    assert placed["spec"]["nodeName"] == "cpu-0"  # the only node without GPUs in the default node set


def test_an_emptydir_at_var_run_in_a_gpu_pod_is_admitted(cluster: Cluster) -> None:
    ns = cluster.namespace()
    run = {"name": "run", "emptyDir": {}}

    completed = cluster.apply(pod("pid-files", volume=run, mount_path="/var/run", limits={"aliyun.com/gpu-mem": 1}), namespace=ns)

    assert completed.returncode == 0, completed.stderr
