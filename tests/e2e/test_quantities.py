"""Quantities and pod requests through the real apiserver: our parser reads what it stores.

kube-apiserver decodes every quantity and writes it back in its own form before an admission
webhook, the scheduler or the extender sees it. These tests send odd spellings of
`aliyun.com/gpu-mem` through a server-side dry run and compare the stored form with
`policies.gpu.quantity`'s prediction, check that `gpu-admission dry-run` on the author's manifest
decides as the cluster did, place a `2000m` pod exactly like a `2` pod, and show the extender
counting a GPU-asking sidecar beside its main container (issue route: sidecars counted once).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest
import yaml

from policies.gpu import quantity
from tests.e2e.harness import Cluster, eventually
from webhook.cluster import install, nodes

pytestmark = pytest.mark.e2e

MEM = "aliyun.com/gpu-mem"
POOL_LABEL = "gpu-admission.io/e2e-pool"
TAINT_KEY = "gpu-admission.io/e2e-quantities"
T4_MIB = 15360

# Spellings the cluster admits as a whole number of GiB (Kubernetes 1.34 writes 1000E and 10^21 back
# as 1, and validates that after the webhook's patch re-decodes the pod).
ACCEPTED = [
    "2",
    "2000m",
    "+2",
    "2e0",
    "0.002k",
    "1k",
    "1000",
    "1.500k",
    "02",
    " 2 ",
    "2.",
    "1e3",
    "1Ki",
    "9223372036854775",
    "1000E",
    "1000000000000000000000",
]
# Spellings the cluster refuses: not an integer, negative, not a quantity, past what it counts exactly.
REFUSED = [
    "1500m",
    "0.5",
    "-2",
    "1kk",
    "K",
    "1KB",
    "--1",
    "1e19",
    "999999999999999999",
    "9223372036854776",
    "99999999999999999999999",
]


def gpu_pod(name: str, mem: object, *, pool: str | None = None, sidecar: object = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.example/app:1", "resources": {"limits": {MEM: mem}}}],
    }
    if sidecar is not None:
        spec["initContainers"] = [
            {
                "name": "proxy",
                "image": "registry.example/proxy:1",
                "restartPolicy": "Always",
                "resources": {"limits": {MEM: sidecar}},
            }
        ]
    if pool is not None:
        spec["nodeSelector"] = {POOL_LABEL: pool}
        spec["tolerations"] = [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def server_dry_run(cluster: Cluster, pod: dict[str, Any], *, namespace: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "-n", namespace, "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(pod))


def our_dry_run(pod: dict[str, Any], *, namespace: str) -> dict[str, Any]:
    """`gpu-admission dry-run` on the author's manifest, as YAML (a CI pipeline's view)."""
    manifest = {**pod, "metadata": {**pod["metadata"], "namespace": namespace}}
    completed = subprocess.run(
        [install.executable(), "dry-run", "-f", "-", "-o", "json"],
        input=yaml.safe_dump(manifest),
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode in (0, 1), completed.stderr
    (result,) = json.loads(completed.stdout)["results"]
    return dict(result)


def make_pool(cluster: Cluster, *, cards: int) -> str:
    """One KWOK cgpu node of `cards` T4s, as the labeler leaves it, tainted for this module's pods."""
    pool = f"q{uuid.uuid4().hex[:8]}"
    inventory = [{"index": i, "uuid": f"GPU-{pool}-{i}", "name": "Tesla-T4", "memoryMiB": T4_MIB} for i in range(cards)]
    capacity = {
        MEM: str(cards * (T4_MIB // 1024)),
        "aliyun.com/gpu-count": str(cards),
        "aliyun.com/gpu": "0",
        "nvidia.com/gpu": "0",
    }
    labels = {"ack.node.gpu.schedule": "cgpu", "ack.node.gpu.placement": "binpack", POOL_LABEL: pool}
    manifest = nodes.FakeNode(
        name=pool, labels=labels, capacity=capacity, annotations={"gpu-admission.io/gpu-inventory": json.dumps(inventory)}
    ).manifest()
    manifest["spec"]["taints"] = [{"key": TAINT_KEY, "value": pool, "effect": "NoSchedule"}]
    completed = cluster.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
    assert completed.returncode == 0, completed.stderr

    def ready() -> bool:
        node = json.loads(cluster.kubectl("get", "node", pool, "-o", "json").stdout or "{}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))

    eventually(ready, what=f"node {pool} Ready")
    return pool


def bound_pod(cluster: Cluster, name: str, *, namespace: str) -> dict[str, Any]:
    def placed(found: dict[str, Any]) -> bool:
        return bool(found["spec"].get("nodeName")) and "gpu-admission.io/allocation" in found["metadata"].get("annotations", {})

    return cluster.pod_once(name, namespace=namespace, condition=placed, what=f"pod {name} bound with an allocation", timeout=120)


def allocation(pod: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(pod["metadata"]["annotations"]["gpu-admission.io/allocation"])
    return result


def test_the_apiserver_stores_each_spelling_as_our_parser_predicts(cluster: Cluster) -> None:
    ns = cluster.namespace()
    for spelling in ACCEPTED:
        completed = server_dry_run(cluster, gpu_pod("odd", spelling), namespace=ns)
        assert completed.returncode == 0, f"{spelling!r}: {completed.stderr}"
        resources = json.loads(completed.stdout)["spec"]["containers"][0]["resources"]
        stored_limit, stored_request = resources["limits"][MEM], resources["requests"][MEM]
        predicted = quantity.decode(spelling)
        assert stored_limit == stored_request == predicted.text, spelling
        assert quantity.count(stored_limit) == quantity.count(spelling) == quantity.parse(predicted.text).as_int64(), spelling


def test_the_dry_run_decides_each_spelling_as_the_cluster_does(cluster: Cluster) -> None:
    ns = cluster.namespace()
    for spelling in ACCEPTED:
        assert our_dry_run(gpu_pod("odd", spelling), namespace=ns)["allowed"] is True, spelling
    for spelling in REFUSED:
        refused = server_dry_run(cluster, gpu_pod("bad", spelling), namespace=ns)
        assert refused.returncode != 0, f"{spelling!r} was admitted: {refused.stdout[:200]}"
        ours = our_dry_run(gpu_pod("bad", spelling), namespace=ns)
        assert ours["allowed"] is False, spelling
        assert "GPU004" in {v["policy"] for v in ours["violations"]}, spelling


def test_a_2000m_pod_is_admitted_and_placed_exactly_like_a_2_pod(cluster: Cluster) -> None:
    ns = cluster.namespace()
    pool = make_pool(cluster, cards=1)
    try:
        placed = []
        for name, spelling in (("plain", "2"), ("odd", "2000m"), ("signed", "+2")):
            completed = cluster.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(gpu_pod(name, spelling, pool=pool)))
            assert completed.returncode == 0, f"{spelling}: {completed.stderr}"
            placed.append(bound_pod(cluster, name, namespace=ns))
        for pod in placed:
            annotations = pod["metadata"]["annotations"]
            assert pod["spec"]["nodeName"] == pool
            assert pod["spec"]["nodeSelector"]["ack.node.gpu.schedule"] == "cgpu"
            assert allocation(pod)["cards"] == [0] and allocation(pod)["memGiB"] == 2
            assert annotations["ALIYUN_COM_GPU_MEM_POD"] == "2" and annotations["ALIYUN_COM_GPU_MEM_IDX"] == "0"
        assert [p["spec"]["containers"][0]["resources"]["limits"][MEM] for p in placed] == ["2", "2", "+2"]
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
        cluster.kubectl("delete", "node", pool, "--wait=false")


def test_a_gpu_asking_sidecar_counts_beside_the_main_container(cluster: Cluster) -> None:
    # Two 15 GiB cards: 4 + 4 GiB fit on one card as 8; 8 + 8 GiB (16) fit the node's 30 GiB, so
    # kube-scheduler's own check passes, but no single card holds them and the extender says so.
    ns = cluster.namespace()
    pool = make_pool(cluster, cards=2)
    try:
        fits = cluster.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(gpu_pod("mesh", "4", pool=pool, sidecar="4")))
        assert fits.returncode == 0, fits.stderr
        mesh = bound_pod(cluster, "mesh", namespace=ns)
        assert allocation(mesh)["memGiB"] == 8 and mesh["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] == "8"

        too_big = cluster.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(gpu_pod("pair", "8", pool=pool, sidecar="8")))
        assert too_big.returncode == 0, too_big.stderr

        def unschedulable() -> bool:
            pod = cluster.get("pod", "pair", namespace=ns)
            conditions = [c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"]
            return not pod["spec"].get("nodeName") and any(
                c.get("reason") == "Unschedulable" and "16 GiB" in c.get("message", "") for c in conditions
            )

        eventually(unschedulable, what="the 8 + 8 GiB sidecar pod judged unschedulable by the extender", timeout=120)
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
        cluster.kubectl("delete", "node", pool, "--wait=false")
