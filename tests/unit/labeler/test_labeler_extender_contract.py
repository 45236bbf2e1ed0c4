"""The labeler writes what the scheduler extender reads: the inventory and topology annotations, through one codec."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from policies import gpu
from policies.gpu import cards
from policies.gpu import inventory as codec
from webhook.labeler import inventory, labels, ownership


def labeled_node(inv: inventory.Inventory, *, mode: gpu.Mode) -> dict[str, Any]:
    """A Node object as the labeler leaves it after one pass with --advertise."""
    plan = ownership.plan(ownership.Node(name="gpu-0"), desired=labels.compute(inv))
    assert plan.patch is not None
    metadata = plan.patch["metadata"]
    capacity = labels.capacity(inv, mode=mode)
    return {
        "metadata": {
            "name": "gpu-0",
            "labels": {**metadata["labels"], gpu.SCHEDULE_LABEL: str(mode)},
            "annotations": metadata["annotations"],
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def test_the_extender_reads_every_card_of_a_mixed_node_from_the_inventory_annotation(card: Callable[..., inventory.Card]) -> None:
    inv = inventory.make([card(0, name="Tesla T4", memory_mib=15360), card(1, name="NVIDIA A10", memory_mib=23028)])
    seen = cards.node_cards(labeled_node(inv, mode=gpu.Mode.CGPU))
    assert seen.source == "inventory"
    assert [(c.index, c.memory_gib, c.uuid, c.model) for c in seen.cards] == [
        (0, 15, inv.cards[0].uuid, "Tesla-T4"),
        (1, 22, inv.cards[1].uuid, "NVIDIA-A10"),
    ]


def test_advertised_memory_equals_the_sum_the_extender_places(card: Callable[..., inventory.Card]) -> None:
    inv = inventory.make([card(i, memory_mib=mib) for i, mib in enumerate((15360, 23028, 32510, 81559))])
    seen = cards.node_cards(labeled_node(inv, mode=gpu.Mode.CORE_MEM))
    assert seen.memory_gib == int(labels.capacity(inv, mode=gpu.Mode.CORE_MEM)[gpu.Resource.GPU_MEM])


def test_the_extender_reads_every_link_with_its_level(cards_of: Callable[..., inventory.Inventory]) -> None:
    inv = cards_of(
        4,
        links=[
            inventory.link(0, 1, "NV2"),
            inventory.link(2, 3, "NV12"),
            inventory.link(0, 2, "PIX"),
            inventory.link(1, 3, "SYS"),
        ],
    )
    seen = cards.node_cards(labeled_node(inv, mode=gpu.Mode.TOPOLOGY)).links
    assert seen.level(1, 0) == "NV2"
    assert seen.level(3, 2) == "NV12"
    assert seen.level(0, 2) == "PIX"
    assert seen.level(1, 3) == "SYS"
    assert seen.level(0, 3) is None


def test_every_annotation_the_labeler_writes_decodes_strictly(cards_of: Callable[..., inventory.Inventory]) -> None:
    inv = cards_of(3, links=[inventory.link(0, 1, "NV18"), inventory.link(1, 2, "PHB"), inventory.link(0, 2, "NODE")])
    written = labels.compute(inv).annotations
    decoded = codec.decode_inventory(written[gpu.INVENTORY_ANNOTATION])
    assert [(c.index, c.memory_mib, c.uuid) for c in decoded] == [(c.index, c.memory_mib, c.uuid) for c in inv.cards]
    assert codec.decode_topology(written[gpu.TOPOLOGY_ANNOTATION]).level(0, 1) == "NV18"


def test_the_topology_value_is_byte_for_byte_the_models_encoding(cards_of: Callable[..., inventory.Inventory]) -> None:
    links = [inventory.link(0, 1, "NV2"), inventory.link(1, 2, "PHB"), inventory.link(0, 2, "NODE")]
    written = labels.compute(cards_of(3, links=links)).annotations[gpu.TOPOLOGY_ANNOTATION]
    assert written == '{"links":[[0,1,"NV2"],[0,2,"NODE"],[1,2,"PHB"]]}'
    assert written == codec.encode_topology((item.a, item.b, item.code) for item in links)
