"""GPU nodes are a trust zone, through the real apiserver and kube-scheduler, from a tenant's side.

A pod that asks for a card gets only what GPU nodes allow: the kubelet's FlexVolume directory (the
kubelet runs a new driver's `init` as root) and `SYS_MODULE` are refused, though no list of
dangerous paths or capabilities ever named them. A CI runner without GPUs keeps the Docker socket
and its privilege, is told why it is kept off GPU nodes, and kube-scheduler places it on the
CPU-only node, and while that node is cordoned it waits Pending rather than land on a free GPU node.
A NIC under `nvidia.com/` is no GPU, and another scheduler's device annotation is refused on any
pod.

The default KWOK node set has GPU nodes (cgpu-binpack-0, ...) and one CPU-only node (cpu-0).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.harness import Cluster

pytestmark = pytest.mark.e2e

CPU_NODE = "cpu-0"
CARD_LABEL = "aliyun.accelerator/nvidia_name"
FLEXVOLUME = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"


def pod(name: str, *, limits: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "image": "registry.example/app:1", **container}
    if limits:
        main["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [main]}}


def create(cluster: Cluster, obj: dict[str, Any], *, namespace: str) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj))


def test_a_gpu_pod_mounting_the_kubelets_flexvolume_directory_is_refused(cluster: Cluster) -> None:
    ns = cluster.namespace()
    attack = pod("flex", limits={"aliyun.com/gpu-mem": 1}, volumeMounts=[{"name": "flex", "mountPath": "/flex"}])
    attack["spec"]["volumes"] = [{"name": "flex", "hostPath": {"path": FLEXVOLUME, "type": "DirectoryOrCreate"}}]

    completed = create(cluster, attack, namespace=ns)

    assert completed.returncode != 0
    assert 'admission webhook "validate.gpu-admission.io" denied the request: GPU003: ' in completed.stderr
    assert f'volume "flex" mounts hostPath {FLEXVOLUME}, which is not an allowed host path' in completed.stderr
    assert cluster.pods(namespace=ns) == []


@pytest.mark.parametrize("spelled", ["SYS_MODULE", "cap_dac_read_search"])
def test_a_gpu_pod_adding_a_capability_no_list_named_is_refused(cluster: Cluster, spelled: str) -> None:
    ns = cluster.namespace()

    completed = create(cluster, pod("module", limits={"aliyun.com/gpu-mem": 1}, securityContext={"capabilities": {"add": [spelled]}}), namespace=ns)

    assert completed.returncode != 0
    assert "GPU002: " in completed.stderr and f'container "main" adds capability {spelled}' in completed.stderr
    assert cluster.pods(namespace=ns) == []


def ci_runner(name: str) -> dict[str, Any]:
    """A privileged CI runner with the Docker socket, asking for no GPU."""
    runner = pod(name, securityContext={"privileged": True}, volumeMounts=[{"name": "docker", "mountPath": "/var/run/docker.sock"}])
    runner["spec"]["volumes"] = [{"name": "docker", "hostPath": {"path": "/var/run/docker.sock", "type": "Socket"}}]
    return runner


def scheduling_condition(found: dict[str, Any]) -> dict[str, Any]:
    """The pod's PodScheduled condition ({} while there is none)."""
    conditions = found.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


def test_a_ci_runner_with_the_docker_socket_is_warned_kept_off_gpu_nodes_and_placed_on_the_cpu_node(cluster: Cluster) -> None:
    ns = cluster.namespace()

    completed = create(cluster, ci_runner("ci-runner"), namespace=ns)

    assert completed.returncode == 0, completed.stderr
    assert "Warning: GPU103: pods that use no GPU but have node power are kept off GPU nodes: kept off GPU nodes" in completed.stderr
    assert "volume \"docker\" mounts hostPath /run/docker.sock (written '/var/run/docker.sock')" in completed.stderr
    stored = cluster.pod_once(
        "ci-runner", namespace=ns, condition=lambda found: bool(found.get("spec", {}).get("nodeName")), what="ci-runner scheduled"
    )
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": CARD_LABEL, "operator": "DoesNotExist"}]}]
    assert stored["spec"]["nodeName"] == CPU_NODE
    assert CARD_LABEL not in cluster.node_labels(CPU_NODE)


def test_a_ci_runner_waits_pending_while_only_gpu_nodes_are_schedulable_and_then_lands_on_the_cpu_node(cluster: Cluster) -> None:
    ns = cluster.namespace()
    cordoned = cluster.kubectl("cordon", CPU_NODE)
    assert cordoned.returncode == 0, cordoned.stderr
    try:
        completed = create(cluster, ci_runner("waiting-runner"), namespace=ns)
        assert completed.returncode == 0, completed.stderr
        # kube-scheduler tried every node: the cordoned CPU node and GPU nodes the affinity excludes.
        waiting = cluster.pod_once(
            "waiting-runner",
            namespace=ns,
            condition=lambda found: scheduling_condition(found).get("reason") == "Unschedulable",
            what="waiting-runner found unschedulable",
        )
    finally:
        uncordoned = cluster.kubectl("uncordon", CPU_NODE)
    assert uncordoned.returncode == 0, uncordoned.stderr
    assert "nodeName" not in waiting["spec"]
    message = scheduling_condition(waiting)["message"]
    assert "1 node(s) were unschedulable" in message
    assert "node(s) didn't match Pod's node affinity/selector" in message

    placed = cluster.pod_once(
        "waiting-runner", namespace=ns, condition=lambda found: bool(found["spec"].get("nodeName")), what="waiting-runner scheduled"
    )

    assert placed["spec"]["nodeName"] == CPU_NODE


def test_a_container_asking_only_for_a_nic_gets_void_devices(cluster: Cluster) -> None:
    ns = cluster.namespace()

    completed = create(cluster, pod("rdma", limits={"nvidia.com/hostdev": 1}), namespace=ns)

    assert completed.returncode == 0, completed.stderr
    stored = cluster.get("pod", "rdma", namespace=ns)
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in stored["spec"]["containers"][0]["env"]


def test_another_schedulers_device_annotation_is_refused_on_a_pod_without_gpus(cluster: Cluster) -> None:
    ns = cluster.namespace()
    forged = pod("forged")
    forged["metadata"]["annotations"] = {"scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":0}]}'}

    completed = create(cluster, forged, namespace=ns)

    assert completed.returncode != 0
    assert "GPU010: " in completed.stderr and "scheduling.koordinator.sh/device-allocated" in completed.stderr
    assert cluster.pods(namespace=ns) == []
