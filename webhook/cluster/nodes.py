"""Fake GPU nodes for the local cluster: the node file format and the Node objects KWOK manages."""

from __future__ import annotations

import dataclasses
import importlib.resources
from collections.abc import Mapping
from typing import Any

import yaml

from webhook.labeler import inventory as labeler_inventory

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
BASE_CAPACITY: Mapping[str, str] = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}


class NodeFileError(ValueError):
    """The node file cannot be used; the message is one line naming the entry and field."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FakeNode:
    """One fake node: its name, labels and extended-resource capacity."""

    name: str
    labels: Mapping[str, str]
    capacity: Mapping[str, str]
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The labeler's inventory file for this node (`gpus`, optional `topology`, `driverVersion`,
    # `cudaVersion`); when present, `cluster up` runs a real labeler for the node with it.
    inventory: Mapping[str, Any] | None = None

    def manifest(self) -> dict[str, Any]:
        """The v1 Node to create. Status is accepted on create, which is how capacity gets set."""
        capacity = {**BASE_CAPACITY, **self.capacity}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    **self.labels,
                },
                "annotations": {KWOK_ANNOTATION: "fake", **self.annotations},
            },
            "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity},
        }


def parse(document: Any, *, source: str) -> tuple[FakeNode, ...]:
    """Read a node file document (`nodes: [{name, labels, capacity, annotations, gpus, topology}]`)."""
    if not isinstance(document, Mapping) or not isinstance(document.get("nodes"), list):
        raise NodeFileError(f"{source}: expected a mapping with a 'nodes' list")
    found: list[FakeNode] = []
    for index, entry in enumerate(document["nodes"]):
        where = f"{source}: nodes[{index}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise NodeFileError(f"{where}: 'name' must be a non-empty string")
        found.append(
            FakeNode(
                name=entry["name"],
                labels=_strings(entry.get("labels"), where=f"{where}.labels"),
                capacity=_strings(entry.get("capacity"), where=f"{where}.capacity"),
                annotations=_strings(entry.get("annotations"), where=f"{where}.annotations"),
                inventory=_inventory(entry, where=where),
            )
        )
    names = [node.name for node in found]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise NodeFileError(f"{source}: duplicate node names: {', '.join(duplicates)}")
    return tuple(found)


def load(path: str | None) -> tuple[FakeNode, ...]:
    """The nodes of a file, or the built-in default set when no path is given."""
    if path is None:
        text = importlib.resources.files("webhook.cluster").joinpath("default-nodes.yaml").read_text()
        return parse(yaml.safe_load(text), source="default-nodes.yaml")
    try:
        with open(path, encoding="utf-8") as stream:
            document = yaml.safe_load(stream)
    except OSError as error:
        raise NodeFileError(f"{path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise NodeFileError(f"{path}: invalid YAML: {str(error).splitlines()[0]}") from error
    return parse(document, source=path)


def _inventory(entry: Mapping[str, Any], *, where: str) -> dict[str, Any] | None:
    """The entry's labeler inventory file (its keys are the labeler's), checked by the labeler's own parser."""
    gpus, topology = labeler_inventory.GPUS_KEY, labeler_inventory.TOPOLOGY_KEY
    if gpus not in entry:
        if topology in entry:
            raise NodeFileError(f"{where}: '{topology}' needs '{gpus}'")
        return None
    if not isinstance(entry[gpus], list) or not entry[gpus]:
        raise NodeFileError(f"{where}.{gpus}: expected a non-empty list of cards")
    document = {key: entry[key] for key in labeler_inventory.FILE_KEYS if key in entry}
    try:
        labeler_inventory.parse(document, source=where)
    except labeler_inventory.InventoryError as error:
        raise NodeFileError(str(error)) from error
    return document


def _strings(value: Any, *, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise NodeFileError(f"{where}: expected a mapping")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or isinstance(item, (Mapping, list)) or item is None:
            raise NodeFileError(f"{where}: {key!r} must map to a string or number")
        out[key] = str(item).lower() if isinstance(item, bool) else str(item)
    return out
