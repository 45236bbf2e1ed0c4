"""What the audit checks read off decoded objects: metadata, a node's mode, GPU resources and usage summary (with the tolerance real use gets), a pod's phase and reservation, and references to them.

Tolerant of malformed objects everywhere (a missing or odd field reads as absent), so no check
raises on what a cluster or a manifest file holds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

from policies import gpu, nodeaffinity, podspec
from policies.gpu import allocation, quantity, usage
from webhook.audit import findings

# --- metadata ------------------------------------------------------------------------------------


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's labels (empty where absent or malformed)."""
    return podspec.mapping(podspec.mapping(obj.get("metadata")).get("labels"))


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's annotations (empty where absent or malformed)."""
    return podspec.mapping(podspec.mapping(obj.get("metadata")).get("annotations"))


def name_of(obj: Mapping[str, Any]) -> str:
    """An object's name ("" where absent)."""
    value = podspec.mapping(obj.get("metadata")).get("name")
    return value if isinstance(value, str) else ""


# --- nodes ---------------------------------------------------------------------------------------


def capacity(node: Mapping[str, Any]) -> dict[str, int]:
    """The node's GPU resources from `status.capacity` (read by `policies.gpu.quantity`; unparseable as 0)."""
    status = podspec.mapping(podspec.mapping(node.get("status")).get("capacity"))
    return {key: quantity.count(value) or 0 for key, value in status.items() if gpu.is_gpu_resource(key)}


def mode_label(node: Mapping[str, Any]) -> str | None:
    """The raw `ack.node.gpu.schedule` value, None where the label is absent."""
    value = labels_of(node).get(gpu.SCHEDULE_LABEL)
    return None if value is None else str(value)


def mode(node: Mapping[str, Any]) -> gpu.Mode | None:
    """The node's mode (`default` without the label); None for a value that is no mode."""
    return gpu.mode_of(labels_of(node))


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    """Whether the node has GPUs by its labels, inventory annotation or capacity."""
    if any(nodeaffinity.is_gpu_node_label(key, value) for key, value in labels_of(node).items()):
        return True
    if gpu.INVENTORY_ANNOTATION in annotations_of(node):
        return True
    return any(count > 0 for count in capacity(node).values())


# A CUDA context and allocator rounding put a process somewhat above what it computes with; the
# figures live in policies.gpu.usage, shared with the labeler's limits.
USAGE_TOLERANCE_MIB = usage.TOLERANCE_MIB
USAGE_TOLERANCE_FRACTION = usage.TOLERANCE_FRACTION


def usage_tolerance_mib(allowed_mib: int) -> int:
    """How far above `allowed_mib` real use may go before GPU214/GPU215 report it."""
    return usage.tolerance_mib(allowed_mib)


def node_usage(node: Mapping[str, Any]) -> usage.NodeUsage | None:
    """The labeler's usage summary on a Node (None where it has none)."""
    text = annotations_of(node).get(usage.USAGE_ANNOTATION)
    return _parsed_usage(text) if isinstance(text, str) else None


@functools.lru_cache(maxsize=4096)  # one entry per node summary: every pod of a node reads it
def _parsed_usage(text: str) -> usage.NodeUsage | None:
    return usage.parse(text)


# --- pods ----------------------------------------------------------------------------------------


def active(pod: Mapping[str, Any]) -> bool:
    """Whether the pod has not finished (`Succeeded` or `Failed`)."""
    return not allocation.is_terminal(pod)


def annotated_node(pod: Mapping[str, Any]) -> str:
    """The node our allocation annotation names ("" where there is none); a stale one included.

    Looser than `allocation.annotated_node`, on purpose: an annotation that is otherwise malformed
    still says which node the pod was meant for, and GPU203 reports a pod bound elsewhere (GPU210
    then leaves it alone) rather than calling it unaccounted.
    """
    text = annotations_of(pod).get(gpu.ALLOCATION_ANNOTATION)
    return _annotated_node(text) if isinstance(text, str) else ""


@functools.lru_cache(maxsize=4096)  # by value: GPU203 and GPU210 both read it, and replicas share it
def _annotated_node(text: str) -> str:
    try:
        document = json.loads(text)
    except ValueError:
        return ""
    node = document.get("node") if isinstance(document, Mapping) else None
    return node if isinstance(node, str) else ""


def card_list(held: allocation.Allocation) -> str:
    """The allocation's card indexes, as `0,1`."""
    return ",".join(str(index) for index in held.cards)


# --- references ----------------------------------------------------------------------------------


def node_ref(node: Mapping[str, Any]) -> findings.ObjectRef:
    """The reference to a Node (cluster-scoped, whatever the decoded object says)."""
    return dataclasses.replace(findings.ObjectRef.of(node), namespace="", api_version="v1", kind="Node")


def pod_ref(namespace: str, pod_name: str, uid: str = "") -> findings.ObjectRef:
    """The reference to a Pod known by name (from an allocation, not an object)."""
    return findings.ObjectRef(namespace=namespace, kind="Pod", name=pod_name, api_version="v1", uid=uid)


def allocation_ref(held: allocation.Allocation) -> findings.ObjectRef:
    """The reference to the Pod holding an allocation."""
    return pod_ref(held.namespace, held.name, held.uid)
