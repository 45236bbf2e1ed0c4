"""Ownership: patch only on change, remove what no longer applies, leave other owners' labels alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from policies import gpu
from webhook.labeler import inventory, labels, ownership

InventoryFactory = Callable[..., Any]
NodeFactory = Callable[..., dict[str, Any]]

NAME, MEM, COUNT, MIB = gpu.CARD_NAME_LABEL, gpu.CARD_MEMORY_LABEL, gpu.CARD_COUNT_LABEL, gpu.CARD_MEMORY_MIB_LABEL


def apply(node: ownership.Node, patch: dict[str, Any] | None) -> ownership.Node:
    """The node after a metadata merge patch (what the apiserver would store)."""
    if patch is None:
        return node
    metadata = patch["metadata"]
    new_labels = dict(node.labels)
    new_annotations = dict(node.annotations)
    for target, section in ((new_labels, "labels"), (new_annotations, "annotations")):
        for key, value in metadata.get(section, {}).items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return ownership.Node(name=node.name, labels=new_labels, annotations=new_annotations, resource_version="2")


def test_a_fresh_node_gets_everything_and_an_ownership_record(cards_of: InventoryFactory) -> None:
    desired = labels.compute(cards_of(4))
    plan = ownership.plan(ownership.Node(name="n", resource_version="7"), desired=desired)
    assert plan.patch is not None
    metadata = plan.patch["metadata"]
    assert metadata["labels"] == desired.labels
    assert metadata["resourceVersion"] == "7"
    record = json.loads(metadata["annotations"][ownership.OWNED_ANNOTATION])
    assert record == {"labels": sorted(desired.labels), "annotations": sorted(desired.annotations)}
    assert plan.foreign == ()


def test_a_second_pass_over_its_own_output_sends_nothing(cards_of: InventoryFactory) -> None:
    desired = labels.compute(cards_of(4))
    first = ownership.plan(ownership.Node(name="n"), desired=desired)
    node = apply(ownership.Node(name="n"), first.patch)
    assert ownership.plan(node, desired=desired).patch is None


def test_only_the_values_that_differ_are_sent(cards_of: InventoryFactory) -> None:
    node = apply(ownership.Node(name="n"), ownership.plan(ownership.Node(name="n"), desired=labels.compute(cards_of(4))).patch)
    plan = ownership.plan(node, desired=labels.compute(cards_of(3)))
    assert plan.patch is not None
    assert plan.patch["metadata"]["labels"] == {COUNT: "3"}
    assert set(plan.patch["metadata"]["annotations"]) == {gpu.INVENTORY_ANNOTATION}


def test_owned_keys_that_no_longer_apply_are_removed(cards_of: InventoryFactory, card: Callable[..., Any]) -> None:
    mixed = inventory.make(
        [card(0), card(1, name="NVIDIA A10", memory_mib=23028)], driver_version="550.1", links=[inventory.link(0, 1, "PIX")]
    )
    node = apply(ownership.Node(name="n"), ownership.plan(ownership.Node(name="n"), desired=labels.compute(mixed)).patch)
    assert node.annotations[labels.MIXED_ANNOTATION] == "true"
    plan = ownership.plan(node, desired=labels.compute(cards_of(1)))
    assert plan.patch is not None
    metadata = plan.patch["metadata"]
    assert metadata["labels"][labels.DRIVER_VERSION_LABEL] is None
    assert metadata["annotations"][labels.MIXED_ANNOTATION] is None
    assert metadata["annotations"][gpu.TOPOLOGY_ANNOTATION] is None


def test_when_every_card_is_gone_every_owned_key_and_the_record_go_too(cards_of: InventoryFactory) -> None:
    node = apply(
        ownership.Node(name="n", labels={"keep": "me"}),
        ownership.plan(ownership.Node(name="n"), desired=labels.compute(cards_of(2))).patch,
    )
    after = apply(node, ownership.plan(node, desired=labels.compute(cards_of(0))).patch)
    assert after.labels == {"keep": "me"}
    assert after.annotations == {}


def test_keys_it_never_owned_are_never_removed(cards_of: InventoryFactory) -> None:
    node = ownership.Node(name="n", labels={gpu.SCHEDULE_LABEL: "cgpu", "team": "a"}, annotations={"note": "x"})
    plan = ownership.plan(node, desired=labels.compute(cards_of(0)))
    assert plan.patch is None


def test_aliyun_labels_of_another_owner_are_left_alone(cards_of: InventoryFactory) -> None:
    node = ownership.Node(name="n", labels={NAME: "Tesla-M40", MEM: "12209MiB", COUNT: "1"})
    plan = ownership.plan(node, desired=labels.compute(cards_of(4)))
    assert plan.patch is not None
    written = plan.patch["metadata"]["labels"]
    assert NAME not in written and MEM not in written and COUNT not in written
    assert written[MIB] == "15360"  # our own prefix is always ours
    assert plan.foreign == (COUNT, MEM, NAME)
    assert NAME not in json.loads(plan.patch["metadata"]["annotations"][ownership.OWNED_ANNOTATION])["labels"]


def test_one_foreign_aliyun_label_makes_the_whole_group_foreign(cards_of: InventoryFactory) -> None:
    node = ownership.Node(name="n", labels={COUNT: "2"})
    plan = ownership.plan(node, desired=labels.compute(cards_of(4)))
    assert plan.patch is not None
    assert {NAME, MEM, COUNT}.isdisjoint(plan.patch["metadata"]["labels"])
    assert plan.foreign == (COUNT,)


def test_take_over_replaces_another_owners_aliyun_labels_and_owns_them(cards_of: InventoryFactory) -> None:
    node = ownership.Node(name="n", labels={NAME: "Tesla-M40", MEM: "12209MiB", COUNT: "1"})
    plan = ownership.plan(node, desired=labels.compute(cards_of(4)), take_over=True)
    assert plan.patch is not None
    assert plan.patch["metadata"]["labels"][NAME] == "Tesla-T4"
    assert plan.patch["metadata"]["labels"][COUNT] == "4"
    assert plan.foreign == ()
    after = apply(node, plan.patch)
    assert ownership.plan(after, desired=labels.compute(cards_of(4))).patch is None  # and no flag is needed from now on


def test_take_over_on_a_node_without_cards_removes_the_other_owners_aliyun_labels(cards_of: InventoryFactory) -> None:
    node = ownership.Node(name="n", labels={NAME: "Tesla-M40", COUNT: "1", "aliyun.accelerator/other": "x"})
    plan = ownership.plan(node, desired=labels.compute(cards_of(0)), take_over=True)
    assert plan.patch is not None
    assert plan.patch["metadata"]["labels"] == {NAME: None, COUNT: None}


def test_its_own_aliyun_labels_are_updated_without_take_over(cards_of: InventoryFactory) -> None:
    node = apply(ownership.Node(name="n"), ownership.plan(ownership.Node(name="n"), desired=labels.compute(cards_of(4))).patch)
    node = ownership.Node(name="n", labels={**node.labels, NAME: "edited-by-hand"}, annotations=node.annotations)
    plan = ownership.plan(node, desired=labels.compute(cards_of(4)))
    assert plan.patch is not None
    assert plan.patch["metadata"]["labels"] == {NAME: "Tesla-T4"}


def test_an_unreadable_ownership_record_counts_as_empty_and_is_rewritten(cards_of: InventoryFactory) -> None:
    node = ownership.Node(name="n", annotations={ownership.OWNED_ANNOTATION: "not json"})
    assert ownership.owned(node.annotations) == ownership.Owned()
    plan = ownership.plan(node, desired=labels.compute(cards_of(1)))
    assert plan.patch is not None
    assert json.loads(plan.patch["metadata"]["annotations"][ownership.OWNED_ANNOTATION])["labels"]


def test_a_record_of_the_wrong_shape_counts_as_empty() -> None:
    assert ownership.owned({ownership.OWNED_ANNOTATION: '{"labels": [1], "annotations": []}'}) == ownership.Owned()
    assert ownership.owned({ownership.OWNED_ANNOTATION: '{"labels": []}'}) == ownership.Owned()


def test_a_node_object_is_read_from_its_json(node: NodeFactory) -> None:
    obj = node("gpu-0", labels={"a": "b"}, annotations={"c": "d"}, capacity={"aliyun.com/gpu-mem": "60"})
    parsed = ownership.Node.from_object(obj)
    assert parsed.name == "gpu-0"
    assert parsed.labels == {"a": "b"}
    assert parsed.capacity["aliyun.com/gpu-mem"] == "60"
    assert parsed.resource_version == "1"
    assert ownership.Node.from_object({}).labels == {}


# --- capacity ------------------------------------------------------------------------------------


def test_capacity_is_patched_in_both_capacity_and_allocatable() -> None:
    node = ownership.Node(name="n", capacity={"cpu": "32"}, allocatable={"cpu": "31"})
    patch = ownership.capacity_patch(node, want={"aliyun.com/gpu-mem": "60", "aliyun.com/gpu": "0"})
    assert patch == {
        "status": {
            "capacity": {"aliyun.com/gpu-mem": "60", "aliyun.com/gpu": "0"},
            "allocatable": {"aliyun.com/gpu-mem": "60", "aliyun.com/gpu": "0"},
        }
    }


def test_capacity_already_in_place_sends_nothing() -> None:
    current = {"aliyun.com/gpu-mem": "60", "aliyun.com/gpu": "0"}
    node = ownership.Node(name="n", capacity=current, allocatable=current)
    assert ownership.capacity_patch(node, want={"aliyun.com/gpu-mem": "60", "aliyun.com/gpu": "0"}) is None


def test_only_the_field_that_differs_is_sent() -> None:
    node = ownership.Node(name="n", capacity={"aliyun.com/gpu": "8"}, allocatable={"aliyun.com/gpu": "7"})
    assert ownership.capacity_patch(node, want={"aliyun.com/gpu": "8"}) == {"status": {"allocatable": {"aliyun.com/gpu": "8"}}}


def test_capacity_the_apiserver_wrote_in_its_own_form_sends_nothing() -> None:
    # 10 cards in core_mem mode: 1000 % is stored as "1k"; comparing spellings would patch forever.
    current = {"aliyun.com/gpu-core.percentage": "1k", "aliyun.com/gpu-mem": "150", "aliyun.com/gpu": "0"}
    node = ownership.Node(name="n", capacity=current, allocatable=current)
    want = {"aliyun.com/gpu-core.percentage": "1000", "aliyun.com/gpu-mem": "150", "aliyun.com/gpu": "0"}
    assert ownership.capacity_patch(node, want=want) is None
    changed = ownership.capacity_patch(node, want={**want, "aliyun.com/gpu-core.percentage": "1100"})
    assert changed is not None and changed["status"]["capacity"] == {"aliyun.com/gpu-core.percentage": "1100"}
