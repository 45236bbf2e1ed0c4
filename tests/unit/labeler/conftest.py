"""Labeler test factories: cards, inventories, and an in-memory Node that applies merge patches."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from webhook.kube import errors as kube_errors
from webhook.labeler import inventory, ownership

CardFactory = Callable[..., inventory.Card]


def make_card(index: int = 0, *, name: str = "Tesla T4", memory_mib: int = 15360) -> inventory.Card:
    return inventory.Card(index=index, uuid=f"GPU-{index:08x}-0000-4000-8000-000000000000", name=name, memory_mib=memory_mib)


def make_inventory(count: int = 4, *, name: str = "Tesla T4", memory_mib: int = 15360, **kwargs: Any) -> inventory.Inventory:
    return inventory.make([make_card(i, name=name, memory_mib=memory_mib) for i in range(count)], **kwargs)


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            child = target.setdefault(key, {})
            merge(child, value)
        else:
            target[key] = copy.deepcopy(value)


class FakeNodes:
    """The runner's view of the apiserver, for one or more nodes, recording every patch."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {obj["metadata"]["name"]: obj for obj in objects}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.status_patches: list[tuple[str, dict[str, Any]]] = []
        self.fail_next: list[Exception] = []
        self.conflicts = 0
        self._version = 1

    def get(self, name: str) -> ownership.Node:
        self._maybe_fail()
        if name not in self.objects:
            raise kube_errors.NotFound(f"get node {name}: not found")
        return ownership.Node.from_object(self.objects[name])

    def patch(self, name: str, body: Mapping[str, Any]) -> None:
        self._maybe_fail()
        obj = self.objects[name]
        version = body.get("metadata", {}).get("resourceVersion")
        if self.conflicts:
            self.conflicts -= 1
            self._bump(obj)
            raise kube_errors.Conflict(f"patch node {name}: the node changed meanwhile")
        if version is not None and version != obj["metadata"]["resourceVersion"]:
            raise kube_errors.Conflict(f"patch node {name}: the node changed meanwhile")
        copied = copy.deepcopy(dict(body))
        copied.get("metadata", {}).pop("resourceVersion", None)
        self.patches.append((name, copied))
        merge(obj, copied)
        self._bump(obj)

    def patch_status(self, name: str, body: Mapping[str, Any]) -> None:
        self._maybe_fail()
        self.status_patches.append((name, copy.deepcopy(dict(body))))
        merge(self.objects[name], body)
        self._bump(self.objects[name])

    def labels(self, name: str) -> dict[str, str]:
        result: dict[str, str] = self.objects[name]["metadata"].get("labels", {})
        return result

    def annotations(self, name: str) -> dict[str, str]:
        result: dict[str, str] = self.objects[name]["metadata"].get("annotations", {})
        return result

    def capacity(self, name: str) -> dict[str, str]:
        result: dict[str, str] = self.objects[name]["status"].get("capacity", {})
        return result

    def set_label(self, name: str, key: str, value: str | None) -> None:
        merge(self.objects[name], {"metadata": {"labels": {key: value}}})
        self._bump(self.objects[name])

    def _bump(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    def _maybe_fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)


def node_object(
    name: str = "gpu-0",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    base_capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", **(capacity or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1", "labels": dict(labels or {}), "annotations": dict(annotations or {})},
        "status": {"capacity": dict(base_capacity), "allocatable": dict(base_capacity)},
    }


InventoryFactory = Callable[..., inventory.Inventory]
NodeFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def card() -> CardFactory:
    """`card(index, name=..., memory_mib=...)`: one Card with a UUID derived from its index."""
    return make_card


@pytest.fixture
def cards_of() -> InventoryFactory:
    """`cards_of(count, name=..., memory_mib=..., **make_kwargs)`: an inventory of identical cards."""
    return make_inventory


@pytest.fixture
def node() -> NodeFactory:
    """`node(name, labels=..., annotations=..., capacity=...)`: a v1 Node as JSON."""
    return node_object


@pytest.fixture
def fake_nodes() -> type[FakeNodes]:
    return FakeNodes
