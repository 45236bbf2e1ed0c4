"""Bind honours holds as filter does: a card held for a preemptor (its nomination, or its record
after a restart) is never handed to a pod of lower or equal priority, even where kube-scheduler asks
for that bind (a filter answered before the hold was seen, a bind retried); a pod of higher
priority, and the preemptor itself, still bind."""

from __future__ import annotations

from typing import Any

from tests.unit.extender import conftest
from tests.unit.extender.test_extender_preempt_hold import NOW, _bound, _lease, _pending, _record, _restarted
from webhook.extender import binder, store, wire


def _request(pod: dict[str, Any]) -> wire.BindRequest:
    metadata = pod["metadata"]
    return wire.BindRequest(namespace=metadata["namespace"], name=metadata["name"], uid=metadata["uid"], node="n")


async def _bind(apiserver: Any, cache: store.Store, pod: dict[str, Any]) -> binder.BindResult:
    for node in cache.nodes():
        apiserver.add_node(node)
    for other in cache.pods():
        apiserver.add_pod(other)
    return await binder.Binder(apiserver, clock=lambda: NOW, cache=cache).bind(_request(pod))


async def test_bind_refuses_the_card_held_for_a_preemptor_after_a_restart(apiserver: Any) -> None:
    late = _pending("late", gib=8, priority=0)
    cache = _restarted(_pending(), late, leases=[_lease(_record())])
    result = await _bind(apiserver, cache, late)
    assert result.allocation is None
    assert "held for team-a/boss, which preempted here" in result.error


async def test_bind_without_a_hold_or_above_it_places_the_pod(apiserver: Any) -> None:
    late = _pending("late", gib=8, priority=0)
    bare = _restarted(_pending(), late, leases=[])  # no record: the half-freed card is free to take
    result = await _bind(apiserver, bare, late)
    assert result.error == "" and result.allocation is not None and result.allocation.cards == (0,)


async def test_a_pod_above_the_preemptor_is_not_held_back(apiserver: Any) -> None:
    vip = _pending("vip", gib=8, priority=2000)
    cache = _restarted(_pending(), vip, leases=[_lease(_record())])
    result = await _bind(apiserver, cache, vip)
    assert result.error == "" and result.allocation is not None


async def test_the_preemptor_binds_to_its_own_held_card(apiserver: Any) -> None:
    boss = _pending("boss", gib=8)
    cache = store.Store()
    cache.replace_nodes([conftest.node("n", count=2, gib=16)])
    cache.replace_leases([_lease(_record(victims=("uid-c0",)))])
    cache.replace_pods([_bound("c0", card=0, gib=8, deleting=True), _bound("b1", card=1), _bound("d1", card=1), boss])
    result = await _bind(apiserver, cache, boss)
    assert result.error == "" and result.allocation is not None and result.allocation.cards == (0,)
