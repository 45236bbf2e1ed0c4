"""Bind against an in-memory apiserver: concurrency, replicas, restarts, expiry, error answers."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from policies import gpu
from policies.gpu import allocation, reservations
from webhook.extender import binder, wire
from webhook.kube import errors as kube_errors

NOW = 1_800_000_000.0
Factory = Any


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _request(obj: dict[str, Any], node: str) -> wire.BindRequest:
    meta = obj["metadata"]
    return wire.BindRequest(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], node=node)


def _lease_ledger(apiserver: Any, node: str) -> dict[str, allocation.Allocation]:
    """The ledger the node's Lease carries (what this version writes)."""
    lease = apiserver.leases.get((reservations.LEDGER_NAMESPACE, reservations.lease_name(node)))
    return reservations.lease_reservations(lease) if lease is not None else {}


def _pods(apiserver: Any, make_gpu_pod: Factory, count: int, *, prefix: str = "p", **kwargs: Any) -> list[dict[str, Any]]:
    return [apiserver.add_pod(make_gpu_pod(f"{prefix}{i}", **kwargs)) for i in range(count)]


def _binding_of_p0_fails(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory, *, ttl: float
) -> tuple[binder.Binder, Clock, dict[str, Any], dict[str, Any]]:
    """Node gpu-0 with one card, pods p0 and p1 asking 10 GiB each, and a binder (`ttl`, its own clock)
    whose Binding of p0 loses its connection after the commit: (binder, clock, p0, p1)."""
    apiserver.add_node(make_node("gpu-0", count=1))
    first, later = _pods(apiserver, make_gpu_pod, 2, mem=10)
    apiserver.fail_next_binding["p0"] = kube_errors.KubeError("connection reset", status=0)
    clock = Clock()
    return binder.Binder(apiserver, clock=clock, ttl=ttl), clock, first, later


async def test_binding_annotates_the_pod_then_binds_it(apiserver: Any, make_node: Factory, make_gpu_pod: Factory) -> None:
    apiserver.add_node(make_node("gpu-0"))
    (obj,) = _pods(apiserver, make_gpu_pod, 1, mem=4)
    result = await binder.Binder(apiserver, clock=Clock()).bind(_request(obj, "gpu-0"))
    assert result.error == "" and result.allocation is not None and result.allocation.cards == (0,)
    stored = apiserver.pods[("team-a", "p0")]
    assert stored["spec"]["nodeName"] == "gpu-0"
    notes = stored["metadata"]["annotations"]
    assert (
        notes["ALIYUN_COM_GPU_MEM_IDX"] == "0"
        and notes["ALIYUN_COM_GPU_MEM_POD"] == "4"
        and notes["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    )
    assert json.loads(notes[gpu.ALLOCATION_ANNOTATION])["cards"] == [0]
    assert apiserver.calls.index("create_lease") < apiserver.calls.index("bind")
    lease = apiserver.leases[(reservations.LEDGER_NAMESPACE, "gpu-ledger.gpu-0")]
    assert lease["spec"]["holderIdentity"] and lease["metadata"]["ownerReferences"][0]["name"] == "gpu-0"
    assert gpu.RESERVATIONS_ANNOTATION not in apiserver.nodes["gpu-0"]["metadata"].get("annotations", {}), (
        "the Node is never written"
    )
    assert "patch_pod_annotations" not in apiserver.calls, "the Binding carries the annotations"


async def test_a_burst_of_concurrent_binds_never_over_commits_a_card(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    pods = _pods(apiserver, make_gpu_pod, 40, mem=4)  # 160 GiB of asks for 4 x 15 GiB: 12 fit (3 per card)
    one = binder.Binder(apiserver, clock=Clock())
    results = await asyncio.gather(*(one.bind(_request(p, "gpu-0")) for p in pods))
    assert sum(1 for r in results if not r.error) == 12
    assert used_per_card(apiserver, "gpu-0", now=NOW) == [12, 12, 12, 12]
    assert all("insufficient GPU memory" in r.error for r in results if r.error)


async def test_two_replicas_binding_at_once_never_over_commit(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    apiserver.add_node(make_node("gpu-1", placement="spread"))
    pods = _pods(apiserver, make_gpu_pod, 60, mem=5)
    replicas = [binder.Binder(apiserver, clock=Clock()), binder.Binder(apiserver, clock=Clock())]
    rng = random.Random(7)
    results = await asyncio.gather(
        *(replicas[i % 2].bind(_request(p, rng.choice(["gpu-0", "gpu-1"]))) for i, p in enumerate(pods))
    )
    assert sum(1 for r in results if not r.error) == 24  # 3 x 5 GiB per card, 8 cards
    assert used_per_card(apiserver, "gpu-0", now=NOW) == [15, 15, 15, 15]
    assert used_per_card(apiserver, "gpu-1", now=NOW) == [15, 15, 15, 15]
    assert apiserver.conflicts > 0, "the replicas should have raced on the Lease's resourceVersion"
    assert sum(r.conflicts for r in results) == apiserver.conflicts


async def test_node_heartbeats_no_longer_conflict_with_commits(apiserver: Any, make_node: Factory, make_gpu_pod: Factory) -> None:
    apiserver.add_node(make_node("gpu-0"))
    first, second = _pods(apiserver, make_gpu_pod, 2, mem=4)
    real_get = apiserver.get_node

    async def get_then_heartbeat(name: str) -> dict[str, Any]:
        found = await real_get(name)
        apiserver.touch_node(name)  # a kubelet status update lands between our read and our write
        return dict(found)

    apiserver.get_node = get_then_heartbeat
    one = binder.Binder(apiserver, clock=Clock())
    for obj in (first, second):  # a create, then a replace of the Lease
        result = await one.bind(_request(obj, "gpu-0"))
        assert result.error == "" and result.conflicts == 0


async def test_a_lease_written_between_read_and_write_costs_a_retry(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    first, second = _pods(apiserver, make_gpu_pod, 2, mem=4)
    one = binder.Binder(apiserver, clock=Clock())
    assert (await one.bind(_request(first, "gpu-0"))).error == ""
    real_list = apiserver.list_node_pods
    bumps = iter(range(2))

    async def list_then_bump(node: str, *, at_least: str = "") -> list[dict[str, Any]]:
        found = await real_list(node, at_least=at_least)
        if next(bumps, None) is not None:  # another replica commits between our read and our write
            key = (reservations.LEDGER_NAMESPACE, reservations.lease_name(node))
            apiserver.leases[key]["metadata"]["resourceVersion"] = apiserver._next()
        return list(found)

    apiserver.list_node_pods = list_then_bump
    result = await one.bind(_request(second, "gpu-0"))
    assert result.error == "" and result.conflicts == 2
    assert result.allocation is not None and result.allocation.cards == (0,)


async def test_a_restarted_extender_sees_what_the_previous_one_allocated(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    first, second = _pods(apiserver, make_gpu_pod, 6, mem=3)[:5], None
    before = binder.Binder(apiserver, clock=Clock())
    for p in first:
        assert (await before.bind(_request(p, "gpu-0"))).error == ""
    second = apiserver.add_pod(make_gpu_pod("after-restart", mem=3))
    after = binder.Binder(apiserver, clock=Clock())  # a new process: nothing in memory
    result = await after.bind(_request(second, "gpu-0"))
    assert result.allocation is not None and result.allocation.cards == (1,)
    assert used_per_card(apiserver, "gpu-0", now=NOW) == [15, 3, 0, 0]


async def test_a_bind_that_died_after_committing_holds_the_card_until_the_ttl(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    one, _, crashed, later = _binding_of_p0_fails(apiserver, make_node, make_gpu_pod, ttl=60)
    assert "connection reset" in (await one.bind(_request(crashed, "gpu-0"))).error
    # The ledger entry and the annotation of the unbound pod both still hold 10 GiB of the card:
    blocked = await one.bind(_request(later, "gpu-0"))
    assert "GPU0 with 5 GiB free" in blocked.error
    # The scheduler retries the same pod: its own reservation does not stand in its way.
    assert (await one.bind(_request(crashed, "gpu-0"))).error == ""
    assert "insufficient" in (await one.bind(_request(later, "gpu-0"))).error


async def test_an_unbound_reservation_expires_after_the_ttl(apiserver: Any, make_node: Factory, make_gpu_pod: Factory) -> None:
    one, clock, crashed, later = _binding_of_p0_fails(apiserver, make_node, make_gpu_pod, ttl=60)
    await one.bind(_request(crashed, "gpu-0"))
    clock.now += 61
    result = await one.bind(_request(later, "gpu-0"))
    assert result.error == "" and result.allocation is not None
    ledger = _lease_ledger(apiserver, "gpu-0")
    assert list(ledger) == [later["metadata"]["uid"]], "the expired entry is pruned on the next commit"


async def test_bound_pods_leave_the_ledger_on_the_next_commit(apiserver: Any, make_node: Factory, make_gpu_pod: Factory) -> None:
    apiserver.add_node(make_node("gpu-0"))
    pods = _pods(apiserver, make_gpu_pod, 3, mem=1)
    one = binder.Binder(apiserver, clock=Clock())
    for p in pods:
        await one.bind(_request(p, "gpu-0"))
    assert list(_lease_ledger(apiserver, "gpu-0")) == [pods[-1]["metadata"]["uid"]]


async def test_errors_come_back_as_binding_results_not_exceptions(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    (obj,) = _pods(apiserver, make_gpu_pod, 1, mem=4)
    one = binder.Binder(apiserver, clock=Clock())
    replaced = wire.BindRequest(name="p0", namespace="team-a", uid="not-the-uid", node="gpu-0")
    assert "was replaced" in (await one.bind(replaced)).error
    missing = wire.BindRequest(name="ghost", namespace="team-a", uid="u", node="gpu-0")
    assert "not found" in (await one.bind(missing)).error
    assert "not found" in (await one.bind(_request(obj, "no-such-node"))).error
    assert (await one.bind(_request(obj, "gpu-0"))).error == ""
    assert (await one.bind(_request(obj, "gpu-0"))).error == "", "a retried bind of a bound pod is a success"
    assert "already bound to gpu-0" in (await one.bind(_request(obj, "gpu-1"))).error


async def test_whole_card_pods_get_the_best_connected_free_cards(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    links = [(a, b, "NV2" if (a < 4) == (b < 4) else "SYS") for a in range(8) for b in range(a + 1, 8)]
    apiserver.add_node(make_node("topo", mode="topology", placement=None, count=8, links=links))
    one, two = _pods(apiserver, make_gpu_pod, 2, whole=4)
    b = binder.Binder(apiserver, clock=Clock())
    first, second = await asyncio.gather(b.bind(_request(one, "topo")), b.bind(_request(two, "topo")))
    assert first.allocation is not None and second.allocation is not None
    assert {first.allocation.cards, second.allocation.cards} == {(0, 1, 2, 3), (4, 5, 6, 7)}


async def test_a_pod_asking_nothing_we_place_is_not_bound(apiserver: Any, make_node: Factory, make_gpu_pod: Factory) -> None:
    apiserver.add_node(make_node("gpu-0"))
    (obj,) = _pods(apiserver, make_gpu_pod, 1)
    result = await binder.Binder(apiserver, clock=Clock()).bind(_request(obj, "gpu-0"))
    assert "asks for no resource the GPU extender places" in result.error
    assert "nodeName" not in apiserver.pods[("team-a", "p0")]["spec"]


async def test_a_pod_deleted_mid_bind_frees_its_card_at_the_next_commit_not_after_the_ttl(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    one, clock, gone, later = _binding_of_p0_fails(apiserver, make_node, make_gpu_pod, ttl=600)
    await one.bind(_request(gone, "gpu-0"))
    del apiserver.pods[("team-a", "p0")]  # the user deletes the pod the bind was cut off for
    assert "insufficient" in (await one.bind(_request(later, "gpu-0"))).error, "young entries are binds in flight"
    clock.now += reservations.IN_FLIGHT_GRACE_S
    result = await one.bind(_request(later, "gpu-0"))
    assert result.error == "" and result.allocation is not None
    assert list(_lease_ledger(apiserver, "gpu-0")) == [later["metadata"]["uid"]]


async def test_a_ledger_entry_of_a_pod_that_cannot_be_read_is_kept(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    one, clock, stuck, later = _binding_of_p0_fails(apiserver, make_node, make_gpu_pod, ttl=600)
    await one.bind(_request(stuck, "gpu-0"))
    real_get = apiserver.get_pod

    async def flaky(namespace: str, name: str) -> dict[str, Any]:
        if name == "p0":
            raise kube_errors.KubeError("timeout", status=0)
        return dict(await real_get(namespace, name))

    apiserver.get_pod = flaky
    clock.now += reservations.IN_FLIGHT_GRACE_S
    assert "insufficient GPU memory" in (await one.bind(_request(later, "gpu-0"))).error


async def test_binds_waiting_for_one_node_are_committed_together(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    pods = _pods(apiserver, make_gpu_pod, 20, mem=3)
    one = binder.Binder(apiserver, clock=Clock())
    results = await asyncio.gather(*(one.bind(_request(p, "gpu-0")) for p in pods))
    assert all(r.error == "" for r in results)
    assert used_per_card(apiserver, "gpu-0", now=NOW) == [15, 15, 15, 15]
    assert apiserver.lease_writes < 5, f"{apiserver.lease_writes} commits for 20 binds: they should batch"
    assert len(_lease_ledger(apiserver, "gpu-0")) <= 20


async def test_prune_drops_expired_and_gone_entries_and_says_whether_it_wrote(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    alive = apiserver.add_pod(make_gpu_pod("alive", mem=2))
    entries = {
        "expired": allocation.Allocation(
            uid="expired",
            namespace="team-a",
            name="x",
            node="gpu-0",
            cards=(0,),
            memory_gib=2,
            assumed_at=NOW - 200,
            expires=NOW - 80,
        ),
        "deleted": allocation.Allocation(
            uid="deleted",
            namespace="team-a",
            name="gone",
            node="gpu-0",
            cards=(1,),
            memory_gib=2,
            assumed_at=NOW - 20,
            expires=NOW + 100,
        ),
        alive["metadata"]["uid"]: allocation.Allocation(
            uid=alive["metadata"]["uid"],
            namespace="team-a",
            name="alive",
            node="gpu-0",
            cards=(2,),
            memory_gib=2,
            assumed_at=NOW - 20,
            expires=NOW + 100,
        ),
    }
    one = binder.Binder(apiserver, clock=Clock())
    assert await one.prune("gpu-0") is False, "no Lease: nothing to prune"
    await apiserver.create_lease(reservations.LEDGER_NAMESPACE, reservations.lease_body("gpu-0", "uid-gpu-0", entries, "other"))
    assert await one.prune("gpu-0") is True
    assert list(_lease_ledger(apiserver, "gpu-0")) == [alive["metadata"]["uid"]]
    assert await one.prune("gpu-0") is False


async def test_no_per_node_state_outlives_the_binds_to_that_node(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    pods = _pods(apiserver, make_gpu_pod, 6, mem=4)
    one = binder.Binder(apiserver, clock=Clock())
    # Names of nodes that do not exist (a node scaled away, a hostile caller): each one fails ...
    failed = await asyncio.gather(*(one.bind(_request(p, f"gone-{i}")) for i, p in enumerate(pods)))
    assert all("not found" in r.error for r in failed)
    # ... and a real burst succeeds; afterwards nothing is kept per node.
    bound = await asyncio.gather(*(one.bind(_request(p, "gpu-0")) for p in pods))
    assert all(r.error == "" for r in bound)
    assert one.nodes_committing == frozenset()


async def test_a_node_keeps_its_queue_while_binds_to_it_wait(apiserver: Any, make_node: Factory, make_gpu_pod: Factory) -> None:
    apiserver.add_node(make_node("gpu-0"))
    (obj,) = _pods(apiserver, make_gpu_pod, 1, mem=4)
    one = binder.Binder(apiserver, clock=Clock())
    pending = asyncio.ensure_future(one.bind(_request(obj, "gpu-0")))
    seen: set[frozenset[str]] = set()
    while not pending.done():  # step the loop and look at the queues between steps
        seen.add(one.nodes_committing)
        await asyncio.sleep(0)
    assert frozenset({"gpu-0"}) in seen, "the bind waited in its node's queue"
    assert (await pending).error == ""
    assert one.nodes_committing == frozenset()


async def test_an_earlier_versions_node_ledger_entry_still_holds_its_card_until_it_expires(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any
) -> None:
    """Upgrade: an entry the Node-ledger version committed (pod still unbound) holds its card for
    the new version too, and the new version never writes the Node annotation."""
    old = allocation.Allocation(
        uid="old-uid",
        namespace="team-a",
        name="in-flight",
        node="gpu-0",
        cards=(0,),
        memory_gib=12,
        assumed_at=NOW - 5,
        expires=NOW + 60,
        source="reservation",
    )
    written_before = reservations.encode({"old-uid": old})
    apiserver.add_node(make_node("gpu-0", annotations={gpu.RESERVATIONS_ANNOTATION: written_before}))
    apiserver.add_pod(make_gpu_pod("in-flight", mem=12, uid="old-uid"))
    first, second = _pods(apiserver, make_gpu_pod, 2, mem=12)
    clock = Clock()
    one = binder.Binder(apiserver, clock=clock)
    result = await one.bind(_request(first, "gpu-0"))
    assert result.allocation is not None and result.allocation.cards == (1,), "card 0 has 3 GiB free, not 12"
    assert used_per_card(apiserver, "gpu-0", now=NOW) == [12, 12, 0, 0]
    assert apiserver.nodes["gpu-0"]["metadata"]["annotations"][gpu.RESERVATIONS_ANNOTATION] == written_before
    assert "old-uid" not in _lease_ledger(apiserver, "gpu-0"), "the new version copies nothing of the old ledger"
    clock.now += 61  # the old entry expired: card 0 is free again
    result = await one.bind(_request(second, "gpu-0"))
    assert result.allocation is not None and result.allocation.cards == (0,)


async def test_a_missing_ledger_namespace_is_a_clear_bind_error(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    (obj,) = _pods(apiserver, make_gpu_pod, 1, mem=4)
    result = await binder.Binder(apiserver, clock=Clock(), namespace="no-such-namespace").bind(_request(obj, "gpu-0"))
    assert "namespace 'no-such-namespace'" in result.error and "--ledger-namespace" in result.error
    assert "nodeName" not in apiserver.pods[("team-a", "p0")]["spec"]


async def test_a_ledger_lease_deleted_between_read_and_write_is_created_again(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any
) -> None:
    apiserver.add_node(make_node("gpu-0"))
    first, second = _pods(apiserver, make_gpu_pod, 2, mem=4)
    one = binder.Binder(apiserver, clock=Clock())
    assert (await one.bind(_request(first, "gpu-0"))).error == ""
    real_list = apiserver.list_node_pods
    deletions = iter(range(1))

    async def list_then_delete(node: str, *, at_least: str = "") -> list[dict[str, Any]]:
        found = await real_list(node, at_least=at_least)
        if next(deletions, None) is not None:
            del apiserver.leases[(reservations.LEDGER_NAMESPACE, reservations.lease_name(node))]
        return list(found)

    apiserver.list_node_pods = list_then_delete
    result = await one.bind(_request(second, "gpu-0"))
    assert result.error == "" and result.conflicts == 1
    assert list(_lease_ledger(apiserver, "gpu-0")) == [second["metadata"]["uid"]]
    assert used_per_card(apiserver, "gpu-0", now=NOW) == [8, 0, 0, 0], "p0 is bound: its annotation counts"
