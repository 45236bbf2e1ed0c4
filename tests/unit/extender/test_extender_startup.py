"""The start-up window: while the watch has not listed ResourceSlices and ResourceClaims once, a card
a DRA claim holds could look free, so filter offers no card (an error kube-scheduler retries). A
DRA API that is not served (404) is nothing to wait for."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import test_utils, web

from tests import dra_objects
from webhook.extender import app, binder, store

NOW = 1_800_000_000.0
Client = test_utils.TestClient[web.Request, web.Application]


def loaded(apiserver: Any, make_node: Any) -> store.Store:
    apiserver.add_node(make_node("gpu-0", count=2, gib=15, inventory=[15360, 15360]))
    cache = store.Store()
    cache.expect_dra()  # what the watch does when it starts
    cache.replace_nodes(list(apiserver.nodes.values()))
    cache.replace_leases([])
    cache.replace_pods([])
    return cache


async def _filter(client: Client, pod: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["gpu-0"]}).encode()
    async with client.post("/filter", data=body, headers={"Content-Type": "application/json"}) as answer:
        assert answer.status == 200
        found: dict[str, Any] = await answer.json()
        return found


async def test_filter_offers_no_card_until_slices_and_claims_are_listed(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, make_node: Any, make_gpu_pod: Any
) -> None:
    cache = loaded(apiserver, make_node)
    assert cache.synced and not cache.dra_synced
    client = await aiohttp_client(
        app.make_app(cache=cache, bind=binder.Binder(apiserver, cache=cache), settings=app.Settings(clock=lambda: NOW))
    )
    answer = await _filter(client, make_gpu_pod(mem=4))
    assert "still loading DRA ResourceSlices and ResourceClaims" in answer["Error"] and not answer["NodeNames"]
    async with client.get("/healthz") as probe:
        assert probe.status == 200  # readiness is about nodes, pods and ledgers; only filter waits
    cache.replace_slices([dra_objects.slice_for("gpu-0", ["GPU-0000", "GPU-0001"])])
    assert not cache.dra_synced  # the claims are not in yet
    cache.replace_claims([dra_objects.claim("train", namespace="ml", uid="c-1", allocated=("gpu-0", "gpu-0"))])
    assert cache.dra_synced
    answer = await _filter(client, make_gpu_pod(mem=4))
    assert answer["Error"] == "" and answer["NodeNames"] == ["gpu-0"]


def test_an_api_not_served_is_nothing_to_wait_for(apiserver: Any, make_node: Any) -> None:
    cache = loaded(apiserver, make_node)
    cache.not_served("ResourceSlice")
    assert not cache.dra_synced
    cache.not_served("ResourceClaim")
    assert cache.dra_synced


def test_a_store_without_a_dra_watch_waits_for_nothing() -> None:
    assert store.Store().dra_synced
