"""`/inspect` and `/metrics` from per-node parts kept with the store's versions (issue 19): the same
bytes as recomputing every node's state and rendering with prometheus_client and `json`, on a
generated cluster, and fresh parts wherever a node, its pods or a time limit changed."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from prometheus_client import exposition
from prometheus_client import registry as prom_registry

from policies.gpu import allocation, inspection, usage
from webhook.extender import occupancy, overview, store

NOW = 1_800_000_000.0
TTL = 120.0
Factory = Any


def _reference_inspect(cache: store.Store, *, now: float = NOW) -> bytes:
    """What /inspect answered before: every state recomputed, `json.dumps` (aiohttp's default)."""
    states = cache.all_states(now=now, ttl=TTL)
    return json.dumps(inspection.as_json(states.values(), usage=inspection.node_usages(cache.nodes()))).encode()


def _reference_metrics(cache: store.Store, *, now: float = NOW) -> str:
    """The occupancy families as the two collectors wrote them through prometheus_client."""
    registry = prom_registry.CollectorRegistry(auto_describe=False)
    registry.register(occupancy.Collector(lambda: cache.all_states(now=now, ttl=TTL).values()))
    registry.register(occupancy.UsageCollector(lambda: inspection.node_usages(cache.nodes())))
    return exposition.generate_latest(registry).decode()


def _usage_annotation(cards: int, rng: random.Random) -> str:
    summary = usage.NodeUsage(
        cards=tuple(
            usage.CardUse(
                index=i,
                total_mib=15360,
                used_mib=rng.choice([None, 512, 9000]),
                out_of_band=rng.choice([(), (usage.OutOfBand(pid=4242, used_mib=1024),)]),
            )
            for i in range(cards)
        )
    )
    return usage.render(summary)


def _held(
    make_gpu_pod: Factory, name: str, *, node: str, card: int, gib: int, bound: bool, assumed: float = NOW
) -> dict[str, Any]:
    pod: dict[str, Any] = make_gpu_pod(name, mem=gib, node_name=node if bound else None)
    held = allocation.Allocation(
        uid=pod["metadata"]["uid"], namespace="team-a", name=name, node=node, cards=(card,), memory_gib=gib, assumed_at=assumed
    )
    pod["metadata"]["annotations"] = allocation.bind_annotations(held, card_memory_gib=15)
    return pod


@pytest.fixture
def cluster(make_node: Factory, make_gpu_pod: Factory) -> store.Store:
    rng = random.Random(3)
    nodes = []
    for i in range(30):
        kind = i % 5
        if kind == 0:
            node = make_node(f"n-{i:02d}", placement="spread")
        elif kind == 1:
            node = make_node(f"n-{i:02d}", mode="topology", count=4)
        elif kind == 2:
            node = make_node(f"n-{i:02d}", mode="default")  # exclusive: managed, not in the cgpu table
        elif kind == 3:
            node = make_node(f"n-{i:02d}", mode=None, capacity={})  # no GPU at all
        else:
            node = make_node(f"n-{i:02d}", mode="core_mem", count=2)
        if kind in (0, 4) and rng.random() < 0.6:
            node["metadata"].setdefault("annotations", {})[usage.USAGE_ANNOTATION] = _usage_annotation(4 if kind == 0 else 2, rng)
        nodes.append(node)
    pods = []
    for i in range(80):
        node = f"n-{rng.choice([0, 5, 10, 15, 20, 25, 4, 9]):02d}"
        pods.append(
            _held(
                make_gpu_pod,
                f"p-{i}",
                node=node,
                card=rng.randrange(2),
                gib=rng.choice([1, 2, 3]),
                bound=rng.random() < 0.7,
                assumed=NOW - rng.choice([0, 30, 90]),
            )
        )
    cache = store.Store()
    cache.replace_nodes(nodes)
    if hasattr(cache, "replace_leases"):
        cache.replace_leases([])
    cache.replace_pods(pods)
    return cache


def test_the_views_are_the_same_bytes_as_recomputing_every_node(cluster: store.Store) -> None:
    view = overview.Overview(cluster)
    inspected, text = view.inspect_json(now=NOW, ttl=TTL), view.metrics_text(now=NOW, ttl=TTL)
    assert inspected == _reference_inspect(cluster)
    assert text == _reference_metrics(cluster)
    assert "usedMiB" in inspected.decode() and occupancy.USAGE_NAMES[1] + "{" in text, "usage summaries are in the fixture"
    assert "pending" in inspected.decode() and '"bound": false' in inspected.decode()
    # Remembered: the same answers again, and later ones match once unbound allocations expire.
    assert view.inspect_json(now=NOW, ttl=TTL) == inspected
    later = NOW + 61  # the allocations assumed 90 s before NOW and never bound stop counting
    assert view.inspect_json(now=later, ttl=TTL) == _reference_inspect(cluster, now=later) != inspected
    assert view.metrics_text(now=later, ttl=TTL) == _reference_metrics(cluster, now=later)


def test_a_changed_node_gets_fresh_parts_and_the_others_are_kept(
    cluster: store.Store, make_gpu_pod: Factory, make_node: Factory
) -> None:
    view = overview.Overview(cluster)
    before = view.metrics_text(now=NOW, ttl=TTL)
    computed: list[str] = []
    real = cluster.inspect_state

    def counting(name: str, *, now: float, ttl: float) -> Any:
        computed.append(name)
        return real(name, now=now, ttl=ttl)

    cluster.inspect_state = counting  # type: ignore[method-assign]
    assert view.metrics_text(now=NOW, ttl=TTL) == before and computed == []
    cluster.put_pod(_held(make_gpu_pod, "newcomer", node="n-05", card=3, gib=7, bound=True))
    after = view.metrics_text(now=NOW, ttl=TTL)
    assert computed == ["n-05"]
    assert after != before and after == _reference_metrics(cluster)
    assert 'card_gpu_memory_allocated_bytes{card="3",node="n-05"} 7.516192768e+09' in after
    assert view.inspect_json(now=NOW, ttl=TTL) == _reference_inspect(cluster)
    cluster.apply("Node", "DELETED", make_node("n-05"))  # a node that leaves leaves both views
    cluster.put_node(make_node("n-99", placement="spread"))  # and one that joins shows up
    assert view.inspect_json(now=NOW, ttl=TTL) == _reference_inspect(cluster)
    assert view.metrics_text(now=NOW, ttl=TTL) == _reference_metrics(cluster)
    assert 'node="n-05"' not in view.metrics_text(now=NOW, ttl=TTL)
    cluster.replace_pods([])  # a relist without the pods: every node's version moves
    assert view.inspect_json(now=NOW, ttl=TTL) == _reference_inspect(cluster)
    assert json.loads(view.inspect_json(now=NOW, ttl=TTL))["usedGPU"] == 0


def test_an_empty_cluster_and_label_values_needing_escapes(make_node: Factory) -> None:
    cache = store.Store()
    cache.replace_nodes([])
    cache.replace_pods([])
    view = overview.Overview(cache)
    assert view.inspect_json(now=NOW, ttl=TTL) == _reference_inspect(cache) == b'{"nodes": [], "totalGPU": 0, "usedGPU": 0}'
    assert view.metrics_text(now=NOW, ttl=TTL) == _reference_metrics(cache)
    odd = make_node('we"ird\\node')
    odd["metadata"]["labels"]["ack.node.gpu.schedule"] = "cgpu"
    cache.put_node(odd)
    assert view.metrics_text(now=NOW, ttl=TTL) == _reference_metrics(cache)
    assert 'node="we\\"ird\\\\node"' in view.metrics_text(now=NOW, ttl=TTL)
