"""The `preempt` verb over the wire (ExtenderPreemptionArgs in, ExtenderPreemptionResult out) and the
nomination hold in `filter`, in-process against the app."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import test_utils, web

from policies.gpu import allocation
from tests.unit.extender import conftest
from webhook.extender import app, binder, preemption, store
from webhook.serving import metrics

NOW = 1_800_000_000.0
Client = test_utils.TestClient[web.Request, web.Application]
BUDGET_LIST = web.AppKey("test-budgets", list)  # the fixture's PodDisruptionBudgets, which a test may add to


def _bound(
    name: str, *, node: str, card: int, gib: int, priority: int = 0, labels: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    held = allocation.Allocation(
        uid=f"uid-{name}", namespace="team-a", name=name, node=node, cards=(card,), memory_gib=gib, assumed_at=NOW
    )
    pod = conftest.pod(
        name,
        uid=f"uid-{name}",
        mem=gib,
        node_name=node,
        phase="Running",
        annotations=allocation.bind_annotations(held, card_memory_gib=16),
    )
    pod["spec"]["priority"] = priority
    if labels:
        pod["metadata"]["labels"] = labels
    pod["spec"].update(extra)
    return pod


def _preemptor(name: str = "boss", *, gib: int = 16, priority: int = 1000, **spec: Any) -> dict[str, Any]:
    pod = conftest.pod(name, uid=f"uid-{name}", mem=gib)
    pod["spec"]["priority"] = priority
    pod["spec"].update(spec)
    return pod


@pytest.fixture
def cache() -> store.Store:
    # the example: two 16 GiB cards, each holding two 8 GiB pods of priority 0 (a0, c0 on card 0; b1, d1 on card 1)
    filled = store.Store()
    filled.replace_nodes(
        [conftest.node("n", count=2, gib=16), conftest.node("cpu", mode=None, placement=None, capacity={"cpu": "8"})]
    )
    filled.replace_leases([])
    filled.replace_pods(
        [
            _bound("a0", node="n", card=0, gib=8),
            _bound("b1", node="n", card=1, gib=8),
            _bound("c0", node="n", card=0, gib=8),
            _bound("d1", node="n", card=1, gib=8),
            {
                **conftest.pod("web", uid="uid-web", node_name="n", phase="Running"),
                "spec": {"nodeName": "n", "priority": 0, "containers": [{"name": "c"}]},
            },
        ]
    )
    return filled


@pytest.fixture
async def client(aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, cache: store.Store) -> Client:
    budgets: list[dict[str, Any]] = []

    async def list_budgets() -> list[dict[str, Any]]:
        return budgets

    application = app.make_app(
        cache=cache,
        bind=binder.Binder(apiserver, clock=lambda: NOW, cache=cache),
        settings=app.Settings(clock=lambda: NOW),
        budgets=list_budgets,
    )
    application[BUDGET_LIST] = budgets
    return await aiohttp_client(application)


async def _post(client: Client, path: str, body: object) -> tuple[int, Any]:
    async with client.post(path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        return answer.status, await answer.json()


def _offer(pod: dict[str, Any], offered: dict[str, list[str]]) -> dict[str, Any]:
    """What kube-scheduler sends a nodeCacheCapable extender: victims by UID."""
    return {
        "Pod": pod,
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0} for node, uids in offered.items()
        },
    }


async def test_default_preemptions_scattered_victims_become_one_card(client: Client) -> None:
    # kube-scheduler's default picks the two youngest pods, one on each card
    status, answer = await _post(client, "/preempt", _offer(_preemptor(), {"n": ["uid-c0", "uid-d1"]}))
    assert status == 200
    victims = answer["NodeNameToMetaVictims"]["n"]
    uids = {pod["UID"] for pod in victims["Pods"]}
    assert uids in ({"uid-a0", "uid-c0"}, {"uid-b1", "uid-d1"})
    assert victims["NumPDBViolations"] == 0


async def test_a_node_without_a_card_set_is_dropped_and_unoffered_nodes_are_never_added(
    client: Client, cache: store.Store
) -> None:
    # a0 outranks the preemptor: card 0 cannot be freed; card 1 can
    cache.put_pod(_bound("a0", node="n", card=0, gib=8, priority=5000))
    status, answer = await _post(client, "/preempt", _offer(_preemptor(), {"n": ["uid-c0", "uid-d1"]}))
    assert {pod["UID"] for pod in answer["NodeNameToMetaVictims"]["n"]["Pods"]} == {"uid-b1", "uid-d1"}
    # equal priority everywhere: no node, and nothing that was not offered
    status, answer = await _post(client, "/preempt", _offer(_preemptor(priority=0), {"n": ["uid-c0", "uid-d1"]}))
    assert status == 200 and answer == {"NodeNameToMetaVictims": {}}
    status, answer = await _post(client, "/preempt", _offer(_preemptor(), {}))
    assert answer == {"NodeNameToMetaVictims": {}}


async def test_offered_victims_that_hold_no_card_are_kept_as_kube_scheduler_chose_them(client: Client) -> None:
    status, answer = await _post(client, "/preempt", _offer(_preemptor(), {"n": ["uid-c0", "uid-d1", "uid-web"]}))
    uids = [pod["UID"] for pod in answer["NodeNameToMetaVictims"]["n"]["Pods"]]
    assert "uid-web" in uids and len(uids) == 3


async def test_a_pod_that_never_preempts_gets_no_node(client: Client) -> None:
    status, answer = await _post(client, "/preempt", _offer(_preemptor(preemptionPolicy="Never"), {"n": ["uid-c0", "uid-d1"]}))
    assert answer == {"NodeNameToMetaVictims": {}}


async def test_a_budget_moves_the_choice_to_the_other_card(client: Client, cache: store.Store) -> None:
    for name, card in (("a0", 0), ("c0", 0)):
        cache.put_pod(_bound(name, node="n", card=card, gib=8, labels={"app": "db"}))
    client.app[BUDGET_LIST].append(
        {
            "metadata": {"name": "db", "namespace": "team-a"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}},
            "status": {"disruptionsAllowed": 0},
        }
    )
    status, answer = await _post(client, "/preempt", _offer(_preemptor(), {"n": ["uid-a0", "uid-d1"]}))
    assert {pod["UID"] for pod in answer["NodeNameToMetaVictims"]["n"]["Pods"]} == {"uid-b1", "uid-d1"}


async def test_malformed_preempt_bodies_are_400(client: Client) -> None:
    status, answer = await _post(client, "/preempt", {"Pod": "nope"})
    assert status == 400 and "Pod" in answer["Error"]
    status, answer = await _post(client, "/preempt", {"Pod": _preemptor(), "NodeNameToMetaVictims": {"n": {"Pods": [{}]}}})
    assert status == 400 and "UID" in answer["Error"]


async def test_metrics_count_preemptions_nodes_and_victims(client: Client) -> None:
    await _post(client, "/preempt", _offer(_preemptor(), {"n": ["uid-c0", "uid-d1"]}))
    await _post(client, "/preempt", _offer(_preemptor(priority=0), {"n": ["uid-c0", "uid-d1"]}))
    async with client.get("/metrics") as answer:
        text = await answer.text()
    assert metrics.sample(text, "gpu_admission_extender_requests_total", verb="preempt", result="ok") == 2
    assert metrics.sample(text, "gpu_admission_extender_preemption_nodes_total", outcome="kept") == 1
    assert metrics.sample(text, "gpu_admission_extender_preemption_nodes_total", outcome="dropped") == 1
    assert metrics.sample(text, "gpu_admission_extender_preemption_victims_total") == 2


async def test_filter_holds_the_freed_card_for_the_nominated_pod(client: Client, cache: store.Store) -> None:
    # the preemption took b1 and d1 away; the preemptor is nominated to n and not bound yet
    cache.apply("Pod", "DELETED", _bound("b1", node="n", card=1, gib=8))
    cache.apply("Pod", "DELETED", _bound("d1", node="n", card=1, gib=8))
    low = _preemptor("low", gib=8, priority=0)
    filter_body = {"Pod": low, "Nodes": None, "NodeNames": ["n"]}
    status, answer = await _post(client, "/filter", filter_body)
    assert answer["NodeNames"] == ["n"]  # before the nomination is seen, card 1 is free
    boss = _preemptor()
    boss["status"]["nominatedNodeName"] = "n"
    cache.put_pod(boss)
    status, answer = await _post(client, "/filter", filter_body)
    assert answer["NodeNames"] == [] and "held for team-a/boss, which preempted here" in answer["FailedNodes"]["n"]
    # an equal-priority pod is held back as well; a higher one is not
    status, answer = await _post(client, "/filter", {**filter_body, "Pod": _preemptor("peer", gib=8, priority=1000)})
    assert answer["NodeNames"] == []
    status, answer = await _post(client, "/filter", {**filter_body, "Pod": _preemptor("vip", gib=8, priority=2000)})
    assert answer["NodeNames"] == ["n"]
    # the preemptor itself passes (its own hold is not held against it)
    status, answer = await _post(client, "/filter", {**filter_body, "Pod": boss})
    assert answer["NodeNames"] == ["n"]
    # the hold lapses when the nominee is deleted
    cache.apply("Pod", "DELETED", boss)
    status, answer = await _post(client, "/filter", filter_body)
    assert answer["NodeNames"] == ["n"]


async def test_the_hold_covers_a_card_whose_victims_are_still_terminating(client: Client, cache: store.Store) -> None:
    cache.apply("Pod", "DELETED", _bound("b1", node="n", card=1, gib=8))
    dying = _bound("d1", node="n", card=1, gib=8)
    dying["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    cache.put_pod(dying)
    boss = _preemptor()
    boss["status"]["nominatedNodeName"] = "n"
    cache.put_pod(boss)
    status, answer = await _post(
        client, "/filter", {"Pod": _preemptor("low", gib=8, priority=0), "Nodes": None, "NodeNames": ["n"]}
    )
    assert answer["NodeNames"] == []
    # a low pod cannot become nominated by itself to grab the hold: a nominee only holds against lower or equal pods
    sneaky = _preemptor("sneaky", gib=8, priority=0)
    sneaky["status"]["nominatedNodeName"] = "n"
    cache.put_pod(sneaky)
    status, answer = await _post(client, "/filter", {"Pod": boss, "Nodes": None, "NodeNames": ["n"]})
    assert answer["NodeNames"] == []  # card 1 still has d1's 8 GiB until it is gone: the boss waits, it is not displaced
    cache.apply("Pod", "DELETED", dying)
    status, answer = await _post(client, "/filter", {"Pod": boss, "Nodes": None, "NodeNames": ["n"]})
    assert answer["NodeNames"] == ["n"]  # the sneaky nominee of lower priority holds nothing against the boss


def test_on_generated_clusters_every_answer_keeps_kube_schedulers_rules_and_never_overcommits() -> None:
    """Random two- and four-card nodes with random pods and priorities: every node answered was
    offered, has at least one victim, every victim is bound to that node with a lower priority
    than the preemptor, and once the victims are gone the preemptor fits on one card, which it
    would then share without over-commit."""
    import random

    from policies.gpu import cardrequest, cards
    from webhook.extender import placement, wire

    rng = random.Random(27)
    answered = 0
    for round_ in range(150):
        count = rng.choice((2, 4))
        nodes = [conftest.node(f"n{i}", count=count, gib=16) for i in range(3)]
        pods: list[dict[str, Any]] = []
        for node in nodes:
            name = node["metadata"]["name"]
            free = [16] * count
            for j in range(rng.randint(0, 8)):
                gib = rng.choice((2, 4, 8))
                fitting = [c for c in range(count) if free[c] >= gib]
                if not fitting:
                    continue
                index = rng.choice(fitting)
                free[index] -= gib
                pods.append(_bound(f"{name}-p{j}", node=name, card=index, gib=gib, priority=rng.choice((0, 100, 1000, 5000))))
        filled = store.Store()
        filled.replace_nodes(nodes)
        filled.replace_leases([])
        filled.replace_pods(pods)
        asked = rng.choice((4, 8, 12, 16))
        priority = rng.choice((0, 100, 1000, 5000))
        preemptor = _preemptor(f"boss-{round_}", gib=asked, priority=priority)
        offered = {
            n["metadata"]["name"]: tuple(p["metadata"]["uid"] for p in pods if p["spec"]["nodeName"] == n["metadata"]["name"])[:1]
            for n in nodes
        }
        request = wire.PreemptRequest(pod=preemptor, victims=offered, violations={})
        kept = preemption.answer(filled, request, now=NOW, ttl=app.Settings().ttl, budgets=())
        for answer, (uids, _) in kept.items():
            answered += 1
            assert answer in offered and uids
            on_node = {p["metadata"]["uid"]: p for p in pods if p["spec"]["nodeName"] == answer}
            assert set(uids) <= set(on_node)
            assert all(on_node[u]["spec"]["priority"] < priority for u in uids)
            priorities = [on_node[u]["spec"]["priority"] for u in uids]
            assert priorities == sorted(priorities, reverse=True)  # most important first
            state = filled.state(answer, now=NOW, ttl=60)
            assert state is not None
            after = cards.occupy(state.node, [a for a in state.allocations if a.uid not in set(uids)])
            fit = placement.evaluate(cardrequest.Request(memory_gib=asked), after)
            assert fit.fits
            card = after.card(fit.cards[0])
            assert card is not None and card.memory_used + asked <= card.card.memory_gib
    assert answered > 20  # the generator does reach preemptions


async def test_a_card_whose_victims_are_being_deleted_already_needs_no_new_eviction(client: Client, cache: store.Store) -> None:
    for name, card in (("b1", 1), ("d1", 1)):
        dying = _bound(name, node="n", card=card, gib=8)
        dying["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
        cache.put_pod(dying)
    status, answer = await _post(client, "/preempt", _offer(_preemptor(), {"n": ["uid-c0", "uid-d1"]}))
    # card 1 will be free once they are gone: no eviction is needed, the node is dropped (the pod waits)
    assert answer == {"NodeNameToMetaVictims": {}}
    async with client.get("/metrics") as metrics_answer:
        text = await metrics_answer.text()
    assert metrics.sample(text, "gpu_admission_extender_preemption_victims_total") == 0


async def test_a_second_call_for_the_same_preemptor_keeps_to_the_first_answer(client: Client, cache: store.Store) -> None:
    """kube-scheduler may call again while the first victims are evicted (its async preemption
    deletes the last victim after the others). The first answer's remaining victims are answered
    as going: the node needs no new eviction (dropped while they go), and no new set that ranks
    better by then is chosen: otherwise a third pod loses its place."""
    for name in ("a0", "b1", "c0", "d1"):
        cache.apply("Pod", "DELETED", _bound(name, node="n", card=0, gib=8))
    cache.put_pod(_bound("p0", node="n", card=0, gib=16, priority=5))
    cache.put_pod(_bound("q1", node="n", card=1, gib=16, priority=100))
    status, answer = await _post(client, "/preempt", _offer(_preemptor(), {"n": ["uid-p0"]}))
    assert [pod["UID"] for pod in answer["NodeNameToMetaVictims"]["n"]["Pods"]] == ["uid-p0"]
    cache.put_pod(_bound("q1", node="n", card=1, gib=16, priority=0))  # now q1 would rank better
    status, answer = await _post(client, "/preempt", _offer(_preemptor(), {"n": ["uid-q1"]}))
    assert answer == {"NodeNameToMetaVictims": {}}  # p0 is going already: no second eviction, q1 stays
    # another preemptor is not bound by that answer
    status, answer = await _post(client, "/preempt", _offer(_preemptor("other"), {"n": ["uid-q1"]}))
    assert [pod["UID"] for pod in answer["NodeNameToMetaVictims"]["n"]["Pods"]] == ["uid-q1"]
