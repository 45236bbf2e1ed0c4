"""Filter, score and choose: classification, messages, binpack and spread as the seed pictures them."""

from __future__ import annotations

from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation as allocation_
from policies.gpu import cardrequest, cards
from webhook.extender import placement

NOW = 1_800_000_000.0
Factory = Any


def _fill(
    make_node: Factory, make_gpu_pod: Factory, node_obj: dict[str, Any], sizes: list[int], *, core_percent: int = 0
) -> list[int]:
    """Place pods one after another as bind does (choose, annotate), return GiB per card."""
    pods: list[dict[str, Any]] = []
    for i, size in enumerate(sizes):
        state = cards.node_state(node_obj, pods, now=NOW)
        wanted = cardrequest.Request(memory_gib=size, core_percent=core_percent)
        chosen = placement.choose(wanted, state)
        assert chosen is not None, f"pod {i} ({size} GiB) did not fit"
        allocation = allocation_.Allocation(
            uid=f"u{i}",
            namespace="ns",
            name=f"p{i}",
            node=node_obj["metadata"]["name"],
            cards=chosen,
            memory_gib=size,
            core_percent=core_percent,
            assumed_at=NOW,
        )
        annotations = allocation_.bind_annotations(allocation, card_memory_gib=15)
        pods.append(make_gpu_pod(f"p{i}", uid=f"u{i}", mem=size, node_name=node_obj["metadata"]["name"], annotations=annotations))
    return [c.memory_used for c in cards.node_state(node_obj, pods, now=NOW).cards]


def test_binpack_fills_one_card_before_the_next_as_the_seed_shows(make_node: Factory, make_gpu_pod: Factory) -> None:
    # seed 002: "15/15 9/15 0/15 0/15 24/60" on a 4 x 15 GiB binpack node
    assert _fill(make_node, make_gpu_pod, make_node(placement="binpack"), [3] * 8) == [15, 9, 0, 0]


def test_binpack_is_the_default_placement(make_node: Factory, make_gpu_pod: Factory) -> None:
    assert _fill(make_node, make_gpu_pod, make_node(placement=None), [3] * 8) == [15, 9, 0, 0]


def test_spread_puts_each_pod_on_the_emptiest_card(make_node: Factory, make_gpu_pod: Factory) -> None:
    # seed 002 shows 3 x 4 GiB on three different cards, one card left empty
    assert _fill(make_node, make_gpu_pod, make_node(placement="spread"), [4] * 3) == [4, 4, 4, 0]


def test_binpack_takes_the_fullest_card_that_still_fits(make_node: Factory, make_gpu_pod: Factory) -> None:
    assert _fill(make_node, make_gpu_pod, make_node(placement="binpack"), [10, 12, 4, 3]) == [14, 15, 0, 0]


def test_core_mem_accounts_the_core_percentage_per_card(make_node: Factory, make_gpu_pod: Factory) -> None:
    node_obj = make_node(mode="core_mem", count=2, gib=22)
    # 4 pods of 2 GiB and 30 % each: three fit on card 0 by cores (90 %), the fourth goes to card 1
    assert _fill(make_node, make_gpu_pod, node_obj, [2, 2, 2, 2], core_percent=30) == [6, 2]


def test_mixed_card_sizes_from_the_inventory_place_a_big_pod_on_the_big_card(make_node: Factory, make_gpu_pod: Factory) -> None:
    node_obj = make_node(count=2, inventory=[16384, 32768])
    assert _fill(make_node, make_gpu_pod, node_obj, [20, 14]) == [14, 20]
    state = cards.node_state(node_obj, [], now=NOW)
    assert placement.evaluate(cardrequest.Request(memory_gib=33), state).verdict is placement.Verdict.NEVER


def _states(**nodes: cards.NodeState) -> dict[str, cards.NodeState | None]:
    return dict(nodes)


def test_filter_separates_never_fitting_nodes_from_full_ones(make_node: Factory, make_gpu_pod: Factory) -> None:
    note = allocation_.bind_annotations(
        allocation_.Allocation(uid="x", namespace="ns", name="x", node="full", cards=(0,), memory_gib=13, assumed_at=NOW),
        card_memory_gib=15,
    )
    busy = make_gpu_pod("x", uid="x", mem=13, node_name="full", annotations=note)
    states = _states(
        roomy=cards.node_state(make_node("roomy"), [], now=NOW),
        full=cards.node_state(make_node("full", count=1), [busy], now=NOW),
        small=cards.node_state(make_node("small", count=4, gib=4), [], now=NOW),
        exclusive=cards.node_state(make_node("exclusive", mode="default"), [], now=NOW),
        cpu=cards.node_state(make_node("cpu", mode=None, placement=None, capacity={}), [], now=NOW),
    )
    outcome = placement.filter_nodes(
        cardrequest.Request(memory_gib=8), states=states, names=["roomy", "full", "small", "exclusive", "cpu", "unknown"]
    )
    assert outcome.passed == ["roomy"]
    assert set(outcome.failed) == {"full", "unknown"}
    assert set(outcome.unresolvable) == {"small", "exclusive", "cpu"}
    assert outcome.failed["full"] == (
        "insufficient GPU memory on any single card: the pod needs 8 GiB (aliyun.com/gpu-mem) on one card; "
        "the card with the most free memory is GPU0 with 2 GiB free of 15 GiB"
    )
    assert outcome.unresolvable["small"] == (
        "no GPU card is large enough: the pod needs 8 GiB (aliyun.com/gpu-mem) on one card; the largest card is GPU0 with 4 GiB"
    )
    assert outcome.unresolvable["exclusive"] == (
        'node is in GPU mode "default" (ack.node.gpu.schedule); aliyun.com/gpu-mem is served by cgpu, share, mps, core_mem'
    )
    assert "default (no label)" in outcome.unresolvable["cpu"]
    assert "cache" in outcome.failed["unknown"]


def test_a_core_request_names_cores_in_its_message_and_needs_core_mem(make_node: Factory) -> None:
    wanted = cardrequest.Request(memory_gib=2, core_percent=50)
    cgpu = placement.evaluate(wanted, cards.node_state(make_node(mode="cgpu"), [], now=NOW))
    assert cgpu.verdict is placement.Verdict.NEVER and "served by core_mem" in cgpu.message
    core_node = make_node("c", mode="core_mem", count=1, gib=22)
    pods = [
        {
            "metadata": {
                "uid": "a",
                "name": "a",
                "namespace": "n",
                "annotations": {
                    gpu.ALLOCATION_ANNOTATION: '{"node":"c","cards":[0],"memGiB":2,"corePercent":60,"whole":false,"assumedAt":"2027-01-15T08:00:00Z"}'
                },
            },
            "spec": {"nodeName": "c"},
            "status": {"phase": "Running"},
        }
    ]
    full = placement.evaluate(wanted, cards.node_state(core_node, pods, now=NOW))
    assert full.verdict is placement.Verdict.FULL
    assert full.message.endswith("the card with the most free memory is GPU0 with 20 GiB and 40% cores free of 22 GiB")
    assert "50% (aliyun.com/gpu-core.percentage)" in full.message


def test_a_malformed_request_fits_nowhere_with_its_problem(make_node: Factory) -> None:
    fit = placement.evaluate(cardrequest.Request(problem="bad"), cards.node_state(make_node(), [], now=NOW))
    assert fit.verdict is placement.Verdict.NEVER and fit.message == "bad"


def test_topology_pods_need_a_topology_node_and_get_the_nvlinked_cards(make_node: Factory) -> None:
    links = [(a, b, "NV2" if (a < 4) == (b < 4) else "SYS") for a in range(8) for b in range(a + 1, 8)]
    topo = cards.node_state(make_node("t", mode="topology", placement=None, count=8, links=links), [], now=NOW)
    fit = placement.evaluate(cardrequest.Request(cards=4), topo)
    assert fit.fits and fit.cards == (0, 1, 2, 3)
    assert placement.evaluate(cardrequest.Request(cards=9), topo).verdict is placement.Verdict.NEVER
    shared = cards.node_state(make_node(), [], now=NOW)
    assert placement.evaluate(cardrequest.Request(cards=1), shared).verdict is placement.Verdict.NEVER


def test_whole_cards_taken_leave_a_full_node_with_the_free_ones_named(make_node: Factory, make_gpu_pod: Factory) -> None:
    obj = make_node("t", mode="topology", placement=None, count=4)
    note = allocation_.bind_annotations(
        allocation_.Allocation(uid="w", namespace="n", name="w", node="t", cards=(0, 1, 3), whole=True, assumed_at=NOW),
        card_memory_gib=0,
    )
    state = cards.node_state(obj, [make_gpu_pod("w", uid="w", whole=3, node_name="t", annotations=note)], now=NOW)
    fit = placement.evaluate(cardrequest.Request(cards=2), state)
    assert fit.verdict is placement.Verdict.FULL
    assert fit.message.endswith("1 of 4 cards are free (GPU2)")
    assert placement.evaluate(cardrequest.Request(memory_gib=1), cards.node_state(make_node("s"), [], now=NOW)).fits


@pytest.mark.parametrize(("placement_label", "busier_wins"), [("binpack", True), ("spread", False)])
def test_scores_prefer_busy_binpack_nodes_and_empty_spread_nodes(
    make_node: Factory, make_gpu_pod: Factory, placement_label: str, busier_wins: bool
) -> None:
    note = allocation_.bind_annotations(
        allocation_.Allocation(uid="b", namespace="n", name="b", node="busy", cards=(0,), memory_gib=12, assumed_at=NOW),
        card_memory_gib=15,
    )
    states = _states(
        busy=cards.node_state(
            make_node("busy", placement=placement_label),
            [make_gpu_pod("b", uid="b", mem=12, node_name="busy", annotations=note)],
            now=NOW,
        ),
        idle=cards.node_state(make_node("idle", placement=placement_label), [], now=NOW),
    )
    scores = placement.scores(cardrequest.Request(memory_gib=3), states=states, names=["busy", "idle", "gone"])
    assert all(0 <= s <= 10 for s in scores.values()) and scores["gone"] == 0
    assert (scores["busy"] > scores["idle"]) is busier_wins


def test_a_pod_asking_for_nothing_we_manage_passes_everywhere(make_node: Factory) -> None:
    outcome = placement.filter_nodes(
        cardrequest.Request(), states={"a": cards.node_state(make_node("a", mode="default"), [], now=NOW)}, names=["a"]
    )
    assert outcome.passed == ["a"]
