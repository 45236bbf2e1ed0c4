"""A reservation whose pod is gone (deleted mid-bind) does not block its node: a freshly started
extender counts it only for the in-flight grace, filter then lets pods in, the tidy pass prunes it,
and filter's reason codes say what held the card meanwhile."""

from __future__ import annotations

from typing import Any

from policies.gpu import allocation, cardrequest, reasons, reservations
from webhook.extender import binder, placement
from webhook.extender import store as store_module

NOW = 1_800_000_000.0
Factory = Any


def _gone_reservation(*, assumed_at: float) -> dict[str, allocation.Allocation]:
    entry = allocation.Allocation(
        uid="uid-deleted",
        namespace="team-a",
        name="deleted-mid-bind",
        node="gpu-0",
        cards=(0,),
        memory_gib=15,
        assumed_at=assumed_at,
        expires=assumed_at + allocation.DEFAULT_RESERVATION_TTL_S,
        source="reservation",
    )
    return {entry.uid: entry}


def _restarted(node: dict[str, Any], lease: dict[str, Any]) -> store_module.Store:
    """The cache of an extender that just started: the first list of nodes, pods and Leases is in."""
    cache = store_module.Store()
    cache.replace_nodes([node])
    cache.replace_leases([lease])
    cache.replace_pods([])
    return cache


def test_a_restarted_extender_counts_a_gone_pods_reservation_only_during_the_in_flight_grace(make_node: Factory) -> None:
    lease = reservations.lease_body("gpu-0", "", _gone_reservation(assumed_at=NOW - 2), "before-the-restart")
    lease["metadata"]["resourceVersion"] = "3"
    cache = _restarted(make_node("gpu-0", count=1), lease)
    wanted = cardrequest.Request(memory_gib=8)
    early = cache.states(["gpu-0"], now=NOW, ttl=allocation.DEFAULT_RESERVATION_TTL_S)
    outcome = placement.filter_nodes(wanted, states=early, names=["gpu-0"])
    assert outcome.passed == [] and [r.code for r in outcome.reasons["gpu-0"]] == [reasons.Code.INSUFFICIENT_MEMORY]
    state = early["gpu-0"]
    assert state is not None
    diagnosed = placement.diagnose(wanted, state, stale=frozenset({"uid-deleted"}))
    assert diagnosed.codes[0] is reasons.Code.STALE_ALLOCATION
    later = NOW - 2 + reservations.IN_FLIGHT_GRACE_S + 0.1
    assert placement.filter_nodes(
        wanted, states=cache.states(["gpu-0"], now=later, ttl=allocation.DEFAULT_RESERVATION_TTL_S), names=["gpu-0"]
    ).passed == ["gpu-0"]
    assert cache.stale_ledgers(now=later) == ["gpu-0"]


async def test_the_tidy_prune_removes_the_gone_pods_entry_from_the_lease(apiserver: Any, make_node: Factory) -> None:
    apiserver.add_node(make_node("gpu-0", count=1))
    body = reservations.lease_body("gpu-0", "", _gone_reservation(assumed_at=NOW - 30), "before-the-restart")
    await apiserver.create_lease(reservations.LEDGER_NAMESPACE, body)
    assert await binder.Binder(apiserver, clock=lambda: NOW).prune("gpu-0") is True
    lease = apiserver.leases[(reservations.LEDGER_NAMESPACE, "gpu-ledger.gpu-0")]
    assert reservations.lease_reservations(lease) == {}
    assert await binder.Binder(apiserver, clock=lambda: NOW).prune("gpu-0") is False  # nothing left to write
