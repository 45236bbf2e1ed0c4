"""The scheduler extender's reservation ledger: its format, its one codec and its home, a Lease per node.

The ledger is the commit record of binds in flight (the extender's `binder` holds the protocol): a
JSON object from pod UID to the allocation the pod was given, compact and sorted by UID so equal
ledgers are equal strings:

    {"<uid>":{"pod":"ns/name","node":"gpu-0","cards":[1],"memGiB":4,"corePercent":0,"whole":false,
              "assumedAt":"2026-11-26T12:00:00.000Z","expires":"2026-11-26T12:02:00.000Z"}}

An entry's fields are those of the pod allocation annotation (`policies.gpu.allocation`) plus `pod`
(namespace/name) and `expires`. An unexpired entry holds its cards for a pod that is not seen bound
yet; `prune` drops expired entries and those of pods already bound or finished.

Where it lives. The extender keeps each GPU node's ledger in one `coordination.k8s.io/v1` Lease in
its own namespace (LEDGER_NAMESPACE by default, `--ledger-namespace`), so that a ledger write fans
out to the ledger's own watchers only, not to every Node watcher (`lease_body`):

- name `lease_name(node)`: `gpu-ledger.` + the node name, or + a hash of it where that is too long;
- label LEDGER_LABEL `"true"` (list and watch by it);
- annotations NODE_ANNOTATION (the node; readers take it from here, never from the name) and
  `gpu.RESERVATIONS_ANNOTATION` (the ledger JSON above);
- an owner reference to the Node, so the Lease goes with its Node;
- `spec.holderIdentity`: the replica that wrote it last (informational; the protocol is
  compare-and-swap on `metadata.resourceVersion`).

Earlier versions kept the ledger in the Node annotation `gpu.RESERVATIONS_ANNOTATION`. During an
upgrade every reader takes the union of both (`union`). A Lease is trusted only in the ledger
namespace, under its node's own name, and only when it names its node (`lease_node`): tenants can
create Leases in their own namespaces, and such a Lease must never hold (or free) a card.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from policies import gpu, podspec
from policies.gpu import allocation

# A ledger entry younger than this is a bind in flight: its pod may not show up bound (or even in a
# watch cache) yet. Older entries of pods that are gone or placed elsewhere are dropped early.
IN_FLIGHT_GRACE_S = 10.0

LEDGER_NAMESPACE = "gpu-admission"  # the extender's namespace, where the ledger Leases live by default
LEDGER_LABEL = gpu.LEDGER_LABEL
NODE_ANNOTATION = gpu.LEDGER_NODE_ANNOTATION
LEASE_PREFIX = "gpu-ledger."
_MAX_NAME = 253  # an object name is a DNS subdomain
_HASH_CHARS = 40


def encode(ledger: Mapping[str, allocation.Allocation]) -> str:
    """The ledger annotation value (compact; sorted so equal ledgers are equal strings)."""
    document = {
        uid: {"pod": entry.pod_key, **allocation.fields(entry), "expires": allocation.timestamp(entry.expires or 0.0)}
        for uid, entry in sorted(ledger.items())
    }
    return json.dumps(document, separators=(",", ":"))


def decode(text: str) -> dict[str, allocation.Allocation]:
    """The ledger by pod UID; `gpu.AnnotationError` names the first malformed entry."""
    return _decode(text, strict=True)


def read(text: str | None) -> dict[str, allocation.Allocation]:
    """The ledger by pod UID; malformed entries are dropped, an unreadable ledger is empty (never raises)."""
    return dict(_read(text))


def node_reservations(node: Mapping[str, Any]) -> dict[str, allocation.Allocation]:
    """The ledger a Node object carries (empty where it has none)."""
    annotations = podspec.mapping(podspec.mapping(node.get("metadata")).get("annotations"))
    text = annotations.get(gpu.RESERVATIONS_ANNOTATION)
    return read(text if isinstance(text, str) else None)


def lease_name(node: str) -> str:
    """The name of a node's ledger Lease: the prefix and the node name, or a hash of it where too long."""
    name = LEASE_PREFIX + node
    if len(name) <= _MAX_NAME:
        return name
    return LEASE_PREFIX + hashlib.sha256(node.encode()).hexdigest()[:_HASH_CHARS]


def lease_body(
    node_name: str,
    node_uid: str,
    ledger: Mapping[str, allocation.Allocation],
    holder: str,
    *,
    namespace: str = LEDGER_NAMESPACE,
) -> dict[str, Any]:
    """A node's complete ledger Lease, ready to create (add `metadata.resourceVersion` to replace one).

    The owner reference (omitted where `node_uid` is empty) lets the garbage collector delete the
    Lease with its Node; it does not block the Node's deletion.
    """
    metadata: dict[str, Any] = {
        "name": lease_name(node_name),
        "namespace": namespace,
        "labels": {LEDGER_LABEL: "true"},
        "annotations": {NODE_ANNOTATION: node_name, gpu.RESERVATIONS_ANNOTATION: encode(ledger)},
    }
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": {"holderIdentity": holder}}


def lease_node(lease: Mapping[str, Any], *, namespace: str = LEDGER_NAMESPACE) -> str | None:
    """The node whose ledger a Lease is, or None where the Lease is no ledger to trust.

    It must live in the ledger namespace, name its node in NODE_ANNOTATION, and bear that node's
    `lease_name`: a Lease elsewhere (a tenant's), or a second one claiming the same node, is ignored.
    """
    metadata = podspec.mapping(lease.get("metadata"))
    if metadata.get("namespace") != namespace:
        return None
    node = podspec.mapping(metadata.get("annotations")).get(NODE_ANNOTATION)
    if not isinstance(node, str) or not node or metadata.get("name") != lease_name(node):
        return None
    return node


def lease_reservations(lease: Mapping[str, Any], *, namespace: str = LEDGER_NAMESPACE) -> dict[str, allocation.Allocation]:
    """The ledger a trusted ledger Lease carries (empty for any other Lease, or an unreadable ledger)."""
    if lease_node(lease, namespace=namespace) is None:
        return {}
    text = podspec.mapping(podspec.mapping(lease.get("metadata")).get("annotations")).get(gpu.RESERVATIONS_ANNOTATION)
    return read(text if isinstance(text, str) else None)


def leases_by_node(leases: Iterable[Mapping[str, Any]], *, namespace: str = LEDGER_NAMESPACE) -> dict[str, Mapping[str, Any]]:
    """The trusted ledger Leases by node name (the others are left out)."""
    found: dict[str, Mapping[str, Any]] = {}
    for lease in leases:
        node = lease_node(lease, namespace=namespace)
        if node is not None:
            found[node] = lease
    return found


def union(
    node: Mapping[str, Any], lease: Mapping[str, Any] | None, *, namespace: str = LEDGER_NAMESPACE
) -> dict[str, allocation.Allocation]:
    """A node's whole ledger during an upgrade: its Node annotation's entries (earlier versions) and its Lease's.

    Where both hold a pod, the Lease's entry (the newer writer's) wins. A Lease that is not this
    node's trusted ledger adds nothing.
    """
    ledger = node_reservations(node)
    if lease is not None:
        name = podspec.mapping(node.get("metadata")).get("name")
        if lease_node(lease, namespace=namespace) == name:
            ledger.update(lease_reservations(lease, namespace=namespace))
    return ledger


def prune(
    ledger: Mapping[str, allocation.Allocation], *, pods: Iterable[Mapping[str, Any]], now: float
) -> dict[str, allocation.Allocation]:
    """The ledger without expired entries and without pods already seen bound (or finished).

    A bound pod carries its allocation annotation (bind writes it before creating the Binding), so
    its ledger entry is no longer needed; and a pod never unbinds.
    """
    settled = {
        uid
        for uid, pod in ((str(podspec.mapping(p.get("metadata")).get("uid", "")), p) for p in pods)
        if uid and (allocation.bound_node(pod) or allocation.is_terminal(pod))
    }
    return {uid: entry for uid, entry in ledger.items() if (entry.expires or 0.0) > now and uid not in settled}


@functools.lru_cache(maxsize=4096)  # pure; callers get a fresh dict
def _read(text: str | None) -> tuple[tuple[str, allocation.Allocation], ...]:
    if not text:
        return ()
    try:
        return tuple(_decode(text, strict=False).items())
    except gpu.AnnotationError:
        return ()


def _decode(text: str, *, strict: bool) -> dict[str, allocation.Allocation]:
    key = gpu.RESERVATIONS_ANNOTATION
    document = gpu.load_annotation(text, key=key)
    if not isinstance(document, Mapping):
        raise gpu.AnnotationError(f"{key}: expected a JSON object from pod UID to entry, got {type(document).__name__}")
    found: dict[str, allocation.Allocation] = {}
    for uid, entry in document.items():
        try:
            found[uid] = _entry(uid, entry, key=f"{key}: entry {uid!r}")
        except gpu.AnnotationError:
            if strict:
                raise
    return found


def _entry(uid: str, entry: object, *, key: str) -> allocation.Allocation:
    if not isinstance(entry, Mapping):
        raise gpu.AnnotationError(f"{key}: expected an object, got {type(entry).__name__}")
    node, cards, memory, core, whole, assumed = allocation.read_fields(entry, key=key)
    expires = allocation.parse_time(entry.get("expires"))
    pod = entry.get("pod")
    if expires is None:
        raise gpu.AnnotationError(f"{key}: expires must be an RFC 3339 time, got {entry.get('expires')!r}")
    if not isinstance(pod, str):
        raise gpu.AnnotationError(f"{key}: pod must be a namespace/name string, got {pod!r}")
    namespace, _, name = pod.partition("/")
    return allocation.Allocation(
        uid=uid,
        namespace=namespace,
        name=name,
        node=node,
        cards=cards,
        memory_gib=memory,
        core_percent=core,
        whole=whole,
        assumed_at=assumed,
        expires=expires,
        source="reservation",
    )
