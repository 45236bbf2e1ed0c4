"""Ownership and diffing: from a node's current state and the desired labels to the patches to send.

Pure. The labeler records the keys it writes in the annotation `gpu-admission.io/labeler-owned`
(JSON `{"labels": [...], "annotations": [...]}`, sorted), in the way node-feature-discovery records
its labels in `nfd.node.kubernetes.io/feature-labels`. From that record:

- a key it owned that is no longer computed (a card or a version went away) is removed;
- a change is sent only when some value differs (no patch at all when nothing does);
- the `aliyun.accelerator/nvidia_{name,mem,count}` labels are treated as one group: when any of
  them is on the node and not in the record, another component (ACK's own labeling, an older
  labeler) owns them, and the group is left exactly as it is unless `take_over` is set. With
  `take_over` the group is the labeler's from then on, including removing it when no cards remain.
- keys under `gpu-admission.io/` are the project's own, so they are always the labeler's.

Capacity (`--advertise`) is compared the same way: only resources whose quantity differs are sent,
to `status.capacity` and `status.allocatable` alike.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from policies import gpu
from policies.gpu import quantity
from webhook.labeler import labels

logger = logging.getLogger(__name__)

OWNED_ANNOTATION = gpu.OWN_PREFIX + "labeler-owned"
ACCELERATOR_LABELS: frozenset[str] = frozenset({gpu.CARD_NAME_LABEL, gpu.CARD_MEMORY_LABEL, gpu.CARD_COUNT_LABEL})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Node:
    """What the labeler needs to know of a Node object."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    capacity: Mapping[str, str] = dataclasses.field(default_factory=dict)
    allocatable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resource_version: str = ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Node:
        """Read a v1 Node in its JSON form (camelCase keys)."""
        metadata = obj.get("metadata") or {}
        status = obj.get("status") or {}
        return cls(
            name=str(metadata.get("name", "")),
            labels=_strings(metadata.get("labels")),
            annotations=_strings(metadata.get("annotations")),
            capacity=_strings(status.get("capacity")),
            allocatable=_strings(status.get("allocatable")),
            resource_version=str(metadata.get("resourceVersion") or ""),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Owned:
    """The label and annotation keys the labeler wrote last time."""

    labels: frozenset[str] = frozenset()
    annotations: frozenset[str] = frozenset()

    def encode(self) -> str:
        return json.dumps({"labels": sorted(self.labels), "annotations": sorted(self.annotations)}, separators=(",", ":"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """The merge patch for the Node (None: nothing changes) and the keys left to another owner."""

    patch: dict[str, Any] | None
    owned: Owned
    foreign: tuple[str, ...] = ()


def owned(annotations: Mapping[str, str]) -> Owned:
    """The record of owned keys; an unreadable record counts as empty (and is rewritten)."""
    raw = annotations.get(OWNED_ANNOTATION)
    if raw is None:
        return Owned()
    try:
        document = json.loads(raw)
        label_keys = document["labels"]
        annotation_keys = document["annotations"]
        if not all(isinstance(key, str) for key in [*label_keys, *annotation_keys]):
            raise TypeError("keys must be strings")
    except (ValueError, KeyError, TypeError) as error:
        logger.warning("ignoring an unreadable %s annotation (%s): %.80s", OWNED_ANNOTATION, error, raw)
        return Owned()
    return Owned(labels=frozenset(label_keys), annotations=frozenset(annotation_keys))


def plan(node: Node, *, desired: labels.Desired, take_over: bool = False) -> Plan:
    """The metadata merge patch that makes `node` carry `desired`, honouring ownership (see module)."""
    previous = owned(node.annotations)
    present = ACCELERATOR_LABELS & node.labels.keys()
    foreign = present - previous.labels
    previous_labels = set(previous.labels)
    skipped: frozenset[str] = frozenset()
    if foreign and take_over:
        previous_labels |= foreign
    elif foreign:
        skipped = ACCELERATOR_LABELS
    want_labels = {key: value for key, value in desired.labels.items() if key not in skipped}
    want_annotations = dict(desired.annotations)
    now_owned = Owned(labels=frozenset(want_labels), annotations=frozenset(want_annotations))
    if now_owned.labels or now_owned.annotations:
        want_annotations[OWNED_ANNOTATION] = now_owned.encode()
    stale_annotations = set(previous.annotations) | {OWNED_ANNOTATION}
    label_patch = _diff(node.labels, want=want_labels, stale=previous_labels - skipped)
    annotation_patch = _diff(node.annotations, want=want_annotations, stale=stale_annotations)
    metadata: dict[str, Any] = {}
    if label_patch:
        metadata["labels"] = label_patch
    if annotation_patch:
        metadata["annotations"] = annotation_patch
    if metadata and node.resource_version:
        # Makes the patch conditional: the ownership decision above was taken on this version.
        metadata["resourceVersion"] = node.resource_version
    return Plan(
        patch={"metadata": metadata} if metadata else None, owned=now_owned, foreign=tuple(sorted(foreign if skipped else ()))
    )


def capacity_patch(node: Node, *, want: Mapping[str, str]) -> dict[str, Any] | None:
    """The `nodes/status` merge patch setting capacity and allocatable to `want` (None: already so)."""
    status: dict[str, Any] = {}
    for field, current in (("capacity", node.capacity), ("allocatable", node.allocatable)):
        changed = {name: value for name, value in want.items() if not _same_quantity(current.get(name), value)}
        if changed:
            status[field] = changed
    return {"status": status} if status else None


def _diff(current: Mapping[str, str], *, want: Mapping[str, str], stale: set[str]) -> dict[str, str | None]:
    patch: dict[str, str | None] = {key: value for key, value in want.items() if current.get(key) != value}
    for key in sorted(stale - want.keys()):
        if key in current:
            patch[key] = None  # JSON merge patch: null removes the key
    return patch


def _same_quantity(current: str | None, want: str) -> bool:
    """Equal in value: the apiserver writes 1000 back as `1k` (a 10-card core_mem node's percentage)."""
    have, wanted = quantity.decoded(current), quantity.decoded(want)
    if current is None or have is None or wanted is None:
        return current == want
    return have.same_value(wanted)


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(key): str(item) for key, item in value.items()}
