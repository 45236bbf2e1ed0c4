"""A snapshot of the cluster's GPU allocation: nodes, GPU pods, ledger Leases and reservations, for offline use.

`gpu-admission snapshot --output-file FILE` writes one, `explain --snapshot` and `simulate --snapshot` read it,
so a support case can be replayed without the cluster. The shape (YAML or JSON):

    apiVersion: gpu-admission.io/v1
    kind: GPUSnapshot
    takenAt: "2026-11-26T12:00:00.000Z"      # explain/simulate judge TTLs as at this moment
    nodes: [Node, ...]                        # every node: labels, annotations (inventory, topology,
                                              # the reservation ledger), unschedulable, taints, capacity
    pods: [Pod, ...]                          # pods asking for a GPU the extender places, holding an
                                              # allocation, or asking the device plugin's GPUs (charged
                                              # to budgets): metadata, the scheduling part of spec, phase
    podDisruptionBudgets: [PDB, ...]          # selector and disruptionsAllowed, for defrag plans
    ledgerNamespace: gpu-admission            # where the extender keeps the ledger Leases
    leases: [Lease, ...]                      # the nodes' ledger Leases and the namespaces' budget
                                              # ledger Leases (of that namespace only)
    namespaceLabels: {namespace: {labels}}    # the Namespaces' labels, for budgets that select by label
                                              # (absent where they could not be listed)
    resourceSlices: [ResourceSlice, ...]      # Dynamic Resource Allocation: the published devices
    resourceClaims: [ResourceClaim, ...]      # and the allocated claims (`policies.gpu.dra`)
    reservations: {node: {uid: {...}}}        # the ledgers, decoded: each node's Lease and Node
                                              # annotation together (for people; the objects carry them)

A node's reservation ledger is its ledger Lease's and, from versions before the Lease, its Node
annotation's (`policies.gpu.reservations`); only Leases of the ledger namespace that name their node
are kept, so a tenant's Lease never enters a snapshot. A snapshot from before the Lease has
neither key and replays as it did.

Objects are cut to what the card model, kube-scheduler's node checks and the admission policies
read; environment values, volumes and status conditions are dropped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from policies import gpu, podspec
from policies.gpu import allocation, budgets, cardrequest, dra, reservations
from webhook.cmdline import errors
from webhook.extender import preemption

API_VERSION = "gpu-admission.io/v1"
KIND = "GPUSnapshot"

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Snapshot:
    nodes: list[Object]
    pods: list[Object]
    taken_at: float
    pdbs: list[Object] = dataclasses.field(default_factory=list)
    leases: list[Object] = dataclasses.field(default_factory=list)  # the nodes' ledger Leases
    ledger_namespace: str = reservations.LEDGER_NAMESPACE
    slices: list[Object] = dataclasses.field(default_factory=list)  # DRA ResourceSlices
    claims: list[Object] = dataclasses.field(default_factory=list)  # allocated DRA ResourceClaims
    # The Namespaces' labels by name (budgets that select by label); None: not listed.
    namespace_labels: dict[str, dict[str, str]] | None = None


def take(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    now: float,
    pdbs: Iterable[Mapping[str, Any]] = (),
    leases: Iterable[Mapping[str, Any]] = (),
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
    slices: Iterable[Mapping[str, Any]] = (),
    claims: Iterable[Mapping[str, Any]] = (),
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Snapshot:
    """The snapshot of listed objects: every node, the pods that matter to GPU placement, the PDBs,
    and the nodes' ledger Leases (those `ledger_namespace` holds for a node; any other is left out)."""
    leases = list(leases)
    kept_leases = [slim_lease(lease) for lease in reservations.leases_by_node(leases, namespace=ledger_namespace).values()]
    # The preempt verb's hold records (`gpu-hold.<node>`), which explain and simulate show and honour.
    kept_leases += [
        slim_lease(lease) for lease in leases if preemption.hold_lease_node(lease, namespace=ledger_namespace) is not None
    ]
    # The namespaces' budget ledgers (`policies.gpu.budgets`), which explain counts budgets with.
    kept_leases += [slim_lease(lease) for lease in leases if budgets.lease_namespace(lease, home=ledger_namespace) is not None]
    kept_nodes = [slim_node(n) for n in nodes]
    kept_pods = [slim_pod(p) for p in pods if is_gpu_pod(p) or budgets.native_asks(p)]
    kept_pdbs = [
        {
            "metadata": {k: v for k, v in podspec.mapping(b.get("metadata")).items() if k in ("name", "namespace", "uid")},
            "spec": dict(podspec.mapping(b.get("spec"))),
            "status": {k: v for k, v in podspec.mapping(b.get("status")).items() if k == "disruptionsAllowed"},
        }
        for b in pdbs
    ]
    return Snapshot(
        nodes=kept_nodes,
        pods=kept_pods,
        taken_at=now,
        pdbs=kept_pdbs,
        leases=kept_leases,
        ledger_namespace=ledger_namespace,
        slices=[dra.slim_slice(s) for s in slices],
        claims=[dra.slim_claim(c) for c in claims if dra.claim_results(c)],
        namespace_labels=None if namespace_labels is None else {ns: dict(labels) for ns, labels in namespace_labels.items()},
    )


def is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    annotations = podspec.mapping(podspec.mapping(pod.get("metadata")).get("annotations"))
    return (
        cardrequest.pod_request(pod).managed
        or gpu.ALLOCATION_ANNOTATION in annotations
        or bool(annotations.get(gpu.GPUSHARE_MEM_IDX_ANNOTATION))
    )


def ledgers(snapshot: Snapshot) -> dict[str, dict[str, allocation.Allocation]]:
    """Each node's reservation ledger (its Lease's and its Node annotation's), nodes without one left out."""
    leases = reservations.leases_by_node(snapshot.leases, namespace=snapshot.ledger_namespace)
    found: dict[str, dict[str, allocation.Allocation]] = {}
    for node in snapshot.nodes:
        name = str(podspec.mapping(node.get("metadata")).get("name", ""))
        ledger = reservations.union(node, leases.get(name), namespace=snapshot.ledger_namespace)
        if ledger:
            found[name] = ledger
    return found


def document(snapshot: Snapshot) -> Object:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "takenAt": allocation.timestamp(snapshot.taken_at),
        "nodes": snapshot.nodes,
        "pods": snapshot.pods,
        "podDisruptionBudgets": snapshot.pdbs,
        "ledgerNamespace": snapshot.ledger_namespace,
        "leases": snapshot.leases,
        "resourceSlices": snapshot.slices,
        "resourceClaims": snapshot.claims,
        **({"namespaceLabels": snapshot.namespace_labels} if snapshot.namespace_labels is not None else {}),
        "reservations": {name: json.loads(reservations.encode(ledger)) for name, ledger in ledgers(snapshot).items()},
    }


def dumps(snapshot: Snapshot, *, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(document(snapshot), indent=1) + "\n"
    return yaml.safe_dump(document(snapshot), sort_keys=False)


def load(path: str) -> Snapshot:
    """Read a snapshot file; any problem is one InputError naming the file."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise errors.InputError(f"cannot read snapshot {path}: {error.strerror or error}") from error
    try:
        data = json.loads(text)  # JSON first: PyYAML reads a big snapshot a hundred times slower
    except ValueError:
        data = None
    try:
        data = data if data is not None else yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise errors.InputError(f"{path}: not YAML or JSON: {str(error).splitlines()[0]}") from error
    if not isinstance(data, Mapping) or data.get("kind") != KIND:
        raise errors.InputError(f"{path}: not a {KIND} (write one with `gpu-admission snapshot --output-file FILE`)")
    nodes, pods = data.get("nodes"), data.get("pods")
    if not isinstance(nodes, list) or not isinstance(pods, list):
        raise errors.InputError(f"{path}: nodes and pods must be lists")
    taken = data.get("takenAt")
    moment = allocation.parse_time(taken) if isinstance(taken, str) else None
    if moment is None:
        raise errors.InputError(f"{path}: takenAt must be an RFC 3339 time")
    pdbs = data.get("podDisruptionBudgets") or []
    leases = data.get("leases") or []
    if not isinstance(leases, list):
        raise errors.InputError(f"{path}: leases must be a list")
    namespace = data.get("ledgerNamespace", reservations.LEDGER_NAMESPACE)
    if not isinstance(namespace, str) or not namespace:
        raise errors.InputError(f"{path}: ledgerNamespace must be a namespace name")
    return Snapshot(
        nodes=[dict(n) for n in nodes if isinstance(n, Mapping)],
        pods=[dict(p) for p in pods if isinstance(p, Mapping)],
        taken_at=moment,
        pdbs=[dict(b) for b in pdbs if isinstance(b, Mapping)] if isinstance(pdbs, list) else [],
        leases=[dict(lease) for lease in leases if isinstance(lease, Mapping)],
        ledger_namespace=namespace,
        slices=_objects(data.get("resourceSlices"), path=path, key="resourceSlices"),
        claims=_objects(data.get("resourceClaims"), path=path, key="resourceClaims"),
        namespace_labels=_labels(data.get("namespaceLabels"), path=path),
    )


def _labels(value: object, *, path: str) -> dict[str, dict[str, str]] | None:
    """`namespaceLabels` (absent: None, as in snapshots taken before it or without the Namespaces)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(labels, Mapping) for labels in value.values()):
        raise errors.InputError(f"{path}: namespaceLabels must map each namespace to its labels")
    return {str(ns): {str(k): str(v) for k, v in labels.items()} for ns, labels in value.items()}


def _objects(value: object, *, path: str, key: str) -> list[Object]:
    """A list of objects under `key` (absent: none, as in snapshots taken before it)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise errors.InputError(f"{path}: {key} must be a list")
    return [dict(item) for item in value if isinstance(item, Mapping)]


def slim_node(node: Mapping[str, Any]) -> Object:
    metadata = podspec.mapping(node.get("metadata"))
    spec = podspec.mapping(node.get("spec"))
    status = podspec.mapping(node.get("status"))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {k: metadata[k] for k in ("name", "uid", "resourceVersion", "labels", "annotations") if k in metadata},
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": {k: status[k] for k in ("capacity", "allocatable", "addresses") if k in status},
    }


def slim_lease(lease: Mapping[str, Any]) -> Object:
    """A ledger (or hold) Lease as a snapshot keeps it: identity, labels, the node, ledger and
    hold annotations, the holder."""
    metadata = podspec.mapping(lease.get("metadata"))
    annotations = podspec.mapping(metadata.get("annotations"))
    kept: Object = {k: metadata[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels") if k in metadata}
    kept["annotations"] = {
        k: annotations[k]
        for k in (
            reservations.NODE_ANNOTATION,
            gpu.RESERVATIONS_ANNOTATION,
            preemption.HOLDS_ANNOTATION,
            budgets.NAMESPACE_ANNOTATION,
            budgets.LEDGER_ANNOTATION,
        )
        if k in annotations
    }
    holder = podspec.mapping(lease.get("spec")).get("holderIdentity")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": kept,
        "spec": {"holderIdentity": holder} if isinstance(holder, str) else {},
    }


# priority and preemptionPolicy: who may preempt whom (explain's and simulate's preemption, issue 27).
_SPEC_KEYS = (
    "nodeName",
    "nodeSelector",
    "affinity",
    "tolerations",
    "schedulerName",
    "priorityClassName",
    "priority",
    "preemptionPolicy",
)


def slim_pod(pod: Mapping[str, Any]) -> Object:
    metadata = podspec.mapping(pod.get("metadata"))
    spec = podspec.mapping(pod.get("spec"))
    status = podspec.mapping(pod.get("status"))
    slim_spec: Object = {k: spec[k] for k in _SPEC_KEYS if k in spec}
    for kind in ("containers", "initContainers"):
        entries = [
            {k: c[k] for k in ("name", "image", "resources", "restartPolicy") if k in c}
            for c in podspec.sequence(spec.get(kind))
            if isinstance(c, Mapping)
        ]
        if entries:
            slim_spec[kind] = entries
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            k: metadata[k]
            for k in (
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "labels",
                "annotations",
                "ownerReferences",
                "deletionTimestamp",
            )
            if k in metadata
        },
        "spec": slim_spec,
        "status": {k: status[k] for k in ("phase", "startTime", "nominatedNodeName") if k in status},
    }
