"""Privilege short of `privileged: true`, through the real apiserver: SYS_ADMIN/ALL capabilities
(GPU002, GPU103) and `kubectl debug` ephemeral containers added to running pods (GPU009).

The default KWOK node set has GPU nodes (cgpu-binpack-0, ...) and one CPU-only node (cpu-0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from policies import nodeaffinity
from policies.trustzone import DEFAULT_ZONE
from tests.e2e.harness import Cluster

pytestmark = pytest.mark.e2e

GPU_NODE = "cgpu-binpack-0"
CPU_NODE = "cpu-0"
CARD_LABEL = "aliyun.accelerator/nvidia_name"


def pod(
    name: str, *, capabilities: list[str] | None = None, limits: dict[str, Any] | None = None, node: str | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    if capabilities is not None:
        container["securityContext"] = {"capabilities": {"add": capabilities}}
    if limits:
        container["resources"] = {"limits": limits}
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def required_terms(stored: dict[str, Any]) -> list[Mapping[str, Any]]:
    """The stored pod's required node-affinity terms, read as the engine reads them."""
    return list(nodeaffinity.required_terms(stored["spec"]))


def running_on(cluster: Cluster, name: str, *, namespace: str) -> dict[str, Any]:
    def running(found: dict[str, Any]) -> bool:
        return bool(found.get("status", {}).get("phase") == "Running")

    return cluster.pod_once(name, namespace=namespace, condition=running, what=f"pod {namespace}/{name} Running")


def run_pod(cluster: Cluster, manifest: dict[str, Any], *, namespace: str) -> dict[str, Any]:
    """Create `manifest` (it must be admitted) and wait until it runs: the pod as stored."""
    completed = cluster.apply(manifest, namespace=namespace)
    assert completed.returncode == 0, completed.stderr
    return running_on(cluster, manifest["metadata"]["name"], namespace=namespace)


def debug(cluster: Cluster, name: str, *, namespace: str, profile: str, container: str = "debugger") -> Any:
    """`kubectl debug POD --profile=...`: adds an ephemeral container through pods/ephemeralcontainers."""
    return cluster.kubectl(
        "debug",
        name,
        "-n",
        namespace,
        f"--profile={profile}",
        "--image=registry.example/busybox:1",
        "-c",
        container,
        "--target=main",
    )


def ephemeral(cluster: Cluster, name: str, *, namespace: str) -> dict[str, dict[str, Any]]:
    stored = cluster.get("pod", name, namespace=namespace)
    return {c["name"]: c for c in stored["spec"].get("ephemeralContainers", [])}


def test_a_gpu_mem_pod_adding_sys_admin_is_refused_by_gpu002(cluster: Cluster) -> None:
    ns = cluster.namespace()

    completed = cluster.apply(pod("sysadmin-gpu", capabilities=["SYS_ADMIN"], limits={"aliyun.com/gpu-mem": 2}), namespace=ns)

    assert completed.returncode != 0
    assert "GPU002" in completed.stderr and 'container "main" adds capability SYS_ADMIN' in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_a_cpu_pod_adding_all_capabilities_is_kept_off_gpu_nodes_by_gpu103(cluster: Cluster) -> None:
    ns = cluster.namespace()

    completed = cluster.apply(pod("all-caps", capabilities=["ALL"]), namespace=ns)

    assert completed.returncode == 0, completed.stderr
    stored = running_on(cluster, "all-caps", namespace=ns)
    assert required_terms(stored) == [{"matchExpressions": [dict(e) for e in DEFAULT_ZONE.keep_off]}]
    assert CARD_LABEL not in cluster.node_labels(stored["spec"]["nodeName"])


def test_a_cpu_pod_adding_net_bind_service_is_admitted_unchanged(cluster: Cluster) -> None:
    ns = cluster.namespace()

    completed = cluster.apply(pod("web", capabilities=["NET_BIND_SERVICE"]), namespace=ns)

    assert completed.returncode == 0, completed.stderr
    stored = running_on(cluster, "web", namespace=ns)
    assert "affinity" not in stored["spec"]
    assert stored["spec"]["containers"][0]["securityContext"] == {"capabilities": {"add": ["NET_BIND_SERVICE"]}}


def test_kubectl_debug_sysadmin_is_refused_on_a_pod_running_on_a_gpu_node(cluster: Cluster) -> None:
    ns = cluster.namespace()
    run_pod(cluster, pod("on-gpu", node=GPU_NODE), namespace=ns)

    completed = debug(cluster, "on-gpu", namespace=ns, profile="sysadmin")

    assert completed.returncode != 0
    assert "GPU009" in completed.stderr
    assert f'ephemeral container "debugger" is privileged; the pod runs on the GPU node {GPU_NODE}' in completed.stderr
    assert ephemeral(cluster, "on-gpu", namespace=ns) == {}


def test_kubectl_debug_netadmin_is_refused_on_a_pod_running_on_a_gpu_node(cluster: Cluster) -> None:
    # NET_ADMIN opens nf_tables to the container, the kernel code behind most recent escapes.
    ns = cluster.namespace()
    run_pod(cluster, pod("net-on-gpu", node=GPU_NODE), namespace=ns)

    completed = debug(cluster, "net-on-gpu", namespace=ns, profile="netadmin")

    assert completed.returncode != 0
    assert (
        "GPU009" in completed.stderr and 'ephemeral container "debugger" adds capability NET_ADMIN, NET_RAW' in completed.stderr
    )
    assert ephemeral(cluster, "net-on-gpu", namespace=ns) == {}


def test_kubectl_debug_sysadmin_is_allowed_on_a_pod_running_on_the_cpu_only_node(cluster: Cluster) -> None:
    ns = cluster.namespace()
    run_pod(cluster, pod("on-cpu", node=CPU_NODE), namespace=ns)

    completed = debug(cluster, "on-cpu", namespace=ns, profile="sysadmin")

    assert completed.returncode == 0, completed.stderr
    assert ephemeral(cluster, "on-cpu", namespace=ns)["debugger"]["securityContext"] == {"privileged": True}


def test_a_sys_admin_ephemeral_container_patched_onto_a_pod_on_a_gpu_node_is_refused(cluster: Cluster) -> None:
    ns = cluster.namespace()
    run_pod(cluster, pod("patched", node=GPU_NODE), namespace=ns)
    added = {
        "name": "raw",
        "image": "registry.example/busybox:1",
        "targetContainerName": "main",
        "securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}},
    }
    patch = json.dumps({"spec": {"ephemeralContainers": [added]}})

    completed = cluster.kubectl(
        "patch", "pod", "patched", "-n", ns, "--subresource=ephemeralcontainers", "--type=strategic", "-p", patch
    )

    assert completed.returncode != 0
    assert "GPU009" in completed.stderr and 'ephemeral container "raw" adds capability CAP_SYS_ADMIN' in completed.stderr
    assert ephemeral(cluster, "patched", namespace=ns) == {}


def test_kubectl_debug_of_a_gpu_node_itself_is_refused(cluster: Cluster) -> None:
    ns = cluster.namespace()

    completed = cluster.kubectl("debug", f"node/{GPU_NODE}", "-n", ns, "--profile=sysadmin", "--image=registry.example/busybox:1")

    assert completed.returncode != 0
    # The pod names a GPU node (the webhook reads the node's labels): the host's root filesystem by
    # hostPath, and privileged with the host's PID and network namespaces.
    assert "GPU003" in completed.stderr and "GPU002" in completed.stderr
    assert f"the pod runs on the GPU node {GPU_NODE}" in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_kubectl_debug_sysadmin_on_a_running_gpu_mem_pod_is_refused_by_gpu009(cluster: Cluster) -> None:
    ns = cluster.namespace()
    run_pod(cluster, pod("shared", limits={"aliyun.com/gpu-mem": 1}), namespace=ns)

    completed = debug(cluster, "shared", namespace=ns, profile="sysadmin")

    assert completed.returncode != 0
    assert "GPU009" in completed.stderr and 'ephemeral container "debugger" is privileged' in completed.stderr
    assert "GPU002" not in completed.stderr  # one policy judges new ephemeral containers, GPU pod or not
    assert ephemeral(cluster, "shared", namespace=ns) == {}
