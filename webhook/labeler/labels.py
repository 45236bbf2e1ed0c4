"""Label computation: from an Inventory to the node labels, annotations and extended-resource capacity.

Pure (data in, data out), so every rule here is tested without a GPU, as in NVIDIA GPU Feature
Discovery where device access, label computation and label publishing are three units.

What a node with cards gets:

| key | kind | value |
|---|---|---|
| `aliyun.accelerator/nvidia_name` | label | the card model, sanitised (see `sanitise`); on a mixed node the most common model |
| `aliyun.accelerator/nvidia_mem` | label | `<MiB>MiB` of one card; on a mixed node the smallest card |
| `aliyun.accelerator/nvidia_count` | label | the number of cards |
| `gpu-admission.io/gpu-memory-mib` | label | the same MiB as a bare number (for `Gt` node affinity) |
| `gpu-admission.io/driver-version`, `gpu-admission.io/cuda-version` | label | when known |
| `gpu-admission.io/gpu-inventory` | annotation | the cards, as `policies.gpu.inventory` encodes them |
| `gpu-admission.io/gpu-topology` | annotation | the links, as `policies.gpu.inventory` encodes them (only when links are known) |
| `gpu-admission.io/gpu-mixed` | annotation | `"true"`, only on a node whose cards differ in model or memory |

A node without cards gets none of them. The name in the inventory annotation is sanitised like the
label, so it compares equal to `nvidia_name` and to the card-model annotations pods use.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

from policies import gpu
from policies.gpu import inventory as codec  # the annotations' codec; `inventory` is the labeler's own
from webhook.labeler import inventory

MIXED_ANNOTATION = gpu.OWN_PREFIX + "gpu-mixed"
DRIVER_VERSION_LABEL = gpu.OWN_PREFIX + "driver-version"
CUDA_VERSION_LABEL = gpu.OWN_PREFIX + "cuda-version"

UNKNOWN_NAME = "unknown"  # a name with nothing label-safe in it; the label must still exist (GPU103)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Desired:
    """The labels and annotations the labeler means a node to carry (all of them its own keys)."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]


def sanitise(name: str) -> str:
    """A card name as a valid label value (`gpu.card_name_label_value`); `unknown` when nothing is left."""
    return gpu.card_name_label_value(name) or UNKNOWN_NAME


def compute(inv: inventory.Inventory) -> Desired:
    """The labels and annotations for a node with these cards (none for a node without cards)."""
    if not inv.cards:
        return Desired(labels={}, annotations={})
    names = [sanitise(card.name) for card in inv.cards]
    smallest = min(card.memory_mib for card in inv.cards)
    labels = {
        gpu.CARD_NAME_LABEL: _most_common(names),
        gpu.CARD_MEMORY_LABEL: f"{smallest}MiB",
        gpu.CARD_COUNT_LABEL: str(len(inv.cards)),
        gpu.CARD_MEMORY_MIB_LABEL: str(smallest),
    }
    for key, version in ((DRIVER_VERSION_LABEL, inv.driver_version), (CUDA_VERSION_LABEL, inv.cuda_version)):
        if version is not None and version.strip():
            labels[key] = sanitise(version)
    annotations = {
        gpu.INVENTORY_ANNOTATION: codec.encode_inventory(
            codec.Card(index=card.index, memory_mib=card.memory_mib, uuid=card.uuid, name=name)
            for card, name in zip(inv.cards, names, strict=True)
        ),
    }
    if inv.links:
        annotations[gpu.TOPOLOGY_ANNOTATION] = codec.encode_topology((item.a, item.b, item.code) for item in inv.links)
    if len({(name, card.memory_mib) for name, card in zip(names, inv.cards, strict=True)}) > 1:
        annotations[MIXED_ANNOTATION] = "true"
    return Desired(labels=labels, annotations=annotations)


# --- extended-resource capacity (`--advertise`) -------------------------------------------------

# What each mode advertises is the model's `gpu.MODE_RESOURCES`; every other resource is set to 0.
# `nvidia.com/gpu` belongs to the NVIDIA device plugin: a default-mode node keeps whatever the
# plugin advertises; only the other modes set it to 0 (the seeds: enabling a mode zeroes the rest).
DEVICE_PLUGIN_RESOURCES: frozenset[str] = frozenset({gpu.Resource.NVIDIA_GPU})


def capacity(inv: inventory.Inventory, *, mode: gpu.Mode) -> dict[str, str]:
    """The extended resources a node in `mode` advertises, as quantity strings.

    Memory is whole GiB per card (`floor(MiB / 1024)`, summed), since a pod asks for GiB on one card
    and a fraction of a GiB can never be handed out. The core percentage is 100 per card.
    """
    cards = len(inv.cards)
    amounts: Mapping[gpu.Resource, int] = {
        gpu.Resource.NVIDIA_GPU: cards,
        gpu.Resource.GPU_MEM: sum(card.memory_mib // gpu.MIB_PER_GIB for card in inv.cards),
        gpu.Resource.GPU_COUNT: cards,
        gpu.Resource.GPU_CORE_PERCENTAGE: gpu.MAX_CORE_PERCENTAGE * cards,
        gpu.Resource.ALIYUN_GPU: cards,
    }
    mine = gpu.MODE_RESOURCES[mode]
    return {
        str(resource): str(amounts[resource] if resource in mine else 0)
        for resource in gpu.Resource
        if not (mode is gpu.Mode.DEFAULT and resource in DEVICE_PLUGIN_RESOURCES)
    }


def _most_common(names: list[str]) -> str:
    # Deterministic on mixed nodes (GFD's map-order flapping, NVIDIA/gpu-feature-discovery #27):
    # the most common model wins, ties go to the first name in sorted order.
    counts = collections.Counter(names)
    return min(counts, key=lambda name: (-counts[name], name))
