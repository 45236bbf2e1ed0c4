"""`--honour-out-of-band-usage`: cards offer their memory less what out-of-band processes hold, in
the cache, in bind and for the Nodes kube-scheduler sends; off by default. `inspect` shows real use."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation, cardrequest, cards, inspection, usage
from webhook.extender import binder, placement, reality, wire
from webhook.extender import store as store_module

Factory = Any
NOW = 1_750_000_000.0


def summary(*card_uses: usage.CardUse) -> dict[str, str]:
    return {usage.USAGE_ANNOTATION: usage.render(usage.NodeUsage(cards=card_uses))}


OOB_ON_0 = summary(
    usage.CardUse(
        index=0, total_mib=15360, used_mib=7000, out_of_band=(usage.OutOfBand(pid=4, used_mib=6000, container_id="c" * 64),)
    ),
    usage.CardUse(index=1, total_mib=15360, used_mib=0),
)


def inventory_mib(node: dict[str, Any] | Any) -> list[int]:
    return [entry["memoryMiB"] for entry in json.loads(node["metadata"]["annotations"][gpu.INVENTORY_ANNOTATION])]


def test_a_card_shrinks_by_its_out_of_band_memory(make_node: Factory) -> None:
    node = make_node(count=2, inventory=[15360, 15360], annotations=OOB_ON_0)
    seen = reality.honour_out_of_band(node)
    assert inventory_mib(seen) == [9360, 15360]
    assert [c.memory_gib for c in cards.node_cards(seen).cards] == [9, 15]
    assert inventory_mib(node) == [15360, 15360], "the input is not changed"


@pytest.mark.parametrize(
    "annotations",
    [
        {},  # no summary
        summary(
            usage.CardUse(
                index=0, total_mib=15360, used_mib=9000, pods=(usage.PodUse(uid="u", namespace="a", name="p", used_mib=9000),)
            )
        ),
        {usage.USAGE_ANNOTATION: "{broken"},
    ],
    ids=["no-summary", "pods-only", "malformed-summary"],
)
def test_nodes_without_out_of_band_use_are_left_as_they_are(make_node: Factory, annotations: dict[str, str]) -> None:
    node = make_node(count=2, inventory=[15360, 15360], annotations=annotations)
    assert reality.honour_out_of_band(node) is node


def test_a_node_without_inventory_or_with_a_broken_one_is_left_as_it_is(make_node: Factory) -> None:
    capacity_only = make_node(count=2, annotations=OOB_ON_0)
    assert reality.honour_out_of_band(capacity_only) is capacity_only
    broken = make_node(count=2, annotations={**OOB_ON_0, gpu.INVENTORY_ANNOTATION: "{"})
    assert reality.honour_out_of_band(broken) is broken


def test_out_of_band_memory_beyond_the_card_leaves_nothing(make_node: Factory) -> None:
    huge = summary(usage.CardUse(index=0, total_mib=4096, out_of_band=(usage.OutOfBand(pid=1, used_mib=99999),)))
    seen = reality.honour_out_of_band(make_node(count=1, inventory=[4096], annotations=huge))
    assert inventory_mib(seen) == [0]


def state(cache: store_module.Store, name: str = "gpu-0") -> cards.NodeState:
    found = cache.state(name, now=NOW, ttl=allocation.DEFAULT_RESERVATION_TTL_S)
    assert found is not None
    return found


def test_the_cache_honours_out_of_band_use_only_when_asked(make_node: Factory) -> None:
    node = make_node(count=2, inventory=[15360, 15360], annotations=OOB_ON_0)
    off, on = store_module.Store(), store_module.Store(honour_out_of_band=True)
    off.replace_nodes([node])
    on.replace_nodes([node])
    assert state(off).free == ((15, 100), (15, 100))
    assert state(on).free == ((9, 100), (15, 100))


def test_placement_avoids_the_card_that_is_full_in_reality(make_node: Factory, make_gpu_pod: Factory) -> None:
    # Binpack fills card 0 first; 10 GiB no longer fits there once 6000 MiB are held out-of-band.
    node = make_node(count=2, inventory=[15360, 15360], annotations=OOB_ON_0)
    request = cardrequest.pod_request(make_gpu_pod("p", mem=10))
    blind = store_module.Store()
    blind.replace_nodes([node])
    honest = store_module.Store(honour_out_of_band=True)
    honest.replace_nodes([node])
    assert placement.evaluate(request, state(blind)).cards == (0,)
    assert placement.evaluate(request, state(honest)).cards == (1,)


def test_a_node_whose_cards_are_all_taken_out_of_band_is_filtered_out(make_node: Factory, make_gpu_pod: Factory) -> None:
    both = summary(
        *(usage.CardUse(index=i, total_mib=15360, out_of_band=(usage.OutOfBand(pid=10 + i, used_mib=12000),)) for i in (0, 1))
    )
    honest = store_module.Store(honour_out_of_band=True)
    honest.replace_nodes([make_node(count=2, inventory=[15360, 15360], annotations=both)])
    assert not placement.evaluate(cardrequest.pod_request(make_gpu_pod("p", mem=4)), state(honest)).fits


async def test_bind_decides_on_the_fresh_node_less_out_of_band_use(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    apiserver.add_node(make_node("gpu-0", count=2, inventory=[15360, 15360], annotations=OOB_ON_0))
    obj = apiserver.add_pod(make_gpu_pod("p0", mem=10))
    request = wire.BindRequest(name="p0", namespace="team-a", uid=obj["metadata"]["uid"], node="gpu-0")
    result = await binder.Binder(apiserver, clock=lambda: NOW, honour_out_of_band=True).bind(request)
    assert result.error == "" and result.allocation is not None
    assert result.allocation.cards == (1,)
    stored = apiserver.pods[("team-a", "p0")]["metadata"]["annotations"]
    assert stored["ALIYUN_COM_GPU_MEM_DEV"] == "15", "gpushare's card size stays the real one"


@pytest.mark.parametrize("pods_synced", [True, False], ids=["from-the-cache", "pods-from-the-apiserver"])
async def test_bind_from_the_cache_annotates_the_real_card_size(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory, pods_synced: bool
) -> None:
    """The cache holds Nodes less out-of-band use; the Binding's card size must still be the real card's."""
    node = apiserver.add_node(make_node("gpu-0", count=2, inventory=[15360, 15360], annotations=OOB_ON_0))
    obj = apiserver.add_pod(make_gpu_pod("p0", mem=4))
    cache = store_module.Store(honour_out_of_band=True)
    cache.replace_nodes([node])
    cache.replace_leases([])
    cache.seen("Lease", obj["metadata"]["resourceVersion"])
    if pods_synced:
        cache.replace_pods([obj])
        cache.seen("Pod", obj["metadata"]["resourceVersion"])
    request = wire.BindRequest(name="p0", namespace="team-a", uid=obj["metadata"]["uid"], node="gpu-0")
    one = binder.Binder(apiserver, clock=lambda: NOW, cache=cache, honour_out_of_band=True)
    result = await one.bind(request)
    assert result.error == "" and result.allocation is not None
    assert result.allocation.cards == (0,), "4 GiB fit in the 9 GiB card 0 has left in reality"
    assert ("get_node" in apiserver.calls, "list_node_pods" in apiserver.calls) == (False, not pods_synced)
    stored = apiserver.pods[("team-a", "p0")]["metadata"]["annotations"]
    assert stored["ALIYUN_COM_GPU_MEM_DEV"] == "15", "gpushare's card size is the real card's, not the card less out-of-band use"
    assert [c.memory_gib for c in cards.node_cards(cache.node("gpu-0") or {}).cards] == [9, 15], (
        "filter still sees the shrunk card"
    )


async def test_bind_without_the_flag_keeps_binpacking_onto_card_0(
    apiserver: Any, make_node: Factory, make_gpu_pod: Factory
) -> None:
    apiserver.add_node(make_node("gpu-0", count=2, inventory=[15360, 15360], annotations=OOB_ON_0))
    obj = apiserver.add_pod(make_gpu_pod("p0", mem=10))
    request = wire.BindRequest(name="p0", namespace="team-a", uid=obj["metadata"]["uid"], node="gpu-0")
    result = await binder.Binder(apiserver, clock=lambda: NOW).bind(request)
    assert result.allocation is not None and result.allocation.cards == (0,)


# --- inspect ---------------------------------------------------------------------------------------


def test_inspect_adds_a_used_column_per_card_when_a_summary_exists(make_node: Factory) -> None:
    with_summary = make_node("share-a", mode="share", count=2, inventory=[15360, 15360], annotations=OOB_ON_0)
    without = make_node("share-b", mode="share", count=2, inventory=[15360, 15360])
    states = cards.cluster_state([with_summary, without], [], now=NOW)
    text = inspection.summary(states.values(), usage=inspection.node_usages([with_summary, without]))
    header, row_a, row_b = text.splitlines()[:3]
    assert header.split() == [
        "NAME",
        "IPADDRESS",
        "GPU0(Allocated/Total)",
        "GPU1(Allocated/Total)",
        "GPU0(Used)",
        "GPU1(Used)",
        "GPU",
        "Memory(GiB)",
    ]
    assert row_a.split()[2:6] == ["0/15", "0/15", "5.9(5.9", "oob)"]
    assert row_b.split()[2:] == ["0/15", "0/15", "-", "-", "0/30"]


def test_inspect_without_any_summary_is_the_seeds_table(make_node: Factory) -> None:
    plain = make_node("share-b", mode="share", count=2, inventory=[15360, 15360])
    states = cards.cluster_state([plain], [], now=NOW)
    assert inspection.summary(states.values(), usage={}) == inspection.summary(states.values())
    assert "Used" not in inspection.summary(states.values())


def test_inspect_json_carries_used_and_out_of_band_mib(make_node: Factory) -> None:
    node = make_node("share-a", mode="share", count=2, inventory=[15360, 15360], annotations=OOB_ON_0)
    devices = inspection.as_json(cards.cluster_state([node], [], now=NOW).values(), usage=inspection.node_usages([node]))[
        "nodes"
    ][0]["devs"]
    assert [(d.get("usedMiB"), d.get("outOfBandMiB")) for d in devices] == [(6000, 6000), (0, 0)]


def test_the_extender_metrics_expose_real_and_out_of_band_memory_per_card(make_node: Factory) -> None:
    from webhook.extender import occupancy
    from webhook.serving import metrics

    node = make_node("share-a", mode="share", count=2, inventory=[15360, 15360], annotations=OOB_ON_0)
    registry = metrics.Registry()
    registry.register_collector(occupancy.UsageCollector(lambda: inspection.node_usages([node])), names=occupancy.USAGE_NAMES)
    text = registry.render()
    assert metrics.sample(text, occupancy.USAGE_NAMES[0], node="share-a", card="0") == 6000 * 2**20
    assert metrics.sample(text, occupancy.USAGE_NAMES[1], node="share-a", card="0") == 6000 * 2**20
    assert metrics.sample(text, occupancy.USAGE_NAMES[1], node="share-a", card="1") == 0
