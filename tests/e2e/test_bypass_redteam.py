"""Variants of issue 13's routes tried from a tenant's side, through the real apiserver.

- A hostPath of `/sys/fs/cgroup` mounted writable (GPU003): on a cgroup v1 node a root container
  moves itself into the devices controller's root cgroup and opens every card. Only a mount with
  `readOnly: true` and `recursiveReadOnly: Enabled` passes, in the pod and in an ephemeral
  container added later through `pods/ephemeralcontainers` (it cannot add volumes, but it can
  mount the pod's).
- An ephemeral container whose `envFrom` prefix composes `NVIDIA_VISIBLE_DEVICES`: the mutating
  webhook also runs on the subresource and gives it `NVIDIA_VISIBLE_DEVICES=void` in `env`, which
  the kubelet applies after `envFrom`, so the prefix composes nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.harness import Cluster, eventually

pytestmark = pytest.mark.e2e

CPU_NODE = "cpu-0"
RECURSIVE_RO = {"readOnly": True, "recursiveReadOnly": "Enabled"}


def cgroup_pod(name: str, *, mount: dict[str, Any]) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "registry.example/app:1",
        "volumeMounts": [{"name": "cgroup", "mountPath": "/host/cgroup", **mount}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": CPU_NODE,
            "containers": [container],
            "volumes": [{"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}}],
        },
    }


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


@pytest.mark.parametrize("mount", [{}, {"readOnly": True}], ids=["writable", "top-level-read-only"])
def test_a_cgroup_host_path_not_recursively_read_only_is_refused(cluster: Cluster, mount: dict[str, Any]) -> None:
    ns = cluster.namespace()

    completed = cluster.apply(cgroup_pod("cgroup-escape", mount=mount), namespace=ns)

    assert completed.returncode != 0
    assert "GPU003" in completed.stderr
    assert 'container "main" mounts volume "cgroup" (hostPath /sys/fs/cgroup)' in completed.stderr
    assert "recursiveReadOnly: Enabled" in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_a_recursively_read_only_cgroup_mount_is_admitted_and_a_writable_debug_mount_of_it_is_refused(
    cluster: Cluster,
) -> None:
    ns = cluster.namespace()
    assert cluster.apply(cgroup_pod("metrics", mount=RECURSIVE_RO), namespace=ns).returncode == 0
    stored = cluster.get("pod", "metrics", namespace=ns)
    assert stored["spec"]["containers"][0]["volumeMounts"][0]["recursiveReadOnly"] == "Enabled"
    running(cluster, "metrics", namespace=ns)
    debug = {"name": "debugger", "image": "registry.example/busybox:1", "volumeMounts": [{"name": "cgroup", "mountPath": "/cg"}]}

    refused = add_ephemeral(cluster, "metrics", namespace=ns, container=debug)

    assert refused.returncode != 0
    assert "GPU003" in refused.stderr and 'ephemeral container "debugger" mounts volume "cgroup"' in refused.stderr
    assert ephemeral(cluster, "metrics", namespace=ns) == {}

    read_only = {**debug, "name": "reader", "volumeMounts": [{"name": "cgroup", "mountPath": "/cg", **RECURSIVE_RO}]}
    admitted = add_ephemeral(cluster, "metrics", namespace=ns, container=read_only)

    assert admitted.returncode == 0, admitted.stderr
    assert set(ephemeral(cluster, "metrics", namespace=ns)) == {"reader"}


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
