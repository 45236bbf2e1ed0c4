"""Variants of issue 13's routes tried from a tenant's side, through the real apiserver.

- A hostPath of `/sys/fs/cgroup` (GPU003): on a cgroup v1 node a root container with a writable
  hierarchy moves itself into the devices controller's root cgroup and opens every card. GPU nodes
  allow no cgroup host path at all, however it is mounted, in a pod that asks for a GPU or names a
  GPU node; a pod without GPUs keeps it and is kept off GPU nodes (GPU103). Where an admin allows
  it (`trustZone.allow.hostPaths`), only a mount with `readOnly: true` and `recursiveReadOnly:
  Enabled` passes, in the pod and in an ephemeral container added later through
  `pods/ephemeralcontainers` (it cannot add volumes, but it can mount the pod's).
- A hostPath of `/var/log` (GPU003): the kubelet follows a symbolic link planted in
  `/var/log/pods` when it serves `kubectl logs`. Refused in a GPU pod, kept off GPU nodes without
  GPUs; an admin's allowance is read-only.
- A privileged container beside a Dynamic Resource Allocation claim (`spec.resourceClaims`), which
  may hand it a card: GPU002 counts the pod as a GPU pod.
- A pod that claims to be a mirror pod (`kubernetes.io/config.mirror`) without being a kubelet's is
  judged like any other; a kubelet's own mirror pod is still skipped.
- `pods/resize` (not sent to the webhook) cannot add a GPU resource: kube-apiserver refuses it.
- A gated pod's affinity UPDATE (not sent) cannot drop GPU103's DoesNotExist: kube-apiserver only
  lets it narrow.
- An ephemeral container whose `envFrom` prefix composes `NVIDIA_VISIBLE_DEVICES`: the mutating
  webhook also runs on the subresource and gives it `NVIDIA_VISIBLE_DEVICES=void` in `env`, which
  the kubelet applies after `envFrom`, so the prefix composes nothing.

The default KWOK node set has GPU nodes (cgpu-binpack-0, ...) and one CPU-only node (cpu-0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from policies import nodeaffinity
from policies.trustzone import DEFAULT_ZONE
from tests.e2e.harness import Cluster, eventually, webhook_settings

pytestmark = pytest.mark.e2e

CPU_NODE = "cpu-0"
GPU_NODE = "cgpu-binpack-0"
RECURSIVE_RO = {"readOnly": True, "recursiveReadOnly": "Enabled"}
GPU_MEM = {"aliyun.com/gpu-mem": 1}
CARD_LABEL = "aliyun.accelerator/nvidia_name"
OFF_GPU_NODES = [{"matchExpressions": [dict(e) for e in DEFAULT_ZONE.keep_off]}]
KEPT_OFF = "Warning: GPU103: pods that use no GPU but have node power are kept off GPU nodes: kept off GPU nodes"
GPU003_REFUSES = "GPU003: a pod that can reach a GPU node may mount only the host paths and volume types GPU nodes allow: "
# An admin's allowance of both paths for every namespace (read-only, the default of an allowance).
ALLOWANCE: dict[str, Any] = {"trustZone": {"allow": {"hostPaths": ["/sys/fs/cgroup", "/var/log"]}}}


def cgroup_pod(
    name: str,
    *,
    mount: dict[str, Any],
    node: str | None = CPU_NODE,
    limits: dict[str, Any] | None = None,
    path: str = "/sys/fs/cgroup",
    volume: str = "cgroup",
) -> dict[str, Any]:
    """A pod mounting the host's `path` (default `/sys/fs/cgroup`) as `volume`, bound to `node` (None: scheduled)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.example/app:1",
        "volumeMounts": [{"name": volume, "mountPath": "/host/mounted", **mount}],
    }
    if limits:
        container["resources"] = {"limits": limits}
    spec: dict[str, Any] = {"containers": [container], "volumes": [{"name": volume, "hostPath": {"path": path}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def required_terms(stored: dict[str, Any]) -> list[Mapping[str, Any]]:
    """The stored pod's required node-affinity terms, read as the engine reads them."""
    return list(nodeaffinity.required_terms(stored["spec"]))


def scheduled(cluster: Cluster, name: str, *, namespace: str) -> dict[str, Any]:
    """Pod `name` once kube-scheduler has bound it, as stored then."""
    return cluster.pod_once(
        name,
        namespace=namespace,
        condition=lambda found: bool(found["spec"].get("nodeName")),
        what=f"{namespace}/{name} scheduled",
    )


def plain_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": CPU_NODE, "containers": [{"name": "main", "image": "registry.example/app:1"}]},
    }


def running(cluster: Cluster, name: str, *, namespace: str) -> None:
    eventually(
        lambda: cluster.get("pod", name, namespace=namespace).get("status", {}).get("phase") == "Running",
        what=f"pod {namespace}/{name} Running",
    )


def add_ephemeral(cluster: Cluster, name: str, *, namespace: str, container: dict[str, Any]) -> Any:
    patch = json.dumps({"spec": {"ephemeralContainers": [container]}})
    return cluster.kubectl(
        "patch", "pod", name, "-n", namespace, "--subresource=ephemeralcontainers", "--type=strategic", "-p", patch
    )


def ephemeral(cluster: Cluster, name: str, *, namespace: str) -> dict[str, dict[str, Any]]:
    stored = cluster.get("pod", name, namespace=namespace)
    return {c["name"]: c for c in stored["spec"].get("ephemeralContainers", [])}


@pytest.mark.parametrize(
    "mount", [{}, {"readOnly": True}, RECURSIVE_RO], ids=["writable", "top-level-read-only", "recursively-read-only"]
)
def test_a_cgroup_host_path_on_a_named_gpu_node_is_refused_however_it_is_mounted(cluster: Cluster, mount: dict[str, Any]) -> None:
    # A writable cgroup v1 hierarchy lets a root container leave its device cgroup; on a GPU node no
    # cgroup host path is allowed at all (an admin may allow it, recursively read-only).
    ns = cluster.namespace()

    completed = cluster.apply(cgroup_pod("cgroup-escape", mount=mount, node=GPU_NODE), namespace=ns)

    assert completed.returncode != 0
    assert "GPU003" in completed.stderr
    assert 'volume "cgroup" mounts hostPath /sys/fs/cgroup, which is not an allowed host path' in completed.stderr
    assert f"the pod runs on the GPU node {GPU_NODE}" in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_a_cgroup_mount_on_the_cpu_only_node_is_admitted_as_written_with_its_debug_mounts(cluster: Cluster) -> None:
    # The webhook reads the named node's labels: no GPU there, so nothing of the trust zone applies.
    ns = cluster.namespace()
    completed = cluster.apply(cgroup_pod("metrics", mount={}), namespace=ns)
    assert completed.returncode == 0, completed.stderr
    stored = cluster.get("pod", "metrics", namespace=ns)
    assert "affinity" not in stored["spec"]
    running(cluster, "metrics", namespace=ns)
    debug = {"name": "debugger", "image": "registry.example/busybox:1", "volumeMounts": [{"name": "cgroup", "mountPath": "/cg"}]}

    admitted = add_ephemeral(cluster, "metrics", namespace=ns, container=debug)

    assert admitted.returncode == 0, admitted.stderr
    assert set(ephemeral(cluster, "metrics", namespace=ns)) == {"debugger"}


@pytest.mark.parametrize(
    "mount", [{}, {"readOnly": True}, RECURSIVE_RO], ids=["writable", "top-level-read-only", "recursively-read-only"]
)
def test_a_cgroup_host_path_in_a_gpu_pod_is_refused_however_it_is_mounted(cluster: Cluster, mount: dict[str, Any]) -> None:
    # No cgroup host path is allowed on GPU nodes by default, not even recursively read-only.
    ns = cluster.namespace()

    completed = cluster.apply(cgroup_pod("cgroup-escape", mount=mount, node=None, limits=GPU_MEM), namespace=ns)

    assert completed.returncode != 0
    assert GPU003_REFUSES in completed.stderr
    assert 'volume "cgroup" mounts hostPath /sys/fs/cgroup, which is not an allowed host path' in completed.stderr
    assert "the pod requests the GPU resource aliyun.com/gpu-mem" in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_a_writable_cgroup_host_path_without_gpus_is_admitted_and_scheduled_off_gpu_nodes(cluster: Cluster) -> None:
    # A metrics agent without GPUs keeps its writable mount; kube-scheduler never places it on a GPU node.
    ns = cluster.namespace()

    completed = cluster.apply(cgroup_pod("cgroup-metrics", mount={}, node=None), namespace=ns)

    assert completed.returncode == 0, completed.stderr
    assert KEPT_OFF in completed.stderr
    assert 'volume "cgroup" mounts hostPath /sys/fs/cgroup, which is not an allowed host path' in completed.stderr
    stored = scheduled(cluster, "cgroup-metrics", namespace=ns)
    assert required_terms(stored) == OFF_GPU_NODES
    assert stored["spec"]["volumes"][0]["hostPath"]["path"] == "/sys/fs/cgroup"
    assert stored["spec"]["nodeName"] == CPU_NODE
    assert CARD_LABEL not in cluster.node_labels(CPU_NODE)


def test_an_admins_cgroup_allowance_admits_only_recursively_read_only_mounts_in_a_gpu_pod_and_its_debug_containers(
    cluster: Cluster, tmp_path: Path
) -> None:
    with webhook_settings(cluster, ALLOWANCE, directory=tmp_path):
        ns = cluster.namespace()
        # cgroup v1 controllers are submounts that a plain read-only bind leaves writable.
        top_level = cluster.apply(cgroup_pod("top-level", mount={"readOnly": True}, node=None, limits=GPU_MEM), namespace=ns)

        assert top_level.returncode != 0
        assert GPU003_REFUSES in top_level.stderr
        assert (
            'container "main" mounts volume "cgroup" (hostPath /sys/fs/cgroup) without readOnly: true and '
            "recursiveReadOnly: Enabled"
        ) in top_level.stderr

        admitted = cluster.apply(cgroup_pod("metrics", mount=RECURSIVE_RO, node=None, limits=GPU_MEM), namespace=ns)

        assert admitted.returncode == 0, admitted.stderr
        running(cluster, "metrics", namespace=ns)
        stored = cluster.get("pod", "metrics", namespace=ns)
        assert stored["spec"]["containers"][0]["volumeMounts"][0]["recursiveReadOnly"] == "Enabled"
        assert CARD_LABEL in cluster.node_labels(stored["spec"]["nodeName"])  # it runs on a GPU node
        debug = {
            "name": "debugger",
            "image": "registry.example/busybox:1",
            "volumeMounts": [{"name": "cgroup", "mountPath": "/cg"}],
        }

        refused = add_ephemeral(cluster, "metrics", namespace=ns, container=debug)

        assert refused.returncode != 0
        assert "GPU003: " in refused.stderr
        assert (
            'ephemeral container "debugger" mounts volume "cgroup" (hostPath /sys/fs/cgroup) without readOnly: true '
            "and recursiveReadOnly: Enabled"
        ) in refused.stderr
        assert ephemeral(cluster, "metrics", namespace=ns) == {}

        reader = {**debug, "name": "reader", "volumeMounts": [{"name": "cgroup", "mountPath": "/cg", **RECURSIVE_RO}]}
        admitted_debug = add_ephemeral(cluster, "metrics", namespace=ns, container=reader)

        assert admitted_debug.returncode == 0, admitted_debug.stderr
        assert set(ephemeral(cluster, "metrics", namespace=ns)) == {"reader"}
        assert [p["metadata"]["name"] for p in cluster.pods(namespace=ns)] == ["metrics"]


def test_an_ephemeral_containers_env_from_prefix_is_neutralised_by_the_injected_void(cluster: Cluster) -> None:
    ns = cluster.namespace()
    assert cluster.apply(plain_pod("target"), namespace=ns).returncode == 0
    running(cluster, "target", namespace=ns)
    debug = {
        "name": "debugger",
        "image": "registry.example/busybox:1",
        "envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "made-later"}}],
    }

    completed = add_ephemeral(cluster, "target", namespace=ns, container=debug)

    assert completed.returncode == 0, completed.stderr
    env = ephemeral(cluster, "target", namespace=ns)["debugger"].get("env", [])
    # env is applied after envFrom by the kubelet: the prefix can no longer deliver the variable.
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in env


TENANT = "tenant-alice"


def as_tenant(cluster: Cluster, namespace: str) -> None:
    """Bind the built-in `edit` role to TENANT in `namespace` (what a namespace's owner gets)."""
    completed = cluster.kubectl("create", "rolebinding", "tenant-edit", "-n", namespace, "--clusterrole=edit", f"--user={TENANT}")
    assert completed.returncode == 0, completed.stderr


def create_as_tenant(cluster: Cluster, manifest: dict[str, Any], *, namespace: str) -> Any:
    return cluster.kubectl("create", "-n", namespace, f"--as={TENANT}", "-f", "-", stdin=json.dumps(manifest))


def forged_mirror_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {
                "kubernetes.io/config.mirror": "forged",
                "ALIYUN_COM_GPU_MEM_IDX": "0",
                "ALIYUN_COM_GPU_MEM_POD": "1",
            },
        },
        "spec": {
            "nodeName": "cgpu-binpack-0",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1",
                    "resources": {"limits": {"aliyun.com/gpu-mem": 15}},
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                }
            ],
        },
    }


def test_a_tenants_pod_claiming_to_be_a_mirror_pod_is_still_judged(cluster: Cluster) -> None:
    ns = cluster.namespace()
    as_tenant(cluster, ns)

    completed = create_as_tenant(cluster, forged_mirror_pod("not-static"), namespace=ns)

    assert completed.returncode != 0, "the apiserver stored a tenant's mirror-annotated pod unjudged"
    assert "GPU008" in completed.stderr and "GPU001" in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_a_kubelets_own_mirror_pod_is_still_skipped(cluster: Cluster) -> None:
    ns = cluster.namespace()
    got = cluster.kubectl("get", "node", "cpu-0", "-o", "json")
    assert got.returncode == 0, got.stderr
    node = json.loads(got.stdout)
    # The local apiserver authorizes by RBAC alone; this stands in for the Node authorizer's grant.
    bound = cluster.kubectl("create", "rolebinding", "kubelet", "-n", ns, "--clusterrole=edit", "--user=system:node:cpu-0")
    assert bound.returncode == 0, bound.stderr
    mirror = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "node-agent-cpu-0",
            "annotations": {"kubernetes.io/config.mirror": "0123abcd", "kubernetes.io/config.source": "file"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "cpu-0", "uid": node["metadata"]["uid"], "controller": True}
            ],
        },
        "spec": {
            "nodeName": "cpu-0",
            "containers": [
                {
                    "name": "agent",
                    "image": "registry.example/agent:1",
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "dev", "mountPath": "/dev"}],
                }
            ],
            "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
        },
    }

    completed = cluster.kubectl(
        "create",
        "-n",
        ns,
        "--as=system:node:cpu-0",
        "--as-group=system:nodes",
        "--as-group=system:authenticated",
        "-f",
        "-",
        stdin=json.dumps(mirror),
    )

    # GPU003 would refuse the /dev hostPath: admitted means the validating webhook skipped the kubelet's
    # mirror pod; no NVIDIA_VISIBLE_DEVICES=void (GPU104) means the mutating webhook answered it unchanged.
    assert completed.returncode == 0, completed.stderr
    stored = cluster.get("pod", "node-agent-cpu-0", namespace=ns)
    assert stored["spec"]["volumes"][0]["hostPath"]["path"] == "/dev"
    assert "env" not in stored["spec"]["containers"][0]


def test_the_resize_subresource_cannot_add_a_gpu_to_a_running_pod(cluster: Cluster) -> None:
    # pods/resize is not sent to the webhook; kube-apiserver itself lets it change only cpu and memory.
    ns = cluster.namespace()
    assert cluster.apply(plain_pod("grower"), namespace=ns).returncode == 0
    running(cluster, "grower", namespace=ns)
    amount = {"aliyun.com/gpu-mem": "15"}
    patch = json.dumps({"spec": {"containers": [{"name": "main", "resources": {"limits": amount, "requests": amount}}]}})

    completed = cluster.kubectl("patch", "pod", "grower", "-n", ns, "--subresource=resize", "--type=strategic", "-p", patch)

    assert completed.returncode != 0
    assert "GPU0" not in completed.stderr  # refused by kube-apiserver's own validation, not by us
    assert "aliyun.com/gpu-mem" not in json.dumps(cluster.get("pod", "grower", namespace=ns)["spec"])


def test_a_gated_pod_cannot_drop_the_affinity_that_keeps_it_off_gpu_nodes(cluster: Cluster) -> None:
    # A pod with schedulingGates may change its node affinity before it is scheduled, and such an
    # UPDATE is not sent to the webhook; kube-apiserver allows only narrowing it, so GPU103's
    # DoesNotExist stays.
    ns = cluster.namespace()
    gated = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated"},
        "spec": {
            "schedulingGates": [{"name": "example.com/wait"}],
            "containers": [{"name": "main", "image": "registry.example/app:1", "securityContext": {"privileged": True}}],
        },
    }
    assert cluster.apply(gated, namespace=ns).returncode == 0
    stored = cluster.get("pod", "gated", namespace=ns)
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"} in terms[0]["matchExpressions"]
    attempts = [
        [
            {
                "op": "replace",
                "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions",
                "value": [],
            }
        ],
        [
            {
                "op": "add",
                "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/-",
                "value": {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "Exists"}]},
            }
        ],
        [{"op": "remove", "path": "/spec/affinity"}],
    ]

    for patch in attempts:
        completed = cluster.kubectl("patch", "pod", "gated", "-n", ns, "--type=json", "-p", json.dumps(patch))
        assert completed.returncode != 0, patch

    after = cluster.get("pod", "gated", namespace=ns)["spec"]["affinity"]
    assert after == stored["spec"]["affinity"]


def test_a_var_log_host_path_is_refused_on_a_named_gpu_node_and_admitted_on_the_cpu_only_node(cluster: Cluster) -> None:
    # The kubelet follows a symbolic link planted in /var/log/pods when it serves kubectl logs.
    ns = cluster.namespace()
    on_gpu = cgroup_pod("log-link", mount={"readOnly": True}, node=GPU_NODE)
    on_gpu["spec"]["volumes"][0]["hostPath"]["path"] = "/var/log"

    refused = cluster.apply(on_gpu, namespace=ns)

    assert refused.returncode != 0
    assert "GPU003" in refused.stderr and "mounts hostPath /var/log, which is not an allowed host path" in refused.stderr
    on_cpu = cgroup_pod("log-reader", mount={})
    on_cpu["spec"]["volumes"][0]["hostPath"]["path"] = "/var/log"
    admitted = cluster.apply(on_cpu, namespace=ns)
    assert admitted.returncode == 0, admitted.stderr


def test_a_var_log_host_path_is_refused_in_a_gpu_pod_kept_off_gpu_nodes_without_gpus_and_allowed_read_only_by_an_admin(
    cluster: Cluster, tmp_path: Path
) -> None:
    # A writable /var/log lets a pod plant the link the kubelet follows when it serves kubectl logs.
    ns = cluster.namespace()
    reader = cgroup_pod("log-reader", mount={"readOnly": True}, node=None, limits=GPU_MEM, path="/var/log", volume="logs")

    refused = cluster.apply(reader, namespace=ns)

    assert refused.returncode != 0
    assert GPU003_REFUSES in refused.stderr
    assert 'volume "logs" mounts hostPath /var/log, which is not an allowed host path' in refused.stderr
    assert cluster.pods(namespace=ns) == []

    shipper = cgroup_pod("log-shipper", mount={}, node=None, path="/var/log", volume="logs")
    kept_off = cluster.apply(shipper, namespace=ns)

    assert kept_off.returncode == 0, kept_off.stderr
    assert KEPT_OFF in kept_off.stderr
    stored = scheduled(cluster, "log-shipper", namespace=ns)
    assert required_terms(stored) == OFF_GPU_NODES
    assert stored["spec"]["nodeName"] == CPU_NODE

    with webhook_settings(cluster, ALLOWANCE, directory=tmp_path):
        writable = cgroup_pod("log-link", mount={}, node=None, limits=GPU_MEM, path="/var/log", volume="logs")

        refused_writable = cluster.apply(writable, namespace=ns)

        assert refused_writable.returncode != 0
        assert GPU003_REFUSES in refused_writable.stderr
        assert (
            'container "main" mounts volume "logs" (hostPath /var/log) without readOnly: true; the allowed host paths '
            "are read-only"
        ) in refused_writable.stderr

        admitted = cluster.apply(reader, namespace=ns)

        assert admitted.returncode == 0, admitted.stderr
        assert "GPU103" not in admitted.stderr  # a GPU pod: nothing to keep off
    assert sorted(p["metadata"]["name"] for p in cluster.pods(namespace=ns)) == ["log-reader", "log-shipper"]


def test_a_privileged_container_beside_a_dra_claim_is_refused(cluster: Cluster) -> None:
    # Kubernetes 1.34 serves DRA by default: a tenant's ResourceClaimTemplate can hand it a card.
    ns = cluster.namespace()
    claiming: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dra-privileged"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1",
                    "securityContext": {"privileged": True},
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }

    refused = cluster.apply(claiming, namespace=ns)

    assert refused.returncode != 0
    assert "GPU002" in refused.stderr and "resourceClaims" in refused.stderr
    del claiming["spec"]["containers"][0]["securityContext"]
    admitted = cluster.apply(claiming, namespace=ns)
    assert admitted.returncode == 0, admitted.stderr
    assert cluster.get("pod", "dra-privileged", namespace=ns)["spec"]["resourceClaims"][0]["name"] == "gpu"
