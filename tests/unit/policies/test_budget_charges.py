"""GPU-memory budgets: what each kind of pod and claim is charged (mixed-card nodes, MIG profiles,
DRA devices), the namespace ledger's codec and Lease, and the usage, over and prune arithmetic."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation, budgets, cardrequest, cards, dra, inventory, reservations
from tests import dra_objects

NOW = 1_800_000_000.0
GIB = 1024
SMALL, LARGE = 16 * GIB, 80 * GIB  # card 0 and card 1 of the mixed node, in MiB


def node(
    name: str = "mixed-0",
    memory: Sequence[int] | None = (SMALL, LARGE),
    *,
    mode: str | None = "topology",
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node; `memory` lists its cards' MiB by index for the labeler's inventory (None: no inventory)."""
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if mode is not None:
        metadata["labels"][gpu.SCHEDULE_LABEL] = mode
    if memory is not None:
        listed = [inventory.Card(index=i, memory_mib=mib, uuid=f"GPU-{name}-{i}") for i, mib in enumerate(memory)]
        metadata["annotations"] = {gpu.INVENTORY_ANNOTATION: inventory.encode_inventory(listed)}
    return {"metadata": metadata, "status": {"allocatable": dict(allocatable or {})}}


MIXED = node()


def pod(
    uid: str = "u-1",
    *,
    bound: str = "mixed-0",
    limits: Mapping[str, Any] | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str = "Running",
    **metadata: Any,
) -> dict[str, Any]:
    """A pod of namespace `team-a`, bound to `bound` ("": not bound), asking `limits` of one container."""
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    if limits is not None:
        container["resources"] = {"limits": dict(limits)}
    spec: dict[str, Any] = {"containers": [container]}
    if bound:
        spec["nodeName"] = bound
    return {
        "metadata": {"name": f"pod-{uid}", "namespace": "team-a", "uid": uid, "annotations": dict(annotations or {}), **metadata},
        "spec": spec,
        "status": {"phase": phase},
    }


def placed(
    uid: str = "u-1", *, cards_: tuple[int, ...], whole: bool, gib: int = 0, on: str = "mixed-0", **kw: Any
) -> dict[str, Any]:
    """A pod the extender placed: the resource it asked for and the allocation annotation bind wrote."""
    held = allocation.Allocation(
        uid=uid, namespace="team-a", name=f"pod-{uid}", node=on, cards=cards_, memory_gib=gib, whole=whole, assumed_at=NOW - 60
    )
    limits: dict[str, Any] = {gpu.Resource.ALIYUN_GPU: len(cards_)} if whole else {gpu.Resource.GPU_MEM: gib}
    return pod(uid, bound=on, limits=limits, annotations={gpu.ALLOCATION_ANNOTATION: allocation.encode(held)}, **kw)


def charge(memory_mib: int = 0, cards_: int = 0, problem: str = "") -> budgets.Charge:
    return budgets.Charge(memory_mib=memory_mib, cards=cards_, problem=problem)


# --- shares and whole cards the extender placed ----------------------------------------------------


def test_a_share_is_charged_its_gib_whichever_card_it_is_on() -> None:
    on_large = placed(cards_=(1,), whole=False, gib=4)
    on_small = placed(cards_=(0,), whole=False, gib=4)

    assert budgets.held_charge(on_large, MIXED, now=NOW) == charge(4 * GIB)
    assert budgets.held_charge(on_small, MIXED, now=NOW) == charge(4 * GIB)
    assert budgets.held_charge(on_small, None, now=NOW) == charge(4 * GIB)  # a share needs no node to be charged


def test_a_share_placed_by_gpushare_before_us_is_charged_from_its_annotations() -> None:
    annotations = {gpu.GPUSHARE_MEM_IDX_ANNOTATION: "1", gpu.GPUSHARE_MEM_POD_ANNOTATION: "6"}
    shared = pod(limits={gpu.Resource.GPU_MEM: 6}, annotations=annotations)

    assert budgets.held_charge(shared, MIXED, now=NOW) == charge(6 * GIB)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ((1,), charge(LARGE, 1)),  # card 1 is the 80 GiB card
        ((0,), charge(SMALL, 1)),  # card 0 the 16 GiB one
        ((0, 1), charge(SMALL + LARGE, 2)),
    ],
)
def test_whole_cards_are_charged_the_memory_of_each_card_they_were_given(
    given: tuple[int, ...], expected: budgets.Charge
) -> None:
    assert budgets.held_charge(placed(cards_=given, whole=True), MIXED, now=NOW) == expected


def test_a_whole_card_the_inventory_does_not_list_is_charged_as_the_nodes_largest() -> None:
    held = placed(cards_=(0, 7), whole=True)  # card 7 is not (or no longer) in the inventory

    assert budgets.held_charge(held, MIXED, now=NOW) == charge(SMALL + LARGE, 2)


def test_whole_cards_on_a_node_that_is_gone_are_counted_with_a_problem() -> None:
    held = placed(cards_=(0, 1), whole=True)

    found = budgets.held_charge(held, None, now=NOW)

    assert (found.memory_mib, found.cards) == (0, 2)
    assert found.problem == "the memory of card(s) [0, 1] on mixed-0 is unknown"


def test_an_allocation_charge_can_be_read_without_a_pod() -> None:
    whole = allocation.Allocation(uid="u", namespace="n", name="p", node="mixed-0", cards=(1,), whole=True)
    share = allocation.Allocation(uid="u", namespace="n", name="p", node="mixed-0", cards=(0,), memory_gib=3)

    assert budgets.allocation_charge(whole, MIXED) == charge(LARGE, 1)
    assert budgets.allocation_charge(share, MIXED) == charge(3 * GIB)


def test_a_bound_pod_without_our_annotations_is_charged_its_ask() -> None:
    whole = pod(limits={gpu.Resource.ALIYUN_GPU: 2})  # bound by someone else: its cards are not known
    share = pod(limits={gpu.Resource.GPU_MEM: 5, gpu.Resource.GPU_CORE_PERCENTAGE: 30})

    assert budgets.held_charge(whole, MIXED, now=NOW) == charge(2 * LARGE, 2)  # the largest card, twice
    assert budgets.held_charge(share, MIXED, now=NOW) == charge(5 * GIB)
    unknown = budgets.held_charge(whole, node(memory=None), now=NOW)
    assert (unknown.memory_mib, unknown.cards, unknown.problem) == (0, 2, "the card memory of node mixed-0 is unknown")


def test_an_allocation_naming_another_node_is_stale_and_the_ask_is_charged_instead() -> None:
    # Our annotation says card 0 (16 GiB) of gpu-9, but someone bound the pod to mixed-0.
    stale = placed(cards_=(0,), whole=True, on="gpu-9") | {
        "spec": {"nodeName": "mixed-0", "containers": [{"name": "main", "resources": {"limits": {gpu.Resource.ALIYUN_GPU: 1}}}]}
    }

    assert budgets.held_charge(stale, MIXED, now=NOW) == charge(LARGE, 1)


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        (cardrequest.Request(cards=1), charge(LARGE, 1)),  # the node's largest card: filter's bound
        (cardrequest.Request(cards=2), charge(LARGE + SMALL, 2)),
        (cardrequest.Request(memory_gib=4), charge(4 * GIB)),
        (cardrequest.Request(memory_gib=4, core_percent=50), charge(4 * GIB)),
    ],
)
def test_asked_is_the_most_a_pod_could_be_charged_on_the_node(wanted: cardrequest.Request, expected: budgets.Charge) -> None:
    assert budgets.asked(wanted, cards.node_cards(MIXED)) == expected


def test_asked_for_whole_cards_takes_the_largest_cards_whatever_their_index() -> None:
    reversed_sizes = node(memory=(LARGE, SMALL, LARGE))

    assert budgets.asked(cardrequest.Request(cards=2), cards.node_cards(reversed_sizes)) == charge(2 * LARGE, 2)


# --- the device plugin's resources ------------------------------------------------------------------


def test_nvidia_gpu_is_charged_the_nodes_largest_card_from_its_inventory() -> None:
    asking = pod(limits={"nvidia.com/gpu": 2}, bound="mixed-0")

    assert budgets.card_memory_mib(MIXED) == LARGE
    assert budgets.held_charge(asking, node(mode=None), now=NOW) == charge(2 * LARGE, 2)


def test_nvidia_gpu_is_charged_from_the_labelers_card_memory_label() -> None:
    labelled = node(memory=None, mode=None, labels={gpu.CARD_MEMORY_MIB_LABEL: "40960"})

    assert budgets.card_memory_mib(labelled) == 40960
    assert budgets.held_charge(pod(limits={"nvidia.com/gpu": 1}), labelled, now=NOW) == charge(40960, 1)


# NVIDIA GPU Feature Discovery writes `nvidia.com/gpu.memory` as the card's total memory in MiB
# (NVIDIA/k8s-device-plugin v0.20.0, internal/lm/resource.go NewGPUResourceLabeler: the label
# `<resource>.memory` from device.GetTotalMemoryMiB(), which internal/resource/nvml-device.go
# computes as NVML's memory total / (1024 * 1024)); 81559 is what an H100 80GB HBM3 reports.
def test_nvidia_gpu_is_charged_from_gpu_feature_discoverys_memory_label() -> None:
    labelled = node(memory=None, mode=None, labels={"nvidia.com/gpu.memory": "81559"})

    assert budgets.GFD_MEMORY_LABEL == "nvidia.com/gpu.memory"
    assert budgets.card_memory_mib(labelled) == 81559
    assert budgets.held_charge(pod(limits={"nvidia.com/gpu": 2}), labelled, now=NOW) == charge(2 * 81559, 2)


def test_the_inventory_comes_before_the_labelers_label_and_that_before_gfds() -> None:
    labels = {gpu.CARD_MEMORY_MIB_LABEL: "16384", "nvidia.com/gpu.memory": "15360"}

    assert budgets.card_memory_mib(node(labels=labels)) == LARGE
    assert budgets.card_memory_mib(node(memory=None, labels=labels)) == 16384
    assert budgets.card_memory_mib(node(memory=None, labels={"nvidia.com/gpu.memory": "15360"})) == 15360


def test_a_shared_node_without_inventory_gives_its_card_memory_from_capacity() -> None:
    capacity = node(memory=None, mode="cgpu", allocatable={gpu.Resource.GPU_MEM: "30", gpu.Resource.GPU_COUNT: "2"})

    assert budgets.card_memory_mib(capacity) == 15 * GIB  # gpushare's gpu-mem / gpu-count
    assert budgets.card_memory_mib(None) == 0
    assert budgets.card_memory_mib(node(memory=None, mode=None)) == 0


def test_nvidia_gpu_on_a_node_of_unknown_card_memory_counts_its_cards_and_says_why() -> None:
    found = budgets.held_charge(
        pod(limits={"nvidia.com/gpu": 2}, bound="bare-0"), node("bare-0", memory=None, mode=None), now=NOW
    )

    assert (found.memory_mib, found.cards) == (0, 2)
    assert found.problem == (
        "nvidia.com/gpu: the card memory of node bare-0 is unknown "
        "(no inventory, gpu-admission.io/gpu-memory-mib or nvidia.com/gpu.memory)"
    )
    missing = budgets.held_charge(pod(limits={"nvidia.com/gpu": 1}, bound="bare-0"), None, now=NOW)
    assert missing.problem.startswith("nvidia.com/gpu: the card memory of node bare-0 is unknown")


def test_a_time_sliced_card_is_charged_the_whole_card_and_no_card() -> None:
    found = budgets.held_charge(pod(limits={"nvidia.com/gpu.shared": 1}), MIXED, now=NOW)

    assert found == charge(LARGE, 0)
    unknown = budgets.held_charge(pod(limits={"nvidia.com/gpu.shared": 1}), node(memory=None), now=NOW)
    assert (unknown.memory_mib, unknown.cards) == (0, 0) and unknown.problem.startswith("nvidia.com/gpu.shared: ")


# MIG profile names are NVIDIA's: "<g>g.<N>gb", N the slice's memory in GB, "+me" one with the media
# extensions (NVIDIA MIG User Guide, "Supported MIG Profiles"; NVIDIA/mig-parted v0.15.0
# deployments/systemd/config-default.yaml lists A100-40GB 1g.5gb .. 7g.40gb, H100-80GB / A100-80GB
# 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb, H100 NVL 1g.12gb .. 7g.94gb,
# H200 1g.18gb .. 7g.141gb, and Blackwell's 1g.24gb+gfx, 1g.24gb+me.all, 1g.24gb-me). The device
# plugin's resource is `nvidia.com/mig-<profile>` with "+" turned into "." (a resource name cannot
# hold "+"): NVIDIA/k8s-device-plugin v0.20.0 internal/rm/rm.go, since v0.14.0 ("Sanitize resource
# name"); time-slicing renames a resource with ".shared" (api/config/v1/consts.go).
@pytest.mark.parametrize(
    ("resource", "gib"),
    [
        ("nvidia.com/mig-1g.10gb", 10),
        ("nvidia.com/mig-3g.40gb", 40),
        ("nvidia.com/mig-1g.10gb+me", 10),  # the profile's own spelling
        # A100-40GB
        ("nvidia.com/mig-1g.5gb", 5),
        ("nvidia.com/mig-2g.10gb", 10),
        ("nvidia.com/mig-3g.20gb", 20),
        ("nvidia.com/mig-4g.20gb", 20),
        ("nvidia.com/mig-7g.40gb", 40),
        # H100-80GB (and A100-80GB)
        ("nvidia.com/mig-1g.20gb", 20),
        ("nvidia.com/mig-2g.20gb", 20),
        ("nvidia.com/mig-4g.40gb", 40),
        ("nvidia.com/mig-7g.80gb", 80),
        # H100 NVL, H200
        ("nvidia.com/mig-1g.12gb", 12),
        ("nvidia.com/mig-3g.47gb", 47),
        ("nvidia.com/mig-7g.94gb", 94),
        ("nvidia.com/mig-1g.18gb", 18),
        ("nvidia.com/mig-7g.141gb", 141),
        # the resource names the device plugin serves for profiles with attributes
        ("nvidia.com/mig-1g.10gb.me", 10),
        ("nvidia.com/mig-1g.24gb.me.all", 24),
        ("nvidia.com/mig-1g.24gb.gfx", 24),
        ("nvidia.com/mig-1g.24gb-me", 24),
        ("nvidia.com/mig-1g.10gb.shared", 10),  # a time-sliced slice may use all of the slice
    ],
)
def test_a_mig_slice_is_charged_its_profiles_memory(resource: str, gib: int) -> None:
    assert budgets.mig_memory_mib(resource) == gib * GIB
    asking = pod(limits={resource: 2}, bound="mig-node")
    assert budgets.held_charge(asking, None, now=NOW) == charge(2 * gib * GIB)  # no card memory needed
    assert budgets.least_asked(pod(limits={resource: 1}, bound="")) == charge(gib * GIB)


@pytest.mark.parametrize(
    "resource",
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-",
        "nvidia.com/mig-1g",
        "nvidia.com/mig-1g.10",
        "aliyun.com/gpu-mem",
    ],
)
def test_a_name_that_is_no_mig_profile_has_no_slice_memory(resource: str) -> None:
    assert budgets.mig_memory_mib(resource) is None


def test_each_resource_of_one_pod_adds_up() -> None:
    many = pod(limits={"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2, "nvidia.com/gpu.shared": 1})

    assert budgets.held_charge(many, MIXED, now=NOW) == charge(LARGE + 20 * GIB + LARGE, 1)


# --- what holds nothing ----------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_is_charged_nothing(phase: str) -> None:
    for finished in (
        placed(cards_=(1,), whole=True, phase=phase),
        placed(cards_=(0,), whole=False, gib=4, phase=phase),
        pod(limits={"nvidia.com/gpu": 1}, phase=phase),
        pod(limits={"nvidia.com/mig-3g.40gb": 1}, phase=phase),
    ):
        assert budgets.held_charge(finished, MIXED, now=NOW) is budgets.NOTHING


def test_an_unbound_pod_is_charged_nothing_by_held_charge() -> None:
    for pending in (
        placed(cards_=(1,), whole=True, on="mixed-0") | {"spec": {"containers": []}},
        pod(limits={"nvidia.com/gpu": 1}, bound=""),
        pod(limits={gpu.Resource.GPU_MEM: 4}, bound=""),
    ):
        assert budgets.held_charge(pending, MIXED, now=NOW) is budgets.NOTHING


def test_a_terminating_pod_still_holds_its_charge() -> None:
    leaving = placed(cards_=(1,), whole=True, deletionTimestamp="2027-01-15T08:00:00Z")

    assert budgets.held_charge(leaving, MIXED, now=NOW) == charge(LARGE, 1)


def test_a_pod_without_gpus_is_charged_nothing() -> None:
    plain = pod(limits={"cpu": "2", "memory": "4Gi"})

    assert budgets.held_charge(plain, MIXED, now=NOW) == budgets.NOTHING
    assert not budgets.held_charge(plain, MIXED, now=NOW).charged


# --- before placement: admission's least and the gate's most ----------------------------------------


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({gpu.Resource.GPU_MEM: 6}, charge(6 * GIB)),
        ({gpu.Resource.ALIYUN_GPU: 2}, charge(0, 2)),  # whole cards: their memory depends on the node
        ({"nvidia.com/gpu": 3}, charge(0, 3)),
        ({"nvidia.com/mig-3g.40gb": 1, "nvidia.com/gpu.shared": 1}, charge(40 * GIB)),
        ({"cpu": "1"}, charge()),
    ],
)
def test_least_asked_is_what_the_spec_alone_says(limits: dict[str, Any], expected: budgets.Charge) -> None:
    assert budgets.least_asked(pod(limits=limits, bound="")) == expected


def test_the_gate_charges_the_largest_card_of_the_cluster() -> None:
    small = node("small-0", memory=(SMALL,), mode=None)
    large = node("large-0", memory=(LARGE, LARGE), mode=None)
    asking = pod(limits={"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1}, bound="")

    assert budgets.gate_charge(asking, [small, large]) == charge(2 * LARGE + 10 * GIB, 2)
    assert budgets.gate_charge(pod(limits={gpu.Resource.GPU_MEM: 4}, bound=""), [small]) is budgets.NOTHING
    blind = budgets.gate_charge(asking, [])
    assert (blind.memory_mib, blind.cards) == (10 * GIB, 2)
    assert blind.problem == (
        "nvidia.com/gpu: the card memory of node (not bound) is unknown "
        "(no inventory, gpu-admission.io/gpu-memory-mib or nvidia.com/gpu.memory)"
    )


# --- DRA claims --------------------------------------------------------------------------------------

# resource.k8s.io v1 (k8s.io/api v0.36.3, resource/v1/types.go): Device.capacity is
# map[QualifiedName]DeviceCapacity, DeviceCapacity.value a Quantity; v1beta1 nests the same map
# under Device.basic (resource/v1beta1/types.go BasicDevice.capacity). A QualifiedName without a
# domain is in the driver's domain, so `memory` and `gpu.nvidia.com/memory` name one capacity.
# DeviceRequestAllocationResult carries adminAccess, shareID and consumedCapacity
# (map[QualifiedName]Quantity, DRAConsumableCapacity).


def v1_slice(devices: list[dict[str, Any]], *, pool: str = "gpu-0", driver: str = dra.NVIDIA_DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "spec": {
            "driver": driver,
            "nodeName": pool,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def v1beta1_slice(devices: list[dict[str, Any]], *, pool: str = "gpu-1") -> dict[str, Any]:
    obj = v1_slice([{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}} for d in devices], pool=pool)
    obj["apiVersion"] = "resource.k8s.io/v1beta1"
    return obj


def test_device_memory_reads_the_v1_and_the_v1beta1_shapes() -> None:
    v1 = v1_slice(
        [
            {"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}},
            {"name": "gpu-1", "capacity": {"gpu.nvidia.com/memory": {"value": "81559Mi"}}},  # qualified name
            {"name": "gpu-2", "attributes": {"uuid": {"string": "GPU-2"}}},  # publishes no memory
            {"name": "gpu-3", "capacity": {"memory": {"value": "0"}}},
            {"name": "gpu-4", "capacity": {"memory": {"value": "lots"}}},
        ]
    )
    v1beta1 = v1beta1_slice([{"name": "gpu-0", "capacity": {"memory": {"value": "40Gi"}}}])
    v1alpha3 = v1_slice([{"name": "gpu-0", "basic": {"capacity": {"memory": "16Gi"}}}], pool="gpu-2")  # a bare quantity

    assert budgets.device_memory([v1, v1beta1, v1alpha3]) == {
        (dra.NVIDIA_DRIVER, "gpu-0", "gpu-0"): 80 * GIB,
        (dra.NVIDIA_DRIVER, "gpu-0", "gpu-1"): 81559,
        (dra.NVIDIA_DRIVER, "gpu-1", "gpu-0"): 40 * GIB,
        (dra.NVIDIA_DRIVER, "gpu-2", "gpu-0"): 16 * GIB,
    }


def test_device_memory_skips_slices_without_driver_or_pool() -> None:
    broken: list[dict[str, Any]] = [
        {"spec": {"pool": {"name": "p"}, "devices": []}},
        {"spec": {"driver": "d", "devices": []}},
        {},
    ]

    assert budgets.device_memory(broken) == {}
    assert budgets.device_memory([dra_objects.slice_for("gpu-0", ["GPU-a"], gib=24)]) == {
        (dra.NVIDIA_DRIVER, "gpu-0", "gpu-0"): 24 * GIB
    }


def held(claim: dict[str, Any]) -> tuple[dra.Held, ...]:
    found = dra.claim_results(claim)
    assert found, "the claim has no allocation"
    return found


MEMORY = budgets.device_memory([dra_objects.slice_for("gpu-0", ["GPU-a", "GPU-b"], gib=80)])


def test_an_allocated_device_is_charged_its_memory_capacity() -> None:
    whole = held(dra_objects.claim("c", namespace="team-a", uid="c-1", allocated=("gpu-0", "gpu-1")))

    assert budgets.claim_charge(whole, MEMORY) == charge(80 * GIB)


def test_a_share_of_a_device_is_charged_the_memory_it_consumed() -> None:
    share = held(dra_objects.claim("c", allocated=("gpu-0", "gpu-0"), consumedCapacity={"memory": "10Gi"}, shareID="s-1"))
    qualified = held(dra_objects.claim("c", allocated=("gpu-0", "gpu-0"), consumedCapacity={"gpu.nvidia.com/memory": "12Gi"}))
    none_of_it = held(dra_objects.claim("c", allocated=("gpu-0", "gpu-0"), consumedCapacity={"memory": "0", "cores": "10"}))

    assert budgets.claim_charge(share, MEMORY) == charge(10 * GIB)
    assert budgets.claim_charge(qualified, MEMORY) == charge(12 * GIB)
    assert budgets.claim_charge(none_of_it, MEMORY) == charge(0)


def test_admin_access_to_a_device_is_not_charged() -> None:
    watching = held(dra_objects.claim("monitor", allocated=("gpu-0", "gpu-0"), adminAccess=True))

    assert budgets.claim_charge(watching, MEMORY) is budgets.NOTHING


def test_a_device_without_memory_capacity_gives_a_problem() -> None:
    unknown = held(dra_objects.claim("c", namespace="team-a", allocated=("gpu-9", "gpu-0")))

    found = budgets.claim_charge(unknown, MEMORY)

    assert (found.memory_mib, found.cards) == (0, 0)
    assert found.problem == (
        "ResourceClaim team-a/c (device gpu-0 of driver gpu.nvidia.com): its ResourceSlice publishes no memory capacity"
    )


def test_a_claim_of_several_devices_adds_them_up() -> None:
    claim = dra_objects.claim("c", allocated=("gpu-0", "gpu-0"))
    results = claim["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "device": "gpu-1"})

    assert budgets.claim_charge(held(claim), MEMORY) == charge(160 * GIB)


# --- the ledger codec and Lease ------------------------------------------------------------------------


GATED = budgets.Entry(uid="u-1", pod="team-a/p1", charge=charge(LARGE, 1), assumed_at=NOW)
BINDING = budgets.Entry(uid="u-2", pod="team-a/p2", charge=charge(4 * GIB), assumed_at=NOW + 0.25, expires=NOW + 120.25)


def test_the_ledger_has_its_exact_bytes_and_round_trips() -> None:
    ledger = {"u-2": BINDING, "u-1": GATED}

    text = budgets.encode(ledger)

    assert text == (
        '{"u-1":{"pod":"team-a/p1","memMiB":81920,"cards":1,"assumedAt":"2027-01-15T08:00:00.000Z"},'
        '"u-2":{"pod":"team-a/p2","memMiB":4096,"cards":0,"assumedAt":"2027-01-15T08:00:00.250Z",'
        '"expires":"2027-01-15T08:02:00.250Z"}}'
    )
    assert budgets.read(text) == ledger
    assert budgets.read(budgets.encode({})) == {}


@pytest.mark.parametrize(
    "item",
    [
        "not an object",
        {"memMiB": 1, "assumedAt": "2027-01-15T08:00:00Z"},  # no pod
        {"pod": 3, "memMiB": 1, "assumedAt": "2027-01-15T08:00:00Z"},
        {"pod": "a/b", "assumedAt": "2027-01-15T08:00:00Z"},  # no memMiB
        {"pod": "a/b", "memMiB": -1, "assumedAt": "2027-01-15T08:00:00Z"},
        {"pod": "a/b", "memMiB": "1", "assumedAt": "2027-01-15T08:00:00Z"},
        {"pod": "a/b", "memMiB": True, "assumedAt": "2027-01-15T08:00:00Z"},
        {"pod": "a/b", "memMiB": 1, "cards": -1, "assumedAt": "2027-01-15T08:00:00Z"},
        {"pod": "a/b", "memMiB": 1, "cards": 1.0, "assumedAt": "2027-01-15T08:00:00Z"},
        {"pod": "a/b", "memMiB": 1},  # no assumedAt
        {"pod": "a/b", "memMiB": 1, "assumedAt": "yesterday"},
        {"pod": "a/b", "memMiB": 1, "assumedAt": "2027-01-15T08:00:00Z", "expires": "soon"},
        {"pod": "a/b", "memMiB": 1, "assumedAt": "2027-01-15T08:00:00Z", "expires": None},
    ],
)
def test_a_malformed_entry_is_dropped_and_the_others_kept(item: object) -> None:
    good = json.loads(budgets.encode({"u-1": GATED}))

    assert budgets.read(json.dumps({**good, "bad": item})) == {"u-1": GATED}


@pytest.mark.parametrize("text", [None, "", "{", "[]", '"x"', "42", 42, {"u-1": {}}])
def test_an_unreadable_ledger_is_empty(text: object) -> None:
    assert budgets.read(text) == {}


def test_an_entry_without_cards_has_none_and_one_without_expiry_counts_until_settled() -> None:
    parsed = budgets.read('{"u":{"pod":"a/b","memMiB":2048,"assumedAt":"2027-01-15T08:00:00Z"}}')

    assert parsed["u"].charge == charge(2048, 0)
    assert parsed["u"].expires is None and parsed["u"].counts(NOW + 10**9)
    assert BINDING.counts(NOW + 120) and not BINDING.counts(NOW + 120.25)


def test_a_lease_body_is_read_back_as_its_namespaces_ledger() -> None:
    lease = budgets.lease_body("team-a", {"u-1": GATED}, "extender-0")

    assert lease["metadata"] == {
        "name": "gpu-budget.team-a",
        "namespace": reservations.LEDGER_NAMESPACE,
        "labels": {gpu.LEDGER_LABEL: "true"},
        "annotations": {budgets.NAMESPACE_ANNOTATION: "team-a", budgets.LEDGER_ANNOTATION: budgets.encode({"u-1": GATED})},
    }
    assert lease["spec"] == {"holderIdentity": "extender-0"}
    assert budgets.lease_namespace(lease) == "team-a"
    assert budgets.lease_ledger(lease) == {"u-1": GATED}
    assert budgets.lease_ledger(None) == {}
    moved = budgets.lease_body("team-a", {"u-1": GATED}, "x", home="gpu-system")
    assert budgets.lease_namespace(moved, home="gpu-system") == "team-a"
    assert budgets.lease_ledger(moved, home="gpu-system") == {"u-1": GATED}


def _with(lease: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {**lease, "metadata": {**lease["metadata"], **metadata}}


@pytest.mark.parametrize(
    "change",
    [
        {"namespace": "team-a"},  # a tenant's own Lease, outside the ledger namespace
        {"name": "gpu-budget.team-b"},  # a Lease naming another namespace's ledger name
        {"name": "my-ledger"},
        {"annotations": {budgets.LEDGER_ANNOTATION: "{}"}},  # no namespace annotation
        {"annotations": {budgets.NAMESPACE_ANNOTATION: "", budgets.LEDGER_ANNOTATION: "{}"}},
    ],
)
def test_a_lease_outside_the_ledger_namespace_or_under_a_wrong_name_is_not_trusted(change: dict[str, Any]) -> None:
    lease = _with(budgets.lease_body("team-a", {"u-1": GATED}, "extender-0"), **change)

    assert budgets.lease_namespace(lease) is None
    assert budgets.lease_ledger(lease) == {}


def test_budget_and_node_ledgers_share_a_label_but_never_pass_for_each_other() -> None:
    budget = budgets.lease_body("gpu-0", {"u-1": GATED}, "extender-0")
    node_ledger = reservations.lease_body("gpu-0", "", {}, "extender-0")

    assert budget["metadata"]["labels"] == node_ledger["metadata"]["labels"]  # one list/watch finds both
    assert reservations.lease_node(budget) is None
    assert budgets.lease_namespace(node_ledger) is None


def test_lease_names_are_per_namespace() -> None:
    assert budgets.lease_name("team-a") == "gpu-budget.team-a"
    assert budgets.lease_name("team-a") != budgets.lease_name("team-b")
    assert len(budgets.lease_name("n" * 300)) <= 253


# --- usage ----------------------------------------------------------------------------------------------


NODES = {"mixed-0": MIXED}


def entry(uid: str, memory_mib: int, cards_: int = 0, *, expires: float | None = None) -> budgets.Entry:
    return budgets.Entry(uid=uid, pod=f"team-a/pod-{uid}", charge=charge(memory_mib, cards_), assumed_at=NOW - 5, expires=expires)


def test_usage_counts_a_bound_pod_and_an_unexpired_entry() -> None:
    bound = placed("u-1", cards_=(1,), whole=True)

    used = budgets.usage([bound], {"u-2": entry("u-2", 4 * GIB, expires=NOW + 60)}, nodes=NODES, now=NOW)

    assert used.total == charge(LARGE + 4 * GIB, 1)
    assert used.by_holder == {"u-1": charge(LARGE, 1), "u-2": charge(4 * GIB)}
    assert used.problems == {}


def test_usage_drops_expired_entries_and_those_of_pods_gone() -> None:
    ledger = {
        "u-1": entry("u-1", 4 * GIB, expires=NOW),  # expired just now
        "u-2": entry("u-2", 8 * GIB),  # the gate's entry: no expiry
        "u-3": entry("u-3", 16 * GIB, 1),
    }

    used = budgets.usage([], ledger, nodes=NODES, gone={"u-3"}, now=NOW)

    assert used.by_holder == {"u-2": charge(8 * GIB)}
    assert used.total == charge(8 * GIB)


def test_a_pod_bound_with_a_known_charge_counts_through_the_pod_not_its_entry() -> None:
    # The gate charged an nvidia.com/gpu pod the cluster's largest card; bound to a 16 GiB card, it holds 16 GiB.
    bound = pod("u-1", limits={"nvidia.com/gpu": 1}, bound="small-0")
    small = node("small-0", memory=(SMALL,), mode=None)

    used = budgets.usage([bound], {"u-1": entry("u-1", LARGE, 1)}, nodes={"small-0": small}, now=NOW)

    assert used.by_holder == {"u-1": charge(SMALL, 1)}
    assert used.total == charge(SMALL, 1)


def test_a_pod_both_bound_and_in_the_ledger_counts_once_at_the_larger_charge() -> None:
    bound = placed("u-1", cards_=(0,), whole=False, gib=4)
    larger_entry = {"u-1": entry("u-1", 6 * GIB, expires=NOW + 60)}
    smaller_entry = {"u-1": entry("u-1", 2 * GIB, expires=NOW + 60)}

    for ledger in (larger_entry, smaller_entry):
        used = budgets.usage([bound], ledger, nodes=NODES, now=NOW)
        assert list(used.by_holder) == ["u-1"]
        assert used.total.memory_mib == 4 * GIB  # its own charge, once, whatever the entry said


def test_a_bound_pod_whose_charge_is_unknown_counts_at_the_larger_of_it_and_its_entry() -> None:
    bound = pod("u-1", limits={"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}, bound="bare-0")
    bare = node("bare-0", memory=None, mode=None)

    used = budgets.usage([bound], {"u-1": entry("u-1", LARGE + 10 * GIB, 1)}, nodes={"bare-0": bare}, now=NOW)

    assert used.total == charge(LARGE + 10 * GIB, 1)
    assert set(used.problems) == {"u-1"} and "bare-0" in used.problems["u-1"]
    smaller = budgets.usage([bound], {"u-1": entry("u-1", 5 * GIB, 1)}, nodes={"bare-0": bare}, now=NOW)
    assert smaller.total == charge(10 * GIB, 1)  # what the pod is known to hold is more than its entry


def test_a_finished_pods_entry_no_longer_counts() -> None:
    done = placed("u-1", cards_=(1,), whole=True, phase="Succeeded")

    used = budgets.usage([done], {"u-1": entry("u-1", LARGE, 1)}, nodes=NODES, now=NOW)

    assert used.by_holder == {} and used.total == budgets.NOTHING


def test_a_pod_not_bound_yet_counts_only_through_its_entry() -> None:
    pending = pod("u-1", limits={"nvidia.com/gpu": 1}, bound="")

    assert budgets.usage([pending], {}, nodes=NODES, now=NOW).total == budgets.NOTHING
    assert budgets.usage([pending], {"u-1": entry("u-1", LARGE, 1)}, nodes=NODES, now=NOW).total == charge(LARGE, 1)


def test_claims_count_once_each_and_their_problems_are_named() -> None:
    allocated = held(dra_objects.claim("c", namespace="team-a", uid="c-1", allocated=("gpu-0", "gpu-0")))
    unknown = held(dra_objects.claim("d", namespace="team-a", uid="c-2", allocated=("gpu-9", "gpu-0")))
    watching = held(dra_objects.claim("m", namespace="team-a", uid="c-3", allocated=("gpu-0", "gpu-1"), adminAccess=True))

    used = budgets.usage(
        [], {}, nodes=NODES, claims=[("c-1", allocated), ("c-2", unknown), ("c-3", watching)], device_mib=MEMORY, now=NOW
    )

    assert used.total == charge(80 * GIB)
    assert set(used.by_holder) == {"claim:c-1", "claim:c-2"}
    assert used.problems["claim:c-2"].endswith("its ResourceSlice publishes no memory capacity")


def test_usage_without_some_holders() -> None:
    used = budgets.usage([placed("u-1", cards_=(1,), whole=True)], {"u-2": entry("u-2", 4 * GIB)}, nodes=NODES, now=NOW)

    assert used.without(["u-1"]).total == charge(4 * GIB)
    assert used.without(["u-1", "u-2"]).total == budgets.NOTHING
    assert used.without([]).total == used.total


# --- over ----------------------------------------------------------------------------------------------


def test_over_fits_up_to_the_budget_exactly() -> None:
    assert budgets.over(32 * GIB, None, charge(16 * GIB), charge(16 * GIB)) == ""
    assert budgets.over(32 * GIB, 2, charge(16 * GIB, 1), charge(SMALL, 1)) == ""


def test_over_names_the_memory_used_asked_and_budgeted() -> None:
    assert budgets.over(32 * GIB, None, charge(20 * GIB), charge(16 * GIB)) == (
        "20 GiB used + 16 GiB asked > 32 GiB of GPU memory"
    )
    assert budgets.over(40960, None, charge(1536), charge(40 * GIB)) == "1.5 GiB used + 40 GiB asked > 40 GiB of GPU memory"


def test_over_names_the_cards_used_asked_and_budgeted() -> None:
    assert budgets.over(1000 * GIB, 2, charge(SMALL, 2), charge(SMALL, 1)) == "2 whole cards used + 1 asked > 2 whole cards"
    assert budgets.over(1000 * GIB, None, charge(SMALL, 9), charge(SMALL, 1)) == ""  # cards not limited


def test_over_a_lowered_budget_still_lets_in_what_adds_nothing_over() -> None:
    # Kubernetes' ResourceQuota checks only what a request adds (kubernetes/kubernetes
    # staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go CheckRequest:
    # RemoveZeros, then the new usage masked to the requested names): a namespace over its card
    # budget (lowered from 4 to 2 cards) may still take shares while its memory has room.
    assert budgets.over(160 * GIB, 2, charge(3 * SMALL, 3), charge(4 * GIB)) == ""
    assert budgets.over(160 * GIB, 2, charge(3 * SMALL, 3), charge(SMALL, 1)) == "3 whole cards used + 1 asked > 2 whole cards"
    assert budgets.over(32 * GIB, 8, charge(40 * GIB), charge(0, 0)) == ""
    assert budgets.over(32 * GIB, 8, charge(40 * GIB), charge(GIB)) == "40 GiB used + 1 GiB asked > 32 GiB of GPU memory"


def test_charges_describe_themselves_and_add_up() -> None:
    assert charge(LARGE + SMALL, 2).describe() == "96 GiB and 2 whole cards"
    assert charge(SMALL, 1).describe() == "16 GiB and 1 whole card"
    assert charge(1536).describe() == "1.5 GiB"
    assert charge(GIB, 0, "a") + charge(GIB, 1, "b") == charge(2 * GIB, 1, "a")
    assert charge(GIB, 2).at_least(charge(2 * GIB, 1, "p")) == charge(2 * GIB, 2, "p")
    assert budgets.NOTHING.charged is False and charge(0, 1).charged and charge(1).charged


# --- prune ----------------------------------------------------------------------------------------------


def test_prune_keeps_the_entries_of_pods_not_yet_bound_and_drops_the_settled() -> None:
    pods = {
        "pending": pod("pending", limits={"nvidia.com/gpu": 1}, bound=""),
        "bound": placed("bound", cards_=(1,), whole=True),
        "done": placed("done", cards_=(0,), whole=True, phase="Failed"),
        "gone": pod("gone", limits={"nvidia.com/gpu": 1}, bound=""),
        "expired": pod("expired", limits={gpu.Resource.GPU_MEM: 4}, bound=""),
        "unknown-node": pod("unknown-node", limits={"nvidia.com/gpu": 1}, bound="bare-0"),
    }
    ledger = {
        "pending": entry("pending", LARGE, 1),
        "bound": entry("bound", LARGE, 1),
        "done": entry("done", SMALL, 1),
        "gone": entry("gone", LARGE, 1),
        "expired": entry("expired", 4 * GIB, expires=NOW - 1),
        "unknown-node": entry("unknown-node", LARGE, 1),
        "not-seen-yet": entry("not-seen-yet", 4 * GIB, expires=NOW + 60),  # created after the pod list was read
    }
    used = budgets.usage(
        list(pods.values()), ledger, nodes={**NODES, "bare-0": node("bare-0", memory=None)}, gone={"gone"}, now=NOW
    )

    kept = budgets.prune(ledger, used, pods=pods, gone={"gone"}, now=NOW)

    assert set(kept) == {"pending", "unknown-node", "not-seen-yet"}
    assert kept["pending"] is ledger["pending"]
    assert budgets.prune(kept, used, pods=pods, gone={"gone"}, now=NOW) == kept  # pruning twice changes nothing
