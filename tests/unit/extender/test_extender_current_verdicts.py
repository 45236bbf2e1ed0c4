"""`Store.judged_list` reads the verdicts of unchanged nodes from one table per request shape
(issue 19: a filter at 5,000 nodes checked every node's state in Python). Its answers must be
those of judging each node's current state afresh, whatever happened in between: pods added,
bound, finished, deleted; ledger Leases written (with entries of the very pod being judged, whose
own entry is left out), pruned and deleted; Node heartbeats and label changes; relists; time
passing reservations' expiry; another TTL; more request shapes than a node remembers."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from policies.gpu import allocation, cardrequest, cards, reservations
from webhook.extender import placement
from webhook.extender import store as store_module

NOW = 1_800_000_000.0
Factory = Any
Verdict = tuple[str, str, tuple[int, ...], int]


def _verdict(wanted: cardrequest.Request, state: cards.NodeState) -> Verdict:
    fit = placement.evaluate(wanted, state)
    return (str(fit.verdict), fit.message, fit.cards, fit.score)


class _World:
    """A cluster that changes at random, as the watches would tell a Store."""

    def __init__(self, make_node: Factory, make_gpu_pod: Factory, rng: random.Random) -> None:
        self.rng, self.make_gpu_pod = rng, make_gpu_pod
        self.now, self.ttl, self.version = NOW, 120.0, 100
        self.nodes = {
            f"n-{i}": make_node(
                f"n-{i}", placement=rng.choice(["binpack", "spread"]), count=rng.choice([1, 2, 4]), gib=rng.choice([8, 15])
            )
            for i in range(10)
        }
        self.nodes["n-topology"] = make_node("n-topology", mode="topology", count=4)
        self.nodes["n-default"] = make_node("n-default", mode="default")
        self.pods: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.cache = store_module.Store()
        self.cache.replace_nodes(json.loads(json.dumps(list(self.nodes.values()))))  # copies, as a list decodes them
        self.cache.replace_leases([])
        self.cache.replace_pods([])
        self.count = 0

    def _next(self) -> str:
        self.version += 1
        return str(self.version)

    def new_pod(self) -> dict[str, Any]:
        self.count += 1
        kind = self.rng.randrange(5)
        pod: dict[str, Any]
        if kind == 0:
            pod = self.make_gpu_pod(f"p-{self.count}", whole=self.rng.choice([1, 2]), uid=f"uid-{self.count}")
        elif kind == 1:
            pod = self.make_gpu_pod(
                f"p-{self.count}", mem=self.rng.choice([2, 4]), core=self.rng.choice([30, 60]), uid=f"uid-{self.count}"
            )
        else:
            pod = self.make_gpu_pod(f"p-{self.count}", mem=self.rng.choice([1, 2, 4, 7, 8, 15]), uid=f"uid-{self.count}")
        pod["metadata"]["resourceVersion"] = self._next()
        self.pods[pod["metadata"]["uid"]] = pod
        self.cache.apply("Pod", "ADDED", json.loads(json.dumps(pod)))
        return pod

    def bind(self) -> None:
        pending = [p for p in self.pods.values() if not p["spec"].get("nodeName")]
        if not pending:
            return
        pod = self.rng.choice(pending)
        name = self.rng.choice(sorted(self.nodes))
        state = self.cache.state(name, now=self.now, ttl=self.ttl, exclude_uid=pod["metadata"]["uid"])
        wanted = cardrequest.pod_request(pod)
        chosen = placement.choose(wanted, state) if state is not None else None
        if chosen is None:
            return
        held = allocation.Allocation(
            uid=pod["metadata"]["uid"],
            namespace=pod["metadata"]["namespace"],
            name=pod["metadata"]["name"],
            node=name,
            cards=chosen,
            memory_gib=wanted.memory_gib,
            core_percent=wanted.core_percent,
            whole=bool(wanted.cards),
            assumed_at=self.now,
        )
        pod["metadata"]["annotations"] = allocation.bind_annotations(held, card_memory_gib=15)
        pod["spec"]["nodeName"] = name
        pod["metadata"]["resourceVersion"] = self._next()
        self.cache.apply("Pod", "MODIFIED", json.loads(json.dumps(pod)))

    def annotate_only(self) -> None:
        """A pod that carries an allocation annotation but is not bound (an interrupted bind of an
        older version): it counts until its assumed time plus the TTL, so what it holds depends on the time."""
        pending = [p for p in self.pods.values() if not p["spec"].get("nodeName")]
        if not pending:
            return
        pod = self.rng.choice(pending)
        name = self.rng.choice(sorted(self.nodes))
        wanted = cardrequest.pod_request(pod)
        held = allocation.Allocation(
            uid=pod["metadata"]["uid"],
            namespace=pod["metadata"]["namespace"],
            name=pod["metadata"]["name"],
            node=name,
            cards=(0,),
            memory_gib=max(1, wanted.memory_gib),
            assumed_at=self.now - self.rng.choice([0, 100]),
        )
        pod["metadata"]["annotations"] = allocation.bind_annotations(held, card_memory_gib=15)
        pod["metadata"]["resourceVersion"] = self._next()
        self.cache.apply("Pod", "MODIFIED", json.loads(json.dumps(pod)))

    def write_ledger(self) -> None:
        """A ledger Lease with entries of random pods (pending ones included), some soon to expire."""
        name = self.rng.choice(sorted(self.nodes))
        entries = {}
        for pod in self.rng.sample(list(self.pods.values()), min(len(self.pods), self.rng.randrange(0, 4))):
            wanted = cardrequest.pod_request(pod)
            entries[pod["metadata"]["uid"]] = allocation.Allocation(
                uid=pod["metadata"]["uid"],
                namespace=pod["metadata"]["namespace"],
                name=pod["metadata"]["name"],
                node=name,
                cards=(self.rng.randrange(2),),
                memory_gib=max(1, wanted.memory_gib),
                assumed_at=self.now - self.rng.choice([0, 30]),
                expires=self.now + self.rng.choice([5, 40, 120]),
                source="reservation",
            )
        if self.rng.random() < 0.3:  # an entry of a pod no one has seen (deleted, or not yet watched)
            entries["ghost-" + str(self.count)] = allocation.Allocation(
                uid="ghost-" + str(self.count),
                namespace="team-a",
                name="ghost",
                node=name,
                cards=(0,),
                memory_gib=3,
                assumed_at=self.now,
                expires=self.now + 60,
                source="reservation",
            )
        lease = reservations.lease_body(name, self.nodes[name]["metadata"]["uid"], entries, "test")
        lease["metadata"]["resourceVersion"] = self._next()
        self.leases[name] = lease
        self.cache.apply("Lease", "MODIFIED", json.loads(json.dumps(lease)))

    def step(self) -> None:
        """One random change."""
        rng, cache = self.rng, self.cache
        roll = rng.random()
        if roll < 0.25:
            self.new_pod()
        elif roll < 0.45:
            self.bind()
        elif roll < 0.57:
            self.write_ledger()
        elif roll < 0.62 and self.leases:
            name = rng.choice(sorted(self.leases))
            lease = self.leases.pop(name)
            lease["metadata"]["resourceVersion"] = self._next()
            cache.apply("Lease", "DELETED", lease)
        elif roll < 0.70 and self.pods:
            pod = self.pods.pop(rng.choice(sorted(self.pods)))
            pod["metadata"]["resourceVersion"] = self._next()
            cache.apply("Pod", "DELETED", pod)
        elif roll < 0.75 and self.pods:
            pod = self.pods[rng.choice(sorted(self.pods))]
            pod["status"]["phase"] = rng.choice(["Succeeded", "Running", "Running", "Failed"])  # Running: a kubelet status update
            pod["metadata"]["resourceVersion"] = self._next()
            cache.apply("Pod", "MODIFIED", json.loads(json.dumps(pod)))
        elif roll < 0.78:
            self.annotate_only()
        elif roll < 0.82:
            node = self.nodes[rng.choice(sorted(self.nodes))]
            if rng.random() < 0.3:  # a mode change: another verdict for every request
                node["metadata"]["labels"]["ack.node.gpu.placement"] = rng.choice(["binpack", "spread"])
            node["metadata"]["resourceVersion"] = self._next()  # else a heartbeat: nothing the card model reads
            cache.apply("Node", "MODIFIED", json.loads(json.dumps(node)))
        elif roll < 0.90:
            self.now += rng.choice([1.0, 6.0, 30.0, 50.0])  # reservations and in-flight entries lapse
        elif roll < 0.93:
            self.ttl = rng.choice([60.0, 120.0])
        elif roll < 0.95:
            cache.replace_pods(json.loads(json.dumps(list(self.pods.values()))))
            cache.seen("Pod", self._next())
        elif roll < 0.97:
            cache.replace_leases(json.loads(json.dumps(list(self.leases.values()))))
            cache.seen("Lease", self._next())
        else:
            cache.replace_nodes(json.loads(json.dumps(list(self.nodes.values()))))


@pytest.mark.parametrize(("memo_keys", "max_tokens"), [(32, 4096), (2, 5)], ids=["as-shipped", "tiny-memos"])
def test_remembered_verdicts_equal_fresh_ones_through_random_changes(
    make_node: Factory, make_gpu_pod: Factory, monkeypatch: pytest.MonkeyPatch, memo_keys: int, max_tokens: int
) -> None:
    monkeypatch.setattr(store_module, "_MEMO_KEYS", memo_keys)
    monkeypatch.setattr(store_module, "_MAX_TOKENS", max_tokens)
    rng = random.Random(1919 + memo_keys)
    world = _World(make_node, make_gpu_pod, rng)
    every = sorted(world.nodes)
    checked = excluded = remembered = 0
    for _ in range(900):
        world.step()
        pods = list(world.pods.values())
        pod = rng.choice(pods) if pods and rng.random() < 0.7 else world.new_pod()
        uid = pod["metadata"]["uid"]
        wanted = cardrequest.pod_request(pod)
        names = rng.sample(every, rng.randrange(1, len(every) + 1)) + rng.choice([[], ["unknown"], [every[0]]])
        calls: list[str] = []

        def judge(state: cards.NodeState, wanted: cardrequest.Request = wanted, calls: list[str] = calls) -> Verdict:
            calls.append(state.node.name)
            return _verdict(wanted, state)

        found = world.cache.judged_list(names, now=world.now, ttl=world.ttl, exclude_uid=uid, key=("check", wanted), judge=judge)
        # Judged afresh after the call (a state computed here must not help the call above).
        fresh = [
            None
            if (state := world.cache.state(n, now=world.now, ttl=world.ttl, exclude_uid=uid)) is None
            else _verdict(wanted, state)
            for n in names
        ]
        assert found == fresh, f"step {checked}: {pod['metadata']['name']} on {names}"
        assert world.cache.judged(
            names, now=world.now, ttl=world.ttl, exclude_uid=uid, key=("check", wanted), judge=judge
        ) == dict(zip(names, fresh, strict=True))
        counting = {
            n
            for n in set(names)
            if (s := world.cache.state(n, now=world.now, ttl=world.ttl)) is not None
            and uid in {a.uid for a in (*s.allocations, *s.orphans)}
        }
        excluded += bool(counting)
        calls.clear()
        again = world.cache.judged_list(names, now=world.now, ttl=world.ttl, exclude_uid=uid, key=("check", wanted), judge=judge)
        assert again == fresh
        # Nothing changed: only the nodes whose state counts the pod itself are judged again.
        assert set(calls) <= counting, (calls, counting)
        remembered += not calls
        checked += 1
    assert excluded > 25, "the pod's own entry was left out often enough"
    assert remembered > 300, "most repeated calls were answered from the table"


def test_the_pods_own_ledger_entry_is_left_out_on_every_node_that_lists_it(make_node: Factory, make_gpu_pod: Factory) -> None:
    cache = store_module.Store()
    cache.replace_nodes([make_node("a", count=1, gib=8), make_node("b", count=1, gib=8), make_node("c", count=1, gib=8)])
    cache.replace_leases([])
    cache.replace_pods([])
    pod = make_gpu_pod("p", mem=6)
    pod["metadata"]["resourceVersion"] = "5"
    cache.apply("Pod", "ADDED", pod)
    uid = pod["metadata"]["uid"]
    wanted = cardrequest.pod_request(pod)
    for rv, name in enumerate(("a", "b"), start=10):  # an earlier, interrupted attempt of this very pod on a and b
        entry = allocation.Allocation(
            uid=uid,
            namespace="team-a",
            name="p",
            node=name,
            cards=(0,),
            memory_gib=6,
            assumed_at=NOW,
            expires=NOW + 60,
            source="reservation",
        )
        lease = reservations.lease_body(name, "", {uid: entry}, "test")
        lease["metadata"]["resourceVersion"] = str(rv)
        cache.apply("Lease", "ADDED", lease)
    other = cardrequest.pod_request(make_gpu_pod("q", mem=6))
    judge_other = lambda s: placement.evaluate(other, s, decide=False).fits  # noqa: E731
    judge_own = lambda s: placement.evaluate(wanted, s, decide=False).fits  # noqa: E731
    key = ("filter", wanted)
    # Another pod of the same shape: a and b are full (the entry holds 6 of 8 GiB); remembered.
    assert cache.judged_list(["a", "b", "c"], now=NOW, ttl=120, exclude_uid="other-uid", key=key, judge=judge_other) == [
        False,
        False,
        True,
    ]
    assert cache.judged_list(["a", "b", "c"], now=NOW, ttl=120, exclude_uid="other-uid", key=key, judge=judge_own) == [
        False,
        False,
        True,
    ]
    # The pod itself: its own entries do not stand in its way, although the table says "full".
    assert cache.judged_list(["a", "b", "c"], now=NOW, ttl=120, exclude_uid=uid, key=key, judge=judge_own) == [True, True, True]
    # Once its entries lapse, the other pod fits everywhere too.
    assert cache.judged_list(["c", "a", "b"], now=NOW + 61, ttl=120, exclude_uid="other-uid", key=key, judge=judge_other) == [
        True,
        True,
        True,
    ]


def test_the_stores_node_states_are_those_of_cards_node_state_through_random_changes(
    make_node: Factory, make_gpu_pod: Factory
) -> None:
    """The store reads what each bound pod holds once per copy of the pod (`Store._node_state`):
    its states must be `cards.node_state`'s over the same node, pods and ledger."""
    rng = random.Random(2019)
    world = _World(make_node, make_gpu_pod, rng)
    compared = counted = 0
    for _ in range(700):
        world.step()
        cache, now, ttl = world.cache, world.now, world.ttl
        uid = rng.choice([*world.pods, ""]) if world.pods else ""
        for name in sorted(world.nodes):
            node = cache.node(name)
            assert node is not None
            live = {u: e for u, e in cache.ledger(name).items() if cache._plausible(e, node=name, now=now)}
            # What counts for placement (issue 38: not pods being deleted, nor their ledger entries).
            pods_on, counted_live = cache.counted(cache.pods_on(name), live)
            expected = cards.node_state(node, pods_on, now=now, ttl=ttl, reservations=counted_live, exclude_uid=uid)
            assert cache.state(name, now=now, ttl=ttl, exclude_uid=uid) == expected, name
            assert cache.inspect_state(name, now=now, ttl=ttl) == cards.node_state(
                node, pods_on, now=now, ttl=ttl, reservations=cache.counted(cache.pods_on(name), cache.ledger(name))[1]
            ), name
            # As bind asks: the node's bound pods (the cache's copies, or a list's) and a ledger of its choosing.
            bound = cache.bound_pods(name)
            for pods in (bound, json.loads(json.dumps(bound))):
                counted_pods, counted_entries = cache.counted(pods, live)
                assert cache.node_state_of(node, pods, now=now, ttl=ttl, reservations=live, exclude_uid=uid) == cards.node_state(
                    node, counted_pods, now=now, ttl=ttl, reservations=counted_entries, exclude_uid=uid
                ), name
            compared += 1
            counted += len(expected.allocations)
    assert compared == 700 * len(world.nodes) and counted > 2000, "states with pods and ledger entries in them"
