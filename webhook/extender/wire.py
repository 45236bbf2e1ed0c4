"""The kube-scheduler HTTP extender wire format, `k8s.io/kube-scheduler/extender/v1`, and its parsing.

The Go types carry no json tags, so every key is the Go field name verbatim (PascalCase). The
embedded `Pod` and `Node` objects use the usual Kubernetes lowerCamel JSON. With
`nodeCacheCapable: true` the scheduler sends `NodeNames` and `Nodes: null`; without it, a full
`NodeList` in `Nodes`. Parsing is strict about shapes and says exactly what is wrong, because the
only senders of a malformed body are people (curl) and misconfigured schedulers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

import orjson

MAX_PRIORITY = 10  # extenderv1.MaxExtenderPriority


class NodeList(TypedDict, total=False):
    """A `v1.NodeList`; only `items` matters here."""

    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    items: list[dict[str, Any]]


class ExtenderArgs(TypedDict):
    """The body of `filter` and `prioritize`."""

    Pod: dict[str, Any]
    Nodes: NodeList | None
    NodeNames: list[str] | None


class ExtenderFilterResult(TypedDict):
    """The answer to `filter`; `NodeNames` must be a subset of what was sent."""

    Nodes: NodeList | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    """One entry of the answer to `prioritize` (a `HostPriorityList` is a JSON list of these)."""

    Host: str
    Score: int


class ExtenderBindingArgs(TypedDict):
    """The body of `bind`."""

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(TypedDict):
    """The answer to `bind`; a non-empty `Error` makes the scheduler retry the pod."""

    Error: str


class MetaPod(TypedDict):
    """A pod by UID (`extenderv1.MetaPod`): how a nodeCacheCapable extender names victims."""

    UID: str


class MetaVictims(TypedDict):
    """The victims on one node (`extenderv1.MetaVictims`)."""

    Pods: list[MetaPod]
    NumPDBViolations: int


class ExtenderPreemptionArgs(TypedDict, total=False):
    """The body of `preempt`: the preemptor and kube-scheduler's own victims per candidate node,
    by UID (`NodeNameToMetaVictims`, nodeCacheCapable) or as whole pods (`NodeNameToVictims`)."""

    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Any] | None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None


class ExtenderPreemptionResult(TypedDict):
    """The answer to `preempt`: the nodes kept and their victims. kube-scheduler looks each UID up
    among the pods of that node (an error if absent) and refuses a node with no victim."""

    NodeNameToMetaVictims: dict[str, MetaVictims]


class WireError(ValueError):
    """The body is not what the scheduler sends; the message says which field is wrong."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodesRequest:
    """A parsed `ExtenderArgs`: the pod and the candidate nodes, by name (and objects when sent)."""

    pod: Mapping[str, Any]
    node_names: tuple[str, ...]
    nodes: Mapping[str, Mapping[str, Any]] | None  # set only when the scheduler sent full Node objects

    @property
    def pod_key(self) -> str:
        metadata = self.pod.get("metadata")
        if not isinstance(metadata, Mapping):
            metadata = {}
        return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BindRequest:
    """A parsed `ExtenderBindingArgs`."""

    name: str
    namespace: str
    uid: str
    node: str

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_nodes_request(body: object) -> NodesRequest:
    """Read `ExtenderArgs`; raises WireError naming the first problem."""
    if not isinstance(body, Mapping):
        raise WireError(f"expected a JSON object (ExtenderArgs with Pod and NodeNames), got {_kind(body)}")
    pod = body.get("Pod")
    if not isinstance(pod, Mapping):
        raise WireError(f"'Pod' must be a Pod object, got {_kind(pod)}")
    if not isinstance(pod.get("spec"), Mapping):
        raise WireError("'Pod.spec' must be an object")
    names = body.get("NodeNames")
    nodes = body.get("Nodes")
    if names is not None:
        # `set(map(type, ...))` checks hundreds of names at C speed; a str subclass takes the slow check.
        if not isinstance(names, list) or (not set(map(type, names)) <= _STR and not all(isinstance(n, str) for n in names)):
            raise WireError("'NodeNames' must be a list of node names")
        return NodesRequest(pod=pod, node_names=tuple(names), nodes=None)
    if nodes is not None:
        items = nodes.get("items") if isinstance(nodes, Mapping) else None
        if not isinstance(items, list):
            raise WireError("'Nodes' must be a NodeList with 'items'")
        found: dict[str, Mapping[str, Any]] = {}
        for index, item in enumerate(items):
            metadata = item.get("metadata") if isinstance(item, Mapping) else None
            name = metadata.get("name") if isinstance(metadata, Mapping) else None
            if not isinstance(name, str) or not name:
                raise WireError(f"'Nodes.items[{index}]' has no metadata.name")
            found[name] = item
        return NodesRequest(pod=pod, node_names=tuple(found), nodes=found)
    raise WireError("neither 'NodeNames' nor 'Nodes' is set (configure the extender with nodeCacheCapable: true)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreemptRequest:
    """A parsed `ExtenderPreemptionArgs`: the preemptor and, per candidate node, the UIDs of the
    victims kube-scheduler chose and their PodDisruptionBudget violations."""

    pod: Mapping[str, Any]
    victims: Mapping[str, tuple[str, ...]]
    violations: Mapping[str, int]

    @property
    def pod_key(self) -> str:
        metadata = self.pod.get("metadata")
        if not isinstance(metadata, Mapping):
            metadata = {}
        return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def parse_preempt_request(body: object) -> PreemptRequest:
    """Read `ExtenderPreemptionArgs`; raises WireError naming the first problem."""
    if not isinstance(body, Mapping):
        raise WireError(f"expected a JSON object (ExtenderPreemptionArgs with Pod and NodeNameToMetaVictims), got {_kind(body)}")
    pod = body.get("Pod")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec"), Mapping):
        raise WireError(f"'Pod' must be a Pod object with a spec, got {_kind(pod)}")
    meta, full = body.get("NodeNameToMetaVictims"), body.get("NodeNameToVictims")
    source, field = (meta, "NodeNameToMetaVictims") if meta is not None else (full, "NodeNameToVictims")
    if source is None:
        source = {}
    if not isinstance(source, Mapping):
        raise WireError(f"'{field}' must be an object of node names, got {_kind(source)}")
    victims: dict[str, tuple[str, ...]] = {}
    violations: dict[str, int] = {}
    for node, entry in source.items():
        if not isinstance(node, str) or not isinstance(entry, Mapping):
            raise WireError(f"'{field}.{node}' must be an object with Pods and NumPDBViolations")
        pods = entry.get("Pods") or []
        if not isinstance(pods, list):
            raise WireError(f"'{field}.{node}.Pods' must be a list")
        uids: list[str] = []
        for index, item in enumerate(pods):
            uid = item.get("UID") if meta is not None and isinstance(item, Mapping) else None
            if meta is None and isinstance(item, Mapping):
                metadata = item.get("metadata")
                uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
            if not isinstance(uid, str) or not uid:
                raise WireError(f"'{field}.{node}.Pods[{index}]' has no UID")
            uids.append(uid)
        count = entry.get("NumPDBViolations", 0)
        victims[node] = tuple(uids)
        violations[node] = count if isinstance(count, int) and not isinstance(count, bool) else 0
    return PreemptRequest(pod=pod, victims=victims, violations=violations)


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> ExtenderPreemptionResult:
    """The preempt answer from node -> (victim UIDs, PodDisruptionBudget violations)."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": count} for node, (uids, count) in victims.items()
        }
    }


def parse_bind_request(body: object) -> BindRequest:
    """Read `ExtenderBindingArgs`; raises WireError naming the first problem."""
    if not isinstance(body, Mapping):
        raise WireError(f"expected a JSON object (ExtenderBindingArgs), got {_kind(body)}")
    values: dict[str, str] = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = body.get(key)
        if not isinstance(value, str) or not value:
            raise WireError(f"'{key}' must be a non-empty string")
        values[key] = value
    return BindRequest(name=values["PodName"], namespace=values["PodNamespace"], uid=values["PodUID"], node=values["Node"])


def filter_result(
    *,
    passed: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    request: NodesRequest | None = None,
    error: str = "",
) -> ExtenderFilterResult:
    """The filter answer; echoes full Node objects only when the scheduler sent them."""
    nodes: NodeList | None = None
    names: list[str] | None = list(passed)
    if request is not None and request.nodes is not None:
        nodes = {"items": [dict(request.nodes[name]) for name in passed]}
        names = None
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def filter_error(message: str) -> ExtenderFilterResult:
    """A filter answer that fails the whole call (the scheduler retries the pod later)."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def priorities(scores: Mapping[str, int]) -> list[HostPriority]:
    """The prioritize answer, scores clamped to 0..MAX_PRIORITY."""
    return [{"Host": host, "Score": max(0, min(MAX_PRIORITY, score))} for host, score in scores.items()]


def host_priority_json(host: str, score: int) -> bytes:
    """One `HostPriority` as `priorities` makes it, encoded as orjson encodes it inside the list:
    prioritize keeps these per node state and joins them with `priorities_json` (issue 19)."""
    return b'{"Host":' + orjson.dumps(host) + b',"Score":' + (_SCORES.get(score) or b"%d}" % max(0, min(MAX_PRIORITY, score)))


def priorities_json(entries: Iterable[bytes]) -> bytes:
    """The prioritize answer from `host_priority_json` entries: the bytes orjson writes for `priorities`."""
    return b"[" + b",".join(entries) + b"]"


def binding_result(error: str = "") -> ExtenderBindingResult:
    return {"Error": error}


_STR = frozenset({str})
_SCORES = {score: b"%d}" % score for score in range(MAX_PRIORITY + 1)}


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )
