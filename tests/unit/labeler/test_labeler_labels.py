"""From an inventory to labels, annotations and per-mode capacity (pure; no GPU, no cluster)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from policies import gpu
from webhook.labeler import inventory, labels

CardFactory = Callable[..., inventory.Card]
InventoryFactory = Callable[..., Any]


def test_a_uniform_node_gets_the_three_aliyun_labels_and_the_numeric_memory(cards_of: InventoryFactory) -> None:
    desired = labels.compute(cards_of(4, name="Tesla T4", memory_mib=15360))
    assert desired.labels == {
        gpu.CARD_NAME_LABEL: "Tesla-T4",
        gpu.CARD_MEMORY_LABEL: "15360MiB",
        gpu.CARD_COUNT_LABEL: "4",
        gpu.CARD_MEMORY_MIB_LABEL: "15360",
    }
    assert labels.MIXED_ANNOTATION not in desired.annotations


def test_the_seed_example_tesla_v100_is_spelled_with_dashes(cards_of: InventoryFactory) -> None:
    desired = labels.compute(cards_of(8, name="Tesla V100-SXM2-32GB", memory_mib=32510))
    assert desired.labels[gpu.CARD_NAME_LABEL] == "Tesla-V100-SXM2-32GB"
    assert desired.labels[gpu.CARD_MEMORY_LABEL] == "32510MiB"


def test_the_inventory_annotation_lists_every_card_in_index_order(card: CardFactory) -> None:
    inv = inventory.make([card(1, name="Tesla T4"), card(0, name="Tesla T4")])
    cards = json.loads(labels.compute(inv).annotations[gpu.INVENTORY_ANNOTATION])
    assert cards == [
        {"index": 0, "uuid": inv.cards[0].uuid, "name": "Tesla-T4", "memoryMiB": 15360},
        {"index": 1, "uuid": inv.cards[1].uuid, "name": "Tesla-T4", "memoryMiB": 15360},
    ]


def test_a_mixed_node_labels_the_smallest_card_memory_and_says_it_is_mixed(card: CardFactory) -> None:
    inv = inventory.make(
        [
            card(0, name="NVIDIA A10", memory_mib=23028),
            card(1, name="Tesla T4", memory_mib=15360),
            card(2, name="NVIDIA A10", memory_mib=23028),
        ]
    )
    desired = labels.compute(inv)
    assert desired.labels[gpu.CARD_MEMORY_LABEL] == "15360MiB"
    assert desired.labels[gpu.CARD_MEMORY_MIB_LABEL] == "15360"
    assert desired.labels[gpu.CARD_COUNT_LABEL] == "3"
    assert desired.labels[gpu.CARD_NAME_LABEL] == "NVIDIA-A10"  # the most common model
    assert desired.annotations[labels.MIXED_ANNOTATION] == "true"


def test_a_mixed_name_tie_is_broken_by_name_so_labels_never_flap(card: CardFactory) -> None:
    forward = inventory.make([card(0, name="Tesla T4"), card(1, name="NVIDIA A10", memory_mib=23028)])
    backward = inventory.make([card(0, name="NVIDIA A10", memory_mib=23028), card(1, name="Tesla T4")])
    assert labels.compute(forward).labels[gpu.CARD_NAME_LABEL] == "NVIDIA-A10"
    assert labels.compute(backward).labels[gpu.CARD_NAME_LABEL] == "NVIDIA-A10"


def test_same_model_with_different_memory_is_mixed(card: CardFactory) -> None:
    inv = inventory.make([card(0, name="NVIDIA A100", memory_mib=40960), card(1, name="NVIDIA A100", memory_mib=81920)])
    desired = labels.compute(inv)
    assert desired.annotations[labels.MIXED_ANNOTATION] == "true"
    assert desired.labels[gpu.CARD_MEMORY_LABEL] == "40960MiB"


def test_versions_become_labels_when_known(cards_of: InventoryFactory) -> None:
    desired = labels.compute(cards_of(1, driver_version="550.107.02", cuda_version="12.4"))
    assert desired.labels[labels.DRIVER_VERSION_LABEL] == "550.107.02"
    assert desired.labels[labels.CUDA_VERSION_LABEL] == "12.4"
    assert labels.DRIVER_VERSION_LABEL not in labels.compute(cards_of(1)).labels


def test_topology_is_written_only_when_links_are_known(cards_of: InventoryFactory) -> None:
    linked = cards_of(3, links=[inventory.link(1, 0, "nv2"), inventory.link(0, 2, "SYS"), inventory.link(1, 2, "PIX")])
    annotation = labels.compute(linked).annotations[gpu.TOPOLOGY_ANNOTATION]
    assert json.loads(annotation) == {"links": [[0, 1, "NV2"], [0, 2, "SYS"], [1, 2, "PIX"]]}
    assert gpu.TOPOLOGY_ANNOTATION not in labels.compute(cards_of(3)).annotations


def test_a_node_without_cards_gets_nothing(cards_of: InventoryFactory) -> None:
    desired = labels.compute(cards_of(0))
    assert desired.labels == {}
    assert desired.annotations == {}


def test_every_label_value_is_valid(card: CardFactory) -> None:
    inv = inventory.make([card(0, name="NVIDIA TITAN X (Pascal)")], driver_version="(weird) 1.2 beta", cuda_version="12.4")
    for value in labels.compute(inv).labels.values():
        assert gpu.is_label_value(value), value


# --- the mode -> capacity table -----------------------------------------------------------------

ZERO = "0"


@pytest.mark.parametrize("mode", [gpu.Mode.CGPU, gpu.Mode.SHARE, gpu.Mode.MPS])
def test_shared_modes_advertise_whole_gib_per_card_and_the_card_count(mode: gpu.Mode, cards_of: InventoryFactory) -> None:
    # 15360 MiB = 15 GiB per T4; 4 cards -> 60, the seed's `aliyun.com/gpu-mem: "60"`.
    assert labels.capacity(cards_of(4, memory_mib=15360), mode=mode) == {
        gpu.Resource.NVIDIA_GPU: ZERO,
        gpu.Resource.GPU_MEM: "60",
        gpu.Resource.GPU_COUNT: "4",
        gpu.Resource.GPU_CORE_PERCENTAGE: ZERO,
        gpu.Resource.ALIYUN_GPU: ZERO,
    }


def test_memory_is_floored_per_card_not_over_the_sum(card: CardFactory) -> None:
    # 23028 MiB is 22.49 GiB: two cards give 22 + 22 = 44, not floor(44.98) = 44... and 3 give 66, not 67.
    inv = inventory.make([card(i, memory_mib=23028) for i in range(3)])
    assert labels.capacity(inv, mode=gpu.Mode.CGPU)[gpu.Resource.GPU_MEM] == "66"


def test_core_mem_also_advertises_100_percent_per_card(cards_of: InventoryFactory) -> None:
    assert labels.capacity(cards_of(2, memory_mib=23028), mode=gpu.Mode.CORE_MEM) == {
        gpu.Resource.NVIDIA_GPU: ZERO,
        gpu.Resource.GPU_MEM: "44",
        gpu.Resource.GPU_COUNT: "2",
        gpu.Resource.GPU_CORE_PERCENTAGE: "200",
        gpu.Resource.ALIYUN_GPU: ZERO,
    }


def test_topology_advertises_whole_cards_only(cards_of: InventoryFactory) -> None:
    assert labels.capacity(cards_of(8, memory_mib=32510), mode=gpu.Mode.TOPOLOGY) == {
        gpu.Resource.NVIDIA_GPU: ZERO,
        gpu.Resource.GPU_MEM: ZERO,
        gpu.Resource.GPU_COUNT: ZERO,
        gpu.Resource.GPU_CORE_PERCENTAGE: ZERO,
        gpu.Resource.ALIYUN_GPU: "8",
    }


def test_default_mode_zeroes_the_others_and_leaves_nvidia_gpu_to_the_device_plugin(cards_of: InventoryFactory) -> None:
    advertised = labels.capacity(cards_of(8), mode=gpu.Mode.DEFAULT)
    assert gpu.Resource.NVIDIA_GPU not in advertised
    assert advertised == {
        gpu.Resource.GPU_MEM: ZERO,
        gpu.Resource.GPU_COUNT: ZERO,
        gpu.Resource.GPU_CORE_PERCENTAGE: ZERO,
        gpu.Resource.ALIYUN_GPU: ZERO,
    }


FAMILY_RESOURCES = {
    gpu.Family.EXCLUSIVE: gpu.Resource.NVIDIA_GPU,
    gpu.Family.SHARED: gpu.Resource.GPU_MEM,
    gpu.Family.SHARED_CORE: gpu.Resource.GPU_CORE_PERCENTAGE,
    gpu.Family.TOPOLOGY: gpu.Resource.ALIYUN_GPU,
}


@pytest.mark.parametrize("family", list(gpu.Family))
def test_each_mode_advertises_exactly_the_families_it_serves_per_the_gpu_vocabulary(
    family: gpu.Family, cards_of: InventoryFactory
) -> None:
    resource = FAMILY_RESOURCES[family]
    for mode in gpu.Mode:
        advertised = labels.capacity(cards_of(2), mode=mode)
        if mode not in gpu.modes_for(family):
            assert advertised[resource] == ZERO, (mode, resource)
        elif resource in labels.DEVICE_PLUGIN_RESOURCES:
            assert resource not in advertised, (mode, resource)
        else:
            assert int(advertised[resource]) > 0, (mode, resource)
