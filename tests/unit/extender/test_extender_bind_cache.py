"""Bind from the watch cache (issue 19): no apiserver reads when the pod watch has caught up with
the ledger Lease's version, the GET and LIST of the protocol when it has not, and no
over-commitment with replicas whose caches lag each by its own amount, or a replica restarted
mid-burst."""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

import pytest

from policies import gpu
from tests.unit.extender.conftest import FakeApiServer
from webhook.extender import binder, wire
from webhook.extender import store as store_module

NOW = 1_800_000_000.0
Factory = Any
Object = dict[str, Any]


class WatchedApiServer(FakeApiServer):
    """The in-memory apiserver, also recording the watch events its writes cause."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, Object]] = []

    def add_node(self, obj: Object) -> Object:
        stored = super().add_node(obj)
        self.events.append(("Node", "ADDED", copy.deepcopy(stored)))
        return stored

    def add_pod(self, obj: Object) -> Object:
        stored = super().add_pod(obj)
        self.events.append(("Pod", "ADDED", copy.deepcopy(stored)))
        return stored

    def touch_node(self, name: str) -> None:
        super().touch_node(name)
        self.events.append(("Node", "MODIFIED", copy.deepcopy(self.nodes[name])))

    async def create_lease(self, namespace: str, body: Any) -> Object:
        lease = await super().create_lease(namespace, body)
        self.events.append(("Lease", "ADDED", copy.deepcopy(lease)))
        return lease

    async def replace_lease(self, namespace: str, name: str, body: Any) -> Object:
        lease = await super().replace_lease(namespace, name, body)
        self.events.append(("Lease", "MODIFIED", copy.deepcopy(lease)))
        return lease

    async def bind(self, namespace: str, name: str, *, uid: str, node: str, annotations: Any) -> None:
        await super().bind(namespace, name, uid=uid, node=node, annotations=annotations)
        self.events.append(("Pod", "MODIFIED", copy.deepcopy(self.pods[(namespace, name)])))

    def version(self) -> str:
        every = [*self.nodes.values(), *self.pods.values(), *self.leases.values()]
        return str(max(int(o["metadata"]["resourceVersion"]) for o in every))


class Feed:
    """One replica's watches: a Store listed from the apiserver, then fed the Node, Pod and Lease
    events as three streams (as the three watches are), each in order, each event after a random
    number of event-loop turns (each watch's own lag; the Leases' lag as the pods' unless told)."""

    def __init__(
        self, server: WatchedApiServer, *, rng: random.Random, lag: float, node_lag: float = 0.0, lease_lag: float | None = None
    ) -> None:
        self.server = server
        self.store = store_module.Store()
        self.store.replace_nodes(copy.deepcopy(list(server.nodes.values())))
        self.store.replace_pods(copy.deepcopy(list(server.pods.values())))
        self.store.replace_leases(copy.deepcopy(list(server.leases.values())))
        self.store.seen("Pod", server.version())
        self.store.seen("Lease", server.version())
        self.delivered = {"Node": len(server.events), "Pod": len(server.events), "Lease": len(server.events)}
        self.rng = rng
        self.lag = {"Node": node_lag, "Pod": lag, "Lease": lag if lease_lag is None else lease_lag}
        self.task: asyncio.Task[None] | None = None

    def deliver_all(self) -> None:
        for kind in self.delivered:
            while self._next(kind):
                pass

    def _next(self, kind: str) -> bool:
        events = self.server.events
        while self.delivered[kind] < len(events) and events[self.delivered[kind]][0] != kind:
            self.delivered[kind] += 1
        if self.delivered[kind] >= len(events):
            return False
        _, event, obj = events[self.delivered[kind]]
        self.store.apply(kind, event, copy.deepcopy(obj))
        self.delivered[kind] += 1
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0)
            for kind, lag in self.lag.items():
                if self.rng.random() > lag:
                    self._next(kind)

    def __enter__(self) -> Feed:
        self.task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self.task is not None
        self.task.cancel()


@pytest.fixture
def server() -> WatchedApiServer:
    return WatchedApiServer()


def _request(obj: Object, node: str) -> wire.BindRequest:
    meta = obj["metadata"]
    return wire.BindRequest(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], node=node)


async def _later(one: binder.Binder, request: wire.BindRequest, *, turns: int) -> binder.BindResult:
    """A bind that arrives after `turns` event-loop turns (kube-scheduler's binds trickle in)."""
    for _ in range(turns):
        await asyncio.sleep(0)
    return await one.bind(request)


async def test_a_bind_on_a_current_cache_makes_two_writes_and_no_reads(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any
) -> None:
    server.add_node(make_node("gpu-0"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=4)) for i in range(3)]
    feed = Feed(server, rng=random.Random(1), lag=0.0)
    one = binder.Binder(server, clock=lambda: NOW, cache=feed.store)
    for pod in pods:
        feed.deliver_all()  # the watch has caught up between binds
        result = await one.bind(_request(pod, "gpu-0"))
        assert result.error == "" and result.allocation is not None
    assert server.calls == ["create_lease", "bind", "replace_lease", "bind", "replace_lease", "bind"]
    assert used_per_card(server, "gpu-0", now=NOW) == [12, 0, 0, 0]


async def test_a_pod_cache_behind_the_node_makes_bind_read_from_the_apiserver(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binder, "POD_CATCH_UP_S", 0.01)
    server.add_node(make_node("gpu-0"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=8)) for i in range(2)]
    feed = Feed(server, rng=random.Random(1), lag=0.0)
    # Another replica bound p0 and the watch has not delivered its events yet.
    other = binder.Binder(server, clock=lambda: NOW)
    assert (await other.bind(_request(pods[0], "gpu-0"))).error == ""
    lease = next(iter(server.leases.values()))
    feed.store.apply("Lease", "ADDED", copy.deepcopy(lease))  # the Lease event came, the pod's did not
    server.calls.clear()
    result = await binder.Binder(server, clock=lambda: NOW, cache=feed.store).bind(_request(pods[1], "gpu-0"))
    assert result.allocation is not None and result.allocation.cards == (1,), "p0's 8 GiB on card 0 leave it 7"
    assert server.calls == ["get_lease", "list_node_pods", "replace_lease", "bind"]
    assert used_per_card(server, "gpu-0", now=NOW) == [8, 8, 0, 0]


async def test_a_node_heartbeat_the_cache_has_not_seen_costs_nothing(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory
) -> None:
    server.add_node(make_node("gpu-0"))
    (pod,) = [server.add_pod(make_gpu_pod("p0", mem=8))]
    feed = Feed(server, rng=random.Random(1), lag=0.0)
    server.touch_node("gpu-0")  # a heartbeat the watch has not delivered
    result = await binder.Binder(server, clock=lambda: NOW, cache=feed.store).bind(_request(pod, "gpu-0"))
    assert result.error == "" and result.conflicts == 0
    assert server.calls == ["create_lease", "bind"]


async def test_a_lease_the_cache_has_not_seen_costs_a_conflict_and_a_fresh_read(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binder, "POD_CATCH_UP_S", 0.01)
    server.add_node(make_node("gpu-0"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=8)) for i in range(3)]
    feed = Feed(server, rng=random.Random(1), lag=0.0)
    other = binder.Binder(server, clock=lambda: NOW)  # another replica creates the Lease, then writes it again
    for pod in pods[:2]:
        assert (await other.bind(_request(pod, "gpu-0"))).error == ""
    server.calls.clear()
    result = await binder.Binder(server, clock=lambda: NOW, cache=feed.store).bind(_request(pods[2], "gpu-0"))
    assert result.error == "" and result.conflicts == 1
    assert server.calls == ["create_lease", "get_lease", "list_node_pods", "replace_lease", "bind"]
    assert used_per_card(server, "gpu-0", now=NOW) == [8, 8, 8, 0]


@pytest.mark.parametrize("seed", range(6))
async def test_replicas_with_lagging_caches_never_over_commit(
    server: WatchedApiServer,
    make_node: Factory,
    make_gpu_pod: Factory,
    used_per_card: Any,
    seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(binder, "POD_CATCH_UP_S", 0.002)
    server.add_node(make_node("gpu-0"))
    server.add_node(make_node("gpu-1", placement="spread"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=5)) for i in range(60)]
    rng = random.Random(seed)
    with Feed(server, rng=random.Random(seed + 100), lag=0.3) as a, Feed(server, rng=random.Random(seed + 200), lag=0.9) as b:
        replicas = [
            binder.Binder(server, clock=lambda: NOW, cache=a.store),
            binder.Binder(server, clock=lambda: NOW, cache=b.store),
        ]
        results = await asyncio.gather(
            *(
                _later(replicas[i % 2], _request(p, rng.choice(["gpu-0", "gpu-1"])), turns=rng.randrange(200))
                for i, p in enumerate(pods)
            )
        )
    assert sum(1 for r in results if not r.error) == 24  # 3 x 5 GiB per card, 8 cards
    assert used_per_card(server, "gpu-0", now=NOW) == [15, 15, 15, 15]
    assert used_per_card(server, "gpu-1", now=NOW) == [15, 15, 15, 15]
    assert "get_lease" not in server.calls[: server.calls.index("bind")], "the first commits came from the cache"
    assert not any(event[0] == "Node" for event in server.events[2:]), "no Node was written"


async def test_the_lagging_replica_test_catches_a_cache_trusted_blindly(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above has teeth: a binder that trusted its pod cache without comparing versions
    over-commits on the same burst. Conflict backoffs are event-loop turns here, not wall-clock
    sleeps, so the interleaving (and the over-commit) does not depend on the machine's load."""

    async def always(self: store_module.Store, version: int, *, timeout: float) -> bool:
        return True

    monkeypatch.setattr(store_module.Store, "wait_for_pods", always)
    monkeypatch.setattr(binder, "_BACKOFF_S", 0.0)
    server.add_node(make_node("gpu-0"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=5)) for i in range(40)]
    with Feed(server, rng=random.Random(3), lag=0.3) as a, Feed(server, rng=random.Random(4), lag=0.95) as b:
        replicas = [
            binder.Binder(server, clock=lambda: NOW, cache=a.store),
            binder.Binder(server, clock=lambda: NOW, cache=b.store),
        ]
        rng = random.Random(5)
        await asyncio.gather(
            *(_later(replicas[i % 2], _request(p, "gpu-0"), turns=rng.randrange(200)) for i, p in enumerate(pods))
        )
    assert max(used_per_card(server, "gpu-0", now=NOW)) > 15


async def test_a_replica_restarted_mid_burst_never_over_commits(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any
) -> None:
    server.add_node(make_node("gpu-0"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=5)) for i in range(30)]
    with Feed(server, rng=random.Random(5), lag=0.5) as first:
        before = binder.Binder(server, clock=lambda: NOW, cache=first.store)
        rng = random.Random(7)
        done = await asyncio.gather(*(_later(before, _request(p, "gpu-0"), turns=rng.randrange(100)) for p in pods[:7]))
    assert sum(1 for r in done if not r.error) == 7
    with Feed(server, rng=random.Random(6), lag=0.5) as second:  # a new process: listed afresh, nothing else
        after = binder.Binder(server, clock=lambda: NOW, cache=second.store)
        results = await asyncio.gather(*(_later(after, _request(p, "gpu-0"), turns=rng.randrange(100)) for p in pods[7:]))
    assert sum(1 for r in results if not r.error) == 5
    assert used_per_card(server, "gpu-0", now=NOW) == [15, 15, 15, 15]


async def test_wait_for_pods_follows_events_and_bookmarks() -> None:
    cache = store_module.Store()
    assert cache.pods_version == -1
    cache.replace_pods([])
    cache.seen("Pod", "10")
    assert await cache.wait_for_pods(10, timeout=0.0)
    assert not await cache.wait_for_pods(11, timeout=0.0)
    waiting = asyncio.create_task(cache.wait_for_pods(12, timeout=5.0))
    await asyncio.sleep(0)
    cache.apply("Pod", "ADDED", {"metadata": {"uid": "u", "name": "p", "namespace": "n", "resourceVersion": "11"}, "spec": {}})
    await asyncio.sleep(0)
    assert not waiting.done()
    cache.seen("Pod", "12")  # a bookmark
    assert await waiting is True
    cache.seen("Node", "99")
    cache.seen("Pod", "not-a-number")
    assert cache.pods_version == 12
    cache.replace_pods([])  # a relist: unknown until its version is seen
    assert cache.pods_version == -1


async def test_binds_after_our_own_commit_need_no_pod_events_and_a_relist_forgets_that(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binder, "POD_CATCH_UP_S", 5.0)  # a wait would show in the run time
    server.add_node(make_node("gpu-0"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=6)) for i in range(4)]
    feed = Feed(server, rng=random.Random(1), lag=0.0)  # nothing delivered after the list
    one = binder.Binder(server, clock=lambda: NOW, cache=feed.store)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for pod in pods[:3]:
        assert (await one.bind(_request(pod, "gpu-0"))).error == ""
    assert loop.time() - started < 1.0, "no waiting for our own Bindings' events"
    assert server.calls == ["create_lease", "bind", "replace_lease", "bind", "replace_lease", "bind"]
    lease = next(iter(server.leases.values()))
    assert feed.store.pods_version < int(lease["metadata"]["resourceVersion"])
    assert used_per_card(server, "gpu-0", now=NOW) == [12, 6, 0, 0]
    feed.store.replace_pods(copy.deepcopy(list(server.pods.values())))  # a relist, its version not seen yet
    monkeypatch.setattr(binder, "POD_CATCH_UP_S", 0.01)
    server.calls.clear()
    assert (await one.bind(_request(pods[3], "gpu-0"))).allocation is not None
    assert server.calls == ["get_lease", "list_node_pods", "replace_lease", "bind"]
    assert used_per_card(server, "gpu-0", now=NOW) == [12, 12, 0, 0]


async def test_a_pod_cache_behind_an_earlier_versions_node_ledger_reads_from_the_apiserver(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, used_per_card: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upgrade: the Node-ledger version bound p0 and pruned its entry from the Node annotation. A
    cache that has that Node but not p0's Binding yet must not decide on it (p0's card would look free)."""
    monkeypatch.setattr(binder, "POD_CATCH_UP_S", 0.01)
    server.add_node(make_node("gpu-0", count=1))
    first, second = (server.add_pod(make_gpu_pod(f"p{i}", mem=10)) for i in range(2))
    feed = Feed(server, rng=random.Random(1), lag=0.0)
    # What the earlier version did: p0 bound with its annotations, its ledger entry pruned ("{}").
    await server.bind(
        "team-a",
        "p0",
        uid=first["metadata"]["uid"],
        node="gpu-0",
        annotations={
            gpu.ALLOCATION_ANNOTATION: '{"node":"gpu-0","cards":[0],"memGiB":10,"corePercent":0,"whole":false,"assumedAt":"2027-01-15T08:00:00.000Z"}',
        },
    )
    server.nodes["gpu-0"]["metadata"].setdefault("annotations", {})[gpu.RESERVATIONS_ANNOTATION] = "{}"
    server.touch_node("gpu-0")
    feed.store.apply("Node", "MODIFIED", copy.deepcopy(server.nodes["gpu-0"]))  # the Node came, p0's Binding did not
    server.calls.clear()
    result = await binder.Binder(server, clock=lambda: NOW, cache=feed.store).bind(_request(second, "gpu-0"))
    assert "insufficient GPU memory" in result.error, "p0 holds 10 of the card's 15 GiB"
    assert server.calls == ["get_lease", "list_node_pods"]
    assert used_per_card(server, "gpu-0", now=NOW) == [10]
