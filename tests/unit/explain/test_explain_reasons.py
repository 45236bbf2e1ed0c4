"""explain names the right reason code for each way a GPU pod can be refused, on built node states,
and the extender's filter gives the very same codes (one copy of the rules)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch

from policies import gpu
from policies.gpu import allocation, cardrequest, cards, reasons, reservations
from webhook import config
from webhook.admission import decisions
from webhook.explain import analysis
from webhook.extender import placement

NOW = 1_800_000_000.0
Factory = Callable[..., dict[str, Any]]
Code = reasons.Code


def _explain(pod: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> analysis.Report:
    return analysis.explain(pod, cluster=analysis.Cluster(nodes, [*pods, pod], now=NOW))


def _codes(report: analysis.Report, node: str) -> list[str]:
    (verdict,) = [v for v in report.nodes if v.node == node]
    return [str(c) for c in verdict.codes]


def _fragmented(make_node: Factory, make_placed: Factory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """3 x 16 GiB, 10 + 12 + 12 used: 6 + 4 + 4 = 14 GiB free."""
    node = make_node("frag", count=3, gib=16)
    pods = [make_placed(f"busy-{i}", node_name="frag", card=i, mem=mem) for i, mem in enumerate((10, 12, 12))]
    return node, pods


def test_fragmented_node_names_the_largest_free_block_and_the_total(
    make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    node, pods = _fragmented(make_node, make_placed)
    report = _explain(make_pod("want-10", mem=10), [node], pods)
    (verdict,) = report.nodes
    assert not verdict.fits and [str(c) for c in verdict.codes] == ["FRAGMENTED"]
    message = verdict.reasons[0].message
    assert "14 GiB free in total" in message and "largest free block is 6 GiB (GPU0" in message


def test_fragmented_suggests_moving_the_fewest_pods_off_one_card(
    make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    node, pods = _fragmented(make_node, make_placed)
    report = _explain(make_pod("want-10", mem=10), [node], pods)
    assert report.suggestion is not None
    assert report.suggestion.node == "frag" and report.suggestion.moves == ("team-a/busy-0",)
    assert "off GPU0" in report.suggestion.change


def test_short_memory_in_total_is_insufficient_memory_not_fragmentation(
    make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    node, pods = _fragmented(make_node, make_placed)
    assert _codes(_explain(make_pod("want-15", mem=15), [node], pods), "frag") == ["INSUFFICIENT_MEMORY"]


def test_a_card_too_small_is_insufficient_memory_and_never_suggested(make_node: Factory, make_pod: Factory) -> None:
    report = _explain(make_pod("huge", mem=40), [make_node("small", gib=16)], [])
    assert _codes(report, "small") == ["INSUFFICIENT_MEMORY"] and report.nodes[0].never
    assert report.suggestion is None


def test_a_node_in_another_mode_is_a_mode_mismatch(make_node: Factory, make_pod: Factory) -> None:
    report = _explain(make_pod("shared", mem=4), [make_node("topo", mode="topology", count=4)], [])
    assert _codes(report, "topo") == ["MODE_MISMATCH"]
    assert 'GPU mode "topology"' in report.nodes[0].reasons[0].message


def test_a_mode_selector_the_node_does_not_carry_is_a_mode_mismatch(make_node: Factory, make_pod: Factory) -> None:
    pod = make_pod("isolated", mem=4, node_selector={"ack.node.gpu.schedule": "cgpu"})
    report = _explain(pod, [make_node("plain", mode="share"), make_node("iso", mode="cgpu")], [])
    assert _codes(report, "plain") == ["MODE_MISMATCH"]
    assert (
        report.nodes[1].reasons[0].message
        == 'nodeSelector ack.node.gpu.schedule="cgpu": the node has ack.node.gpu.schedule="share"'
    )
    assert [v.node for v in report.nodes if v.fits] == ["iso"]
    assert report.suggestion is None  # a node fits: nothing to change


def test_card_model_excluded_by_the_gpu102_annotation(make_node: Factory, make_pod: Factory) -> None:
    pod = make_pod("no-t4", mem=4)
    pod["metadata"]["annotations"] = {"gpu-admission.io/exclude-gpu-model": "Tesla-T4"}
    decision = decisions.decide(pod, settings=config.load(None))  # the webhook's mutation, as on create
    admitted = jsonpatch.apply_patch(copy.deepcopy(pod), [dict(op) for op in decision.patch])
    nodes = [make_node("t4", models=["Tesla-T4"] * 3), make_node("a10", models=["NVIDIA-A10"] * 3)]
    report = _explain(admitted, nodes, [])
    assert _codes(report, "t4") == ["CARD_MODEL"]
    # A shared pod gets no node affinity from GPU102: the extender judges each card (CARD_MODEL all the same).
    assert report.nodes[1].reasons[0].message == (
        "no GPU card meets the pod's card-model constraint, no card model Tesla-T4 (gpu-admission.io/exclude-gpu-model): "
        "the node has GPU0, GPU1, GPU2 Tesla-T4 with 16384 MiB"
    )
    assert [v.node for v in report.nodes if v.fits] == ["a10"]


def test_topology_without_enough_free_cards_is_no_topology_set(
    make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    links = [(0, 1, "NV2"), (2, 3, "NV2"), (0, 2, "SYS"), (0, 3, "SYS"), (1, 2, "SYS"), (1, 3, "SYS")]
    node = make_node("topo", mode="topology", placement=None, count=4, gib=32, links=links)
    pods = [make_placed("pair", node_name="topo", card=(0, 1), whole=True)]
    report = _explain(make_pod("three", whole=3), [node], pods)
    assert _codes(report, "topo") == ["NO_TOPOLOGY_SET"]
    assert "2 of 4 cards are free (GPU2, GPU3)" in report.nodes[0].reasons[0].message
    assert _codes(_explain(make_pod("five", whole=5), [node], []), "topo") == ["NO_TOPOLOGY_SET"]


def test_core_percentage_used_up_is_core_exhausted(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    node = make_node("cm", mode="core_mem", count=1, gib=24)
    pods = [make_placed("hog", node_name="cm", card=0, mem=4, core=90)]
    assert _codes(_explain(make_pod("cores", mem=4, core=20), [node], pods), "cm") == ["CORE_EXHAUSTED"]


def test_a_reservation_of_a_gone_pod_is_a_stale_allocation(make_node: Factory, make_pod: Factory) -> None:
    entry = allocation.Allocation(
        uid="gone-uid",
        namespace="team-a",
        name="deleted",
        node="n",
        cards=(0,),
        memory_gib=16,
        assumed_at=NOW - 2,
        expires=NOW + 100,
        source="reservation",
    )
    node = make_node("n", count=1, gib=16, annotations={gpu.RESERVATIONS_ANNOTATION: reservations.encode({"gone-uid": entry})})
    report = _explain(make_pod("waiting", mem=8), [node], [])
    assert _codes(report, "n")[0] == "STALE_ALLOCATION"
    assert "team-a/deleted" in report.nodes[0].reasons[0].message
    assert report.suggestion is not None and "force-delete" in report.suggestion.change


def test_the_extender_stops_counting_a_gone_pods_reservation_after_the_in_flight_grace(
    make_node: Factory, make_pod: Factory
) -> None:
    assumed = NOW - reservations.IN_FLIGHT_GRACE_S - 1
    entry = allocation.Allocation(
        uid="gone-uid",
        namespace="team-a",
        name="deleted",
        node="n",
        cards=(0,),
        memory_gib=16,
        assumed_at=assumed,
        expires=assumed + allocation.DEFAULT_RESERVATION_TTL_S,
        source="reservation",
    )
    node = make_node("n", count=1, gib=16, annotations={gpu.RESERVATIONS_ANNOTATION: reservations.encode({"gone-uid": entry})})
    report = _explain(make_pod("waiting", mem=8), [node], [])
    assert report.nodes[0].fits and report.nodes[0].codes == ()


def test_a_pod_being_deleted_frees_its_card_at_once(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    # Issue 38: from the moment its deletion is seen (deletionTimestamp) a pod's card is free for
    # placement, as the extender counts it, whether it has just been deleted or is stuck Terminating.
    for name, since in (("stuck", NOW - reasons.STUCK_TERMINATING_S - 1), ("leaving", NOW - 5)):
        going = make_placed(name, node_name="n", card=0, mem=16)
        going["metadata"]["deletionTimestamp"] = allocation.timestamp(since)
        report = _explain(make_pod("waiting", mem=8), [make_node("n", count=1, gib=16)], [going])
        assert report.nodes[0].fits and report.nodes[0].cards == (0,), name
    kept = make_placed("kept", node_name="n", card=0, mem=16)
    assert _codes(_explain(make_pod("waiting", mem=8), [make_node("n", count=1, gib=16)], [kept]), "n") == ["INSUFFICIENT_MEMORY"]


def test_a_bind_in_flight_is_reported_as_reserved(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    flying = make_placed("flying", node_name="n", card=0, mem=12, bound=False, assumed_at=NOW - 3)
    report = _explain(make_pod("next", mem=8), [make_node("n", count=1, gib=16)], [flying])
    assert _codes(report, "n") == ["RESERVED_IN_FLIGHT", "INSUFFICIENT_MEMORY"]
    assert report.suggestion is not None and "wait for the binds in flight" in report.suggestion.change


def test_a_cordoned_node_is_unschedulable_even_with_room(make_node: Factory, make_pod: Factory) -> None:
    report = _explain(make_pod("p", mem=4), [make_node("cordoned", unschedulable=True)], [])
    assert _codes(report, "cordoned") == ["UNSCHEDULABLE"] and not report.nodes[0].fits
    assert report.suggestion is not None and "uncordon" in report.suggestion.change


def test_an_untolerated_taint_is_unschedulable_and_a_toleration_lifts_it(make_node: Factory, make_pod: Factory) -> None:
    node = make_node("tainted", taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}])
    assert _codes(_explain(make_pod("p", mem=4), [node], []), "tainted") == ["UNSCHEDULABLE"]
    tolerant = make_pod("p", mem=4)
    tolerant["spec"]["tolerations"] = [{"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}]
    assert _explain(tolerant, [node], []).nodes[0].fits
    soft = make_node("soft", taints=[{"key": "gpu", "effect": "PreferNoSchedule"}])
    assert _explain(make_pod("p", mem=4), [soft], []).nodes[0].fits


def test_the_extender_filter_and_explain_give_the_same_codes(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    node, pods = _fragmented(make_node, make_placed)
    other = make_node("topo", mode="topology", count=4)
    small = make_node("small", gib=8)
    wanted = make_pod("want-10", mem=10)
    states = cards.cluster_state([node, other, small], pods, now=NOW)
    outcome = placement.filter_nodes(cardrequest.pod_request(wanted), states=states, names=["frag", "topo", "small"])
    report = _explain(wanted, [node, other, small], pods)
    assert sorted(verdict.node for verdict in report.nodes) == ["frag", "small", "topo"]
    for verdict in report.nodes:
        assert tuple(r.code for r in outcome.reasons[verdict.node]) == verdict.codes
        assert (outcome.failed | outcome.unresolvable)[verdict.node] == reasons.join(verdict.reasons)


def test_a_bound_pod_says_where_it_sits(make_node: Factory, make_placed: Factory) -> None:
    sitting = make_placed("sits", node_name="n", card=2, mem=6)
    report = _explain(sitting, [make_node("n")], [])
    assert report.bound is not None and report.bound.node == "n" and report.bound.cards == (2,) and report.nodes == ()


def test_a_pod_without_gpu_has_nothing_to_explain(make_node: Factory, make_pod: Factory) -> None:
    report = _explain(make_pod("cpu"), [make_node("n")], [])
    assert not report.managed and report.nodes == () and report.suggestion is None


def test_a_bound_pod_is_admitted_as_stored_not_refused_for_what_the_extender_wrote(
    make_node: Factory, make_placed: Factory
) -> None:
    # A bound pod carries nodeName and the extender's allocation annotations by design; GPU008
    # refuses them in a request, so explain judges the stored pod as the audit does.
    from webhook.explain import cli as explain_cli

    sitting = make_placed("sits", node_name="n", card=2, mem=6)
    report = explain_cli.explain_pod(sitting, nodes=[make_node("n")], pods=[sitting], now=NOW)
    assert report.admission is not None and report.admission.allowed, report.admission
    assert "GPU008" not in {v.policy for v in report.admission.violations}
    # The same pod as a create request is refused: the stored-object settings are what let it pass.
    assert not decisions.decide(sitting, settings=config.load(None)).allowed
