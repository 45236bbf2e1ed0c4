"""Filter and prioritize answered from remembered, pre-encoded per-node answers (issue 19): byte for
byte the answers of judging every node afresh and encoding with the standard library, on generated
nodes and pods, cold and remembered, before and after the cluster changes under them."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import test_utils, web

from policies import gpu
from policies.gpu import allocation, cardrequest, inventory
from webhook.extender import app, binder, placement, store, wire

NOW = 1_800_000_000.0
Client = test_utils.TestClient[web.Request, web.Application]
Factory = Any


def _reference_classify(fits: dict[str, placement.Fit | None], names: list[str]) -> placement.Outcome:
    """`placement.classify` as it was before the two-pass version."""
    outcome = placement.Outcome(passed=[], failed={}, unresolvable={})
    for name in names:
        fit = fits.get(name) or placement._NOT_CACHED
        if fit.verdict is placement.Verdict.FITS:
            outcome.passed.append(name)
            continue
        (outcome.failed if fit.verdict is placement.Verdict.FULL else outcome.unresolvable)[name] = fit.message
    return outcome


def _reference_answers(cache: store.Store, pod: dict[str, Any], names: list[str]) -> tuple[bytes, bytes]:
    """Filter's and prioritize's bodies judged afresh on every node, encoded by `json`."""
    wanted = cardrequest.pod_request(pod)
    states = cache.states(names, now=NOW, ttl=120.0, exclude_uid=pod["metadata"]["uid"])
    fits = {name: None if (s := states.get(name)) is None else placement.evaluate(wanted, s, decide=False) for name in names}
    outcome = _reference_classify(fits, names)
    filtered = wire.filter_result(passed=outcome.passed, failed=outcome.failed, unresolvable=outcome.unresolvable)
    scored = wire.priorities(placement.scores(wanted, states=states, names=names))
    compact = {"separators": (",", ":"), "ensure_ascii": False}
    return json.dumps(filtered, **compact).encode(), json.dumps(scored, **compact).encode()  # type: ignore[arg-type]


def _nodes(make_node: Factory, rng: random.Random) -> list[dict[str, Any]]:
    mixed = [
        inventory.Card(index=i, memory_mib=m, uuid=f"GPU-{i}", name=n)
        for i, (m, n) in enumerate([(16160, "Tesla-V100-SXM2-16GB"), (32510, "Tesla-V100-SXM2-32GB"), (15360, "Tesla-T4")])
    ]
    found = []
    for i in range(24):
        kind = i % 6
        if kind == 0:
            found.append(make_node(f"n-{i:02d}", placement=rng.choice(["binpack", "spread"])))
        elif kind == 1:
            found.append(make_node(f"n-{i:02d}", mode="core_mem", count=2, gib=rng.choice([8, 16])))
        elif kind == 2:
            found.append(make_node(f"n-{i:02d}", mode="topology", count=rng.choice([2, 4, 8])))
        elif kind == 3:
            found.append(make_node(f"n-{i:02d}", mode="default"))
        elif kind == 4:
            node = make_node(f"n-{i:02d}", count=3, gib=15)
            node["metadata"]["annotations"][gpu.INVENTORY_ANNOTATION] = inventory.encode_inventory(mixed)
            found.append(node)
        else:
            found.append(make_node(f"n-{i:02d}", count=1, gib=2, placement="spread"))
    return found


def _pods(make_gpu_pod: Factory, rng: random.Random, count: int) -> list[dict[str, Any]]:
    found = []
    for i in range(count):
        kind = rng.randrange(7)
        if kind <= 1:
            pod = make_gpu_pod(f"p-{i}", mem=rng.choice([1, 2, 4, 8, 15, 20]))
        elif kind == 2:
            pod = make_gpu_pod(f"p-{i}", mem=rng.choice([2, 6]), core=rng.choice([30, 60]))
        elif kind == 3:
            pod = make_gpu_pod(f"p-{i}", whole=rng.choice([1, 2, 3]))
        elif kind == 4:
            pod = make_gpu_pod(
                f"p-{i}", mem=4, annotations={"gpu-admission.io/gpu-model": rng.choice(["Tesla-T4", "Tesla-V100-SXM2-32GB"])}
            )
        elif kind == 5:
            pod = make_gpu_pod(f"p-{i}", mem="two")  # malformed: never fits
        else:
            pod = make_gpu_pod(f"p-{i}")  # no GPU: fits everywhere, not ours
        found.append(pod)
    return found


def _occupy(cache: store.Store, pod: dict[str, Any], node: str) -> bool:
    """Bind `pod` to `node` in the cache as bind would, when it fits there now."""
    wanted = cardrequest.pod_request(pod)
    state = cache.state(node, now=NOW, ttl=120.0)
    chosen = placement.choose(wanted, state) if state is not None else None
    if chosen is None or wanted.family is None:
        return False
    held = allocation.Allocation(
        uid=pod["metadata"]["uid"],
        namespace="team-a",
        name=pod["metadata"]["name"],
        node=node,
        cards=chosen,
        memory_gib=wanted.memory_gib,
        core_percent=wanted.core_percent,
        whole=bool(wanted.cards),
        assumed_at=NOW,
    )
    bound = json.loads(json.dumps(pod))
    bound["metadata"]["annotations"] = allocation.bind_annotations(
        held, card_memory_gib=state.cards[chosen[0]].card.memory_gib if state else 0
    )
    bound["metadata"]["resourceVersion"] = "2"
    bound["spec"]["nodeName"] = node
    cache.put_pod(bound)
    return True


@pytest.fixture
def filled(make_node: Factory) -> store.Store:
    cache = store.Store()
    cache.replace_nodes(_nodes(make_node, random.Random(19)))
    if hasattr(cache, "replace_leases"):
        cache.replace_leases([])
    cache.replace_pods([])
    return cache


@pytest.fixture
async def client(aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, filled: store.Store) -> Client:
    application = app.make_app(
        cache=filled, bind=binder.Binder(apiserver, clock=lambda: NOW, cache=filled), settings=app.Settings(clock=lambda: NOW)
    )
    return await aiohttp_client(application)


async def _raw(client: Client, path: str, pod: dict[str, Any], names: list[str]) -> tuple[bytes, str]:
    async with client.post(path, data=json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()) as answer:
        assert answer.status == 200
        return await answer.read(), answer.headers["Content-Type"]


async def test_answers_equal_fresh_judgement_byte_for_byte_while_the_cluster_fills(
    client: Client, filled: store.Store, make_gpu_pod: Factory
) -> None:
    rng = random.Random(7)
    every = [f"n-{i:02d}" for i in range(24)]
    checked = bound = 0
    for pod in _pods(make_gpu_pod, rng, 120):
        names = rng.sample(every, rng.randrange(1, len(every))) + (["not-cached"] if rng.random() < 0.2 else [])
        expected = _reference_answers(filled, pod, names)
        for _ in range(2):  # cold, then from the remembered per-node answers
            filtered, kind = await _raw(client, "/filter", pod, names)
            scored, _ = await _raw(client, "/prioritize", pod, names)
            assert (filtered, scored) == expected, pod["metadata"]["name"]
            assert kind == "application/json; charset=utf-8"
            checked += 1
        passed = json.loads(filtered)["NodeNames"]
        if passed:
            best = max(json.loads(scored), key=lambda h: (h["Score"], h["Host"]))["Host"]
            bound += _occupy(filled, pod, best)
    assert checked == 240 and bound > 40, "enough pods landed to fill nodes and change answers"


async def test_a_node_state_change_changes_the_remembered_answers(
    client: Client, filled: store.Store, make_gpu_pod: Factory
) -> None:
    names = ["n-00", "n-06"]  # two shared-mode nodes of 4 x 15 GiB
    pod = make_gpu_pod("probe", mem=8)
    before_filter, _ = await _raw(client, "/filter", pod, names)
    before_scores, _ = await _raw(client, "/prioritize", pod, names)
    assert json.loads(before_filter)["NodeNames"] == names
    for card in range(4):  # n-06 fills up: 14 GiB taken on every card
        hog = make_gpu_pod(f"hog-{card}", mem=14)
        held = allocation.Allocation(
            uid=hog["metadata"]["uid"],
            namespace="team-a",
            name=hog["metadata"]["name"],
            node="n-06",
            cards=(card,),
            memory_gib=14,
            assumed_at=NOW,
        )
        hog["metadata"]["annotations"] = allocation.bind_annotations(held, card_memory_gib=15)
        hog["spec"]["nodeName"] = "n-06"
        filled.put_pod(hog)
    after_filter, _ = await _raw(client, "/filter", pod, names)
    after_scores, _ = await _raw(client, "/prioritize", pod, names)
    assert json.loads(after_filter)["NodeNames"] == ["n-00"]
    assert "insufficient GPU memory" in json.loads(after_filter)["FailedNodes"]["n-06"]
    assert {h["Host"]: h["Score"] for h in json.loads(after_scores)}["n-06"] == 0
    assert after_scores != before_scores
    assert (after_filter, after_scores) == _reference_answers(filled, pod, names)


def test_host_priority_entries_join_into_the_bytes_orjson_writes_for_the_list() -> None:
    scores = {"a": 3, 'é"quoted': 10, "below": -4, "above": 13, "zero": 0}
    joined = wire.priorities_json(wire.host_priority_json(host, score) for host, score in scores.items())
    assert joined == app._dumps(wire.priorities(scores)).encode()
    assert json.loads(joined) == [
        {"Host": "a", "Score": 3},
        {"Host": 'é"quoted', "Score": 10},
        {"Host": "below", "Score": 0},
        {"Host": "above", "Score": 10},
        {"Host": "zero", "Score": 0},
    ]
    assert wire.priorities_json([]) == b"[]"


def test_classify_keeps_the_order_sent_for_passed_and_refused_nodes() -> None:
    full = placement._refuse(placement.Verdict.FULL, placement.ReasonCode.CORE_EXHAUSTED, "busy")
    never = placement._refuse(placement.Verdict.NEVER, placement.ReasonCode.NO_GPU, "no cards")
    fits: dict[str, placement.Fit | None] = {"a": placement._FITS, "b": full, "c": placement._FITS, "d": never, "e": None}
    names = ["d", "c", "e", "b", "a", "c"]
    outcome = placement.classify(fits, iter(names))
    reference = _reference_classify(fits, names)
    assert (outcome.passed, outcome.failed, outcome.unresolvable) == (reference.passed, reference.failed, reference.unresolvable)
    assert outcome.passed == ["c", "a", "c"] and list(outcome.failed) == ["e", "b"] and list(outcome.unresolvable) == ["d"]
    assert outcome.reasons["b"] == full.reasons
    every = placement.classify({"a": placement._FITS}, ("a",))
    assert every.passed == ["a"] and not every.failed and not every.reasons


async def test_bodies_decode_as_json_decodes_them(client: Client, make_gpu_pod: Factory) -> None:
    pod = make_gpu_pod("big", mem=4)
    pod["metadata"]["labels"] = {"n": "x"}
    pod["spec"]["priority"] = 123456789012345678901234567890  # orjson would read a float; json keeps it
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["n-00"]}).encode()
    async with client.post("/filter", data=body) as answer:
        assert answer.status == 200 and (await answer.json())["NodeNames"] == ["n-00"]
    for bad, message in (
        (b"", "the body is empty"),
        (b'{"Pod": NaN}', "'Pod' must be a Pod object, got a number"),
        (b"\xff{}", "the body is not utf-8"),
        (b"[1,", "the body is not JSON"),
    ):
        async with client.post("/filter", data=bad) as answer:
            assert answer.status == 400
            assert message in (await answer.json())["Error"]


async def test_refusal_reasons_are_counted_once_per_node(client: Client, make_gpu_pod: Factory) -> None:
    names = ["n-00", "n-06", "n-12", "n-18", "n-03", "not-cached"]  # four 4 x 15 GiB nodes, an exclusive one, an unknown one
    filtered, _ = await _raw(client, "/filter", make_gpu_pod("huge", mem=20), names)
    answer = json.loads(filtered)
    assert answer["NodeNames"] == [] and len(answer["FailedAndUnresolvableNodes"]) == 5
    async with client.get("/metrics") as scraped:
        text = await scraped.text()
    assert 'gpu_admission_extender_filter_reasons_total{code="INSUFFICIENT_MEMORY"} 4.0' in text
    assert 'gpu_admission_extender_filter_reasons_total{code="MODE_MISMATCH"} 1.0' in text
    assert 'gpu_admission_extender_filter_reasons_total{code="NOT_CACHED"} 1.0' in text
    assert 'gpu_admission_extender_filtered_nodes_total{outcome="unresolvable"} 5.0' in text


async def test_node_states_are_computed_before_the_first_filter_once_the_lists_are_in(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]],
    apiserver: Any,
    make_node: Factory,
    make_gpu_pod: Factory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from policies.gpu import cards

    computed: list[str] = []
    real = cards.count  # what every state the store computes ends in (`Store.node_state_of`)

    def counting(node: Any, *args: Any, **kwargs: Any) -> Any:
        computed.append(node.name)
        return real(node, *args, **kwargs)

    monkeypatch.setattr(cards, "count", counting)
    cache = store.Store()
    names = [f"w-{i:03d}" for i in range(600)]  # more than one warming slice

    class Lists:
        """A watch whose first lists arrive as it starts."""

        def start(self) -> None:
            cache.replace_nodes([make_node(name) for name in names])
            if hasattr(cache, "replace_leases"):
                cache.replace_leases([])
            cache.replace_pods([])

        def stop(self) -> None:
            pass

    application = app.make_app(
        cache=cache,
        bind=binder.Binder(apiserver, clock=lambda: NOW, cache=cache),
        settings=app.Settings(clock=lambda: NOW),
        watch=lambda loop: Lists(),
    )
    client = await aiohttp_client(application)
    for _ in range(500):  # each node twice: the filter's state and /inspect's and /metrics' (`overview`)
        if len(computed) >= 2 * len(names):
            break
        await asyncio.sleep(0.01)
    assert sorted(computed) == sorted(names * 2), "every node's states computed once each, in the background"
    computed.clear()
    filtered, _ = await _raw(client, "/filter", make_gpu_pod("first", mem=2), names)
    assert json.loads(filtered)["NodeNames"] == names
    async with client.get("/metrics") as scraped:
        assert f'gpu_admission_extender_node_gpu_memory_total_bytes{{mode="cgpu",node="{names[-1]}"}}' in await scraped.text()
    assert computed == [], "the first filter and the first scrape found every state ready"


async def test_once_warmed_the_listed_state_is_frozen_out_of_the_collectors_full_passes(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, make_node: Factory
) -> None:
    import gc

    cache = store.Store()

    class Lists:
        def start(self) -> None:
            cache.replace_nodes([make_node(f"f-{i:02d}") for i in range(20)])
            cache.replace_leases([])
            cache.replace_pods([])

        def stop(self) -> None:
            pass

    gc.unfreeze()
    try:
        application = app.make_app(
            cache=cache,
            bind=binder.Binder(apiserver, clock=lambda: NOW, cache=cache),
            settings=app.Settings(clock=lambda: NOW),
            watch=lambda loop: Lists(),
        )
        await aiohttp_client(application)
        for _ in range(500):
            if gc.get_freeze_count():
                break
            await asyncio.sleep(0.01)
        held = cache.node("f-07")
        assert held is not None and gc.is_tracked(held)
        assert not any(obj is held for obj in gc.get_objects()), "the store's Node is in the permanent generation"
        fresh = {"metadata": {"name": "later"}}
        assert any(obj is fresh for obj in gc.get_objects()), "what comes later is collected as usual"
    finally:
        gc.unfreeze()


def test_remembered_verdicts_end_when_a_time_limited_allocation_stops_counting(
    filled: store.Store, make_gpu_pod: Factory
) -> None:
    for card in range(4):  # reserved by binds that never completed, assumed 100 s ago: they count until NOW + 20 (TTL 120)
        hog = make_gpu_pod(f"unbound-{card}", mem=14)
        held = allocation.Allocation(
            uid=hog["metadata"]["uid"],
            namespace="team-a",
            name=hog["metadata"]["name"],
            node="n-00",
            cards=(card,),
            memory_gib=14,
            assumed_at=NOW - 100,
        )
        hog["metadata"]["annotations"] = allocation.bind_annotations(held, card_memory_gib=15)
        filled.put_pod(hog)
    wanted = cardrequest.pod_request(make_gpu_pod("probe", mem=8))

    def verdicts(now: float, ttl: float = 120.0) -> dict[str, Any]:
        found = filled.judged(
            ["n-00", "n-06"],
            now=now,
            ttl=ttl,
            key=("filter", wanted),
            judge=lambda s: placement.evaluate(wanted, s, decide=False).verdict,
        )
        return {name: str(verdict) for name, verdict in found.items()}

    assert verdicts(NOW) == verdicts(NOW + 19) == {"n-00": "full", "n-06": "fits"}
    assert verdicts(NOW + 21) == {"n-00": "fits", "n-06": "fits"}, "the reservations expired: judged afresh"
    assert verdicts(NOW, ttl=60.0) == {"n-00": "fits", "n-06": "fits"}, "another TTL setting is another judgement"
    assert verdicts(NOW + 21, ttl=120.0) == {"n-00": "fits", "n-06": "fits"}
