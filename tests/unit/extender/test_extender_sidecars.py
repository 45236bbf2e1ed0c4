"""The extender counts a pod's GPU ask as kube-scheduler does: sidecars add up, spellings are values."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import test_utils, web

from policies import gpu
from policies.gpu import cardrequest, cards
from webhook.extender import app, binder, store

NOW = 1_800_000_000.0
Client = test_utils.TestClient[web.Request, web.Application]
Factory = Any


def with_sidecar(pod: dict[str, Any], gib: int | str) -> dict[str, Any]:
    pod["spec"]["initContainers"] = [
        {
            "name": "proxy",
            "image": "proxy:1",
            "restartPolicy": "Always",
            "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}},
        }
    ]
    return pod


def second_container(gib: int) -> dict[str, Any]:
    return {"name": "second", "image": "app:1", "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}}}


@pytest.fixture
def cache(apiserver: Any, make_node: Factory) -> store.Store:
    apiserver.add_node(make_node("two-cards", count=2, gib=15))
    apiserver.add_node(make_node("one-card", count=1, gib=15))
    filled = store.Store()
    filled.replace_nodes(list(apiserver.nodes.values()))
    filled.replace_leases([])  # no ledger Leases yet
    filled.replace_pods([])
    return filled


@pytest.fixture
async def client(aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, cache: store.Store) -> Client:
    settings = app.Settings(clock=lambda: NOW)
    return await aiohttp_client(
        app.make_app(cache=cache, bind=binder.Binder(apiserver, clock=lambda: NOW, cache=cache), settings=settings)
    )


async def post(client: Client, path: str, body: object) -> Any:
    async with client.post(path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        assert answer.status == 200
        return await answer.json()


async def bind(client: Client, apiserver: Any, pod: dict[str, Any], node: str) -> str:
    stored = apiserver.add_pod(pod)
    meta = stored["metadata"]
    answer = await post(
        client, "/bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    )
    return str(answer["Error"])


def test_a_sidecar_and_a_main_container_of_4_gib_ask_for_8(make_gpu_pod: Factory) -> None:
    assert cardrequest.pod_request(with_sidecar(make_gpu_pod(mem=4), 4)) == cardrequest.Request(memory_gib=8)


def test_an_ordinary_init_container_still_takes_the_maximum(make_gpu_pod: Factory) -> None:
    pod = make_gpu_pod(mem=4)
    pod["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {"aliyun.com/gpu-mem": "6"}}}]

    assert cardrequest.pod_request(pod) == cardrequest.Request(memory_gib=6)


@pytest.mark.parametrize(("spelling", "gib"), [("2000m", 2), ("+2", 2), ("2e0", 2), ("0.002k", 2), ("1k", 1000)])
def test_odd_spellings_are_read_as_the_cluster_reads_them(make_gpu_pod: Factory, spelling: str, gib: int) -> None:
    assert cardrequest.pod_request(make_gpu_pod(mem=spelling)) == cardrequest.Request(memory_gib=gib)


@pytest.mark.parametrize("spelling", ["1500m", "-2", "1kk", "4 Gi"])
def test_what_the_cluster_cannot_store_as_a_whole_number_fits_nowhere(make_gpu_pod: Factory, spelling: str) -> None:
    assert "not a whole non-negative number" in cardrequest.pod_request(make_gpu_pod(mem=spelling)).problem


def test_node_capacity_is_read_with_the_same_parser(make_node: Factory) -> None:
    model = cards.node_cards(make_node(capacity={"aliyun.com/gpu-mem": "30000m", "aliyun.com/gpu-count": "+2"}))

    assert [card.memory_gib for card in model.cards] == [15, 15]


async def test_filter_lets_an_8_gib_sidecar_pod_onto_a_15_gib_card(client: Client, make_gpu_pod: Factory) -> None:
    answer = await post(
        client, "/filter", {"Pod": with_sidecar(make_gpu_pod(mem=4), 4), "Nodes": None, "NodeNames": ["two-cards", "one-card"]}
    )

    assert answer["NodeNames"] == ["two-cards", "one-card"]


async def test_filter_refuses_two_8_gib_containers_on_15_gib_cards(client: Client, make_gpu_pod: Factory) -> None:
    # 16 GiB on one card (gpushare semantics): no 15 GiB card holds it, though the node has 30.
    pod = make_gpu_pod(mem=8, extra_containers=[second_container(8)])

    answer = await post(client, "/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["two-cards", "one-card"]})

    assert answer["NodeNames"] == []
    assert set(answer["FailedAndUnresolvableNodes"]) == {"two-cards", "one-card"}
    assert "16 GiB" in answer["FailedAndUnresolvableNodes"]["two-cards"]


async def test_bind_allocates_the_summed_amount_on_one_card(client: Client, apiserver: Any, make_gpu_pod: Factory) -> None:
    assert await bind(client, apiserver, with_sidecar(make_gpu_pod("mesh", mem=4), 4), "one-card") == ""

    annotations = apiserver.pods[("team-a", "mesh")]["metadata"]["annotations"]
    assert annotations[gpu.GPUSHARE_MEM_POD_ANNOTATION] == "8"
    assert json.loads(annotations[gpu.ALLOCATION_ANNOTATION])["memGiB"] == 8
    # 7 GiB are left on the card: a second 8 GiB sidecar pod no longer fits, a 7 GiB pod does.
    refused = await post(
        client, "/filter", {"Pod": with_sidecar(make_gpu_pod("again", mem=4), 4), "Nodes": None, "NodeNames": ["one-card"]}
    )
    fits = await post(client, "/filter", {"Pod": make_gpu_pod("small", mem=7), "Nodes": None, "NodeNames": ["one-card"]})
    assert refused["NodeNames"] == [] and fits["NodeNames"] == ["one-card"]


async def test_bind_refuses_two_8_gib_containers_on_a_15_gib_card(client: Client, apiserver: Any, make_gpu_pod: Factory) -> None:
    error = await bind(client, apiserver, make_gpu_pod("pair", mem=8, extra_containers=[second_container(8)]), "two-cards")

    assert "no GPU card is large enough" in error
    assert "nodeName" not in apiserver.pods[("team-a", "pair")]["spec"]


async def test_a_2000m_pod_is_bound_exactly_like_a_2_gib_pod(client: Client, apiserver: Any, make_gpu_pod: Factory) -> None:
    assert await bind(client, apiserver, make_gpu_pod("odd", mem="2000m"), "one-card") == ""
    assert await bind(client, apiserver, make_gpu_pod("plain", mem="2"), "two-cards") == ""

    odd = apiserver.pods[("team-a", "odd")]["metadata"]["annotations"]
    plain = apiserver.pods[("team-a", "plain")]["metadata"]["annotations"]
    assert odd[gpu.GPUSHARE_MEM_POD_ANNOTATION] == plain[gpu.GPUSHARE_MEM_POD_ANNOTATION] == "2"
    assert odd[gpu.GPUSHARE_MEM_IDX_ANNOTATION] == plain[gpu.GPUSHARE_MEM_IDX_ANNOTATION] == "0"


def test_the_watch_cache_keeps_what_the_request_rule_reads(make_gpu_pod: Factory) -> None:
    # bind reads the cache's slimmed copy: without restartPolicy a sidecar would count once again.
    pod = with_sidecar(make_gpu_pod(mem=4), 4)
    pod["spec"]["initContainers"].append({"name": "setup", "image": "s:1", "resources": {"limits": {"aliyun.com/gpu-mem": "6"}}})
    pod["spec"]["overhead"] = {"aliyun.com/gpu-mem": "1"}

    slim = store.slim_pod(pod)

    assert cardrequest.pod_request(slim) == cardrequest.pod_request(pod) == cardrequest.Request(memory_gib=11)


async def test_bind_from_the_watch_cache_allocates_the_summed_amount(
    client: Client, apiserver: Any, cache: store.Store, make_gpu_pod: Factory
) -> None:
    stored = apiserver.add_pod(with_sidecar(make_gpu_pod("cached", mem=4), 4))
    cache.replace_leases([])  # no ledger Leases yet
    cache.replace_pods([stored])
    meta = stored["metadata"]

    answer = await post(
        client, "/bind", {"PodName": "cached", "PodNamespace": "team-a", "PodUID": meta["uid"], "Node": "one-card"}
    )

    assert answer["Error"] == ""
    assert apiserver.pods[("team-a", "cached")]["metadata"]["annotations"][gpu.GPUSHARE_MEM_POD_ANNOTATION] == "8"
