"""Card-model constraints (GPU102's annotations) hold for the card the extender picks.

The node is the labeler's mixed node: 2 x Tesla-V100-SXM2-16GB (16160 MiB, 15 GiB to share) and
2 x Tesla-V100-SXM2-32GB (32510 MiB, 31 GiB), described card by card in its inventory annotation.
Its labels say what a node-level rule would see: the most common model (a tie, so the first name,
the 16 GB card) and the smallest card (16160 MiB).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import test_utils, web

from policies import gpu
from policies.gpu import cardrequest, cards, reasons
from webhook.extender import app, binder, placement, store

NOW = 1_800_000_000.0
Client = test_utils.TestClient[web.Request, web.Application]
Factory = Any

V100_16 = "Tesla-V100-SXM2-16GB"
V100_32 = "Tesla-V100-SXM2-32GB"
MIXED = [(V100_16, 16160), (V100_16, 16160), (V100_32, 32510), (V100_32, 32510)]


def mixed_node(make_node: Factory, name: str = "mixed", *, mode: str = "cgpu") -> dict[str, Any]:
    inventory = [{"index": i, "uuid": f"GPU-{i:04d}", "name": model, "memoryMiB": mib} for i, (model, mib) in enumerate(MIXED)]
    obj: dict[str, Any] = make_node(
        name,
        mode=mode,
        count=4,
        capacity=({"aliyun.com/gpu": "4"} if mode == "topology" else {"aliyun.com/gpu-mem": "92", "aliyun.com/gpu-count": "4"}),
        annotations={gpu.INVENTORY_ANNOTATION: json.dumps(inventory)},
    )
    obj["metadata"]["labels"].update(
        {gpu.CARD_NAME_LABEL: V100_16, gpu.CARD_MEMORY_MIB_LABEL: "16160", gpu.CARD_COUNT_LABEL: "4"}
    )
    return obj


def state_of(node: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> cards.NodeState:
    return cards.node_state(node, pods or [], now=NOW)


# --- placement, pure --------------------------------------------------------------------------------


def test_a_16gb_model_pod_asking_20_gib_never_fits_the_mixed_node(make_node: Factory, make_gpu_pod: Factory) -> None:
    pod = make_gpu_pod(mem=20, annotations={gpu.GPU_MODEL_ANNOTATION: V100_16})

    fit = placement.evaluate(cardrequest.pod_request(pod), state_of(mixed_node(make_node)))

    assert fit.verdict is placement.Verdict.NEVER
    assert fit.codes == (reasons.Code.CARD_MODEL,)
    assert fit.message == (
        "no GPU card that meets the pod's card-model constraint is large enough: the pod needs 20 GiB "
        "(aliyun.com/gpu-mem) on one card, and card model Tesla-V100-SXM2-16GB (gpu-admission.io/gpu-model); "
        "the largest such card is GPU0 with 15 GiB (the node has GPU0, GPU1 Tesla-V100-SXM2-16GB with 16160 MiB; "
        "GPU2, GPU3 Tesla-V100-SXM2-32GB with 32510 MiB)"
    )


def test_without_the_model_the_same_pod_takes_a_32gb_card(make_node: Factory, make_gpu_pod: Factory) -> None:
    fit = placement.evaluate(cardrequest.pod_request(make_gpu_pod(mem=20)), state_of(mixed_node(make_node)))

    assert fit.fits and fit.cards == (2,)


def test_a_min_20gi_pod_asking_4_gib_is_placed_on_a_32gb_card(make_node: Factory, make_gpu_pod: Factory) -> None:
    pod = make_gpu_pod(mem=4, annotations={gpu.MIN_GPU_MEMORY_ANNOTATION: "20Gi"})

    fit = placement.evaluate(cardrequest.pod_request(pod), state_of(mixed_node(make_node)))

    assert fit.fits and fit.cards == (2,)  # binpack would take GPU0 (least left over); the constraint leaves GPU2, GPU3


def test_an_ordinary_pod_on_the_mixed_node_is_placed_as_before(make_node: Factory, make_gpu_pod: Factory) -> None:
    fit = placement.evaluate(cardrequest.pod_request(make_gpu_pod(mem=4)), state_of(mixed_node(make_node)))

    assert fit.fits and fit.cards == (0,)  # binpack: the 16 GB card is left with the least free memory


def test_a_min_memory_pod_waits_for_a_large_card_although_small_ones_are_free(make_node: Factory, make_gpu_pod: Factory) -> None:
    node = mixed_node(make_node)
    holders = [
        make_gpu_pod(
            f"holder-{i}",
            mem=30,
            node_name="mixed",
            annotations={"ALIYUN_COM_GPU_MEM_IDX": str(i), "ALIYUN_COM_GPU_MEM_POD": "30"},
        )
        for i in (2, 3)
    ]
    pod = make_gpu_pod(mem=4, annotations={gpu.MIN_GPU_MEMORY_ANNOTATION: "20Gi"})

    fit = placement.evaluate(cardrequest.pod_request(pod), state_of(node, holders))

    assert fit.verdict is placement.Verdict.FULL  # the large cards free up later: FailedNodes, not unresolvable
    assert fit.codes == (reasons.Code.INSUFFICIENT_MEMORY,)
    assert fit.message.endswith(
        "the card with the most free memory is GPU2 with 1 GiB free of 31 GiB (only GPU2, GPU3 meet the pod's card-model "
        "constraint, at least 20480 MiB per card (gpu-admission.io/min-gpu-memory))"
    )
    assert placement.evaluate(cardrequest.pod_request(make_gpu_pod(mem=4)), state_of(node, holders)).cards == (0,)


def test_no_card_of_the_wanted_model_never_fits_and_the_reason_lists_the_cards(make_node: Factory, make_gpu_pod: Factory) -> None:
    pod = make_gpu_pod(mem=1, annotations={gpu.GPU_MODEL_ANNOTATION: "Tesla T4"})

    fit = placement.evaluate(cardrequest.pod_request(pod), state_of(mixed_node(make_node)))

    assert fit.verdict is placement.Verdict.NEVER and fit.codes == (reasons.Code.CARD_MODEL,)
    assert fit.message == (
        "no GPU card meets the pod's card-model constraint, card model Tesla-T4 (gpu-admission.io/gpu-model): the node "
        "has GPU0, GPU1 Tesla-V100-SXM2-16GB with 16160 MiB; GPU2, GPU3 Tesla-V100-SXM2-32GB with 32510 MiB"
    )


def test_an_excluded_model_leaves_the_other_cards(make_node: Factory, make_gpu_pod: Factory) -> None:
    pod = make_gpu_pod(mem=4, annotations={gpu.EXCLUDE_GPU_MODEL_ANNOTATION: V100_16})

    assert placement.evaluate(cardrequest.pod_request(pod), state_of(mixed_node(make_node))).cards == (2,)


def test_a_node_without_an_inventory_cannot_show_a_cards_model(make_node: Factory, make_gpu_pod: Factory) -> None:
    pod = make_gpu_pod(mem=4, annotations={gpu.GPU_MODEL_ANNOTATION: V100_16})
    counted = make_node("counted", count=2, gib=15)  # cards from node capacity: memory known, model not

    fit = placement.evaluate(cardrequest.pod_request(pod), state_of(counted))

    assert fit.verdict is placement.Verdict.NEVER and fit.codes == (reasons.Code.CARD_MODEL,)
    assert "GPU0, GPU1 of unknown model (no gpu-admission.io/gpu-inventory annotation) with 15360 MiB" in fit.message
    memory_only = make_gpu_pod(mem=4, annotations={gpu.MIN_GPU_MEMORY_ANNOTATION: "15Gi"})
    assert placement.evaluate(cardrequest.pod_request(memory_only), state_of(counted)).fits


def test_whole_cards_are_all_of_the_wanted_model(make_node: Factory, make_gpu_pod: Factory) -> None:
    node = mixed_node(make_node, "mixed-topology", mode="topology")
    two = make_gpu_pod(whole=2, annotations={gpu.GPU_MODEL_ANNOTATION: V100_32})
    three = make_gpu_pod(whole=3, annotations={gpu.GPU_MODEL_ANNOTATION: V100_32})

    assert placement.evaluate(cardrequest.pod_request(two), state_of(node)).cards == (2, 3)
    fit = placement.evaluate(cardrequest.pod_request(three), state_of(node))
    assert fit.verdict is placement.Verdict.NEVER and fit.codes == (reasons.Code.CARD_MODEL,)
    assert fit.message.startswith(
        "the pod needs 3 whole cards (aliyun.com/gpu) that meet its card-model constraint, card model "
        "Tesla-V100-SXM2-32GB (gpu-admission.io/gpu-model); 2 of the node's cards do"
    )


def test_filter_prioritize_and_choose_agree_on_the_constrained_card(make_node: Factory, make_gpu_pod: Factory) -> None:
    state = state_of(mixed_node(make_node))
    states: dict[str, cards.NodeState | None] = {"mixed": state}
    too_big = cardrequest.pod_request(make_gpu_pod(mem=20, annotations={gpu.GPU_MODEL_ANNOTATION: V100_16}))
    large = cardrequest.pod_request(make_gpu_pod(mem=4, annotations={gpu.MIN_GPU_MEMORY_ANNOTATION: "20Gi"}))

    refused = placement.filter_nodes(too_big, states=states, names=["mixed"])
    assert refused.passed == [] and set(refused.unresolvable) == {"mixed"}
    assert placement.scores(too_big, states=states, names=["mixed"]) == {"mixed": 0}
    assert placement.choose(too_big, state) is None

    assert placement.filter_nodes(large, states=states, names=["mixed"]).passed == ["mixed"]
    ordinary = cardrequest.pod_request(make_gpu_pod(mem=4))
    assert placement.scores(large, states=states, names=["mixed"]) == placement.scores(ordinary, states=states, names=["mixed"])
    assert placement.choose(large, state) == (2,)


# --- through the extender's HTTP verbs ----------------------------------------------------------------


@pytest.fixture
async def client(aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, make_node: Factory) -> Client:
    apiserver.add_node(mixed_node(make_node))
    cache = store.Store()
    cache.replace_nodes(list(apiserver.nodes.values()))
    cache.replace_leases([])  # no ledger Leases yet
    cache.replace_pods([])
    settings = app.Settings(clock=lambda: NOW)
    application = app.make_app(cache=cache, bind=binder.Binder(apiserver, clock=lambda: NOW, cache=cache), settings=settings)
    return await aiohttp_client(application)


async def _post(client: Client, path: str, body: object) -> Any:
    async with client.post(path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        assert answer.status == 200
        return await answer.json()


async def _filter_and_bind(client: Client, apiserver: Any, pod: dict[str, Any]) -> tuple[Any, Any, Any]:
    stored = apiserver.add_pod(pod)
    args = {"Pod": stored, "Nodes": None, "NodeNames": ["mixed"]}
    filtered = await _post(client, "/filter", args)
    scored = await _post(client, "/prioritize", args)
    name = stored["metadata"]["name"]
    bound = await _post(
        client, "/bind", {"PodName": name, "PodNamespace": "team-a", "PodUID": stored["metadata"]["uid"], "Node": "mixed"}
    )
    return filtered, scored, bound


async def test_the_extender_refuses_the_16gb_model_pod_asking_20_gib(
    client: Client, apiserver: Any, make_gpu_pod: Factory
) -> None:
    pod = make_gpu_pod("sixteen", mem=20, annotations={gpu.GPU_MODEL_ANNOTATION: V100_16})

    filtered, scored, bound = await _filter_and_bind(client, apiserver, pod)

    assert filtered["NodeNames"] == [] and set(filtered["FailedAndUnresolvableNodes"]) == {"mixed"}
    assert filtered["FailedAndUnresolvableNodes"]["mixed"].startswith(
        "no GPU card that meets the pod's card-model constraint is large enough"
    )
    assert scored == [{"Host": "mixed", "Score": 0}]
    assert "card-model constraint" in bound["Error"]  # even a bind that skips filter gets no 32 GB card
    assert "nodeName" not in apiserver.pods[("team-a", "sixteen")]["spec"]


async def test_the_extender_binds_the_min_20gi_pod_to_a_32gb_card(client: Client, apiserver: Any, make_gpu_pod: Factory) -> None:
    pod = make_gpu_pod("large", mem=4, annotations={gpu.MIN_GPU_MEMORY_ANNOTATION: "20Gi"})

    filtered, scored, bound = await _filter_and_bind(client, apiserver, pod)

    assert filtered["NodeNames"] == ["mixed"] and filtered["FailedAndUnresolvableNodes"] == {}
    assert [entry["Host"] for entry in scored] == ["mixed"]
    assert bound == {"Error": ""}
    annotations = apiserver.pods[("team-a", "large")]["metadata"]["annotations"]
    assert annotations[gpu.GPUSHARE_MEM_IDX_ANNOTATION] == "2"
    assert annotations[gpu.GPUSHARE_MEM_DEV_ANNOTATION] == "31"


async def test_the_extender_binds_an_ordinary_pod_as_before(client: Client, apiserver: Any, make_gpu_pod: Factory) -> None:
    filtered, _, bound = await _filter_and_bind(client, apiserver, make_gpu_pod("ordinary", mem=4))

    assert filtered["NodeNames"] == ["mixed"] and bound == {"Error": ""}
    annotations = apiserver.pods[("team-a", "ordinary")]["metadata"]["annotations"]
    assert annotations[gpu.GPUSHARE_MEM_IDX_ANNOTATION] == "0"
    assert annotations[gpu.GPUSHARE_MEM_DEV_ANNOTATION] == "15"
