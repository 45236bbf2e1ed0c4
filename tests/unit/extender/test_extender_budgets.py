"""GPU budgets in the extender (issue 36): filter refuses, bind commits by compare-and-swap, preempt checks room."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from typing import Any

import pytest

from policies import gpu
from policies.gpu import budgets, cardrequest, dra, reasons, reservations
from policies.settings import budgets as settings_budgets
from policies.settings import selection
from tests.unit.extender.conftest import FakeApiServer, node, pod
from webhook.extender import binder, budgeting, placement, wire
from webhook.extender import store as store_module

GIB = 1024


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def budget(
    name: str = "team-a", *, gib: int, cards: int | None = None, namespaces: tuple[str, ...] = ("team-a",)
) -> settings_budgets.Budget:
    return settings_budgets.Budget(
        name=name,
        match=selection.NamespaceMatch(names=frozenset(namespaces)),
        memory_mib=gib * GIB,
        cards=cards,
        memory_text=f"{gib}Gi",
    )


def synced_store(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], *, complete_to: int = 1_000_000) -> store_module.Store:
    cache = store_module.Store()
    cache.replace_nodes(nodes)
    cache.replace_pods(pods)
    cache.replace_leases([])
    cache.replace_namespaces([{"metadata": {"name": "team-a", "labels": {"team": "a"}}}, {"metadata": {"name": "team-b"}}])
    cache.seen("Lease", "1")
    cache.seen("Pod", str(complete_to))  # the pod watch has delivered everything up to here
    return cache


def judged(keeper: budgeting.Keeper, cache: store_module.Store, obj: dict[str, Any], names: list[str]) -> placement.Outcome:
    wanted = cardrequest.pod_request(obj)
    states = cache.states(names, now=1_000_000.0, ttl=120.0)
    outcome = placement.filter_nodes(wanted, states=states, names=names)
    return keeper.judge(outcome, pod=obj, wanted=wanted, now=1_000_000.0)


def test_filter_refuses_every_node_once_the_namespace_budget_is_spent() -> None:
    used = pod("used", mem=6, node_name="gpu-0", phase="Running")
    cache = synced_store([node("gpu-0"), node("gpu-1")], [used])
    keeper = budgeting.Keeper(FakeApiServer(), cache, budgeting.Fixed([budget(gib=8)]))

    fits = judged(keeper, cache, pod("small", mem=2), ["gpu-0", "gpu-1"])
    assert fits.passed == ["gpu-0", "gpu-1"]

    over = judged(keeper, cache, pod("big", mem=4), ["gpu-0", "gpu-1"])
    assert over.passed == []
    assert set(over.failed) == {"gpu-0", "gpu-1"}  # failed, not unresolvable: retried when room frees up
    assert (
        over.failed["gpu-0"]
        == "namespace team-a budget 'team-a' (8Gi of GPU memory): 6 GiB used + 4 GiB asked > 8 GiB of GPU memory"
    )
    assert [r.code for r in over.reasons["gpu-0"]] == [reasons.Code.NAMESPACE_BUDGET]

    never = judged(keeper, cache, pod("huge", mem=9), ["gpu-0"])
    assert list(never.unresolvable) == ["gpu-0"]  # more than the whole budget: no preemption can help

    elsewhere = judged(keeper, cache, pod("other", namespace="team-b", mem=4), ["gpu-0", "gpu-1"])
    assert elsewhere.passed == ["gpu-0", "gpu-1"]  # no budget: unlimited


def test_filter_charges_whole_cards_by_the_nodes_largest_cards_and_counts_cards() -> None:
    mixed = node("mixed", mode="topology", count=2, inventory=[16 * GIB, 80 * GIB])
    small = node("small", mode="topology", count=2, inventory=[16 * GIB, 16 * GIB])
    cache = synced_store([mixed, small], [])
    keeper = budgeting.Keeper(FakeApiServer(), cache, budgeting.Fixed([budget(gib=40, cards=1)]))

    one = judged(keeper, cache, pod("one", whole=1), ["mixed", "small"])
    assert one.passed == ["small"]  # on the mixed node it may get the 80 GiB card
    assert "0 GiB used + 80 GiB asked > 40 GiB" in one.unresolvable["mixed"]  # 80 GiB alone is over 40

    two = judged(keeper, cache, pod("two", whole=2), ["small"])
    assert "whole cards" in two.unresolvable["small"]  # 2 cards against a budget of 1


def test_budgets_chosen_by_label_wait_for_the_namespace_list() -> None:
    cache = store_module.Store()
    cache.replace_nodes([node("gpu-0")])
    cache.replace_pods([])
    cache.replace_leases([])
    by_label = settings_budgets.Budget(
        name="labelled",
        match=selection.NamespaceMatch(selector=selection.LabelSelector(match_labels={"team": "a"})),
        memory_mib=GIB,
    )
    keeper = budgeting.Keeper(FakeApiServer(), cache, budgeting.Fixed([by_label]))
    refused = judged(keeper, cache, pod("p", mem=1), ["gpu-0"])
    assert refused.passed == []
    assert "has not listed the namespaces yet" in refused.failed["gpu-0"]  # never fails open

    cache.replace_namespaces([{"metadata": {"name": "team-a", "labels": {"team": "a"}}}])
    assert judged(keeper, cache, pod("p", mem=1), ["gpu-0"]).passed == ["gpu-0"]
    assert judged(keeper, cache, pod("q", mem=2), ["gpu-0"]).passed == []


def _request(obj: dict[str, Any], node_name: str) -> wire.BindRequest:
    meta = obj["metadata"]
    return wire.BindRequest(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], node=node_name)


class WatchedApiServer(FakeApiServer):
    """The in-memory apiserver with a pod watch per replica: each Binding reaches every replica's
    cache in revision order, after a random delay, and a cache is complete only up to what arrived
    (`Store.pods_version`), as the real watch makes it."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.caches: list[store_module.Store] = []
        self._rng = rng
        self._feeds: list[asyncio.Task[None]] = []

    async def bind(self, namespace: str, name: str, *, uid: str, node: str, annotations: Any) -> None:
        await super().bind(namespace, name, uid=uid, node=node, annotations=annotations)
        event = copy.deepcopy(self.pods[(namespace, name)])
        for cache in self.caches:
            self._feeds.append(
                asyncio.create_task(
                    self._deliver(
                        cache, event, previous=self._feeds[-len(self.caches)] if len(self._feeds) >= len(self.caches) else None
                    )
                )
            )

    async def _deliver(self, cache: store_module.Store, event: dict[str, Any], *, previous: asyncio.Task[None] | None) -> None:
        await asyncio.sleep(self._rng.random() * 0.005)
        if previous is not None:
            await previous  # in revision order
        cache.apply("Pod", "MODIFIED", event)


@pytest.mark.parametrize("seed", range(8))
async def test_two_replicas_binding_at_once_never_go_over_a_namespace_budget(seed: int) -> None:
    apiserver = WatchedApiServer(random.Random(seed))
    nodes = [apiserver.add_node(node(f"gpu-{i}", count=4, gib=15)) for i in range(2)]
    pods = [apiserver.add_pod(pod(f"p{i}", mem=2 if i % 3 else 3)) for i in range(24)]
    replicas = []
    for _ in range(2):
        cache = synced_store(nodes, pods, complete_to=max(int(p["metadata"]["resourceVersion"]) for p in pods))
        apiserver.caches.append(cache)
        keeper = budgeting.Keeper(apiserver, cache, budgeting.Fixed([budget(gib=16)]), clock=Clock())
        replicas.append(binder.Binder(apiserver, clock=Clock(), cache=cache, keeper=keeper))
    rng = random.Random(seed)
    results = await asyncio.gather(
        *(replicas[i % 2].bind(_request(p, rng.choice(["gpu-0", "gpu-1"]))) for i, p in enumerate(pods))
    )
    bound = [p for p in apiserver.pods.values() if p["spec"].get("nodeName")]
    used = sum(int(p["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"]) for p in bound)
    assert used <= 16
    assert used >= 14  # filled as far as 2 and 3 GiB pods allow: no room left unused for a 2 GiB pod
    refused = [r.error for r in results if r.error]
    assert refused and all("NAMESPACE_BUDGET" in error for error in refused)
    # The replicas raced on the budget Lease, and read past their caches where those could not vouch.
    assert apiserver.calls.count("replace_lease") > apiserver.lease_writes - apiserver.calls.count("create_lease")
    assert "get_lease" in apiserver.calls
    assert len(refused) + len(bound) == len(pods)
    lease = apiserver.leases[(reservations.LEDGER_NAMESPACE, budgets.lease_name("team-a"))]
    assert budgets.lease_namespace(lease) == "team-a"
    entries = budgets.lease_ledger(lease)
    assert {e.pod for e in entries.values()} <= {f"team-a/{p['metadata']['name']}" for p in bound}


async def test_a_charge_in_a_namespace_without_budget_writes_nothing() -> None:
    apiserver = FakeApiServer()
    cache = synced_store([], [])
    keeper = budgeting.Keeper(apiserver, cache, budgeting.Fixed([budget(gib=1)]))
    assert await keeper.charge(pod("x", namespace="team-b"), budgets.Charge(memory_mib=99 * GIB), expires=None) == ""
    assert apiserver.lease_writes == 0
    refused = await keeper.charge(pod("y"), budgets.Charge(memory_mib=2 * GIB), expires=None)
    assert (
        refused
        == "NAMESPACE_BUDGET: namespace team-a budget 'team-a' (1Gi of GPU memory): 0 GiB used + 2 GiB asked > 1 GiB of GPU memory"
    )
    assert apiserver.lease_writes == 0


async def test_an_entry_of_a_pod_seen_bound_is_pruned_and_the_pod_counts_instead() -> None:
    apiserver = FakeApiServer()
    first = pod("first", mem=4, uid="first")
    cache = synced_store([node("gpu-0")], [first])
    clock = Clock()
    keeper = budgeting.Keeper(apiserver, cache, budgeting.Fixed([budget(gib=8)]), clock=clock)
    assert await keeper.charge(first, budgets.Charge(memory_mib=4 * GIB), expires=clock.now + 120) == ""
    assert keeper.usage("team-a", now=clock.now).total.memory_mib == 4 * GIB

    running = {**first, "spec": {**first["spec"], "nodeName": "gpu-0"}, "status": {"phase": "Running"}}
    cache.put_pod(running)
    assert keeper.usage("team-a", now=clock.now).total.memory_mib == 4 * GIB  # once, not twice

    assert await keeper.charge(pod("second", mem=4, uid="second"), budgets.Charge(memory_mib=4 * GIB), expires=None) == ""
    lease = apiserver.leases[(reservations.LEDGER_NAMESPACE, budgets.lease_name("team-a"))]
    assert set(budgets.lease_ledger(lease)) == {"second"}  # "first" counts through its pod now
    assert keeper.usage("team-a", now=clock.now).total.memory_mib == 8 * GIB

    cache.apply("Pod", "DELETED", running)
    assert keeper.usage("team-a", now=clock.now).total.memory_mib == 4 * GIB


def test_preemption_needs_room_in_the_budget_once_the_victims_are_gone() -> None:
    mine = pod("mine", mem=6, node_name="gpu-0", phase="Running", uid="mine")
    theirs = pod("theirs", namespace="team-b", mem=6, node_name="gpu-0", phase="Running", uid="theirs")
    cache = synced_store([node("gpu-0")], [mine, theirs])
    keeper = budgeting.Keeper(FakeApiServer(), cache, budgeting.Fixed([budget(gib=8)]))
    wanted = cardrequest.pod_request(pod("pre", mem=4))
    preemptor = pod("pre", mem=4, uid="pre")
    assert not keeper.room_after(preemptor, wanted, "gpu-0", ["theirs"], now=1_000_000.0)  # another namespace frees none
    assert keeper.room_after(preemptor, wanted, "gpu-0", ["mine"], now=1_000_000.0)


def test_inspect_rows_and_metrics_name_used_and_budget() -> None:
    used = pod("used", mem=6, node_name="gpu-0", phase="Running")
    cache = synced_store([node("gpu-0")], [used])
    keeper = budgeting.Keeper(FakeApiServer(), cache, budgeting.Fixed([budget(gib=8, cards=2)]))
    [row] = budgeting.inspect_rows(keeper, now=1_000_000.0)
    assert row == {
        "namespace": "team-a",
        "budget": "team-a",
        "memoryBudgetMiB": 8 * GIB,
        "memoryUsedMiB": 6 * GIB,
        "cardsBudget": 2,
        "cardsUsed": 0,
        "holders": 1,
        "unknownCharges": [],
    }
    families = {f.name: f for f in budgeting.Collector(keeper, clock=lambda: 1_000_000.0).collect()}
    [sample] = families["gpu_admission_extender_namespace_gpu_memory_used_bytes"].samples
    assert sample.labels == {"namespace": "team-a", "budget": "team-a"} and sample.value == 6 * 2**30
    [conflicts] = families["gpu_admission_extender_budget_conflicts"].samples
    assert conflicts.name == "gpu_admission_extender_budget_conflicts_total" and conflicts.value == 0


async def test_a_charge_that_cannot_be_computed_is_refused_not_let_in() -> None:
    apiserver = FakeApiServer()
    keeper = budgeting.Keeper(apiserver, synced_store([], []), budgeting.Fixed([budget(gib=80)]))
    unknown = budgets.Charge(cards=1, problem="nvidia.com/gpu: the card memory of node (not bound) is unknown")
    refused = await keeper.charge(pod("x"), unknown, expires=None)
    assert refused.startswith(
        "NAMESPACE_BUDGET: namespace team-a budget 'team-a' (80Gi of GPU memory): the charge cannot be computed:"
    )
    assert apiserver.lease_writes == 0


def test_a_pod_with_claims_counts_through_its_entry_until_its_claims_are_seen_allocated() -> None:
    bound = pod("dra", uid="dra", node_name="gpu-0", phase="Running")
    bound["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    bound["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "dra-gpu-x7"}]
    entry = budgets.Entry(uid="dra", pod="team-a/dra", charge=budgets.Charge(memory_mib=80 * GIB), assumed_at=0.0)
    before = budgets.usage([bound], {"dra": entry}, nodes={}, claims=[], now=1.0)
    assert before.total.memory_mib == 80 * GIB and "dra" not in before.settled
    assert budgets.prune({"dra": entry}, before, pods={"dra": bound}, gone=set(), now=1.0) == {"dra": entry}

    held = (dra.Held(namespace="team-a", claim="dra-gpu-x7", uid="c1", driver="gpu.nvidia.com", pool="gpu-0", device="gpu-1"),)
    after = budgets.usage(
        [bound],
        {"dra": entry},
        nodes={},
        claims=[("c1", held)],
        device_mib={("gpu.nvidia.com", "gpu-0", "gpu-1"): 40 * GIB},
        now=1.0,
    )
    assert after.total.memory_mib == 40 * GIB and "dra" in after.settled  # the claim's device, once
    assert budgets.prune({"dra": entry}, after, pods={"dra": bound}, gone=set(), now=1.0) == {}


def test_room_freed_in_a_budget_is_told_with_its_node_and_lapsed_entries_too() -> None:
    running = pod("running", mem=4, uid="running", node_name="gpu-0", phase="Running")
    cache = synced_store([node("gpu-0"), node("gpu-1")], [running])
    told: list[tuple[str, str]] = []
    cache.on_budget_freed = lambda namespace, node_name: told.append((namespace, node_name))
    cache.apply("Pod", "DELETED", running)
    assert told == [("team-a", "gpu-0")]

    entry = budgets.Entry(uid="u", pod="team-a/p", charge=budgets.Charge(memory_mib=GIB), assumed_at=0.0, expires=100.0)
    lease = budgets.lease_body("team-a", {"u": entry}, "replica")
    lease["metadata"]["resourceVersion"] = "7"
    cache.put_budget_lease(lease)
    assert cache.budget_usage("team-a", now=50.0).total.memory_mib == GIB
    told.clear()
    assert cache.budget_lapsed(now=99.0) == []
    assert cache.budget_lapsed(now=100.0) == ["team-a"] and told == [("team-a", "")]
    assert cache.budget_usage("team-a", now=100.0).total.memory_mib == 0


def _claim(name: str, requests: list[dict[str, Any]], *, allocated_device: str = "") -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": requests}},
    }
    if allocated_device:
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-0", "device": allocated_device}]
                }
            }
        }
    return claim


def _slice() -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-0-slice"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "gpu-0",
            "pool": {"name": "gpu-0", "generation": 1},
            "devices": [
                {"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}},
                {"name": "mig-1", "capacity": {"memory": {"value": "10Gi"}}},
            ],
        },
    }


def test_the_gate_charges_dra_claims_by_what_they_ask_until_allocated() -> None:
    cache = synced_store([node("gpu-0")], [])
    cache.replace_slices([_slice()])
    cache.replace_claims(
        [
            _claim("two", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]),
            _claim("done", [{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}], allocated_device="mig-1"),
            _claim("all", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]),
            _claim(
                "either",
                [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "big", "deviceClassName": "a"},
                            {"name": "two", "deviceClassName": "b", "count": 2},
                        ],
                    }
                ],
            ),
        ]
    )

    def gated(*claims: str, made: dict[str, str] | None = None) -> dict[str, Any]:
        obj = pod("p")
        obj["spec"]["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims] + [
            {"name": key, "resourceClaimTemplateName": "t"} for key in (made or {})
        ]
        obj["status"]["resourceClaimStatuses"] = [
            {"name": key, "resourceClaimName": value} for key, value in (made or {}).items()
        ]
        return obj

    assert cache.claims_gate_charge(gated("two")) == budgets.Charge(memory_mib=160 * GIB)  # 2 x the largest device
    assert cache.claims_gate_charge(gated("done")) == budgets.Charge(memory_mib=10 * GIB)  # allocated: its device
    assert cache.claims_gate_charge(gated("either")) == budgets.Charge(memory_mib=160 * GIB)  # the larger alternative
    assert cache.claims_gate_charge(gated(made={"gpu": "two"})) == budgets.Charge(memory_mib=160 * GIB)
    assert "asks for all matching devices" in cache.claims_gate_charge(gated("all")).problem
    assert "is not there yet" in cache.claims_gate_charge(gated(made={"gpu": ""})).problem
    assert cache.claims_gate_charge(pod("plain", mem=1)) == budgets.NOTHING

    cache.apply("ResourceClaim", "DELETED", _claim("two", []))
    assert "is not there yet" in cache.claims_gate_charge(gated("two")).problem


@pytest.mark.parametrize("seed", range(6))
def test_the_stores_running_usage_is_what_counting_afresh_gives_through_random_changes(seed: int) -> None:
    """The store keeps each namespace's usage one event at a time (`budgets.Book`); at every step it
    equals `budgets.usage` over the namespace's pods, claims and ledger counted afresh."""
    rng = random.Random(seed)
    mixed = node("mixed", mode="topology", count=2, inventory=[16 * GIB, 80 * GIB])
    shared = node("shared", count=4, gib=15)
    plain = node("plain", mode=None, capacity={"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "7"})
    plain["metadata"]["labels"]["nvidia.com/gpu.memory"] = "40960"
    cache = synced_store([mixed, shared, plain], [])
    cache.replace_slices([_slice()])
    clock = 1_000.0
    ledger: dict[str, budgets.Entry] = {}
    pods: dict[str, dict[str, Any]] = {}
    claims: dict[str, dict[str, Any]] = {}
    seen_memory, seen_claims = 0, False
    for step in range(120):
        choice = rng.random()
        uid = f"u{rng.randrange(30)}"
        namespace = rng.choice(["team-a", "team-b"])
        if choice < 0.45:  # a pod appears or changes
            kind = rng.choice(["share", "whole", "gpu", "mig", "claim"])
            obj = (
                pod(uid, namespace=namespace, mem=rng.choice([1, 4]), uid=uid)
                if kind == "share"
                else pod(uid, namespace=namespace, whole=1, uid=uid)
                if kind == "whole"
                else pod(uid, namespace=namespace, uid=uid)
            )
            if kind == "gpu":
                obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
            if kind == "mig":
                obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
            if kind == "claim":
                obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"c-{uid}"}]
            where = {"share": "shared", "whole": "mixed", "gpu": "plain", "mig": "plain", "claim": "plain"}[kind]
            if rng.random() < 0.7:
                obj["spec"]["nodeName"] = where
                obj["status"]["phase"] = rng.choice(["Running", "Running", "Succeeded"])
                if kind == "whole":
                    obj["metadata"]["annotations"][gpu_allocation_key()] = allocation_text(where, [rng.choice([0, 1])])
            obj["metadata"]["resourceVersion"] = str(step + 10)
            if uid in pods and pods[uid]["metadata"]["namespace"] != namespace:
                cache.apply("Pod", "DELETED", pods.pop(uid))
            pods[uid] = obj
            cache.apply("Pod", "MODIFIED", obj)
        elif choice < 0.6 and uid in pods:
            cache.apply("Pod", "DELETED", pods.pop(uid))
        elif choice < 0.75:  # a claim allocated or released
            name = f"c-{uid}"
            if name in claims and rng.random() < 0.5:
                cache.apply("ResourceClaim", "DELETED", claims.pop(name))
            else:
                claims[name] = _claim(
                    name,
                    [{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}],
                    allocated_device=rng.choice(["mig-1", "gpu-0"]),
                )
                cache.apply("ResourceClaim", "MODIFIED", claims[name])
        elif choice < 0.9:  # a ledger entry
            ledger[uid] = budgets.Entry(
                uid=uid,
                pod=f"team-a/{uid}",
                charge=budgets.Charge(memory_mib=rng.choice([1, 8]) * GIB),
                assumed_at=clock,
                expires=rng.choice([None, clock + rng.choice([-5, 50])]),
            )
        else:
            clock += 10
        lease = budgets.lease_body("team-a", ledger, "replica")
        lease["metadata"]["resourceVersion"] = str(step + 10)
        cache.put_budget_lease(lease)
        for name in ("team-a", "team-b"):
            kept = cache.budget_usage(name, now=clock)
            mine = [p for p in pods.values() if p["metadata"]["namespace"] == name]
            held = [(c["metadata"]["uid"], dra.claim_results(c)) for c in claims.values()]
            fresh = budgets.usage(
                mine,
                budgets.lease_ledger(lease) if name == "team-a" else {},
                nodes={n["metadata"]["name"]: n for n in (mixed, shared, plain)},
                claims=held if name == "team-a" else [],
                device_mib=budgets.device_memory([_slice()]),
                gone={u for u in ledger if cache.gone(u)},
                now=clock,
            )
            assert kept.total == fresh.total, (step, name)
            assert dict(kept.by_holder) == dict(fresh.by_holder), (step, name)
            assert dict(kept.problems) == dict(fresh.problems), (step, name)
            assert set(kept.settled) == set(fresh.settled), (step, name)
            seen_memory = max(seen_memory, kept.total.memory_mib)
            seen_claims = seen_claims or any(key.startswith("claim:") for key in kept.by_holder)
    assert seen_memory >= 40 * GIB and seen_claims  # the walk charged whole cards, slices, shares and claims


def gpu_allocation_key() -> str:
    return gpu.ALLOCATION_ANNOTATION


def allocation_text(node_name: str, cards: list[int]) -> str:
    return json.dumps(
        {
            "node": node_name,
            "cards": cards,
            "memGiB": 0,
            "corePercent": 0,
            "whole": True,
            "assumedAt": "2026-12-06T00:00:00.000Z",
        },
        separators=(",", ":"),
    )


async def test_charges_to_one_namespace_waiting_together_share_one_write() -> None:
    apiserver = FakeApiServer()
    keeper = budgeting.Keeper(apiserver, synced_store([], []), budgeting.Fixed([budget(gib=10)]))
    asked = [pod(f"p{i}", uid=f"u{i:02d}") for i in range(20)]
    answers = await asyncio.gather(*(keeper.charge(p, budgets.Charge(memory_mib=GIB), expires=None) for p in asked))
    assert answers[:10] == [""] * 10  # first come, first served, in the order they asked
    assert all(
        a.startswith("NAMESPACE_BUDGET: namespace team-a budget 'team-a' (10Gi of GPU memory): 10 GiB used + 1 GiB asked")
        for a in answers[10:]
    )
    assert apiserver.lease_writes <= 2  # the first charge's write, then one for all that waited behind it
    lease = apiserver.leases[(reservations.LEDGER_NAMESPACE, budgets.lease_name("team-a"))]
    assert sorted(budgets.lease_ledger(lease)) == [f"u{i:02d}" for i in range(10)]


def test_pods_that_hold_no_budget_free_none_when_they_go() -> None:
    # The extender must not stamp Nodes for every pod of the cluster that ends (a real node's e2e
    # found a web server's restart stamping it): only a pod charged, or named by the ledger, frees room.
    plain = pod("web", uid="web", node_name="gpu-0", phase="Running")  # no GPU
    unbound = pod("waiting", mem=4, uid="waiting")
    cache = synced_store([node("gpu-0")], [plain, unbound])
    told: list[tuple[str, str]] = []
    cache.on_budget_freed = lambda namespace, node_name: told.append((namespace, node_name))
    cache.apply("Pod", "DELETED", plain)
    cache.apply("Pod", "MODIFIED", {**unbound, "status": {"phase": "Failed"}})
    assert told == []

    entry = budgets.Entry(uid="gated", pod="team-a/gated", charge=budgets.Charge(memory_mib=GIB), assumed_at=0.0)
    lease = budgets.lease_body("team-a", {"gated": entry}, "replica")
    lease["metadata"]["resourceVersion"] = "9"
    cache.put_budget_lease(lease)
    gated = pod("gated", uid="gated")
    cache.put_pod(gated)
    cache.apply("Pod", "DELETED", gated)
    assert told == [("team-a", "")]  # its ledger entry held room
