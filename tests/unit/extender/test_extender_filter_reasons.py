"""/filter keeps the reason codes of every node it turns away: the same sentences as before on the
wire, and a per-code counter on /metrics (the codes `gpu-admission explain` shows)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import test_utils, web

from webhook.extender import app, binder, store

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
    cache.replace_pods([])
    application = app.make_app(cache=cache, bind=binder.Binder(apiserver, clock=lambda: NOW), settings=app.Settings(clock=lambda: NOW))
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
