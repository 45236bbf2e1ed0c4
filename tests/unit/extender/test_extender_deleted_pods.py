"""A pod being deleted frees its card for placement from the moment its deletion is seen
(`deletionTimestamp`), not when its object is finally gone (issue 38: on a spread node, pods created
right after another set was deleted were stacked on the cards of pods still Terminating). Unless a
preemption is under way there: a victim a hold record names, or one on a node a pod of higher
priority is nominated to, counts until it is gone."""

from __future__ import annotations

import copy
from typing import Any

from policies.gpu import allocation, cardrequest, reservations
from tests.unit.extender import conftest
from webhook.extender import placement, preemption, store

NOW = 1_800_000_000.0
DELETING = "2027-01-15T08:00:00Z"


def _bound(name: str, card: int, *, gib: int = 3, priority: int = 0) -> dict[str, Any]:
    held = allocation.Allocation(
        uid=f"uid-{name}", namespace="team-a", name=name, node="n", cards=(card,), memory_gib=gib, assumed_at=NOW
    )
    pod = conftest.pod(
        name,
        uid=f"uid-{name}",
        mem=gib,
        node_name="n",
        phase="Running",
        annotations=allocation.bind_annotations(held, card_memory_gib=15),
    )
    pod["spec"]["priority"] = priority
    return pod


def _deleting(pod: dict[str, Any]) -> dict[str, Any]:
    going = copy.deepcopy(pod)
    going["metadata"]["deletionTimestamp"] = DELETING
    going["metadata"]["resourceVersion"] = str(int(going["metadata"].get("resourceVersion") or "1") + 1)
    return going


def _spread_node(cache_pods: list[dict[str, Any]]) -> store.Store:
    cache = store.Store()
    cache.replace_nodes([conftest.node("n", placement="spread", count=4, gib=15)])
    cache.replace_leases([])
    cache.replace_pods(cache_pods)
    return cache


def _place(cache: store.Store, name: str, *, gib: int = 3) -> int:
    """Where the extender puts the next pod (what bind decides), then that pod bound there."""
    fit = placement.evaluate(
        cardrequest.pod_request(conftest.pod(name, mem=gib)), cache.state("n", now=NOW, ttl=60.0) or _never()
    )
    assert fit.fits
    cache.put_pod(_bound(name, fit.cards[0], gib=gib))
    return fit.cards[0]


def _never() -> Any:
    raise AssertionError("node n unknown")


def test_pods_created_right_after_a_set_was_deleted_spread_over_all_cards() -> None:
    cache = _spread_node([])
    first = [_place(cache, f"old-{i}") for i in range(4)]
    assert first == [0, 1, 2, 3]
    freed: list[str] = []
    cache.on_freed = freed.append
    for i in range(4):  # deleted: Terminating, their objects not gone yet
        cache.put_pod(_deleting(cache.pod(f"uid-old-{i}") or _never()))
    assert freed == ["n"] * 4  # kube-scheduler is told at once
    assert [_place(cache, f"new-{i}") for i in range(4)] == [0, 1, 2, 3]


def test_before_the_change_the_terminating_pods_were_counted() -> None:
    """The same node with the old pods still counted (not deleted yet) fills the lowest cards: the
    spread above is the deletion's doing, not the placement's."""
    cache = _spread_node([_bound(f"old-{i}", i) for i in range(4)])
    state = cache.state("n", now=NOW, ttl=60.0)
    assert state is not None and [c.memory_used for c in state.cards] == [3, 3, 3, 3]


def test_a_victim_named_by_a_hold_record_counts_until_it_is_gone() -> None:
    victim = _bound("victim", 0, gib=15)
    cache = _spread_node([victim])
    record = preemption.Hold(
        uid="uid-boss", namespace="team-a", name="boss", node="n", priority=1000, victims=frozenset({"uid-victim"}), at=NOW
    )
    lease = preemption.hold_lease_body("n", "node-uid", {record.uid: record}, namespace="gpu-admission")
    lease["metadata"]["resourceVersion"] = "7"
    cache.put_lease(lease)
    cache.put_pod(_deleting(victim))
    state = cache.state("n", now=NOW, ttl=60.0)
    assert state is not None and state.cards[0].memory_used == 15
    cache.apply("Pod", "DELETED", victim)
    state = cache.state("n", now=NOW, ttl=60.0)
    assert state is not None and state.cards[0].memory_used == 0


def test_a_victim_counts_while_a_pod_of_higher_priority_is_nominated_to_its_node() -> None:
    victim = _bound("victim", 0, gib=15)
    boss = conftest.pod("boss", uid="uid-boss", mem=15)
    boss["spec"]["priority"] = 1000
    boss["status"]["nominatedNodeName"] = "n"
    cache = _spread_node([victim, boss])
    cache.put_pod(_deleting(victim))
    state = cache.state("n", now=NOW, ttl=60.0)
    assert state is not None and state.cards[0].memory_used == 15
    cache.apply("Pod", "DELETED", boss)  # the preemption is over: the card is free at once
    state = cache.state("n", now=NOW, ttl=60.0)
    assert state is not None and state.cards[0].memory_used == 0
    # A nominee of lower or equal priority keeps nothing: its preemption did not evict this pod.
    meek = conftest.pod("meek", uid="uid-meek", mem=15)
    meek["spec"]["priority"] = 0
    meek["status"]["nominatedNodeName"] = "n"
    cache.put_pod(meek)
    state = cache.state("n", now=NOW, ttl=60.0)
    assert state is not None and state.cards[0].memory_used == 0


def test_the_ledger_entries_of_pods_being_deleted_or_gone_stop_counting_too() -> None:
    """Right after their binds the ledger Lease still has entries for the pods (within the in-flight
    grace an entry counts even where its pod is not listed): the deletion frees the card all the same."""
    old = [_bound(f"old-{i}", i) for i in range(4)]
    entries = {
        f"uid-old-{i}": allocation.Allocation(
            uid=f"uid-old-{i}",
            namespace="team-a",
            name=f"old-{i}",
            node="n",
            cards=(i,),
            memory_gib=3,
            assumed_at=NOW - 1,
            expires=NOW + 119,
            source="reservation",
        )
        for i in range(4)
    }
    cache = _spread_node(old)
    cache.replace_leases([reservations.lease_body("n", "", entries, "a-replica")])
    for pod in old[:3]:
        cache.put_pod(_deleting(pod))  # Terminating
    cache.apply("Pod", "DELETED", old[3])  # gone already
    state = cache.state("n", now=NOW, ttl=60.0)
    assert state is not None and [c.memory_used for c in state.cards] == [0, 0, 0, 0]
    # What bind decides on (its own fresh list of the node's pods, the same ledger): the same.
    fresh = cache.node_state_of(cache.node("n") or {}, [_deleting(p) for p in old[:3]], now=NOW, ttl=60.0, reservations=entries)
    assert [c.memory_used for c in fresh.cards] == [0, 0, 0, 0]
