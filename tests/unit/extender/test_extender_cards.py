"""The card model and allocation state: capacity, requests, annotations, reservations, expiry."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation as allocation_
from policies.gpu import cardrequest, cards, reservations

NOW = 1_800_000_000.0
Factory = Any


def _allocation(node: str, cards_: list[int], mem: int, *, core: int = 0, whole: bool = False, assumed: float = NOW) -> str:
    return json.dumps(
        {
            "node": node,
            "cards": cards_,
            "memGiB": mem,
            "corePercent": core,
            "whole": whole,
            "assumedAt": allocation_.timestamp(assumed),
        }
    )


# --- cards of a node ---


def test_capacity_divided_by_card_count_gives_equal_cards(make_node: Factory) -> None:
    model = cards.node_cards(make_node(count=4, gib=15))
    assert [(c.index, c.memory_gib) for c in model.cards] == [(0, 15), (1, 15), (2, 15), (3, 15)]
    assert model.source == "capacity" and model.memory_gib == 60 and model.address == "192.0.2.109"


def test_the_card_count_label_stands_in_for_a_missing_gpu_count(make_node: Factory) -> None:
    obj = make_node(capacity={"aliyun.com/gpu-mem": "44"})
    obj["metadata"]["labels"]["aliyun.accelerator/nvidia_count"] = "2"
    assert [c.memory_gib for c in cards.node_cards(obj).cards] == [22, 22]


def test_the_inventory_annotation_gives_mixed_card_sizes(make_node: Factory) -> None:
    model = cards.node_cards(make_node(count=2, gib=24, inventory=[16384, 32768]))
    assert [(c.index, c.memory_gib, c.uuid) for c in model.cards] == [(0, 16, "GPU-0000"), (1, 32, "GPU-0001")]
    assert model.source == "inventory"


def test_inventory_memory_rounds_down_so_a_pod_always_fits_the_real_card(make_node: Factory) -> None:
    assert [c.memory_gib for c in cards.node_cards(make_node(inventory=[23028, 15360])).cards] == [22, 15]


@pytest.mark.parametrize("text", ["nope", "{}", '[{"index": 0}]', '[{"index": 0, "memoryMiB": 1}, {"index": 0, "memoryMiB": 2}]'])
def test_a_broken_inventory_falls_back_to_capacity(make_node: Factory, text: str) -> None:
    model = cards.node_cards(make_node(annotations={gpu.INVENTORY_ANNOTATION: text}))
    assert model.source == "capacity" and len(model.cards) == 4


def test_topology_nodes_count_whole_cards(make_node: Factory) -> None:
    model = cards.node_cards(make_node(mode="topology", placement=None, count=8, links=[(0, 1, "NV1")]))
    assert len(model.cards) == 8 and model.links.level(0, 1) == "NV1"


@pytest.mark.parametrize(
    ("mode", "capacity", "problem"),
    [
        ("default", None, "exclusive"),
        (None, None, "exclusive"),
        ("warp", None, "not a GPU mode"),
        ("cgpu", {"aliyun.com/gpu-mem": "0"}, "advertises no aliyun.com/gpu-mem"),
        ("cgpu", {"aliyun.com/gpu-mem": "60"}, "no card count"),
        ("topology", {"aliyun.com/gpu": "0"}, "advertises no aliyun.com/gpu"),
    ],
)
def test_nodes_without_usable_cards_say_why(
    make_node: Factory, mode: str | None, capacity: dict[str, str] | None, problem: str
) -> None:
    model = cards.node_cards(make_node(mode=mode, capacity=capacity))
    assert model.cards == () and problem in model.problem


# --- requests ---


def test_requests_sum_regular_containers_and_take_the_larger_init_container(make_gpu_pod: Factory) -> None:
    sidecar = {"name": "side", "resources": {"limits": {"aliyun.com/gpu-mem": 2}}}
    obj = make_gpu_pod(mem=3, extra_containers=[sidecar])
    assert cardrequest.pod_request(obj) == cardrequest.Request(memory_gib=5)
    obj["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {"aliyun.com/gpu-mem": "7"}}}]
    assert cardrequest.pod_request(obj).memory_gib == 7


def test_requests_read_requests_when_limits_are_absent(make_gpu_pod: Factory) -> None:
    obj = make_gpu_pod()
    obj["spec"]["containers"][0]["resources"] = {"requests": {"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "30"}}
    assert cardrequest.pod_request(obj) == cardrequest.Request(memory_gib=4, core_percent=30)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"mem": "1.5"}, "not a whole non-negative number"),
        ({"mem": "1500m"}, "not a whole non-negative number"),
        ({"mem": "-2"}, "not a whole non-negative number"),
        ({"core": 30}, "needs aliyun.com/gpu-mem"),
        ({"mem": 4, "core": 150}, "more than one card"),
        ({"mem": 4, "whole": 1}, "cannot be combined"),
    ],
)
def test_malformed_requests_carry_a_problem(make_gpu_pod: Factory, kwargs: dict[str, Any], problem: str) -> None:
    assert problem in cardrequest.pod_request(make_gpu_pod(**kwargs)).problem


def test_a_pod_without_managed_resources_is_not_ours(make_gpu_pod: Factory) -> None:
    assert not cardrequest.pod_request(make_gpu_pod()).managed


# --- allocations from annotations ---


def test_bind_annotations_are_gpushare_compatible_plus_our_json() -> None:
    allocation = allocation_.Allocation(
        uid="u", namespace="ns", name="p", node="n", cards=(1,), memory_gib=4, core_percent=30, assumed_at=NOW
    )
    written = allocation_.bind_annotations(allocation, card_memory_gib=15)
    assert written["ALIYUN_COM_GPU_MEM_IDX"] == "1"
    assert written["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert written["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    assert written["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    assert written["ALIYUN_COM_GPU_MEM_ASSUME_TIME"] == str(int(NOW * 1e9))
    assert json.loads(written["gpu-admission.io/allocation"]) == {
        "node": "n",
        "cards": [1],
        "memGiB": 4,
        "corePercent": 30,
        "whole": False,
        "assumedAt": "2027-01-15T08:00:00.000Z",
    }


def test_whole_card_annotations_list_every_index_and_no_gpu_mem() -> None:
    allocation = allocation_.Allocation(uid="u", namespace="ns", name="p", node="n", cards=(2, 3), whole=True, assumed_at=NOW)
    written = allocation_.bind_annotations(allocation, card_memory_gib=32)
    assert written["ALIYUN_COM_GPU_MEM_IDX"] == "2,3"
    assert "ALIYUN_COM_GPU_MEM_POD" not in written and "ALIYUN_COM_GPU_MEM_DEV" not in written


def test_state_is_rebuilt_from_the_annotations_of_bound_pods(make_node: Factory, make_gpu_pod: Factory) -> None:
    pods = [
        make_gpu_pod("a", mem=4, node_name="gpu-0", annotations={gpu.ALLOCATION_ANNOTATION: _allocation("gpu-0", [0], 4)}),
        make_gpu_pod("b", mem=5, node_name="gpu-0", annotations={gpu.ALLOCATION_ANNOTATION: _allocation("gpu-0", [2], 5)}),
        # placed by gpushare before us: only its annotations
        make_gpu_pod("c", mem=3, node_name="gpu-0", annotations={"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "3"}),
        make_gpu_pod(
            "elsewhere", mem=9, node_name="gpu-9", annotations={gpu.ALLOCATION_ANNOTATION: _allocation("gpu-9", [0], 9)}
        ),
    ]
    state = cards.node_state(make_node(), pods, now=NOW)
    assert [c.memory_used for c in state.cards] == [7, 0, 5, 0]
    assert {a.name: a.source for a in state.allocations} == {"a": "allocation", "b": "allocation", "c": "gpushare"}


def test_finished_pods_free_their_cards_but_terminating_ones_still_hold_them(make_node: Factory, make_gpu_pod: Factory) -> None:
    note = {gpu.ALLOCATION_ANNOTATION: _allocation("gpu-0", [0], 4)}
    done = make_gpu_pod("done", mem=4, node_name="gpu-0", annotations=note, phase="Succeeded")
    failed = make_gpu_pod("failed", mem=4, node_name="gpu-0", annotations=note, phase="Failed")
    leaving = make_gpu_pod("leaving", mem=4, node_name="gpu-0", annotations=note, phase="Running")
    leaving["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    assert [c.memory_used for c in cards.node_state(make_node(), [done, failed, leaving], now=NOW).cards] == [4, 0, 0, 0]


def test_an_annotated_pod_that_never_got_bound_holds_its_card_until_the_ttl(make_node: Factory, make_gpu_pod: Factory) -> None:
    waiting = make_gpu_pod(
        "waiting", mem=6, annotations={gpu.ALLOCATION_ANNOTATION: _allocation("gpu-0", [1], 6, assumed=NOW - 50)}
    )
    assert [c.memory_used for c in cards.node_state(make_node(), [waiting], now=NOW, ttl=60).cards] == [0, 6, 0, 0]
    assert [c.memory_used for c in cards.node_state(make_node(), [waiting], now=NOW + 10, ttl=60).cards] == [0, 0, 0, 0]
    assert cards.pod_node(waiting) == "gpu-0"


def test_a_stale_annotation_naming_another_node_is_ignored(make_node: Factory, make_gpu_pod: Factory) -> None:
    moved = make_gpu_pod("moved", mem=6, node_name="gpu-0", annotations={gpu.ALLOCATION_ANNOTATION: _allocation("gpu-7", [1], 6)})
    assert allocation_.pod_allocation(moved, now=NOW) is None


def test_ledger_entries_count_until_they_expire_or_the_pod_is_seen_bound(make_node: Factory, make_gpu_pod: Factory) -> None:
    entry = allocation_.Allocation(
        uid="u1", namespace="ns", name="p1", node="gpu-0", cards=(3,), memory_gib=8, assumed_at=NOW, expires=NOW + 60
    )
    obj = make_node(annotations={gpu.RESERVATIONS_ANNOTATION: reservations.encode({"u1": entry})})
    assert reservations.node_reservations(obj)["u1"].cards == (3,)
    assert [c.memory_used for c in cards.node_state(obj, [], now=NOW).cards] == [0, 0, 0, 8]
    assert [c.memory_used for c in cards.node_state(obj, [], now=NOW + 61).cards] == [0, 0, 0, 0]
    assert [c.memory_used for c in cards.node_state(obj, [], now=NOW, exclude_uid="u1").cards] == [0, 0, 0, 0]
    # Once bound the pod's own annotation counts, once: the ledger entry is not added on top.
    bound = make_gpu_pod(
        "p1",
        namespace="ns",
        uid="u1",
        mem=8,
        node_name="gpu-0",
        annotations={gpu.ALLOCATION_ANNOTATION: _allocation("gpu-0", [3], 8)},
    )
    assert [c.memory_used for c in cards.node_state(obj, [bound], now=NOW).cards] == [0, 0, 0, 8]
    assert reservations.prune({"u1": entry}, pods=[bound], now=NOW) == {}
    assert reservations.prune({"u1": entry}, pods=[], now=NOW) == {"u1": entry}
    assert reservations.prune({"u1": entry}, pods=[], now=NOW + 60) == {}


def test_a_malformed_ledger_reads_as_empty(make_node: Factory) -> None:
    assert reservations.node_reservations(make_node(annotations={gpu.RESERVATIONS_ANNOTATION: "{oops"})) == {}
    assert reservations.read('{"u": {"pod": "a/b"}, "v": 3}') == {}


def test_core_percentages_add_up_per_card(make_node: Factory, make_gpu_pod: Factory) -> None:
    pods = [
        make_gpu_pod(
            f"p{i}",
            mem=2,
            core=30,
            node_name="gpu-0",
            annotations={gpu.ALLOCATION_ANNOTATION: _allocation("gpu-0", [0], 2, core=30)},
        )
        for i in range(3)
    ]
    state = cards.node_state(make_node(mode="core_mem", count=2, gib=22), pods, now=NOW)
    assert [(c.memory_used, c.core_used, c.core_free) for c in state.cards] == [(6, 90, 10), (0, 0, 100)]


def test_allocations_on_cards_the_node_lacks_are_orphans(make_node: Factory, make_gpu_pod: Factory) -> None:
    lost = make_gpu_pod("lost", mem=2, node_name="gpu-0", annotations={gpu.ALLOCATION_ANNOTATION: _allocation("gpu-0", [9], 2)})
    state = cards.node_state(make_node(), [lost], now=NOW)
    assert [a.name for a in state.orphans] == ["lost"] and state.memory_used == 0


def test_cluster_state_groups_pods_by_node_once(make_node: Factory, make_gpu_pod: Factory) -> None:
    pods = [make_gpu_pod("a", mem=4, node_name="n2", annotations={gpu.ALLOCATION_ANNOTATION: _allocation("n2", [1], 4)})]
    states = cards.cluster_state([make_node("n1"), make_node("n2")], pods, now=NOW)
    assert states["n1"].memory_used == 0 and states["n2"].memory_used == 4
