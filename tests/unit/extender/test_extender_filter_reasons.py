"""/filter keeps the reason codes of every node it turns away: the same sentences as before on the
wire, and a per-code counter on /metrics (the codes `gpu-admission explain` shows)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import test_utils, web

from policies.gpu import allocation as allocation_
from policies.gpu import cardrequest, cards
from webhook.extender import app, binder, placement, store

NOW = 1_800_000_000.0
Client = test_utils.TestClient[web.Request, web.Application]
Factory = Any


async def test_filter_counts_the_reason_codes_of_the_nodes_it_turns_away(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    for node in (make_node("gpu-0"), make_node("small", count=1, gib=2), make_node("topo", mode="topology")):
        apiserver.add_node(node)
    cache = store.Store()
    cache.replace_nodes(list(apiserver.nodes.values()))
    cache.replace_leases([])  # no ledger Leases yet
    cache.replace_pods([])
    application = app.make_app(
        cache=cache, bind=binder.Binder(apiserver, clock=lambda: NOW), settings=app.Settings(clock=lambda: NOW)
    )
    client = await aiohttp_client(application)
    body = {"Pod": make_gpu_pod(mem=4), "Nodes": None, "NodeNames": ["gpu-0", "small", "topo", "unknown"]}
    async with client.post("/filter", data=json.dumps(body), headers={"Content-Type": "application/json"}) as answer:
        result = await answer.json()
    assert result["NodeNames"] == ["gpu-0"]
    assert result["FailedAndUnresolvableNodes"]["topo"].startswith('node is in GPU mode "topology"')
    async with client.get("/metrics") as answer:
        text = await answer.text()
    assert 'gpu_admission_extender_filter_reasons_total{code="INSUFFICIENT_MEMORY"} 1' in text
    assert 'gpu_admission_extender_filter_reasons_total{code="MODE_MISMATCH"} 1' in text
    assert 'gpu_admission_extender_filter_reasons_total{code="NOT_CACHED"} 1' in text
    assert 'code="FRAGMENTED"' not in text


def test_a_verdict_without_reasons_is_the_same_verdict(make_node: Factory, make_gpu_pod: Factory) -> None:
    """prioritize and simulate ask for the verdict alone: it must never differ from filter's."""
    node = make_node("gpu-0", count=3, gib=16)
    topo = make_node("topo", mode="topology", count=4)
    pods = []
    for index, (mem, core) in enumerate(((10, 0), (12, 30), (12, 90))):
        allocation = allocation_.Allocation(
            uid=f"u{index}",
            namespace="ns",
            name=f"p{index}",
            node="gpu-0",
            cards=(index,),
            memory_gib=mem,
            core_percent=core,
            assumed_at=NOW,
        )
        pods.append(
            make_gpu_pod(
                f"p{index}",
                uid=f"u{index}",
                mem=mem,
                node_name="gpu-0",
                annotations=allocation_.bind_annotations(allocation, card_memory_gib=16),
            )
        )
    states = [cards.node_state(node, pods, now=NOW), cards.node_state(topo, [], now=NOW), cards.node_state(node, [], now=NOW)]
    requests = [cardrequest.Request(memory_gib=m, core_percent=c) for m in range(1, 20) for c in (0, 10, 50)]
    requests += [cardrequest.Request(cards=n) for n in range(1, 6)]
    for state in states:
        for wanted in requests:
            full = placement.evaluate(wanted, state, decide=False)
            bare = placement.evaluate(wanted, state, decide=False, explain=False)
            assert bare.verdict is full.verdict, (state.name, wanted)
            assert bare.reasons in ((), full.reasons)  # a cached refusal may keep its reasons; none is made up
            assert (full.reasons != ()) is (full.verdict is not placement.Verdict.FITS)
