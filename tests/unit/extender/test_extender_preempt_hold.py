"""The durable hold (issue 27): the preempt verb's record of a nomination, written to a hold Lease
in the ledger namespace, keeps the freed card for the preemptor when kube-scheduler's nomination
is cleared (an extender restart, a failed bind), and only while the live pods say it should."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import test_utils, web

from policies import gpu
from policies.gpu import allocation, reservations
from tests.unit.extender import conftest
from webhook.extender import app, binder, holds, preemption, store

NOW = 1_800_000_000.0
Client = test_utils.TestClient[web.Request, web.Application]
NS = reservations.LEDGER_NAMESPACE
DELETING = "2027-01-15T08:00:00Z"


def _bound(name: str, *, card: int, gib: int = 8, priority: int = 0, deleting: bool = False, node: str = "n") -> dict[str, Any]:
    held = allocation.Allocation(
        uid=f"uid-{name}", namespace="team-a", name=name, node=node, cards=(card,), memory_gib=gib, assumed_at=NOW
    )
    pod = conftest.pod(
        name,
        uid=f"uid-{name}",
        mem=gib,
        node_name=node,
        phase="Running",
        annotations=allocation.bind_annotations(held, card_memory_gib=16),
    )
    pod["spec"]["priority"] = priority
    if deleting:
        pod["metadata"]["deletionTimestamp"] = DELETING
    return pod


def _pending(name: str = "boss", *, gib: int = 16, priority: int = 1000, nominated: str = "") -> dict[str, Any]:
    pod = conftest.pod(name, uid=f"uid-{name}", mem=gib)
    pod["spec"]["priority"] = priority
    if nominated:
        pod["status"]["nominatedNodeName"] = nominated
    return pod


def _record(
    *,
    uid: str = "uid-boss",
    priority: int = 1000,
    victims: tuple[str, ...] = ("uid-a0", "uid-c0"),
    at: float = NOW,
    node: str = "n",
) -> preemption.Hold:
    return preemption.Hold(
        uid=uid,
        namespace="team-a",
        name=uid.removeprefix("uid-"),
        node=node,
        priority=priority,
        victims=frozenset(victims),
        at=at,
    )


def _lease(*records: preemption.Hold, namespace: str = NS, node: str = "n") -> dict[str, Any]:
    body = preemption.hold_lease_body(node, "node-uid", {r.uid: r for r in records}, namespace=namespace)
    body["metadata"]["resourceVersion"] = "7"
    return body


def _restarted(*pods: dict[str, Any], leases: list[dict[str, Any]]) -> store.Store:
    """A store as a freshly started extender lists it: card 0 of n half freed (a0 gone, c0 Terminating),
    card 1 full (b1, d1)."""
    fresh = store.Store()
    fresh.replace_nodes([conftest.node("n", count=2, gib=16)])
    fresh.replace_leases(leases)
    fresh.replace_pods([_bound("c0", card=0, deleting=True), _bound("b1", card=1), _bound("d1", card=1), *pods])
    return fresh


@pytest.fixture
def make_client(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any
) -> Callable[..., Awaitable[Client]]:
    async def make(cache: store.Store, *, clock: Callable[[], float] = lambda: NOW) -> Client:
        application = app.make_app(
            cache=cache,
            bind=binder.Binder(apiserver, clock=clock, cache=cache),
            settings=app.Settings(clock=clock),
            leases=apiserver,
        )
        return await aiohttp_client(application)

    return make


async def _filter(client: Client, pod: dict[str, Any]) -> list[str]:
    body = {"Pod": pod, "Nodes": None, "NodeNames": ["n"]}
    async with client.post("/filter", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        return list((await answer.json())["NodeNames"])


# --- `standing`: the rule, case by case ---------------------------------------------------------


def _stands(
    pod: dict[str, Any] | None,
    *,
    now: float = NOW + 10,
    evicted: bool = True,
    left: bool = True,
    gone_since: float | None = None,
    **record: Any,
) -> bool:
    return preemption.standing(_record(**record), pod, now=now, evicted=evicted, victims_left=left, gone_since=gone_since)


def test_a_record_stands_while_its_preemptor_waits_and_a_victim_terminates() -> None:
    assert _stands(_pending())
    assert _stands(_pending(nominated="n"))  # the nomination and the record agree
    assert _stands(_pending(), left=False, gone_since=NOW + 5)  # victims gone 5 s ago: the preemptor is due any moment


@pytest.mark.parametrize(
    ("case", "pod", "kwargs"),
    [
        ("the preemptor is gone", None, {}),
        ("another pod of that name", {**_pending(), "metadata": {**_pending()["metadata"], "uid": "uid-other"}}, {}),
        ("bound here or elsewhere", {**_pending(), "spec": {**_pending()["spec"], "nodeName": "m"}}, {}),
        ("being deleted", {**_pending(), "metadata": {**_pending()["metadata"], "deletionTimestamp": DELETING}}, {}),
        ("finished", {**_pending(), "status": {"phase": "Failed"}}, {}),
        ("nominated to another node", _pending(nominated="m"), {}),
        ("never preempts", {**_pending(), "spec": {**_pending()["spec"], "preemptionPolicy": "Never"}}, {}),
        ("a priority other than recorded", _pending(priority=5000), {}),
        ("older than HOLD_MAX_S", _pending(), {"now": NOW + preemption.HOLD_MAX_S}),
        ("no victim evicted (kube-scheduler picked another node)", _pending(), {"evicted": False}),
        ("victims gone longer than the grace", _pending(), {"left": False, "gone_since": NOW + 10 - preemption.HOLD_GRACE_S}),
    ],
)
def test_a_record_lapses(case: str, pod: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
    assert not _stands(pod, **kwargs), case


def test_records_round_trip_and_garbage_is_left_out() -> None:
    record = _record()
    assert preemption.read_holds(preemption.encode_holds({record.uid: record}), node="n") == {record.uid: record}
    text = json.dumps(
        {
            "u1": {"pod": "x", "priority": 1, "victims": [], "at": 1},
            "u2": {"pod": "a/b", "priority": True, "victims": [], "at": 1},
            "u3": "nope",
            "u4": {"pod": "a/b", "priority": 1, "victims": ["v", 3], "at": 2.5},
        }
    )
    assert list(preemption.read_holds(text, node="n")) == ["u4"] and preemption.read_holds(text, node="n")["u4"].victims == {"v"}
    assert preemption.read_holds("{not json", node="n") == {} and preemption.read_holds(None, node="n") == {}


def test_old_records_are_dropped_when_a_record_is_added() -> None:
    old, other = _record(uid="uid-old", at=NOW - preemption.HOLD_MAX_S), _record(uid="uid-other", at=NOW - 10)
    kept = preemption.with_hold({old.uid: old, other.uid: other}, _record(), now=NOW)
    assert set(kept) == {"uid-other", "uid-boss"}


# --- trust: only the extender's own Lease counts --------------------------------------------------


def test_only_a_hold_lease_of_the_right_name_in_the_ledger_namespace_is_read() -> None:
    assert preemption.hold_lease_node(_lease(_record()), namespace=NS) == "n"
    assert preemption.hold_lease_node(_lease(_record(), namespace="team-a"), namespace=NS) is None  # a tenant's copy
    renamed = _lease(_record())
    renamed["metadata"]["name"] = "gpu-hold.m"  # claims node n under another node's name
    assert preemption.hold_lease_node(renamed, namespace=NS) is None
    ledger = reservations.lease_body("n", "node-uid", {}, "x")
    assert preemption.hold_lease_node(ledger, namespace=NS) is None  # the ledger is no hold Lease, nor the reverse
    assert reservations.lease_node(_lease(_record())) is None


async def test_after_a_restart_the_record_keeps_the_half_freed_card_from_a_lower_pod(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    # the extender restarted, kube-scheduler cleared the nomination (a failed call): only the record is left
    cache = _restarted(_pending(), leases=[_lease(_record())])
    client = await make_client(cache)
    assert await _filter(client, _pending("late", gib=8, priority=0)) == []
    assert await _filter(client, _pending("peer", gib=8, priority=1000)) == []  # equal priority is held back too
    assert await _filter(client, _pending("vip", gib=8, priority=2000)) == ["n"]  # a higher pod does not see it
    # without the record (the behaviour before): the late pod would have taken the free half of card 0
    bare = await make_client(_restarted(_pending(), leases=[]))
    assert await _filter(bare, _pending("late", gib=8, priority=0)) == ["n"]


async def test_a_record_in_a_tenants_namespace_or_a_pods_own_annotation_holds_nothing(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    forged = _pending()
    forged["metadata"].setdefault("annotations", {})[preemption.HOLDS_ANNOTATION] = preemption.encode_holds(
        {"uid-boss": _record()}
    )
    cache = _restarted(forged, leases=[_lease(_record(), namespace="team-a")])
    cache.put_lease(_lease(_record(), namespace="team-a"))
    client = await make_client(cache)
    assert await _filter(client, _pending("late", gib=8, priority=0)) == ["n"]


async def test_a_record_holds_only_for_a_pending_preemptor_above_the_pod(make_client: Callable[..., Awaitable[Client]]) -> None:
    # a record the extender wrote for a pod that is not above the late pod holds nothing against it
    cache = _restarted(_pending("meek", priority=0), leases=[_lease(_record(uid="uid-meek", priority=0))])
    client = await make_client(cache)
    assert await _filter(client, _pending("late", gib=8, priority=0)) == []  # equal: held, as kube-scheduler holds for nominees
    assert await _filter(client, _pending("late", gib=8, priority=1)) == ["n"]
    # the priority recorded must be the pod's: a record cannot lend a pod a priority it lacks
    cache = _restarted(_pending("meek", priority=0), leases=[_lease(_record(uid="uid-meek", priority=1000))])
    assert await _filter(await make_client(cache), _pending("late", gib=8, priority=500)) == ["n"]


async def test_the_record_lapses_when_the_preemptor_is_bound_deleted_or_its_time_is_up(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    late = _pending("late", gib=8, priority=0)
    cache = _restarted(_pending(), leases=[_lease(_record())])
    client = await make_client(cache)
    assert await _filter(client, late) == []
    bound_elsewhere = _pending()
    bound_elsewhere["spec"]["nodeName"] = "m"
    cache.put_pod(bound_elsewhere)
    assert await _filter(client, late) == ["n"]

    cache = _restarted(_pending(), leases=[_lease(_record())])
    client = await make_client(cache)
    cache.apply("Pod", "DELETED", _pending())
    assert await _filter(client, late) == ["n"]

    clock = [NOW]
    cache = _restarted(_pending(), leases=[_lease(_record())])
    client = await make_client(cache, clock=lambda: clock[0])
    assert await _filter(client, late) == []
    clock[0] = NOW + preemption.HOLD_MAX_S  # c0 still terminates (a finalizer): the hold ends anyway
    assert await _filter(client, late) == ["n"]


async def test_once_the_victims_are_gone_the_record_holds_for_the_grace_then_lapses(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    clock = [NOW + 5]
    cache = _restarted(_pending(), leases=[_lease(_record())])
    client = await make_client(cache, clock=lambda: clock[0])
    cache.apply("Pod", "DELETED", _bound("c0", card=0, deleting=True))
    late = _pending("late", gib=8, priority=0)
    assert await _filter(client, late) == []  # card 0 is free, but the preemptor is due on it
    assert await _filter(client, _pending()) == ["n"]  # the preemptor itself fits
    clock[0] += preemption.HOLD_GRACE_S
    assert await _filter(client, late) == ["n"]


async def test_a_record_on_a_node_kube_scheduler_did_not_pick_holds_nothing(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    # the victims named are all there and none is being deleted: no eviction happened on this node
    full = store.Store()
    full.replace_nodes([conftest.node("n", count=2, gib=16)])
    full.replace_leases([_lease(_record(victims=("uid-b1", "uid-d1")))])
    full.replace_pods([_bound("a0", card=0), _bound("b1", card=1), _bound("d1", card=1), _pending()])
    assert full.held_for("n", now=NOW + 1) == []
    full.put_pod(_bound("d1", card=1, deleting=True))
    assert [p["metadata"]["name"] for p in full.held_for("n", now=NOW + 1)] == ["boss"]


# --- writing the record -----------------------------------------------------------------------------


async def test_a_nomination_seen_is_recorded_and_a_restarted_extender_holds_from_it(
    make_client: Callable[..., Awaitable[Client]], apiserver: Any
) -> None:
    cache = store.Store()
    cache.replace_nodes([conftest.node("n", count=2, gib=16)])
    cache.replace_leases([])
    cache.replace_pods([_bound("a0", card=0), _bound("c0", card=0), _bound("b1", card=1), _bound("d1", card=1), _pending()])
    client = await make_client(cache)
    recorder = client.app[app.HOLDS]
    async with client.post(
        "/preempt",
        data=json.dumps(
            {"Pod": _pending(), "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "uid-c0"}, {"UID": "uid-d1"}]}}}
        ).encode(),
        headers={"Content-Type": "application/json"},
    ) as answer:
        victims = {pod["UID"] for pod in (await answer.json())["NodeNameToMetaVictims"]["n"]["Pods"]}
    # kube-scheduler deletes the victims and nominates the pod; the store tells the recorder
    for uid in victims:
        name = uid.removeprefix("uid-")
        cache.put_pod(_bound(name, card=0 if name.endswith("0") else 1, deleting=True))
    assert await recorder.record_nomination("uid-boss", "n") is False  # not nominated yet: nothing to write
    cache.put_pod(_pending(nominated="n"))
    assert await recorder.record_nomination("uid-boss", "n") is True
    lease = apiserver.leases[(NS, preemption.hold_lease_name("n"))]
    written = preemption.read_holds(lease["metadata"]["annotations"][preemption.HOLDS_ANNOTATION], node="n")["uid-boss"]
    assert written.victims == victims and written.priority == 1000 and written.at == NOW
    assert lease["metadata"]["labels"] == {gpu.LEDGER_LABEL: "true"} and lease["metadata"]["ownerReferences"][0]["kind"] == "Node"
    # restart: a fresh store lists the Lease; the nomination is cleared; one victim left, Terminating
    kept = sorted(victims)[0]
    fresh = store.Store()
    fresh.replace_nodes([conftest.node("n", count=2, gib=16)])
    fresh.replace_leases(list(apiserver.leases.values()))
    others = [_bound(n, card=0 if n.endswith("0") else 1) for n in ("a0", "c0", "b1", "d1") if f"uid-{n}" not in victims]
    name = kept.removeprefix("uid-")
    fresh.replace_pods([*others, _bound(name, card=0 if name.endswith("0") else 1, deleting=True), _pending()])
    assert await _filter(await make_client(fresh), _pending("late", gib=8, priority=0)) == []


async def test_two_writers_keep_each_others_records(make_client: Callable[..., Awaitable[Client]], apiserver: Any) -> None:
    first, second = store.Store(), store.Store()
    for cache in (first, second):
        cache.replace_nodes([conftest.node("n", count=2, gib=16)])
        cache.replace_leases([])
    one = holds.Recorder(apiserver, first, namespace=NS)
    two = holds.Recorder(apiserver, second, namespace=NS)
    await one.record(_record(uid="uid-one"), now=NOW)
    await two.record(_record(uid="uid-two"), now=NOW)  # its cache has not seen the Lease: create fails, it reads and replaces
    await one.record(_record(uid="uid-three"), now=NOW + 1)  # its copy is stale now: a 409, read again
    lease = apiserver.leases[(NS, preemption.hold_lease_name("n"))]
    assert set(preemption.read_holds(lease["metadata"]["annotations"][preemption.HOLDS_ANNOTATION], node="n")) == {
        "uid-one",
        "uid-two",
        "uid-three",
    }


# --- a second preemption while the first is under way -------------------------------------------


async def test_no_second_preemption_while_the_first_ones_victims_are_being_deleted(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    """At 500 nodes kube-scheduler called the verb again a second after its first answer, with other
    candidate nodes; answering them made it evict a second card on another node."""
    cache = store.Store()
    cache.replace_nodes([conftest.node("n", count=2, gib=16), conftest.node("m", count=2, gib=16)])
    cache.replace_leases([])
    on_m = [_bound(name, card=card, gib=16, node="m") for name, card in (("am", 0), ("bm", 1))]
    cache.replace_pods(
        [_bound("a0", card=0), _bound("c0", card=0), _bound("b1", card=1), _bound("d1", card=1), *on_m, _pending()]
    )
    client = await make_client(cache)

    async def preempt(offered: dict[str, list[str]]) -> dict[str, Any]:
        body = {
            "Pod": _pending(),
            "NodeNameToMetaVictims": {node: {"Pods": [{"UID": u} for u in uids]} for node, uids in offered.items()},
        }
        async with client.post(
            "/preempt", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        ) as answer:
            return dict((await answer.json())["NodeNameToMetaVictims"])

    first = await preempt({"n": ["uid-c0", "uid-d1"]})
    assert set(first) == {"n"}
    for pod in first["n"]["Pods"]:
        name = pod["UID"].removeprefix("uid-")
        cache.put_pod(_bound(name, card=0 if name.endswith("0") else 1, deleting=True))
    assert await preempt({"n": ["uid-c0"], "m": ["uid-am"]}) == {}  # n's eviction has begun: no second card anywhere
    # another preemptor is not held back by it: m is answered for it
    body = {"Pod": _pending("other"), "NodeNameToMetaVictims": {"m": {"Pods": [{"UID": "uid-am"}]}}}
    async with client.post("/preempt", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        assert set((await answer.json())["NodeNameToMetaVictims"]) == {"m"}


async def test_a_lease_whose_records_are_all_past_is_emptied(apiserver: Any) -> None:
    cache = store.Store()
    cache.replace_nodes([conftest.node("n", count=2, gib=16), conftest.node("m", count=2, gib=16)])
    cache.replace_leases([])
    clock = [NOW]
    recorder = holds.Recorder(apiserver, cache, namespace=NS, clock=lambda: clock[0])
    await recorder.record(_record(), now=NOW)
    await recorder.record(_record(uid="uid-late", node="m", at=NOW + 100), now=NOW + 100)
    clock[0] = NOW + preemption.HOLD_MAX_S  # n's one record is past; m's is not
    assert await recorder.tidy() == 1
    assert set(cache.hold_nodes()) == {"m"}
    lease = apiserver.leases[(NS, preemption.hold_lease_name("n"))]
    assert preemption.read_holds(lease["metadata"]["annotations"][preemption.HOLDS_ANNOTATION], node="n") == {}
    assert await recorder.tidy() == 0  # nothing left to empty: no write


def test_of_a_preemptors_records_on_several_nodes_only_the_newest_holds() -> None:
    cache = store.Store()
    cache.replace_nodes([conftest.node("n", count=2, gib=16), conftest.node("m", count=2, gib=16)])
    older = _record(at=NOW - 20)
    newer = _record(node="m", victims=("uid-am",), at=NOW - 10)
    cache.replace_leases([_lease(older), _lease(newer, node="m")])
    cache.replace_pods(
        [
            _bound("a0", card=0),
            _bound("c0", card=0, deleting=True),
            _bound("am", card=0, gib=16, node="m", deleting=True),
            _pending(),
        ]
    )
    assert cache.held_for("n", now=NOW) == [] and [p["metadata"]["name"] for p in cache.held_for("m", now=NOW)] == ["boss"]
    cache.apply("Lease", "DELETED", _lease(newer, node="m"))  # the Node m went, and its Lease with it
    assert [p["metadata"]["name"] for p in cache.held_for("n", now=NOW)] == ["boss"]


async def test_two_equal_preemptors_answered_the_same_card_are_free_to_preempt_again(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    """In e2e two preemptors created at once were both answered card 1 (the second call came 0.2 s
    after the first answer, before its victims were marked). Both nominated there, each holds card 1
    against the other (equal priority): one of them must preempt the other card. Victims gone mean
    nothing is under way: an empty answer then would leave the pod waiting for an event (a victim's
    deletion) that never comes."""
    cache = store.Store()
    cache.replace_nodes([conftest.node("n", count=2, gib=16)])
    cache.replace_leases([])
    cache.replace_pods(
        [
            _bound("a0", card=0),
            _bound("c0", card=0),
            _bound("b1", card=1),
            _bound("d1", card=1),
            _pending("boss-1"),
            _pending("boss-2"),
        ]
    )
    client = await make_client(cache)

    async def preempt(name: str) -> set[str]:
        body = {"Pod": _pending(name), "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "uid-c0"}, {"UID": "uid-d1"}]}}}
        async with client.post(
            "/preempt", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        ) as answer:
            return {pod["UID"] for entry in (await answer.json())["NodeNameToMetaVictims"].values() for pod in entry["Pods"]}

    first = await preempt("boss-1")
    assert await preempt("boss-2") == first  # the race: nothing is marked yet
    for uid in first:
        name = uid.removeprefix("uid-")
        cache.apply("Pod", "DELETED", _bound(name, card=0 if name.endswith("0") else 1))
    for name in ("boss-1", "boss-2"):
        cache.put_pod(_pending(name, nominated="n"))
    await client.app[app.HOLDS].record_nomination("uid-boss-2", "n")  # what the recorder's loop does (no victim left: nothing)
    # the victims are gone: nothing is under way any more, and boss-1's nomination holds card 1 (or 0)
    # against boss-2, so boss-2 is answered the other card at once, not left waiting for an event
    assert await preempt("boss-2") == {"uid-a0", "uid-b1", "uid-c0", "uid-d1"} - first


async def test_a_pod_nominated_where_it_fits_now_preempts_nowhere_else(make_client: Callable[..., Awaitable[Client]]) -> None:
    """At 500 nodes kube-scheduler asked again after the first answer's victims had gone (before
    the pod's next attempt placed it), with other candidates: 3 of 20 preemptors evicted a second card."""
    cache = store.Store()
    cache.replace_nodes([conftest.node("n", count=2, gib=16), conftest.node("m", count=2, gib=16)])
    cache.replace_leases([])
    on_m = [_bound(name, card=card, gib=16, node="m") for name, card in (("am", 0), ("bm", 1))]
    cache.replace_pods(
        [_bound("b1", card=1), _bound("d1", card=1), *on_m, _pending(nominated="n")]
    )  # card 0 of n: its victims gone
    client = await make_client(cache)
    body = {"Pod": _pending(nominated="n"), "NodeNameToMetaVictims": {"m": {"Pods": [{"UID": "uid-am"}]}}}
    async with client.post("/preempt", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        assert (await answer.json())["NodeNameToMetaVictims"] == {}
    cache.put_pod(_bound("a0", card=0, gib=16))  # card 0 of n taken after all: m is answered
    async with client.post("/preempt", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        assert set((await answer.json())["NodeNameToMetaVictims"]) == {"m"}
