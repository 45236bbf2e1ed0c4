"""Card-model annotations hold for the card a pod gets, through the webhook and the real kube-scheduler.

A KWOK node as the labeler leaves a machine with 2 x Tesla-V100-SXM2-16GB and 2 x
Tesla-V100-SXM2-32GB: the inventory annotation lists each card, the labels summarise the node (the
most common model, a tie, so the first name: the 16 GB card; the smallest card, 16160 MiB). Pods go
through the webhook (GPU102) and `default-scheduler`, which calls the cluster's extender as
`deploy/scheduler-config.yaml` configures it; what is checked is what the apiserver stores.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.e2e.harness import Cluster, eventually
from tests.e2e.test_extender import POOL_LABEL, TAINT_KEY, Pool, allocation, card_use, create, events_of, gpu_pod, pools
from webhook.cluster import nodes

pytestmark = pytest.mark.e2e

__all__ = ["pools"]  # the module-scoped fixture that deletes the nodes this module creates

MIXED = [("Tesla-V100-SXM2-16GB", 16160)] * 2 + [("Tesla-V100-SXM2-32GB", 32510)] * 2


def mixed_pool(cluster: Cluster, created: list[str]) -> Pool:
    """One mixed node, labelled and annotated as the labeler writes them for those four cards."""
    pool = f"m{uuid.uuid4().hex[:8]}"
    name = f"{pool}-0"
    inventory = [{"index": i, "uuid": f"GPU-{pool}-{i}", "name": model, "memoryMiB": mib} for i, (model, mib) in enumerate(MIXED)]
    gib = tuple(mib // 1024 for _, mib in MIXED)
    labels = {
        "ack.node.gpu.schedule": "cgpu",
        "ack.node.gpu.placement": "binpack",
        "aliyun.accelerator/nvidia_name": "Tesla-V100-SXM2-16GB",
        "aliyun.accelerator/nvidia_mem": "16160MiB",
        "aliyun.accelerator/nvidia_count": "4",
        "gpu-admission.io/gpu-memory-mib": "16160",
        POOL_LABEL: pool,
    }
    annotations = {"gpu-admission.io/gpu-inventory": json.dumps(inventory), "gpu-admission.io/gpu-mixed": "true"}
    capacity = {"aliyun.com/gpu-mem": str(sum(gib)), "aliyun.com/gpu-count": "4", "nvidia.com/gpu": "0"}
    manifest = nodes.FakeNode(name=name, labels=labels, capacity=capacity, annotations=annotations).manifest()
    manifest["spec"]["taints"] = [{"key": TAINT_KEY, "value": pool, "effect": "NoSchedule"}]
    created.append(name)
    completed = cluster.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
    assert completed.returncode == 0, completed.stderr

    def ready() -> bool:
        conditions = cluster.get("node", name, namespace="default").get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    eventually(ready, what=f"node {name} Ready")
    return Pool(name=pool, nodes=(name,), card_gib=gib)


def annotated(pod: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    pod["metadata"]["annotations"] = annotations
    return pod


def test_card_model_annotations_hold_for_the_card_on_a_mixed_node(cluster: Cluster, pools: list[str]) -> None:
    pool = mixed_pool(cluster, pools)
    ns = cluster.namespace()
    scheduler = "default-scheduler"
    create(
        cluster,
        [
            annotated(
                gpu_pod("large", pool=pool, scheduler=scheduler, group="c", mem=4), {"gpu-admission.io/min-gpu-memory": "20Gi"}
            ),
            annotated(
                gpu_pod("sixteen", pool=pool, scheduler=scheduler, group="c", mem=20),
                {"gpu-admission.io/gpu-model": "Tesla-V100-SXM2-16GB"},
            ),
            gpu_pod("ordinary", pool=pool, scheduler=scheduler, group="c", mem=4),
        ],
        namespace=ns,
    )
    (node,) = pool.nodes

    def placed(name: str) -> bool:
        return bool(cluster.get("pod", name, namespace=ns)["spec"].get("nodeName"))

    eventually(
        lambda: placed("large") and placed("ordinary"), what="the min-gpu-memory pod and the ordinary pod bound", timeout=120
    )
    large, ordinary = (cluster.get("pod", name, namespace=ns) for name in ("large", "ordinary"))
    # The webhook left the node choice to the extender: node affinity on the smallest-card label would
    # have kept this pod off the node (16160 MiB < 20 GiB) although two of its cards qualify.
    assert "affinity" not in large["spec"]
    assert (allocation(large)["node"], allocation(large)["cards"]) == (node, [2])
    assert (allocation(ordinary)["node"], allocation(ordinary)["cards"]) == (node, [0])  # binpack, as before
    assert large["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_DEV"] == "31"

    expected = "no GPU card that meets the pod's card-model constraint is large enough: the pod needs 20 GiB (aliyun.com/gpu-mem)"
    eventually(
        lambda: any(expected in m for m in events_of(cluster, ns, "sixteen")), what="the FailedScheduling event of the 16 GB pod"
    )
    assert not placed("sixteen")  # the free 32 GB card would hold 20 GiB: the model keeps the pod off it
    assert card_use(cluster, pool, ns) == {node: [4, 0, 4, 0]}
