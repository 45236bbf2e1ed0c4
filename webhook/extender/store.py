"""The extender's in-memory copy of Nodes, Pods and the nodes' ledger Leases (fed by list+watch),
indexed by node.

A node's reservation ledger is the union of its Lease's (`policies.gpu.reservations.lease_body`, in the
ledger namespace) and, from versions before the Lease, the Node annotation's, which nothing writes
any more: its entries count until they expire or their pod shows up bound.

Filter and prioritize read it; they are optimistic and may be a moment stale. Bind trusts it only
as far as it can prove it current: the pod watch's progress (`pods_version`, the etcd revision the
pod copies are complete up to) must have reached the resourceVersion of the Lease whose ledger bind
compare-and-swaps, otherwise bind reads from the apiserver (see `binder`). Objects are slimmed on
the way in to the fields the card model reads, so a big cluster's pods stay cheap to hold.

All methods run on the event loop's thread (the watch threads hand their events over with
`call_soon_threadsafe`), so there is no locking here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import operator
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from policies import gpu, podspec
from policies.gpu import allocation, budgets, cards, dra, reservations
from webhook.extender import preemption, reality

Object = dict[str, Any]


_OWN_LEASE: Any = object()  # `Store.budget_usage`: the budget Lease held here


class Store:
    """Nodes by name, pods by UID, and the pods each node carries or has reserved."""

    def __init__(self, *, honour_out_of_band: bool = False, namespace: str = reservations.LEDGER_NAMESPACE) -> None:
        self._honour_out_of_band = honour_out_of_band  # see `reality`: cards shrink by out-of-band use
        self._namespace = namespace  # the ledger namespace: Leases elsewhere are no ledger
        self._nodes: dict[str, Object] = {}
        self._real_nodes: dict[
            str, Object
        ] = {}  # node name -> its slim copy as written, where `_nodes` holds it less out-of-band use
        self._leases: dict[str, Object] = {}  # node name -> its ledger Lease (slim)
        self._node_ledger_rv: dict[
            str, int
        ] = {}  # node -> the revision of the first copy seen with its current annotation ledger
        self._pods: dict[str, Object] = {}
        self._pod_node: dict[str, str] = {}
        # UIDs of pods the watch saw deleted (the latest MAX_GONE): a UID is never reused, so a ledger
        # entry of one holds no card, even inside the in-flight grace of an unknown pod (issue 27: a
        # preemption's victim deleted seconds after its bind kept its card through its entry).
        self._gone: dict[str, None] = {}
        self._nominated: dict[str, set[str]] = {}  # node -> pods nominated to it (`preemption.nominated_node`), not bound yet
        self._nominee_node: dict[str, str] = {}
        # The preempt verb's records (`preemption.Hold`), from the hold Leases: node -> preemptor UID ->
        # record; and per preemptor, when this process first saw every victim of its record gone.
        self._holds: dict[str, dict[str, preemption.Hold]] = {}
        self._hold_victims: frozenset[str] = frozenset()  # UIDs the hold records name as victims (`_counts`)
        self._hold_leases: dict[str, Object] = {}  # node -> its hold Lease (slim), for the next write's precondition
        self._victims_gone: dict[str, float] = {}
        self._newest_hold: dict[str, float] = {}  # preemptor UID -> the time of its newest record on any node
        self._by_node: dict[str, set[str]] = {}
        self._versions: dict[str, int] = {}  # per node: bumped whenever the node or its pods change
        self._states: dict[str, _Cached] = {}
        self._ledger_refs: dict[str, set[str]] = {}  # pod UID -> nodes whose ledger names it
        self.nodes_synced = False
        self.pods_synced = False
        self.leases_synced = False
        self._leases_version = -1  # the revision the Lease watch has delivered every event up to
        self._leases_listed = -1  # the revision of the last Lease list
        self._lease_deleted: dict[str, int] = {}  # node -> the revision its Lease's deletion was seen at
        self._pods_version = -1  # the revision the pod watch has delivered every event up to; -1: unknown
        self._pod_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._tokens: dict[Hashable, int] = {}  # `judged` keys
        # `judged`'s verdicts by key token, for the nodes whose remembered state is current and
        # holds that token in its memo: a filter over 5,000 nodes reads them at C speed instead of
        # checking each node's state in Python (issue 19). An entry goes whenever its node's
        # state stops being current (`_forget`), so it never outlives the memo it copies.
        self._held: dict[str, tuple[Object, bool, cards.Holding]] = {}  # uid -> (pod copy, bound, its holding: kept where bound)
        self._node_cards: dict[str, tuple[Object, cards.NodeCards]] = {}  # name -> (node copy, its cards)
        self._current: dict[int, dict[str, object]] = {}
        self._current_ttl: float | None = None  # the ttl `_current` was judged with
        self._lapses: list[tuple[float, str]] = []  # (valid_until, node) of remembered states that lapse in time
        self._vouched: dict[str, int] = {}  # node -> the version of this process's last commit whose pods this cache covers
        # Dynamic Resource Allocation (`policies.gpu.dra`): ResourceSlices by name, allocated
        # ResourceClaims by UID (slim), and what they hold per node and card UUID.
        self._slices: dict[str, Object] = {}
        self._claims: dict[str, Object] = {}
        self._claim_specs: dict[tuple[str, str], Object] = {}  # (namespace, name) -> spec of every claim (budget gate)
        self._dra_holds: dict[str, dict[str, tuple[dra.Held, ...]]] = {}
        self.slices_synced = False
        self.claims_synced = False
        self._dra_unserved: set[str] = set()  # kinds whose list answered 404 (`not_served`)
        self._dra_expected = False  # a watch of them runs (`expect_dra`): until it lists, the view is incomplete
        # GPU budgets (`budgeting`): the pods of each namespace, the namespaces' labels (for the
        # budgets' selectors), each budgeted namespace's ledger Lease (slim), and each namespace's
        # usage as last computed, with the change counter it was computed at.
        self._by_namespace: dict[str, set[str]] = {}
        self._namespace_labels: dict[str, dict[str, str]] = {}
        self.namespaces_synced = False
        self._budget_leases: dict[str, Object] = {}
        self._budget_lease_deleted: dict[str, int] = {}  # namespace -> the revision its budget Lease's deletion was seen at
        self._budget_changes: dict[str, int] = {}  # namespace -> bumped on each change of its pods or its ledger
        self._budget_epoch = 0  # bumped when nodes, claims or slices change (a charge may change with them)
        self._usages: dict[str, tuple[tuple[int, int], float, budgets.Usage]] = {}  # namespace -> (versions, valid until, usage)
        self._book = budgets.Book()  # the bound pods' and the claims' charges, per namespace, kept per event
        # Called with a namespace when its budget may have room again (a pod of it gone or finished,
        # ledger entries gone): the budget gate tries its gated pods again.
        # With the node the room came from where known ("" for a ledger entry gone): `app` nudges.
        self.on_budget_freed: Callable[[str, str], None] | None = None
        # Called when a pod carrying the budget gate arrives or changes (`gates`: a pass soon).
        self.on_gated: Callable[[], None] | None = None
        # Called with a node's name when cards may have come free there: a counted pod deleted,
        # finished or moved, or ledger entries gone (`nudge`: kube-scheduler must hear of it).
        self.on_freed: Callable[[str], None] | None = None
        # Called with a pod's UID and a node when the pod is first seen nominated there (`holds`).
        self.on_nominated: Callable[[str, str], None] | None = None

    @property
    def honours_out_of_band(self) -> bool:
        """Whether the Nodes held here are already read less out-of-band use (`reality`)."""
        return self._honour_out_of_band

    @property
    def pods_version(self) -> int:
        """The etcd revision up to which every pod event has been applied here (from the watch's
        events, bookmarks and lists; never from `put_pod`, which binds use for their own copies);
        -1 when unknown (not listed yet, or a resourceVersion that is not a number)."""
        return self._pods_version

    def seen(self, kind: str, version: str) -> None:
        """The `kind` watch (or list) has delivered everything up to `version` (a bookmark, a list's version)."""
        if kind == "Pod":
            self._advance_pods(version)
        elif kind == "Lease" and version.isdigit():
            if self._leases_listed < 0:
                self._leases_listed = int(version)  # the list's own version comes first
            self._leases_version = max(self._leases_version, int(version))

    @property
    def leases_version(self) -> int:
        """The etcd revision up to which every ledger Lease event has been applied here; -1: unknown.
        A node without a Lease here had none then (or only one deleted at or before it)."""
        return self._leases_version

    def lease_floor(self, node: str) -> int:
        """For a node without a Lease here: a revision at or after every prune its Lease ledger ever
        had. A Lease deleted before the last list was pruned before that list's revision; one deleted
        since, at its deletion's revision (its DELETED event came, or the Lease would still be here).
        -1: unknown (not listed yet)."""
        return max(self._leases_listed, self._lease_deleted.get(node, -1)) if self._leases_listed >= 0 else -1

    def node_ledger_version(self, name: str) -> int:
        """The revision of the first copy of the Node seen here with the annotation ledger it has now
        (written by an earlier version; -1 where it has none): every entry ever pruned from that
        ledger was of a pod bound before it, so a pod cache complete up to it shows those pods."""
        return self._node_ledger_rv.get(name, -1)

    def vouch(self, node: str, version: int) -> None:
        """This process wrote `node`'s ledger Lease at `version` from a read this cache covered
        (`binder`): every ledger entry pruned up to that version is of a pod this cache shows bound
        or gone, though the pod watch may not have reached `version` yet. Forgotten on a relist."""
        self._vouched[node] = version

    def vouched(self, node: str) -> int:
        return self._vouched.get(node, -1)

    async def wait_for_pods(self, version: int, *, timeout: float) -> bool:
        """Wait (at most `timeout` s) until `pods_version` reaches `version`; whether it did."""
        if self._pods_version >= version:
            return True
        if timeout <= 0 or version < 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (version, waiter)
        self._pod_waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            return False
        finally:
            if entry in self._pod_waiters:
                self._pod_waiters.remove(entry)
        return self._pods_version >= version

    def _advance_pods(self, version: str) -> None:
        if not version.isdigit():
            return
        number = int(version)
        if number <= self._pods_version:
            return
        self._pods_version = number
        if self._pod_waiters:
            for wanted, waiter in [w for w in self._pod_waiters if w[0] <= number]:
                self._pod_waiters.remove((wanted, waiter))
                if not waiter.done():
                    waiter.set_result(None)

    @property
    def synced(self) -> bool:
        return self.nodes_synced and self.pods_synced and self.leases_synced

    # --- reading ---

    @property
    def dra_synced(self) -> bool:
        """Whether the DRA view is complete: ResourceSlices and ResourceClaims each listed once, or
        found not served (or no watch of them runs: a store filled by hand). Until then a card a
        claim holds could look free, so filter offers no card."""
        listed = {"ResourceSlice": self.slices_synced, "ResourceClaim": self.claims_synced}
        return not self._dra_expected or all(done or kind in self._dra_unserved for kind, done in listed.items())

    def expect_dra(self) -> None:
        """A watch of ResourceSlices and ResourceClaims starts: `dra_synced` waits for its lists."""
        self._dra_expected = True

    def not_served(self, kind: str) -> None:
        """The watch found `kind` (ResourceSlice, ResourceClaim) not served: nothing of it to wait for."""
        self._dra_unserved.add(kind)

    def dra_holds(self, node: str) -> dra.NodeHolds:
        """The node's cards DRA claims hold, by card UUID."""
        return self._dra_holds.get(node, dra.NO_HOLDS)

    def slices(self) -> list[Object]:
        return list(self._slices.values())

    def claims(self) -> list[Object]:
        return list(self._claims.values())

    def node(self, name: str) -> Object | None:
        """The node as the card model should judge it (less out-of-band use with `honour_out_of_band`)."""
        return self._nodes.get(name)

    def real_node(self, name: str) -> Object | None:
        """The node's cards as they are (what gpushare's card-size annotation must carry), even
        where `node` shrinks them by out-of-band use."""
        return self._real_nodes.get(name) or self._nodes.get(name)

    def pod(self, uid: str) -> Object | None:
        return self._pods.get(uid)

    def lease(self, node: str) -> Object | None:
        """The node's ledger Lease as last seen (slim), None where it has none."""
        return self._leases.get(node)

    # --- GPU budgets ---

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        """A namespace's labels as last seen; None where the namespace is not known here."""
        return self._namespace_labels.get(namespace)

    def real_cards(self, name: str) -> cards.NodeCards | None:
        """The node's cards as they are (not less out-of-band use), made once per copy of the Node."""
        real = self._real_nodes.get(name)
        if real is not None:
            return cards.node_cards(real)
        node = self._nodes.get(name)
        if node is None:
            return None
        kept = self._node_cards.get(name)
        if kept is None or kept[0] is not node:
            kept = self._node_cards[name] = (node, cards.node_cards(node))
        return kept[1]

    def any_node(self) -> str:
        """A node's name ("" where none is known): a Node to stamp where room frees up nowhere in particular."""
        return next(iter(self._nodes), "")

    def namespaces(self) -> list[str]:
        """The namespaces listed here (their labels are known)."""
        return list(self._namespace_labels)

    def pod_namespaces(self) -> list[str]:
        """The namespaces of the pods held here."""
        return list(self._by_namespace)

    def namespace_pods(self, namespace: str) -> list[Object]:
        return [self._pods[uid] for uid in self._by_namespace.get(namespace, ()) if uid in self._pods]

    def budget_lease(self, namespace: str) -> Object | None:
        """The namespace's budget ledger Lease as last seen (slim), None where it has none."""
        return self._budget_leases.get(namespace)

    def budget_lease_floor(self, namespace: str) -> int:
        """`lease_floor` for a namespace's budget Lease: a revision at or after every prune of its
        ledger, where none is here; -1: unknown (not listed yet)."""
        return max(self._leases_listed, self._budget_lease_deleted.get(namespace, -1)) if self._leases_listed >= 0 else -1

    def claims_gate_charge(self, pod: Mapping[str, Any]) -> budgets.Charge:
        """What the pod's DRA claims are charged at the budget gate (`budgets.claims_gate_charge`)."""
        if not podspec.mapping(pod.get("spec")).get("resourceClaims"):
            return budgets.NOTHING
        namespace = _namespace(pod)
        allocated = {_name(claim): dra.claim_results(claim) for claim in self._claims.values() if _namespace(claim) == namespace}
        pending = {name: spec for (ns, name), spec in self._claim_specs.items() if ns == namespace}
        return budgets.claims_gate_charge(
            pod, allocated=allocated, pending=pending, memory=budgets.device_memory(self._slices.values())
        )

    def gone(self, uid: str) -> bool:
        """Whether the pod watch saw this UID deleted (UIDs are never reused)."""
        return uid in self._gone

    def budget_usage(
        self,
        namespace: str,
        *,
        now: float,
        lease: Mapping[str, Any] | None = _OWN_LEASE,
        pods: Sequence[Mapping[str, Any]] | None = None,
    ) -> budgets.Usage:
        """What the namespace holds against its budget (`budgets.usage`): its bound pods, its
        allocated DRA claims and its ledger's entries (`lease`: that Lease's instead of the one
        held here, for a bind deciding on what it read; `pods`: the namespace's pods as listed from
        the apiserver instead of the cache's, where the cache cannot vouch for them: then an entry
        of a pod not listed is of a pod gone). Remembered until something it counts changes or an
        entry expires."""
        own = lease is _OWN_LEASE and pods is None
        key = (self._budget_changes.get(namespace, 0), self._budget_epoch)
        if own:
            found = self._usages.get(namespace)
            if found is not None and found[0] == key and now < found[1]:
                return found[2]
        ledger = budgets.lease_ledger(self._budget_leases.get(namespace) if lease is _OWN_LEASE else lease, home=self._namespace)
        if pods is None:  # the book's counts and the ledger's entries: no pod recounted (`budgets.Book`)
            found_usage = self._book.usage(namespace, ledger, gone=self._gone.__contains__, now=now)
            if own:
                until = min((e.expires for e in ledger.values() if e.expires is not None and e.expires > now), default=_NEVER)
                self._usages[namespace] = (key, until, found_usage)
            return found_usage
        listed = pods
        nodes = {
            node: self._real_nodes.get(node) or self._nodes[node]
            for node in {cards.pod_node(p) for p in pods}
            if node in self._nodes
        }
        claims = [
            (uid, dra.claim_results(claim))
            for uid, claim in self._claims.items()
            if podspec.mapping(claim.get("metadata")).get("namespace") == namespace
            and not dra.is_hold_claim(claim, namespace=self._namespace)
        ]
        found_usage = budgets.usage(
            pods,
            ledger,
            nodes=nodes,
            claims=claims,
            device_mib=budgets.device_memory(self._slices.values()) if claims else None,
            gone=set(ledger) - {str(podspec.mapping(p.get("metadata")).get("uid", "")) for p in listed},
            now=now,
        )
        return found_usage

    def _holds_budget(self, uid: str, namespace: str) -> bool:
        """Whether the pod holds room in its namespace's budget: charged as bound, or named by the
        namespace's budget ledger (its going frees room; other pods' going frees none)."""
        lease = self._budget_leases.get(namespace)
        return self._book.charged(uid) or (lease is not None and uid in budgets.lease_ledger(lease, home=self._namespace))

    def _budget_changed(self, namespace: str, *, freed: bool = False, node: str = "") -> None:
        if namespace:
            self._budget_changes[namespace] = self._budget_changes.get(namespace, 0) + 1
            if freed and self.on_budget_freed is not None:
                self.on_budget_freed(namespace, node)

    def budget_lapsed(self, *, now: float) -> list[str]:
        """Namespaces whose remembered usage had a ledger entry expire by `now` (room freed with no
        event: the tidy pass tells `on_budget_freed`, and computes their usage afresh)."""
        lapsed = [namespace for namespace, (_, until, _) in self._usages.items() if until <= now]
        for namespace in lapsed:
            del self._usages[namespace]
            if self.on_budget_freed is not None:
                self.on_budget_freed(namespace, "")
        return lapsed

    def put_namespace(self, obj: Mapping[str, Any]) -> None:
        labels = podspec.mapping(podspec.mapping(obj.get("metadata")).get("labels"))
        self._namespace_labels[_name(obj)] = {str(k): str(v) for k, v in labels.items()}

    def replace_namespaces(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._namespace_labels = {}
        for item in items:
            self.put_namespace(item)
        self.namespaces_synced = True

    def put_budget_lease(self, obj: Mapping[str, Any]) -> bool:
        """A namespace's budget ledger Lease (`budgets.lease_namespace`); False where it is none to trust."""
        namespace = budgets.lease_namespace(obj, home=self._namespace)
        if namespace is None:
            return False
        held = self._budget_leases.get(namespace)
        if held is not None and (_same_version(obj, held) or _older(obj, held)):
            return True
        metadata = podspec.mapping(obj.get("metadata"))
        slim = {
            "metadata": {
                **{k: metadata[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in metadata},
                "annotations": dict(podspec.mapping(metadata.get("annotations"))),
            }
        }
        self._budget_leases[namespace] = slim
        shrunk = held is not None and bool(
            set(budgets.lease_ledger(held, home=self._namespace)) - set(budgets.lease_ledger(slim, home=self._namespace))
        )
        self._budget_changed(namespace, freed=shrunk)
        return True

    def ledger(self, node: str) -> dict[str, allocation.Allocation]:
        """The node's whole ledger: its Node annotation's entries (earlier versions) and its Lease's."""
        held = self._nodes.get(node)
        if held is None:
            return {}
        return self.ledger_with(held)

    def ledger_with(self, node: Mapping[str, Any]) -> dict[str, allocation.Allocation]:
        """The whole ledger of `node` (a Node object from elsewhere: the scheduler's) with its Lease's here."""
        return reservations.union(node, self._leases.get(_name(node)), namespace=self._namespace)

    def nodes(self) -> list[Object]:
        return list(self._nodes.values())

    def pods(self) -> list[Object]:
        return list(self._pods.values())

    def pods_on(self, node: str) -> list[Object]:
        """Pods bound to `node` or holding an allocation annotation for it."""
        return [self._pods[uid] for uid in self._by_node.get(node, ())]

    def nominated_nodes(self) -> Mapping[str, set[str]]:
        """Nodes with pods nominated to them after a preemption (`preemption.nominated_node`), by UID."""
        return self._nominated

    def nominees(self, node: str) -> list[Object]:
        """The pods nominated to `node`, waiting for their victims to leave."""
        return [self._pods[uid] for uid in self._nominated.get(node, ()) if uid in self._pods]

    def hold_nodes(self) -> Mapping[str, Mapping[str, preemption.Hold]]:
        """Nodes with preemption records (`preemption.Hold`; standing or not: see `held_for`)."""
        return self._holds

    def hold_lease(self, node: str) -> Object | None:
        return self._hold_leases.get(node)

    def held_for(self, node: str, *, now: float) -> list[Object]:
        """The preemptors whose record on `node` stands (`preemption.standing`), judged on the live
        pods; a preemptor with records on several nodes counts on its newest one only."""
        found: list[Object] = []
        for uid, hold in self._holds.get(node, {}).items():
            if self._newest_hold.get(uid, hold.at) > hold.at:
                continue
            there = [self._pods[victim] for victim in hold.victims if victim in self._pods]
            evicted = len(there) < len(hold.victims) or any(_deleting(victim) for victim in there)
            gone_since = None if there else self._victims_gone.setdefault(uid, now)
            if there:
                self._victims_gone.pop(uid, None)
            pod = self._pods.get(uid)
            if pod is not None and preemption.standing(
                hold, pod, now=now, evicted=evicted, victims_left=bool(there), gone_since=gone_since
            ):
                found.append(pod)
        return found

    def with_holds(self, node: str, state: cards.NodeState, *, pod: Mapping[str, Any], now: float) -> cards.NodeState:
        """`state` with the cards held by pods of the pod's priority or above that are nominated to
        the node, or whose preemption's record there stands (`held_for`), as `preemption.held`
        places them; the state itself where none is. Filter, bind, explain and simulate all judge
        a pod on this."""
        if node not in self._nominated and node not in self._holds:
            return state
        metadata = podspec.mapping(pod.get("metadata"))
        waiting = {
            str(podspec.mapping(p.get("metadata")).get("uid", "")): p
            for p in (*self.held_for(node, now=now), *self.nominees(node))
        }
        nominees = preemption.holders(
            (preemption.nominee_of(other) for other in waiting.values()),
            priority=preemption.priority_of(pod),
            uid=str(metadata.get("uid", "")),
        )
        if not nominees:
            return state
        going = frozenset(a.uid for a in state.allocations if (other := self._pods.get(a.uid)) is not None and _deleting(other))
        return preemption.held(state, nominees, going=going)

    def put_hold_lease(self, obj: Mapping[str, Any]) -> bool:
        """A hold Lease (`preemption.hold_lease_node`); False where it is none to trust."""
        node = preemption.hold_lease_node(obj, namespace=self._namespace)
        if node is None:
            return False
        held = self._hold_leases.get(node)
        if held is not None and (_same_version(obj, held) or _older(obj, held)):
            return True
        metadata = podspec.mapping(obj.get("metadata"))
        text = podspec.mapping(metadata.get("annotations")).get(preemption.HOLDS_ANNOTATION)
        self._hold_leases[node] = {
            "metadata": {k: metadata[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in metadata}
        }
        holds = preemption.read_holds(text, node=node)
        if holds:
            self._holds[node] = holds
        else:
            self._holds.pop(node, None)
        self._index_holds()
        return True

    def _index_holds(self) -> None:
        """`_newest_hold` and `_hold_victims` from `_holds` again (on each hold Lease change: rare,
        and few records); the nodes of victims that count differently now are touched."""
        newest: dict[str, float] = {}
        victims: set[str] = set()
        for records in self._holds.values():
            for uid, hold in records.items():
                newest[uid] = max(newest.get(uid, hold.at), hold.at)
                victims.update(hold.victims)
        self._newest_hold = newest
        changed, self._hold_victims = self._hold_victims ^ victims, frozenset(victims)
        for uid in changed:
            if (node := self._pod_node.get(uid)) is not None and (pod := self._pods.get(uid)) is not None and _deleting(pod):
                self._touch(node)

    def _counts(self, pod: Mapping[str, Any]) -> bool:
        """Whether a pod's cards count for placement: not from the moment its deletion is seen
        (`deletionTimestamp`; it is going, and kube-scheduler is told the node changed), unless a
        preemption is under way there: a hold record names it as a victim, or a pod of higher
        priority is nominated to its node. Then it counts until it is gone, so that the preemptor
        is not placed beside a victim that still runs (`preemption.held` places it where the
        victims leave)."""
        if not _deleting(pod):
            return True
        uid = _uid(pod)
        if uid in self._hold_victims:
            return True
        node = self._pod_node.get(uid) or cards.pod_node(pod)
        nominees = self._nominated.get(node, ()) if node else ()
        if not nominees:
            return False
        priority = preemption.priority_of(pod)
        return any(preemption.priority_of(self._pods[n]) > priority for n in nominees if n in self._pods)

    def bound_pods(self, node: str) -> list[Object]:
        """Pods whose `spec.nodeName` is `node` (what a LIST with that field selector answers)."""
        found = []
        for uid in self._by_node.get(node, ()):
            pod = self._pods[uid]
            if podspec.mapping(pod.get("spec")).get("nodeName") == node:
                found.append(pod)
        return found

    def state(self, name: str, *, now: float, ttl: float, exclude_uid: str = "") -> cards.NodeState | None:
        """The node's card state; `exclude_uid` leaves out the pod being placed (its own earlier,
        interrupted attempt must not make it look as if the node were full).

        Ledger entries of pods this cache knows are bound elsewhere or finished, or that it has not
        seen for longer than a bind takes (deleted), are left out, as bind leaves them out. States
        are cached per node until the node, one of its pods or a pod in its ledger changes, or
        until the first time-limited entry in it stops counting: filter judges hundreds of nodes
        per pod.
        """
        node = self._nodes.get(name)
        if node is None:
            return None
        version = self._versions.get(name, 0)
        hit = self._states.get(name)
        if hit is not None and hit.version == version and hit.ttl == ttl and now < hit.valid_until:
            state, uids = hit.state, hit.uids
        else:
            # Something time-limited stopped counting (a reservation expired, an in-flight entry's
            # pod never showed up): cards came free without any watch event.
            lapsed = hit is not None and hit.version == version and hit.ttl == ttl
            ledger = self.ledger(name)
            live = {uid: entry for uid, entry in ledger.items() if self._plausible(entry, node=name, now=now)}
            for uid in ledger:
                self._ledger_refs.setdefault(uid, set()).add(name)
            state = self.node_state_of(node, self.pods_on(name), now=now, ttl=ttl, reservations=live)
            unseen = [(e.assumed_at or 0.0) + reservations.IN_FLIGHT_GRACE_S for e in live.values() if e.uid not in self._pods]
            valid_until = min([cards.valid_until(state, ttl=ttl), *unseen])
            uids = frozenset(a.uid for a in (*state.allocations, *state.orphans))
            if hit is not None:
                self._forget(name)
            self._states[name] = _Cached(version=version, ttl=ttl, valid_until=valid_until, state=state, uids=uids)
            if valid_until != _NEVER:
                heapq.heappush(self._lapses, (valid_until, name))
            if lapsed:
                self._freed(name)
        if exclude_uid and exclude_uid in uids:
            ledger = self.ledger(name)
            live = {uid: entry for uid, entry in ledger.items() if self._plausible(entry, node=name, now=now)}
            return self.node_state_of(node, self.pods_on(name), now=now, ttl=ttl, reservations=live, exclude_uid=exclude_uid)
        return state

    def node_state_of(
        self,
        node: Mapping[str, Any],
        pods: Iterable[Mapping[str, Any]],
        *,
        now: float,
        ttl: float,
        reservations: Mapping[str, allocation.Allocation],
        exclude_uid: str = "",
    ) -> cards.NodeState:
        """`cards.node_state(node, pods, now=now, ttl=ttl, reservations=reservations, exclude_uid=exclude_uid)`,
        with each of the cache's own pod copies' `cards.Holding` (whether it finished, what it
        holds) made once per copy where the pod is bound (then it depends on neither the time nor
        the TTL: `allocation.pod_allocation`), and a held Node's cards once per copy of it. Other
        pods and nodes (a list's, another view of the node) are read afresh. The counting is
        `cards.count`, `cards.node_state`'s own (unit tests compare the two on generated clusters);
        bind decides on it too when its read came from this cache."""
        name = _name(node)
        pods = list(pods)
        reservations = self._counted_entries(reservations, pods)
        if node is self._nodes.get(name):
            kept = self._node_cards.get(name)
            if kept is None or kept[0] is not node:
                kept = self._node_cards[name] = (node, cards.node_cards(node))
            node_cards = kept[1]
        else:
            node_cards = cards.node_cards(node)
        return cards.count(
            node_cards,
            self._holdings(pods, now=now, ttl=ttl),
            ledger=reservations,
            now=now,
            exclude_uid=exclude_uid,
            dra_holds=self._dra_holds.get(name, dra.NO_HOLDS),
        )

    def counted(
        self, pods: Iterable[Mapping[str, Any]], ledger: Mapping[str, allocation.Allocation]
    ) -> tuple[list[Mapping[str, Any]], Mapping[str, allocation.Allocation]]:
        """The pods and ledger entries that count for placement (`_counts`, `_counted_entries`):
        `node_state_of` is `cards.node_state` over these."""
        listed = list(pods)
        return [p for p in listed if self._counts(p)], self._counted_entries(ledger, listed)

    def _counted_entries(
        self, ledger: Mapping[str, allocation.Allocation], pods: Sequence[Mapping[str, Any]]
    ) -> Mapping[str, allocation.Allocation]:
        """The ledger entries that count: not those of a pod whose deletion was seen, by the watch's
        delete (`_gone`, even within the in-flight grace) or its `deletionTimestamp` (`_counts`), in
        this cache or in `pods` (a bind's fresh list)."""
        if not ledger:
            return ledger
        going = {_uid(pod) for pod in pods if _deleting(pod) and not self._counts(pod)}
        dropped = [
            uid
            for uid in ledger
            if uid in going or uid in self._gone or ((pod := self._pods.get(uid)) is not None and not self._counts(pod))
        ]
        return {uid: entry for uid, entry in ledger.items() if uid not in dropped} if dropped else ledger

    def _holdings(self, pods: Iterable[Mapping[str, Any]], *, now: float, ttl: float) -> Iterator[cards.Holding]:
        held_by, ours = self._held, self._pods
        for pod in pods:
            if not self._counts(pod):
                continue  # being deleted: its card is free for placement at once
            uid = _uid(pod)
            if ours.get(uid) is not pod:
                yield cards.holding(pod, now=now, ttl=ttl)
                continue
            memo = held_by.get(uid)
            if memo is None or memo[0] is not pod:
                memo = held_by[uid] = (pod, bool(allocation.bound_node(pod)), cards.holding(pod, now=now, ttl=ttl))
            yield memo[2] if memo[1] else cards.holding(pod, now=now, ttl=ttl)

    def judged(
        self,
        names: Iterable[str],
        *,
        now: float,
        ttl: float,
        exclude_uid: str = "",
        key: Hashable,
        judge: Callable[[cards.NodeState], _T],
    ) -> dict[str, _T | None]:
        """`judge(state)` for each node (None for a node not in the cache), remembered under `key`
        with the node's cached state: until the node, one of its pods or a pod in its ledger changes,
        or a time-limited entry stops counting, the same key on the same node costs a lookup.
        `key` must stand for everything `judge` reads besides the state (filter and prioritize:
        the verb and the pod's `cardrequest.Request`). A node whose state leaves out
        `exclude_uid` is judged afresh."""
        names = names if isinstance(names, (list, tuple)) else list(names)
        return dict(
            zip(names, self.judged_list(names, now=now, ttl=ttl, exclude_uid=exclude_uid, key=key, judge=judge), strict=True)
        )

    def judged_list(
        self,
        names: Sequence[str],
        *,
        now: float,
        ttl: float,
        exclude_uid: str = "",
        key: Hashable,
        judge: Callable[[cards.NodeState], _T],
    ) -> list[_T | None]:
        """`judged`'s values in the order of `names`.

        Between two calls only the few nodes a bind or a watch event changed have a new state: the
        verdicts of the others are read from `_current` in one C-speed pass, and only the misses
        (a changed node, a node not judged under `key` yet, one not in the cache) and the nodes
        whose state may count `exclude_uid` (the pod's own node, nodes whose ledger names it) go
        through the per-node check of `_judge`. The answers are `_judge`'s for every node (the
        unit tests compare them over generated clusters)."""
        token = self._tokens.get(key)  # a small int: hashing the request itself on every node would cost more than judging
        if token is None:
            if len(self._tokens) >= _MAX_TOKENS:
                self._tokens.clear()
                self._current.clear()
                for cached in self._states.values():
                    cached.judged.clear()  # tokens are reused from now on
            token = self._tokens[key] = len(self._tokens)
        if ttl != self._current_ttl:
            self._current.clear()
            self._current_ttl = ttl
        lapses = self._lapses
        while lapses and lapses[0][0] <= now:
            self._forget(heapq.heappop(lapses)[1])
        current = self._current.get(token)
        if current is None:
            current = self._current[token] = {}
        values: list[Any] = list(map(current.get, names, itertools.repeat(_MISSING)))
        # By identity (`in` and `index` would call the verdicts' Python `__eq__`), at C speed.
        slow = list(itertools.compress(itertools.count(), map(operator.is_, values, itertools.repeat(_MISSING))))
        if exclude_uid:
            counting = set(self._ledger_refs.get(exclude_uid, ()))
            owner = self._pod_node.get(exclude_uid)
            if owner is not None:
                counting.add(owner)
            if counting:
                slow.extend(i for i, name in enumerate(names) if name in counting)
        for index in slow:
            values[index] = self._judge(names[index], now=now, ttl=ttl, exclude_uid=exclude_uid, token=token, judge=judge)
        return values

    def _judge(
        self, name: str, *, now: float, ttl: float, exclude_uid: str, token: int, judge: Callable[[cards.NodeState], _T]
    ) -> _T | None:
        """One node's verdict for `judged` (what every node's was before `_current`)."""
        hit = self._states.get(name)
        if hit is None or hit.version != self._versions.get(name, 0) or hit.ttl != ttl or now >= hit.valid_until:
            state = self.state(name, now=now, ttl=ttl, exclude_uid=exclude_uid)
            if state is None:
                return None
            hit = self._states.get(name)
            if hit is None or hit.state is not state:  # the pod's own entry is left out: not the cached state
                return judge(state)
        elif exclude_uid and exclude_uid in hit.uids:
            state = self.state(name, now=now, ttl=ttl, exclude_uid=exclude_uid)
            return None if state is None else judge(state)
        memo = hit.judged
        if token in memo:
            value: _T = memo[token]  # type: ignore[assignment] # stored by a judge of the same key
        else:
            if len(memo) >= _MEMO_KEYS:
                self._forget(name)
                memo.clear()
            value = memo[token] = judge(hit.state)
        self._current.setdefault(token, {})[name] = value
        return value

    def _forget(self, name: str) -> None:
        """The node's remembered state stops being current: its verdicts leave `_current`."""
        hit = self._states.get(name)
        if hit is not None:
            for token in hit.judged:
                current = self._current.get(token)
                if current is not None:
                    current.pop(name, None)

    def _forget_all(self) -> None:
        self._current.clear()
        self._lapses.clear()

    def stale_ledgers(self, *, now: float) -> list[str]:
        """Nodes whose ledger Lease holds entries that no longer count (expired, or their pod is
        gone, finished or placed elsewhere): worth a prune. (A Node annotation's ledger, from an
        earlier version, is never written: its entries simply stop counting.)"""
        found = []
        for name, lease in self._leases.items():
            ledger = reservations.lease_reservations(lease, namespace=self._namespace)
            if any((e.expires or 0.0) <= now or not self._plausible(e, node=name, now=now) for e in ledger.values()):
                found.append(name)
        return found

    def lapsed(self, *, now: float) -> list[str]:
        """Nodes whose remembered state holds something time-limited that has stopped counting by
        `now`; `state` on them notices the free (and tells `on_freed`)."""
        return [name for name, hit in self._states.items() if hit.valid_until <= now]

    def _plausible(self, entry: allocation.Allocation, *, node: str, now: float) -> bool:
        """Whether a ledger entry may still stand for a card in use, by what this cache knows."""
        pod = self._pods.get(entry.uid)
        if pod is None:
            if entry.uid in self._gone:
                return False  # deleted: it holds nothing, whatever its entry's age
            return not self.pods_synced or (entry.assumed_at or 0.0) + reservations.IN_FLIGHT_GRACE_S > now
        bound_to = podspec.mapping(pod.get("spec")).get("nodeName")
        finished = allocation.is_terminal(pod)
        return not finished and (not bound_to or bound_to == node)

    def states(self, names: Iterable[str], *, now: float, ttl: float, exclude_uid: str = "") -> dict[str, cards.NodeState | None]:
        return {name: self.state(name, now=now, ttl=ttl, exclude_uid=exclude_uid) for name in names}

    def all_states(self, *, now: float, ttl: float) -> dict[str, cards.NodeState]:
        return {name: state for name in sorted(self._nodes) if (state := self.inspect_state(name, now=now, ttl=ttl)) is not None}

    def inspect_state(self, name: str, *, now: float, ttl: float) -> cards.NodeState | None:
        """One node of `all_states` (what inspect and the metrics show: the whole ledger); None when unknown."""
        node = self._nodes.get(name)
        if node is None:
            return None
        return self.node_state_of(node, self.pods_on(name), now=now, ttl=ttl, reservations=self.ledger(name))

    def version(self, name: str) -> int:
        """Moves whenever the node, its pods or its ledger change (what `state` and `inspect_state`
        read), relists included: callers keep per-node results under it (`overview`)."""
        return self._versions.get(name, 0)

    # --- writing ---

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        for name in self._nodes:
            self._touch(name)  # a node gone from the list: its version must still move
        self._nodes, self._real_nodes, self._states, self._node_ledger_rv = {}, {}, {}, {}
        self._node_cards = {}
        self._forget_all()
        for item in items:
            self.put_node(item)
        self.nodes_synced = True

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        for name in self._by_node:
            self._touch(name)  # a node may hold none of the listed pods: its version must still move
        self._pods, self._pod_node, self._by_node, self._states = {}, {}, {}, {}
        self._by_namespace, self._usages = {}, {}
        self._book = budgets.Book()
        self._budget_epoch += 1
        self._nominated, self._nominee_node = {}, {}
        self._held = {}
        self._forget_all()
        self._pods_version = -1  # the list's version follows (`seen`)
        self._vouched = {}  # the list may predate a binding this cache had from its own bind
        self._ledger_refs = {}
        for item in items:
            self.put_pod(item)
        self._book_claims()
        self.pods_synced = True

    def replace_leases(self, items: Iterable[Mapping[str, Any]]) -> None:
        for name in self._leases:
            self._touch(name)
        self._leases, self._states, self._lease_deleted = {}, {}, {}
        self._holds, self._hold_leases, self._newest_hold = {}, {}, {}
        self._budget_leases, self._budget_lease_deleted, self._usages = {}, {}, {}
        self._forget_all()
        self._leases_version = self._leases_listed = -1  # the list's version follows (`seen`)
        self._vouched = {}
        for item in items:
            self.put_lease(item)
        self.leases_synced = True

    def replace_slices(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._slices = {_name(item): dra.slim_slice(item) for item in items}
        self.slices_synced = True
        self._recount_dra()

    def replace_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        items = list(items)
        self._claims = {_uid(item): dra.slim_claim(item) for item in items if dra.claim_results(item)}
        self._claim_specs = {(_namespace(item), _name(item)): _claim_spec(item) for item in items}
        self.claims_synced = True
        self._recount_dra()

    def _recount_dra(self) -> None:
        """What DRA holds, worked out again; nodes whose holds changed move their version (and
        where a card came free, `on_freed` hears of it)."""
        self._budget_epoch += 1  # a claim's charge (its devices' memory) may have changed
        self._book_claims()
        before = self._dra_holds
        self._dra_holds = dra.holds(self._slices.values(), self._claims.values(), namespace=self._namespace)
        for node in set(before) | set(self._dra_holds):
            old, new = before.get(node, {}), self._dra_holds.get(node, {})
            if old != new:
                self._touch(node)
                if any(uuid not in new for uuid in old):
                    self._freed(node)

    def _book_claims(self) -> None:
        """Every namespace's allocated claims into the book again (claims change rarely), and the
        pods that name claims, whose settling may have changed with them."""
        held: dict[str, list[tuple[str, tuple[dra.Held, ...]]]] = {}
        for uid, claim in self._claims.items():
            if not dra.is_hold_claim(claim, namespace=self._namespace):
                held.setdefault(_namespace(claim), []).append((uid, dra.claim_results(claim)))
        memory = budgets.device_memory(self._slices.values()) if held else {}
        for namespace in set(held) | set(self._book.claim_namespaces()):
            for uid in self._book.claims(namespace, held.get(namespace, []), memory):
                self._book_pod(uid)

    def _book_pod(self, uid: str) -> None:
        """The pod's charge into the book again (its node's cards or its claims changed)."""
        pod = self._pods.get(uid)
        if pod is not None:
            node = cards.pod_node(pod)
            self._book.put(uid, pod, (self._real_nodes.get(node) or self._nodes.get(node)) if node else None)

    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One watch event (`ADDED`, `MODIFIED`, `DELETED`) for `kind` `Node`, `Pod`, `Lease`,
        `ResourceSlice` or `ResourceClaim`."""
        if kind == "Namespace":
            if event == "DELETED":
                self._namespace_labels.pop(_name(obj), None)
            else:
                self.put_namespace(obj)
            return
        if kind in ("ResourceSlice", "ResourceClaim"):
            kept = self._slices if kind == "ResourceSlice" else self._claims
            key = _name(obj) if kind == "ResourceSlice" else _uid(obj)
            if kind == "ResourceClaim":
                if event == "DELETED":
                    self._claim_specs.pop((_namespace(obj), _name(obj)), None)
                else:
                    self._claim_specs[(_namespace(obj), _name(obj))] = _claim_spec(obj)
            if event == "DELETED" or (kind == "ResourceClaim" and not dra.claim_results(obj)):
                if kept.pop(key, None) is None:
                    return
            else:
                kept[key] = dra.slim_slice(obj) if kind == "ResourceSlice" else dra.slim_claim(obj)
            self._recount_dra()
            return
        if kind == "Node":
            if event == "DELETED":
                self._nodes.pop(_name(obj), None)
                self._real_nodes.pop(_name(obj), None)
                self._node_cards.pop(_name(obj), None)
                self._node_ledger_rv.pop(_name(obj), None)
                self._touch(_name(obj))
            else:
                self.put_node(obj)
        elif kind == "Lease":
            if event == "DELETED" and (held_on := preemption.hold_lease_node(obj, namespace=self._namespace)) is not None:
                if not _older(obj, self._hold_leases.get(held_on)):
                    self._hold_leases.pop(held_on, None)
                    self._holds.pop(held_on, None)
                    self._index_holds()
            elif event == "DELETED" and (budgeted := budgets.lease_namespace(obj, home=self._namespace)) is not None:
                if not _older(obj, self._budget_leases.get(budgeted)):
                    self._budget_leases.pop(budgeted, None)
                    self._budget_lease_deleted[budgeted] = revision(obj) if revision(obj) >= 0 else _UNPROVABLE
                    self._budget_changed(budgeted, freed=True)
            elif event == "DELETED":
                node = reservations.lease_node(obj, namespace=self._namespace)
                if node is not None and not _older(obj, self._leases.get(node)):
                    dropped = self._leases.pop(node, None)
                    if dropped is not None and _lease_uids(dropped):
                        self._freed(node)
                    self._vouched.pop(node, None)
                    self._lease_deleted[node] = revision(obj) if revision(obj) >= 0 else _UNPROVABLE
                    self._touch(node)
            else:
                self.put_lease(obj)
            version = podspec.mapping(obj.get("metadata")).get("resourceVersion")
            if isinstance(version, str):
                self.seen("Lease", version)
        elif kind == "Pod":
            if event == "DELETED":
                uid = _uid(obj)
                held = self._pods.get(uid)
                node = self._pod_node.get(uid)
                charged = held is not None and self._holds_budget(uid, _namespace(held))
                self._gone[uid] = None
                self._victims_gone.pop(uid, None)
                if len(self._gone) > MAX_GONE:
                    del self._gone[next(iter(self._gone))]
                self._drop_pod(uid)
                if held is not None and node and _holds_cards(held):
                    self._freed(node)
                if held is not None:
                    self._budget_changed(_namespace(held), freed=charged, node=node or "")
            else:
                self.put_pod(obj)
            # Events come in revision order: everything up to this one is applied now.
            version = podspec.mapping(obj.get("metadata")).get("resourceVersion")
            if isinstance(version, str):
                self._advance_pods(version)

    def put_node(self, obj: Mapping[str, Any]) -> None:
        name = _name(obj)
        held = self._nodes.get(name)
        if held is not None and _same_version(obj, held):
            return  # the watch event of the write bind already put here: the cached state stays
        if name and not _older(obj, held):
            real = slim_node(obj)
            seen = reality.honour_out_of_band(real) if self._honour_out_of_band else real
            slim = real if seen is real else dict(seen)
            self._nodes[name] = slim
            if slim is real:
                self._real_nodes.pop(name, None)
            else:
                self._real_nodes[name] = real
            if held is None or _node_ledger_text(slim) != _node_ledger_text(held):
                text = _node_ledger_text(slim)
                # a ledger at a version that is no revision can never be proven covered: bind reads
                self._node_ledger_rv[name] = (revision(slim) if revision(slim) >= 0 else _UNPROVABLE) if text is not None else -1
            if held is None or not _same_but_version(slim, held):
                self._budget_epoch += 1  # a card's memory may have changed (budgets charge by it)
                for uid in list(self._by_node.get(name, ())):
                    self._book_pod(uid)
                self._touch(name)  # a status heartbeat changes nothing kept here: the cached state stays

    def put_lease(self, obj: Mapping[str, Any]) -> None:
        """A ledger Lease (ignored unless it is a node's trusted ledger in the ledger namespace)."""
        node = reservations.lease_node(obj, namespace=self._namespace)
        if node is None:
            # The preempt verb's records and the namespaces' budget ledgers share the ledger's label and watch.
            if not self.put_hold_lease(obj):
                self.put_budget_lease(obj)
            return
        held = self._leases.get(node)
        if held is not None and (_same_version(obj, held) or _older(obj, held)):
            return  # the watch event of the write bind already put here, or an older copy
        slim = slim_lease(obj)
        self._leases[node] = slim
        if held is None or _lease_ledger_text(slim) != _lease_ledger_text(held):
            self._touch(node)
            if held is not None and _lease_uids(held) - _lease_uids(slim):
                self._freed(node)  # entries dropped (pruned, expired): cards only the ledger held

    def put_pod(self, obj: Mapping[str, Any]) -> None:
        uid = _uid(obj)
        if not uid or _older(obj, self._pods.get(uid)):
            return
        slim = slim_pod(obj)
        held = self._pods.get(uid)
        if held is not None and _same_but_version(slim, held):
            self._pods[uid] = slim  # a status update that changes nothing kept here: the node's cached state stays
            return
        # Where the pod's cards counted: a change that stops them counting frees them (`_freed`).
        was_on = self._pod_node.get(uid) if held is not None and _holds_cards(held) and self._counts(held) else None
        waited_for = self._nominee_node.get(uid)
        charged = held is not None and self._holds_budget(uid, _namespace(held))
        self._drop_pod(uid)
        self._pods[uid] = slim
        namespace = _namespace(slim)
        self._by_namespace.setdefault(namespace, set()).add(uid)
        if self.on_gated is not None and budgets.gate_index(podspec.mapping(slim.get("spec"))) is not None:
            self.on_gated()
        self._budget_changed(
            namespace,
            freed=charged and allocation.is_terminal(slim),
            node=cards.pod_node(slim),
        )
        waits_for = preemption.nominated_node(slim)
        if waits_for:
            self._nominee_node[uid] = waits_for
            self._nominated.setdefault(waits_for, set()).add(uid)
            if waits_for != waited_for:
                self._touch(waits_for)  # pods being deleted there count again (`_counts`)
                if self.on_nominated is not None:
                    self.on_nominated(uid, waits_for)
        node = cards.pod_node(slim)
        if node:
            self._pod_node[uid] = node
            self._by_node.setdefault(node, set()).add(uid)
            self._touch(node)
        self._book.put(uid, slim, (self._real_nodes.get(node) or self._nodes.get(node)) if node else None)
        if was_on and (was_on != node or allocation.is_terminal(slim) or not self._counts(slim)):
            self._freed(was_on)  # finished, being deleted, or no longer on that node

    def _freed(self, node: str) -> None:
        if self.on_freed is not None:
            self.on_freed(node)

    def _touch(self, node: str) -> None:
        self._forget(node)
        self._versions[node] = self._versions.get(node, 0) + 1

    def _drop_pod(self, uid: str) -> None:
        for referring in self._ledger_refs.pop(uid, set()):
            self._touch(referring)  # a ledger entry of this pod may count differently now
        dropped = self._pods.pop(uid, None)
        self._book.drop(uid)
        if dropped is not None:
            namespace = _namespace(dropped)
            members = self._by_namespace.get(namespace)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._by_namespace[namespace]
            self._budget_changed(namespace)
        self._held.pop(uid, None)
        waited = self._nominee_node.pop(uid, None)
        if waited is not None:
            waiting = self._nominated.get(waited)
            if waiting is not None:
                waiting.discard(uid)
                if not waiting:
                    del self._nominated[waited]
            self._touch(waited)  # pods being deleted there may stop counting (`_counts`)
        node = self._pod_node.pop(uid, None)
        if node is not None:
            self._touch(node)
            members = self._by_node.get(node)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._by_node[node]


_T = TypeVar("_T")
MAX_GONE = 65_536  # deleted pod UIDs remembered (`Store._gone`)
_UNPROVABLE = 1 << 62  # a revision no pod watch reaches
_MEMO_KEYS = 32  # verdicts remembered per node state (one per request shape that filter or prioritize met)
_MAX_TOKENS = 4096  # distinct `judged` keys before the memos start over
_MISSING: Any = object()  # not in `Store._current`
_NEVER = float("inf")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Cached:
    version: int
    ttl: float
    valid_until: float
    state: cards.NodeState
    uids: frozenset[str]  # the pods the state counts (allocations and orphans)
    judged: dict[int, object] = dataclasses.field(default_factory=dict)  # `Store.judged`'s memo, by key token


def slim_node(node: Mapping[str, Any]) -> Object:
    """The parts of a Node the card model and inspect read."""
    metadata = podspec.mapping(node.get("metadata"))
    status = podspec.mapping(node.get("status"))
    return {
        "metadata": {
            key: metadata[key] for key in ("name", "uid", "resourceVersion", "labels", "annotations") if key in metadata
        },
        "status": {key: status[key] for key in ("capacity", "allocatable", "addresses") if key in status},
    }


def slim_lease(lease: Mapping[str, Any]) -> Object:
    """The parts of a ledger Lease the extender reads: its identity, version and the two annotations."""
    metadata = podspec.mapping(lease.get("metadata"))
    annotations = podspec.mapping(metadata.get("annotations"))
    return {
        "metadata": {key: metadata[key] for key in ("name", "namespace", "uid", "resourceVersion") if key in metadata}
        | {
            "annotations": {
                k: annotations[k] for k in (reservations.NODE_ANNOTATION, gpu.RESERVATIONS_ANNOTATION) if k in annotations
            }
        },
    }


def slim_pod(pod: Mapping[str, Any]) -> Object:
    """The parts of a Pod the card model and inspect read (no managedFields, env, volumes ...)."""
    metadata = podspec.mapping(pod.get("metadata"))
    spec = podspec.mapping(pod.get("spec"))
    status = podspec.mapping(pod.get("status"))
    slim_spec: Object = {}
    if isinstance(spec.get("nodeName"), str):
        slim_spec["nodeName"] = spec["nodeName"]
    # What `policies.gpu.podrequests` reads: resources, whether an init container is a sidecar
    # (`restartPolicy: Always`, which adds up instead of taking the maximum), and the overhead.
    for kind in ("containers", "initContainers"):
        entries = [
            {"name": c.get("name"), "resources": c.get("resources")}
            | ({"restartPolicy": c["restartPolicy"]} if "restartPolicy" in c else {})
            for c in podspec.sequence(spec.get(kind))
            if isinstance(c, Mapping)
        ]
        if entries:
            slim_spec[kind] = entries
    if "overhead" in spec:
        slim_spec["overhead"] = spec["overhead"]
    # The budget gate (`gates`) and the claims a pod's budget charge may come through.
    for key in ("schedulingGates", "resourceClaims"):
        if key in spec:
            slim_spec[key] = spec[key]
    for key in ("priority", "preemptionPolicy"):  # who may evict whom (`preemption`)
        if key in spec:
            slim_spec[key] = spec[key]
    return {
        "metadata": {
            key: metadata[key]
            for key in (
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "annotations",
                "labels",
                "deletionTimestamp",
                "creationTimestamp",  # the budget gate's order: oldest first (`gates`)
            )
            if key in metadata
        },
        "spec": slim_spec,
        # The phase for the card model; the start time and the nomination for preemption (issue 27).
        # (and the names of the claims made from its templates, for its GPU budget: `budgets.pod_claim_names`).
        "status": {
            key: status[key] for key in ("phase", "startTime", "nominatedNodeName", "resourceClaimStatuses") if key in status
        },
    }


def _name(obj: Mapping[str, Any]) -> str:
    return str(podspec.mapping(obj.get("metadata")).get("name", ""))


def _namespace(obj: Mapping[str, Any]) -> str:
    return str(podspec.mapping(obj.get("metadata")).get("namespace", ""))


def _claim_spec(obj: Mapping[str, Any]) -> Object:
    """The device requests of a ResourceClaim (what the budget gate charges before allocation)."""
    return {"devices": {"requests": podspec.mapping(podspec.mapping(obj.get("spec")).get("devices")).get("requests") or []}}


def _uid(obj: Mapping[str, Any]) -> str:
    return str(podspec.mapping(obj.get("metadata")).get("uid", ""))


def _node_ledger_text(node: Mapping[str, Any]) -> object:
    return podspec.mapping(podspec.mapping(node.get("metadata")).get("annotations")).get(gpu.RESERVATIONS_ANNOTATION)


def _deleting(pod: Mapping[str, Any]) -> bool:
    return podspec.mapping(pod.get("metadata")).get("deletionTimestamp") is not None


def _holds_cards(pod: Mapping[str, Any]) -> bool:
    """Whether the pod holds cards by its annotations (a pod of no card frees none when it goes)."""
    return allocation.pod_allocation(pod, now=0.0) is not None


def _lease_uids(lease: Mapping[str, Any]) -> set[str]:
    text = _lease_ledger_text(lease)
    return set(reservations.read(text)) if isinstance(text, str) else set()


def _lease_ledger_text(lease: Mapping[str, Any]) -> object:
    return podspec.mapping(podspec.mapping(lease.get("metadata")).get("annotations")).get(gpu.RESERVATIONS_ANNOTATION)


def revision(obj: Mapping[str, Any]) -> int:
    """An object's resourceVersion as an etcd revision; -1 when it is not a number (then the cache
    cannot be compared with it, and bind reads from the apiserver)."""
    version = podspec.mapping(obj.get("metadata")).get("resourceVersion")
    return int(version) if isinstance(version, str) and version.isdigit() else -1


def _same_but_version(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether two slim Nodes (or Pods) differ in their resourceVersion only."""
    if new.get("status") != old.get("status") or new.get("spec") != old.get("spec"):
        return False
    a, b = dict(podspec.mapping(new.get("metadata"))), dict(podspec.mapping(old.get("metadata")))
    a.pop("resourceVersion", None)
    b.pop("resourceVersion", None)
    return a == b


def _same_version(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    version = podspec.mapping(new.get("metadata")).get("resourceVersion")
    return bool(version) and version == podspec.mapping(old.get("metadata")).get("resourceVersion")


def _older(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether `new` is an older version than `old` (our own write can arrive before its watch event).

    resourceVersions are opaque by contract; etcd-backed apiservers use the store revision, a
    decimal number, which is the only case compared here. Anything else counts as newer.
    """
    if old is None:
        return False
    a = podspec.mapping(new.get("metadata")).get("resourceVersion")
    b = podspec.mapping(old.get("metadata")).get("resourceVersion")
    if isinstance(a, str) and isinstance(b, str) and a.isdigit() and b.isdigit():
        return int(a) < int(b)
    return False
