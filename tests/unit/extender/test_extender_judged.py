"""Filter's and prioritize's verdicts remembered with each node's cached state (issue 19): the
same answers as judging every node afresh, one judgement per node state and request shape, and a
fresh one whenever the node, its pods or the pod's own entry change what is counted."""

from __future__ import annotations

import copy
from typing import Any

from policies.gpu import allocation, cardrequest, cards
from webhook.extender import placement
from webhook.extender import store as store_module

NOW = 1_800_000_000.0
Factory = Any


def _bound(make_gpu_pod: Factory, name: str, *, node: str, card: int, gib: int) -> dict[str, Any]:
    """A pod bound to `node` holding `gib` GiB of `card`, annotated as bind annotates it."""
    obj: dict[str, Any] = make_gpu_pod(name, mem=gib)
    held = allocation.Allocation(
        uid=obj["metadata"]["uid"], namespace="team-a", name=name, node=node, cards=(card,), memory_gib=gib, assumed_at=NOW
    )
    obj["spec"]["nodeName"] = node
    obj["metadata"]["annotations"] = allocation.bind_annotations(held, card_memory_gib=15)
    return obj


def _store(make_node: Factory, count: int) -> store_module.Store:
    cache = store_module.Store()
    cache.replace_nodes([make_node(f"gpu-{i}", placement="spread" if i % 2 else "binpack") for i in range(count)])
    cache.replace_leases([])  # no ledger Leases yet
    cache.replace_pods([])
    return cache


def test_remembered_verdicts_equal_fresh_ones_and_are_judged_once_per_state(make_node: Factory, make_gpu_pod: Factory) -> None:
    cache = _store(make_node, 6)
    names = [f"gpu-{i}" for i in range(6)] + ["unknown"]
    for card in range(4):
        cache.put_pod(_bound(make_gpu_pod, f"big-{card}", node="gpu-0", card=card, gib=14))
    wanted = cardrequest.pod_request(make_gpu_pod("p", mem=4))
    calls: list[str] = []

    def judge(state: cards.NodeState) -> placement.Fit:
        calls.append(state.node.name)
        return placement.evaluate(wanted, state, decide=False)

    fresh = placement.filter_nodes(wanted, states=cache.states(names, now=NOW, ttl=120), names=names)
    first = placement.classify(cache.judged(names, now=NOW, ttl=120, key=("filter", wanted), judge=judge), names)
    second = placement.classify(cache.judged(names, now=NOW, ttl=120, key=("filter", wanted), judge=judge), names)
    assert first == second == fresh
    assert "gpu-0" in fresh.failed and "unknown" in fresh.failed and len(fresh.passed) == 5
    assert sorted(calls) == sorted(names[:-1]), "the second filter judged nothing again"
    scored = cache.judged(names, now=NOW, ttl=120, key=("score", wanted), judge=lambda s: placement.score(wanted, s))
    assert {n: v or 0 for n, v in scored.items()} == placement.scores(
        wanted, states=cache.states(names, now=NOW, ttl=120), names=names
    )


def test_a_change_on_a_node_or_another_request_shape_is_judged_afresh(make_node: Factory, make_gpu_pod: Factory) -> None:
    cache = _store(make_node, 3)
    names = ["gpu-0", "gpu-1", "gpu-2"]
    calls: list[tuple[str, int]] = []

    def judge_for(request: cardrequest.Request) -> Any:
        def judge(state: cards.NodeState) -> bool:
            calls.append((state.node.name, request.memory_gib))
            return placement.evaluate(request, state, decide=False).fits

        return judge

    small, large = cardrequest.pod_request(make_gpu_pod("s", mem=4)), cardrequest.pod_request(make_gpu_pod("l", mem=15))
    assert cache.judged(names, now=NOW, ttl=120, key=small, judge=judge_for(small)) == dict.fromkeys(names, True)
    assert cache.judged(names, now=NOW, ttl=120, key=large, judge=judge_for(large)) == dict.fromkeys(names, True)
    calls.clear()
    hogs = [_bound(make_gpu_pod, f"hog-{card}", node="gpu-1", card=card, gib=15) for card in range(4)]
    for hog in hogs:
        cache.put_pod(hog)
    assert cache.judged(names, now=NOW, ttl=120, key=large, judge=judge_for(large)) == {
        "gpu-0": True,
        "gpu-1": False,
        "gpu-2": True,
    }
    assert calls == [("gpu-1", 15)], "only the node whose pods changed"
    calls.clear()
    # The pod's own earlier allocation on gpu-1 is left out of its state: judged afresh, not remembered.
    assert cache.judged(
        names, now=NOW, ttl=120, exclude_uid=hogs[0]["metadata"]["uid"], key=large, judge=judge_for(large)
    ) == dict.fromkeys(names, True)
    assert calls == [("gpu-1", 15)]
    assert cache.judged(names, now=NOW, ttl=120, key=large, judge=judge_for(large))["gpu-1"] is False


def test_a_node_update_that_changes_only_its_version_keeps_the_verdicts(make_node: Factory, make_gpu_pod: Factory) -> None:
    cache = _store(make_node, 2)
    wanted = cardrequest.pod_request(make_gpu_pod("p", mem=4))
    calls: list[str] = []

    def judge(state: cards.NodeState) -> bool:
        calls.append(state.node.name)
        return placement.evaluate(wanted, state, decide=False).fits

    cache.judged(["gpu-0", "gpu-1"], now=NOW, ttl=120, key=wanted, judge=judge)
    beat = copy.deepcopy(cache.node("gpu-0") or {})
    beat["metadata"]["resourceVersion"] = "99"
    beat["status"]["conditions"] = [{"type": "Ready", "status": "True"}]  # what a heartbeat changes; not kept
    cache.apply("Node", "MODIFIED", beat)
    relabelled = copy.deepcopy(make_node("gpu-1", mode="topology"))
    relabelled["metadata"]["resourceVersion"] = "100"
    cache.apply("Node", "MODIFIED", relabelled)
    calls.clear()
    assert cache.judged(["gpu-0", "gpu-1"], now=NOW, ttl=120, key=wanted, judge=judge) == {"gpu-0": True, "gpu-1": False}
    assert calls == ["gpu-1"], "only the node whose mode changed is judged again"
    assert (cache.node("gpu-0") or {})["metadata"]["resourceVersion"] == "99", "bind's compare-and-swap needs the new version"
