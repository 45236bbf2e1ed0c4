"""The ledger-freed stamp (`webhook.extender.nudge`): kube-scheduler retries pods the extender turned
away on a Node update; with the ledger in a Lease, cards that only the ledger (or the extender's
lagging cache) held come free with no such update, so the extender stamps the Node itself — only
after turning a pod away, at most once a second per node, and only where the store saw a free."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation, reservations
from tests.unit.extender.conftest import node, pod
from webhook.extender import nudge, store

NOW = 1_800_000_000.0
TTL = 120.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Stamps:
    def __init__(self, *, fail: bool = False) -> None:
        self.made: list[tuple[str, str]] = []
        self.fail = fail

    async def __call__(self, node_name: str, stamp: str) -> None:
        if self.fail:
            raise RuntimeError("apiserver down")
        self.made.append((node_name, stamp))


def nudger(stamps: Stamps, clock: Clock) -> nudge.Nudger:
    return nudge.Nudger(stamps, monotonic=clock, wall=lambda: NOW)


async def test_a_free_after_a_refusal_stamps_the_node_once_with_the_time() -> None:
    clock, stamps = Clock(), Stamps()
    n = nudger(stamps, clock)
    clock.now += 0.1
    n.freed("gpu-0")  # what the process before this one turned away is unknown: one stamp per node
    await n.stamp_due()
    assert stamps.made == [("gpu-0", allocation.timestamp(NOW))]
    clock.now += 5
    n.freed("gpu-0")
    assert n.due() == frozenset(), "nothing was turned away since the stamp: no Node write"
    n.refused()
    clock.now += 0.5
    n.freed("gpu-0")
    n.freed("gpu-1")
    await n.stamp_due()
    assert stamps.made[1:] == [("gpu-0", allocation.timestamp(NOW)), ("gpu-1", allocation.timestamp(NOW))]
    clock.now += 5
    n.freed("gpu-0")  # no pod turned away since the stamp: nothing waits for this free
    await n.stamp_due()
    assert len(stamps.made) == 3 and n.stamped == 3


async def test_stamps_of_one_node_are_a_second_apart() -> None:
    clock, stamps = Clock(), Stamps()
    n = nudger(stamps, clock)
    n.refused()
    n.freed("gpu-0")
    await n.stamp_due()
    clock.now += 0.2
    n.refused()
    n.freed("gpu-0")
    await n.stamp_due()
    assert len(stamps.made) == 1 and n.due() == {"gpu-0"}, "held back until a second has passed"
    clock.now += 0.8
    await n.stamp_due()
    assert len(stamps.made) == 2 and n.due() == frozenset()


async def test_run_stamps_what_falls_due_and_a_failed_stamp_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    stamps = Stamps(fail=True)
    n = nudge.Nudger(stamps, min_interval=0.01)
    task = asyncio.create_task(n.run())
    n.refused()
    n.freed("gpu-0")
    await asyncio.sleep(0.05)
    assert n.stamped == 0 and n.due() == frozenset() and "stamping gpu-0" in caplog.text
    stamps.fail = False
    n.refused()
    n.freed("gpu-0")
    await asyncio.sleep(0.05)
    task.cancel()
    assert [name for name, _ in stamps.made] == ["gpu-0"]


def _cache() -> tuple[store.Store, list[str]]:
    cache = store.Store()
    freed: list[str] = []
    cache.on_freed = freed.append
    cache.replace_nodes([node("gpu-0"), node("gpu-1")])
    cache.replace_pods([])
    cache.replace_leases([])
    return cache, freed


def _bound(name: str, *, node_name: str = "gpu-0", card: int = 0, phase: str = "Running", version: str = "5") -> dict[str, Any]:
    uid = f"uid-{name}"
    held = allocation.Allocation(
        uid=uid, namespace="team-a", name=name, node=node_name, cards=(card,), memory_gib=4, assumed_at=NOW
    )
    bound = pod(
        name, mem=4, node_name=node_name, uid=uid, phase=phase, annotations=allocation.bind_annotations(held, card_memory_gib=15)
    )
    bound["metadata"]["resourceVersion"] = version
    return bound


def test_the_store_reports_a_free_when_a_counted_pod_is_deleted_or_finishes_not_when_one_binds() -> None:
    cache, freed = _cache()
    pending = pod("a", mem=4, uid="uid-a")
    cache.apply("Pod", "ADDED", pending)
    cache.apply("Pod", "MODIFIED", _bound("a", version="6"))  # bound: cards taken, none freed
    cache.apply("Pod", "MODIFIED", _bound("a", version="7"))  # nothing kept changed
    assert freed == []
    cache.apply("Pod", "MODIFIED", _bound("a", phase="Succeeded", version="8"))
    assert freed == ["gpu-0"]
    cache.apply("Pod", "DELETED", _bound("a", phase="Succeeded", version="9"))
    assert freed == ["gpu-0"], "a finished pod held nothing any more"
    cache.apply("Pod", "ADDED", _bound("b", node_name="gpu-1", version="10"))
    cache.apply("Pod", "DELETED", _bound("b", node_name="gpu-1", version="11"))
    assert freed == ["gpu-0", "gpu-1"]
    cache.apply("Pod", "DELETED", pod("never-bound", mem=4))
    assert freed == ["gpu-0", "gpu-1"], "an unbound pod held no card"
    cpu = pod("cpu-only", node_name="gpu-1")
    cache.apply("Pod", "ADDED", cpu)
    cache.apply("Pod", "DELETED", {**cpu, "metadata": {**cpu["metadata"], "resourceVersion": "12"}})
    assert freed == ["gpu-0", "gpu-1"], "a pod of no card frees none: the node is not stamped for it"


def test_the_store_reports_a_free_when_ledger_entries_leave_the_lease() -> None:
    cache, freed = _cache()
    entry = allocation.Allocation(
        uid="uid-x", namespace="team-a", name="x", node="gpu-0", cards=(1,), memory_gib=4, assumed_at=NOW, expires=NOW + TTL
    )
    lease = reservations.lease_body("gpu-0", "node-uid", {"uid-x": entry}, "test")
    lease["metadata"]["resourceVersion"] = "20"
    cache.apply("Lease", "ADDED", lease)
    assert freed == [], "a new entry takes cards"
    pruned = reservations.lease_body("gpu-0", "node-uid", {}, "test")
    pruned["metadata"]["resourceVersion"] = "21"
    cache.apply("Lease", "MODIFIED", pruned)
    assert freed == ["gpu-0"]
    again = reservations.lease_body("gpu-0", "node-uid", {"uid-x": entry}, "test")
    again["metadata"]["resourceVersion"] = "22"
    cache.apply("Lease", "MODIFIED", again)
    cache.apply("Lease", "DELETED", {**again, "metadata": {**again["metadata"], "resourceVersion": "23"}})
    assert freed == ["gpu-0", "gpu-0"]


def test_the_store_reports_a_reservation_that_lapses_without_any_event() -> None:
    cache, freed = _cache()
    entry = allocation.Allocation(
        uid="uid-x", namespace="team-a", name="x", node="gpu-0", cards=(1,), memory_gib=4, assumed_at=NOW, expires=NOW + 30
    )
    old_ledger = node("gpu-0", annotations={gpu.RESERVATIONS_ANNOTATION: reservations.encode({"uid-x": entry})})
    old_ledger["metadata"]["resourceVersion"] = "30"
    cache.apply("Node", "MODIFIED", old_ledger)  # an earlier version's Node ledger: never pruned, only lapses
    assert cache.state("gpu-0", now=NOW, ttl=TTL) is not None
    assert cache.lapsed(now=NOW + 1) == [] and freed == []
    assert cache.lapsed(now=NOW + 30) == ["gpu-0"]
    cache.state("gpu-0", now=NOW + 30, ttl=TTL)
    assert freed == ["gpu-0"] and cache.lapsed(now=NOW + 31) == []


async def test_a_filter_that_turns_a_pod_away_and_a_pod_deleted_after_it_stamp_the_node(
    aiohttp_client: Any, apiserver: Any
) -> None:
    """Inside the app: a free before any pod was turned away stamps nothing; a pod that fits
    nowhere, then the pod holding the card goes: the Node is stamped."""
    from webhook.extender import app, binder

    cache = store.Store()
    cache.replace_nodes([node("small", count=1, gib=4)])
    cache.replace_leases([])
    cache.replace_pods([_bound("holder", node_name="small", version="5")])
    stamps = Stamps()
    clock = Clock()
    nudger_ = nudge.Nudger(stamps, min_interval=0.0, monotonic=clock)
    clock.now += 1  # long after the start: only a refusal makes a free worth a stamp
    application = app.make_app(
        cache=cache, bind=binder.Binder(apiserver, cache=cache), nudger=nudger_, settings=app.Settings(clock=lambda: NOW)
    )
    client = await aiohttp_client(application)

    async def filter_(mem: int) -> dict[str, Any]:
        body = {"Pod": pod("wants", mem=mem), "Nodes": None, "NodeNames": ["small"]}
        async with client.post("/filter", json=body) as answer:
            found: dict[str, Any] = await answer.json()
            return found

    cache.apply("Pod", "DELETED", _bound("other", node_name="small", version="6"))  # not counted: unknown pod
    await asyncio.sleep(0.02)
    assert stamps.made == [], "nothing was turned away yet"
    clock.now += 1
    answer = await filter_(4)
    assert "small" in answer["FailedNodes"], answer
    clock.now += 1
    cache.apply("Pod", "DELETED", _bound("holder", node_name="small", version="7"))
    for _ in range(50):
        if stamps.made:
            break
        await asyncio.sleep(0.01)
    assert [name for name, _ in stamps.made] == ["small"]
