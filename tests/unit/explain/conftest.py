"""Factories for explain/simulate/defrag tests: GPU Nodes, GPU Pods, and pods already placed on cards."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import inventory
from tests import resources

Object = dict[str, Any]
NOW = 1_800_000_000.0


def node(
    name: str = "gpu-0",
    *,
    mode: str | None = "cgpu",
    placement: str | None = "binpack",
    count: int = 3,
    gib: int = 16,
    models: Sequence[str] | None = None,
    links: list[tuple[int, int, str]] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    unschedulable: bool = False,
    taints: list[Object] | None = None,
) -> Object:
    """A GPU Node with an inventory of `count` cards of `gib` GiB (model Tesla-T4 unless `models`)."""
    all_labels: dict[str, str] = {"aliyun.accelerator/nvidia_name": (models or ["Tesla-T4"])[0]}
    if mode is not None:
        all_labels["ack.node.gpu.schedule"] = mode
    if placement is not None:
        all_labels["ack.node.gpu.placement"] = placement
    all_labels.update(labels or {})
    if mode == "topology":
        capacity = {"aliyun.com/gpu": str(count)}
    else:
        capacity = {"aliyun.com/gpu-mem": str(count * gib), "aliyun.com/gpu-count": str(count)}
        if mode == "core_mem":
            capacity["aliyun.com/gpu-core.percentage"] = str(100 * count)
    notes: dict[str, str] = {
        gpu.INVENTORY_ANNOTATION: json.dumps(
            [
                {"index": i, "uuid": f"GPU-{name}-{i}", "name": (models or ["Tesla-T4"] * count)[i], "memoryMiB": gib * 1024}
                for i in range(count)
            ]
        )
    }
    if links is not None:
        notes[gpu.TOPOLOGY_ANNOTATION] = inventory.encode_topology(links)
    notes.update(annotations or {})
    spec: Object = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": "1", "labels": all_labels, "annotations": notes},
        "spec": spec,
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def pod(
    name: str = "p",
    *,
    namespace: str = "team-a",
    mem: int | None = None,
    core: int | None = None,
    whole: int | None = None,
    node_selector: Mapping[str, str] | None = None,
    affinity: Object | None = None,
    uid: str | None = None,
    owner: str | None = None,
) -> Object:
    """A pending GPU pod."""
    limits = resources.gpu_limits(mem=mem, core=core, whole=whole)
    container: Object = {"name": "main", "image": "registry.example/app:1"}
    if limits:
        container["resources"] = {"limits": limits}
    spec: Object = {"containers": [container]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if affinity:
        spec["affinity"] = affinity
    metadata: Object = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()), "resourceVersion": "1"}
    if owner:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": "rs-" + owner, "controller": True}
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}


def placed(
    name: str,
    *,
    node_name: str,
    card: int | Sequence[int],
    mem: int = 0,
    core: int = 0,
    whole: bool = False,
    bound: bool = True,
    assumed_at: float = NOW - 60,
    namespace: str = "team-a",
    owner: str | None = None,
) -> Object:
    """A pod the extender placed: bound (unless `bound` is off: a bind in flight) with its annotations."""
    indices = (card,) if isinstance(card, int) else tuple(card)
    obj = pod(name, namespace=namespace, mem=mem or None, core=core or None, whole=len(indices) if whole else None, owner=owner)
    allocation = allocation_.Allocation(
        uid=obj["metadata"]["uid"],
        namespace=namespace,
        name=name,
        node=node_name,
        cards=indices,
        memory_gib=mem,
        core_percent=core,
        whole=whole,
        assumed_at=assumed_at,
    )
    obj["metadata"]["annotations"] = allocation_.bind_annotations(allocation, card_memory_gib=16)
    if bound:
        obj["spec"]["nodeName"] = node_name
        obj["status"]["phase"] = "Running"
    return obj


def ledger_entry(uid: str, *, pod_key: str, node_name: str, card: int, mem: int, assumed_at: float) -> allocation_.Allocation:
    namespace, _, name = pod_key.partition("/")
    return allocation_.Allocation(
        uid=uid,
        namespace=namespace,
        name=name,
        node=node_name,
        cards=(card,),
        memory_gib=mem,
        assumed_at=assumed_at,
        expires=assumed_at + allocation_.DEFAULT_RESERVATION_TTL_S,
        source="reservation",
    )


@pytest.fixture
def make_node() -> Callable[..., Object]:
    return node


@pytest.fixture
def make_pod() -> Callable[..., Object]:
    return pod


@pytest.fixture
def make_placed() -> Callable[..., Object]:
    return placed
