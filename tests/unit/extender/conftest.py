"""Factories for Nodes and Pods as the apiserver returns them, and an in-memory apiserver fake.

The fake implements `webhook.extender.api.Api` with the semantics the bind protocol relies on:
a global resourceVersion, 409 on a stale resourceVersion or UID, 409 on binding a bound pod,
quorum reads. Every call yields to the event loop, so concurrent binds really interleave. It is
for unit tests only; the real proof against kube-apiserver is the e2e tier.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonpatch
import jsonpointer
import pytest

from policies import gpu
from policies.gpu import allocation, cards, reservations
from policies.gpu import inventory as inventory_  # `inventory` is a factory argument
from webhook.kube import errors as kube_errors

Object = dict[str, Any]
NodeFactory = Callable[..., Object]
PodFactory = Callable[..., Object]


def node(
    name: str = "gpu-0",
    *,
    mode: str | None = "cgpu",
    placement: str | None = "binpack",
    count: int = 4,
    gib: int = 15,
    inventory: list[int] | None = None,
    links: list[tuple[int, int, str]] | None = None,
    capacity: Mapping[str, str] | None = None,
    address: str = "192.0.2.109",
    annotations: Mapping[str, str] | None = None,
) -> Object:
    """A Node; shared modes advertise gpu-mem and gpu-count, topology advertises aliyun.com/gpu."""
    labels: dict[str, str] = {}
    if mode is not None:
        labels["ack.node.gpu.schedule"] = mode
    if placement is not None:
        labels["ack.node.gpu.placement"] = placement
    if capacity is None:
        if mode == "topology":
            capacity = {"aliyun.com/gpu": str(count)}
        elif mode in ("cgpu", "share", "mps", "core_mem"):
            capacity = {"aliyun.com/gpu-mem": str(count * gib), "aliyun.com/gpu-count": str(count)}
            if mode == "core_mem":
                capacity = {**capacity, "aliyun.com/gpu-core.percentage": str(100 * count)}
        else:
            capacity = {"nvidia.com/gpu": str(count)}
    notes: dict[str, str] = dict(annotations or {})
    if inventory is not None:
        notes[gpu.INVENTORY_ANNOTATION] = json.dumps(
            [{"index": i, "uuid": f"GPU-{i:04d}", "name": "Tesla-T4", "memoryMiB": mib} for i, mib in enumerate(inventory)]
        )
    if links is not None:
        notes[gpu.TOPOLOGY_ANNOTATION] = inventory_.encode_topology(links)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": "1", "labels": labels, "annotations": notes},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
        },
    }


def pod(
    name: str = "p",
    *,
    namespace: str = "team-a",
    mem: int | str | None = None,
    core: int | None = None,
    whole: int | None = None,
    node_name: str | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str = "Pending",
    uid: str | None = None,
    extra_containers: list[Object] | None = None,
) -> Object:
    limits: dict[str, Any] = {}
    if mem is not None:
        limits["aliyun.com/gpu-mem"] = str(mem)
    if core is not None:
        limits["aliyun.com/gpu-core.percentage"] = str(core)
    if whole is not None:
        limits["aliyun.com/gpu"] = str(whole)
    container: Object = {"name": "main", "image": "registry.example/app:1"}
    if limits:
        container["resources"] = {"limits": limits}
    spec: Object = {"containers": [container, *(extra_containers or [])]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "resourceVersion": "1",
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


@pytest.fixture
def make_node() -> NodeFactory:
    return node


@pytest.fixture
def make_gpu_pod() -> PodFactory:
    return pod


class FakeApiServer:
    """An apiserver in memory: Nodes and Pods, a global resourceVersion, preconditions, Bindings."""

    def __init__(self) -> None:
        self.nodes: dict[str, Object] = {}
        self.pods: dict[tuple[str, str], Object] = {}
        self._versions = itertools.count(2)
        self.leases: dict[tuple[str, str], Object] = {}
        self.namespaces = {reservations.LEDGER_NAMESPACE}
        self.calls: list[str] = []
        self.lease_writes = 0
        self.conflicts = 0
        self.fail_next_binding: dict[str, Exception] = {}
        self.pod_patches: list[tuple[str, str, list[Object]]] = []  # the JSON patches of pods, as sent
        self.recorded_events: list[Object] = []

    # --- setup ---

    def add_node(self, obj: Object) -> Object:
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = self._next()
        self.nodes[stored["metadata"]["name"]] = stored
        return stored

    def add_pod(self, obj: Object) -> Object:
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = self._next()
        self.pods[(stored["metadata"]["namespace"], stored["metadata"]["name"])] = stored
        return stored

    def touch_node(self, name: str) -> None:
        """What a kubelet heartbeat does: a new resourceVersion, nothing we care about changed."""
        self.nodes[name]["metadata"]["resourceVersion"] = self._next()

    def bound_pods(self, node: str) -> list[Object]:
        return [p for p in self.pods.values() if p["spec"].get("nodeName") == node]

    # --- the Api protocol ---

    async def get_pod(self, namespace: str, name: str) -> Object:
        await self._turn("get_pod")
        found = self.pods.get((namespace, name))
        if found is None:
            raise kube_errors.NotFound(f'pods "{name}" not found', status=404)
        return copy.deepcopy(found)

    async def get_node(self, name: str) -> Object:
        await self._turn("get_node")
        found = self.nodes.get(name)
        if found is None:
            raise kube_errors.NotFound(f'nodes "{name}" not found', status=404)
        return copy.deepcopy(found)

    async def list_node_pods(self, node: str, *, at_least: str = "") -> list[Object]:
        await self._turn("list_node_pods")
        return [copy.deepcopy(p) for p in self.pods.values() if p["spec"].get("nodeName") == node]

    async def list_namespace_pods(self, namespace: str, *, at_least: str = "") -> list[Object]:
        await self._turn("list_namespace_pods")
        return [copy.deepcopy(p) for (ns, _), p in self.pods.items() if ns == namespace]

    async def get_lease(self, namespace: str, name: str) -> Object:
        await self._turn("get_lease")
        found = self.leases.get((namespace, name))
        if found is None:
            raise kube_errors.NotFound(f'leases.coordination.k8s.io "{name}" not found', status=404)
        return copy.deepcopy(found)

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Object:
        await self._turn("create_lease")
        stored = copy.deepcopy(dict(body))
        name = stored["metadata"]["name"]
        if stored["metadata"].get("namespace", namespace) != namespace:
            raise kube_errors.KubeError("the namespace of the object does not match the namespace on the request", status=400)
        if namespace not in self.namespaces:
            raise kube_errors.NotFound(f'namespaces "{namespace}" not found', status=404)
        if (namespace, name) in self.leases:
            self.conflicts += 1
            raise kube_errors.Conflict(f'leases.coordination.k8s.io "{name}" already exists', status=409)
        stored["metadata"].update(namespace=namespace, uid=f"lease-uid-{name}", resourceVersion=self._next())
        self.leases[(namespace, name)] = stored
        self.lease_writes += 1
        return copy.deepcopy(stored)

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Object:
        """PUT: the whole object, only at the resourceVersion it carries (an empty one: 422, as the apiserver)."""
        await self._turn("replace_lease")
        found = self.leases.get((namespace, name))
        if found is None:
            raise kube_errors.NotFound(f'leases.coordination.k8s.io "{name}" not found', status=404)
        stored = copy.deepcopy(dict(body))
        version = stored["metadata"].get("resourceVersion")
        if not version:
            raise kube_errors.KubeError("metadata.resourceVersion: Invalid value: 0: must be specified for an update", status=422)
        if found["metadata"]["resourceVersion"] != version:
            self.conflicts += 1
            raise kube_errors.Conflict(
                "the object has been modified; please apply your changes to the latest version", status=409
            )
        stored["metadata"].update(namespace=namespace, uid=found["metadata"]["uid"], resourceVersion=self._next())
        self.leases[(namespace, name)] = stored
        self.lease_writes += 1
        return copy.deepcopy(stored)

    def ledger_of(self, node: str) -> dict[str, allocation.Allocation]:
        """The node's whole ledger as every reader takes it: its Node annotation's and its Lease's."""
        lease = self.leases.get((reservations.LEDGER_NAMESPACE, reservations.lease_name(node)))
        return reservations.union(self.nodes[node], lease)

    async def bind(self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """pods/binding: the Binding's annotations land on the pod in the same write as nodeName."""
        await self._turn("bind")
        failure = self.fail_next_binding.pop(name, None)
        if failure is not None:
            raise failure
        found = self.pods.get((namespace, name))
        if found is None:
            raise kube_errors.NotFound(f'pods "{name}" not found', status=404)
        if found["metadata"]["uid"] != uid:
            raise kube_errors.Conflict("Precondition failed: UID", status=409)
        if found["spec"].get("nodeName"):
            raise kube_errors.Conflict(f"pod {name} is already assigned to node {found['spec']['nodeName']}", status=409)
        found["metadata"].setdefault("annotations", {}).update(annotations)
        found["spec"]["nodeName"] = node
        found["metadata"]["resourceVersion"] = self._next()

    async def _turn(self, call: str) -> None:
        self.calls.append(call)
        await asyncio.sleep(0)  # let every other coroutine run between any two apiserver calls

    def _next(self) -> str:
        return str(next(self._versions))

    # --- the budget gate's writes (`gates`) ---

    async def json_patch_pod(self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]) -> Object:
        """A JSON patch of the pod, all or nothing: a failed `test` (or a bad path) is a 422, as the apiserver's."""
        await self._turn("json_patch_pod")
        self.pod_patches.append((namespace, name, [dict(op) for op in operations]))
        found = self.pods.get((namespace, name))
        if found is None:
            raise kube_errors.NotFound(f'pods "{name}" not found', status=404)
        try:
            patched: Object = jsonpatch.apply_patch(copy.deepcopy(found), [dict(op) for op in operations])
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
            raise kube_errors.KubeError(
                f"the server rejected our request due to an error in our request: {error}", status=422
            ) from error
        patched["metadata"]["resourceVersion"] = self._next()
        self.pods[(namespace, name)] = patched
        return copy.deepcopy(patched)

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> Object:
        await self._turn("create_event")
        self.recorded_events.append(copy.deepcopy(dict(body)))
        return copy.deepcopy(dict(body))


@pytest.fixture
def apiserver() -> FakeApiServer:
    return FakeApiServer()


def card_use(
    server: FakeApiServer, node_name: str, *, now: float, ttl: float = allocation.DEFAULT_RESERVATION_TTL_S
) -> list[int]:
    """GiB used per card of a node, read the way every component reads it (Node and Lease ledgers)."""
    state = cards.node_state(
        server.nodes[node_name], list(server.pods.values()), now=now, ttl=ttl, reservations=server.ledger_of(node_name)
    )
    return [c.memory_used for c in state.cards]


@pytest.fixture
def used_per_card() -> Callable[..., list[int]]:
    return card_use
