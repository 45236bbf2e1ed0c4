"""Factories for the audit tests: nodes like the local cluster's fake ones, pods, workloads, allocations,
and the contexts the scan hands a check.

Each fixture returns a plain function, so tests read as `pod("a", node_name="cgpu-0", gpu_mem=3)`,
and a check is judged as `judge_pod(GPU201, pod(...), node=node())`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from policies.gpu import cards
from webhook.audit import findings
from webhook.audit.checks import base

NOW = 1_750_000_000.0

NodeFactory = Callable[..., dict[str, Any]]
PodFactory = Callable[..., dict[str, Any]]
WorkloadFactory = Callable[..., dict[str, Any]]

_MODE_CAPACITY: Mapping[str, dict[str, str]] = {
    "cgpu": {"aliyun.com/gpu-mem": "60", "aliyun.com/gpu-count": "4", "nvidia.com/gpu": "0", "aliyun.com/gpu": "0"},
    "share": {"aliyun.com/gpu-mem": "60", "aliyun.com/gpu-count": "4", "nvidia.com/gpu": "0", "aliyun.com/gpu": "0"},
    "core_mem": {"aliyun.com/gpu-mem": "44", "aliyun.com/gpu-count": "2", "aliyun.com/gpu-core.percentage": "200"},
    "topology": {"aliyun.com/gpu": "8", "nvidia.com/gpu": "0", "aliyun.com/gpu-mem": "0"},
    "default": {"nvidia.com/gpu": "8", "aliyun.com/gpu-mem": "0", "aliyun.com/gpu": "0"},
}
_MODE_CARDS: Mapping[str, str] = {"cgpu": "4", "share": "4", "core_mem": "2", "topology": "8", "default": "8"}


def build_node(
    name: str = "cgpu-0",
    *,
    mode: str | None = "cgpu",
    capacity: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    card_labels: bool = True,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A GPU node as the seeds describe one (mode None: no schedule label; capacity replaces the mode's)."""
    node_labels: dict[str, str] = {"kubernetes.io/hostname": name}
    if mode is not None:
        node_labels["ack.node.gpu.schedule"] = mode
    if card_labels and mode is not None:
        node_labels.update(
            {
                "aliyun.accelerator/nvidia_name": "Tesla-T4",
                "aliyun.accelerator/nvidia_mem": "15360MiB",
                "aliyun.accelerator/nvidia_count": _MODE_CARDS.get(mode, "4"),
            }
        )
    node_labels.update(labels or {})
    resources = dict(_MODE_CAPACITY.get(mode or "", {}) if capacity is None else capacity)
    status_capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", **resources}
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-node-{name}", "labels": node_labels}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "status": {"capacity": status_capacity, "allocatable": dict(status_capacity)},
    }


def build_pod(
    name: str = "app",
    *,
    namespace: str = "team-a",
    node_name: str | None = None,
    gpu_mem: int | None = None,
    limits: Mapping[str, Any] | None = None,
    env: Sequence[Mapping[str, Any]] | None = None,
    privileged: bool = False,
    volumes: Sequence[Mapping[str, Any]] | None = None,
    node_selector: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    phase: str = "Running",
    uid: str | None = None,
) -> dict[str, Any]:
    """A pod with one container `main`; `gpu_mem` adds aliyun.com/gpu-mem to its limits."""
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    all_limits = dict(limits or {})
    if gpu_mem is not None:
        all_limits["aliyun.com/gpu-mem"] = gpu_mem
    if all_limits:
        container["resources"] = {"limits": all_limits}
    if env is not None:
        container["env"] = [dict(e) for e in env]
    if privileged:
        container["securityContext"] = {"privileged": True}
    spec: dict[str, Any] = {"containers": [container]}
    if node_name:
        spec["nodeName"] = node_name
    if volumes:
        spec["volumes"] = copy.deepcopy(list(volumes))
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}"}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owner:
        kind, owner_name = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": kind,
                "name": owner_name,
                "uid": f"uid-{namespace}-{owner_name}",
                "controller": True,
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": {"phase": phase}}


def build_workload(
    kind: str,
    name: str,
    *,
    pod: Mapping[str, Any],
    namespace: str = "team-a",
    owner: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A workload whose template is `pod`'s metadata labels and spec."""
    template = {"metadata": {"labels": {"app": name}}, "spec": copy.deepcopy(dict(pod["spec"]))}
    template["spec"].pop("nodeName", None)
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": name}}}
    if kind == "CronJob":
        spec = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}
    else:
        spec["template"] = template
    api_version = {"Job": "batch/v1", "CronJob": "batch/v1", "ReplicationController": "v1"}.get(kind, "apps/v1")
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if owner:
        owner_kind, owner_name = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner_kind,
                "name": owner_name,
                "uid": f"uid-{namespace}-{owner_name}",
                "controller": True,
            }
        ]
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}


def allocation(node: str, cards: Sequence[int], *, mem: int = 0, core: int = 0, whole: bool = False) -> dict[str, str]:
    """The annotations bind writes for an allocation (ours and gpushare's)."""
    return {
        "gpu-admission.io/allocation": json.dumps(
            {
                "node": node,
                "cards": list(cards),
                "memGiB": mem,
                "corePercent": core,
                "whole": whole,
                "assumedAt": "2025-06-15T15:00:00.000Z",
            }
        ),
        "ALIYUN_COM_GPU_MEM_IDX": ",".join(str(c) for c in cards),
        "ALIYUN_COM_GPU_MEM_POD": str(mem),
    }


@pytest.fixture
def node() -> NodeFactory:
    return build_node


@pytest.fixture
def pod() -> PodFactory:
    return build_pod


@pytest.fixture
def workload() -> WorkloadFactory:
    return build_workload


def judge_pod(
    check: base.PodCheck,
    pod: Mapping[str, Any],
    *,
    node: Mapping[str, Any] | None = None,
    nodes: Mapping[str, Mapping[str, Any]] | None = None,
    now: float = NOW,
) -> findings.Finding | None:
    """A pod check's result as the scan gets it: `node` is the one the pod is bound to, `nodes` every node."""
    return check.check_pod(pod, base.PodContext(now=now, node=node, nodes=nodes or {}))


def judge_node(
    check: base.NodeCheck,
    node: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]] = (),
    *,
    pods_by_uid: Mapping[str, Mapping[str, Any]] | None = None,
    now: float = NOW,
) -> findings.Finding | None:
    """A node check's result as the scan gets it: `pods` are bound to the node (their allocations make its
    card state), `pods_by_uid` is every pod of the cluster (`pods` by default)."""
    by_uid = {str(p["metadata"]["uid"]): p for p in pods} if pods_by_uid is None else pods_by_uid
    state = cards.node_state(node, pods, now=now)
    return check.check_node(node, base.NodeContext(state=state, now=now, pods=pods, pods_by_uid=by_uid))
