"""Bind with GPU budgets (`budgeting.Keeper`) on the watch cache: a namespace's budget Lease that
this process committed last needs no pod events to be read again, as the node's ledger Lease does
not (`binder._read`'s own-commit path); otherwise binds batched on one node wait for Bindings that
only come after the batch."""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

import pytest

from policies.gpu import budgets, reservations
from policies.settings import budgets as settings_budgets
from tests.unit.extender.test_extender_bind_cache import NOW, Feed, WatchedApiServer, _request
from webhook.extender import binder, budgeting

Factory = Any


@pytest.fixture
def server() -> WatchedApiServer:
    return WatchedApiServer()


def _keeper(server: WatchedApiServer, feed: Feed, *, memory: str) -> budgeting.Keeper:
    found = settings_budgets.budgets([{"name": "team", "namespaces": ["team-a"], "memory": memory}])
    return budgeting.Keeper(server, feed.store, budgeting.Fixed(found), clock=lambda: NOW)


def _charged(server: WatchedApiServer) -> int:
    """GiB the namespace holds as the apiserver stores it: its bound pods, and the entries of its
    budget Lease for pods not bound (yet)."""
    lease = server.leases[(reservations.LEDGER_NAMESPACE, budgets.lease_name("team-a"))]
    bound = {p["metadata"]["uid"]: p for p in server.pods.values() if p["spec"].get("nodeName")}
    held = sum(int(p["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"]) for p in bound.values())
    waiting = sum(e.charge.memory_mib for uid, e in budgets.lease_ledger(lease).items() if uid not in bound)
    return held + waiting // 1024


async def test_binds_batched_on_one_node_in_a_budgeted_namespace_need_no_pod_events(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(budgeting, "POD_CATCH_UP_S", 5.0)  # a wait would show in the run time
    monkeypatch.setattr(binder, "POD_CATCH_UP_S", 5.0)
    server.add_node(make_node("gpu-0"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=2)) for i in range(4)]
    feed = Feed(server, rng=random.Random(1), lag=0.0)  # nothing delivered after the list
    one = binder.Binder(server, clock=lambda: NOW, cache=feed.store, keeper=_keeper(server, feed, memory="6Gi"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await asyncio.gather(*(one.bind(_request(pod, "gpu-0")) for pod in pods))
    assert loop.time() - started < 1.0, "no waiting for our own Bindings' events"
    refused = [r.error for r in results if r.allocation is None]
    assert len(refused) == 1 and "NAMESPACE_BUDGET" in refused[0] and "6 GiB used + 2 GiB asked > 6 GiB" in refused[0]
    assert _charged(server) == 6
    assert server.calls.count("get_lease") == 0


async def test_a_budget_lease_another_replica_wrote_is_read_once_the_pod_watch_reaches_it(
    server: WatchedApiServer, make_node: Factory, make_gpu_pod: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(budgeting, "POD_CATCH_UP_S", 0.05)
    monkeypatch.setattr(binder, "POD_CATCH_UP_S", 0.05)
    server.add_node(make_node("gpu-0"))
    pods = [server.add_pod(make_gpu_pod(f"p{i}", mem=2)) for i in range(3)]
    first = Feed(server, rng=random.Random(1), lag=0.0)
    second = Feed(server, rng=random.Random(2), lag=0.0)
    a = binder.Binder(server, clock=lambda: NOW, cache=first.store, keeper=_keeper(server, first, memory="4Gi"))
    b = binder.Binder(server, clock=lambda: NOW, cache=second.store, keeper=_keeper(server, second, memory="4Gi"))
    assert (await a.bind(_request(pods[0], "gpu-0"))).error == ""
    second.deliver_all()
    assert (await b.bind(_request(pods[1], "gpu-0"))).error == ""
    # a's own commit is no longer the Lease's last one: a does not trust its copy without the
    # pod watch (here it never catches up, so a refuses and says why), and never over-spends.
    first.store.put_budget_lease(copy.deepcopy(server.leases[(reservations.LEDGER_NAMESPACE, budgets.lease_name("team-a"))]))
    refused = await a.bind(_request(pods[2], "gpu-0"))
    assert refused.allocation is None and "NAMESPACE_BUDGET" in refused.error
    assert _charged(server) == 4
