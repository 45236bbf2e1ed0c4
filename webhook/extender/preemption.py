"""Card-aware preemption: which lower-priority pods to evict so that a pod fits on one card (or one
set of whole cards), and the cards held for pods nominated to a node.

Pure functions over `cards.NodeState`, beside `placement` (whose `evaluate` is the only judge of
"fits": a choice is returned only when `evaluate` says the pod fits once its victims are gone, so a
choice can never over-commit a card). The rules:

- kube-scheduler's default preemption counts `aliyun.com/gpu-mem` as one number per node and may
  evict one pod from each of two cards: the sum is freed, no card is. `select` looks card by card
  (a set of N cards at a time for whole-card pods) for the victims that free the request there.
- Only bound pods the extender knows, of *lower* priority than the preemptor, are victims; a pod of
  equal or higher priority, a pod on another card, a bind in flight or a pod the extender does not
  know (CPU pods hold no card, so they are never among the pods of a card) never is.
- Among the card(s) that can be freed: the fewest victims, then the lowest highest priority, then
  the lowest sum of priorities, then the fewest PodDisruptionBudget violations, then the youngest
  victims (latest start), then the lowest card index. Victims being deleted already count as no
  victim in the first three (they cost no eviction: a second call while the first preemption's
  victims terminate answers them again, and kube-scheduler does not delete them twice). kube-scheduler's within-node order reprieves
  the most important pods first, which is the same for the victims' priorities; the victim count
  comes first here, as issue 27 asks (one 8 GiB pod rather than two 4 GiB ones).
- `held`: while a pod is nominated to a node (`status.nominatedNodeName`, set by kube-scheduler
  after a preemption) it holds the card it would get there once the pods being deleted are gone,
  against pods of lower or equal priority: kube-scheduler does the same for node resources
  (`RunFilterPluginsWithNominatedPods`), and the card is ours to hold. The hold only ever takes
  room away from other pods, never adds any.

The preempt verb's answer (`answer`, `under_way`, `Promises`) reads the extender's cache through
`View` (what `store.Store` offers), so that this module needs no store of its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from policies import gpu, podspec, settings
from policies.gpu import allocation, cardrequest, cards
from webhook.extender import placement, wire

# Pods on one card past which the exhaustive search over victim sets gives way to a greedy one
# (2^14 subsets; real cards hold a handful of pods).
MAX_EXHAUSTIVE_PODS = 14
# Whole-card sets past which only the greedy set is tried (16 choose 8 is 12,870).
MAX_EXHAUSTIVE_SETS = 20_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pod:
    """What the selection knows of a pod that might be a victim."""

    uid: str
    key: str  # namespace/name
    priority: int = 0
    started: float = 0.0  # unix seconds of status.startTime (0: unknown)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    namespace: str = ""
    deleting: bool = False  # deletionTimestamp set: it is going already


def priority_of(pod: Mapping[str, Any]) -> int:
    """`spec.priority` as the Priority admission plugin set it (0 where unset, as kube-scheduler reads it)."""
    value = podspec.mapping(pod.get("spec")).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def never_preempts(pod: Mapping[str, Any]) -> bool:
    """`spec.preemptionPolicy: Never`: the pod waits, it never evicts anyone."""
    return podspec.mapping(pod.get("spec")).get("preemptionPolicy") == "Never"


def pod_of(obj: Mapping[str, Any]) -> Pod:
    """A `Pod` from a Pod object (the extender's slim copy is enough)."""
    metadata = podspec.mapping(obj.get("metadata"))
    namespace = str(metadata.get("namespace", ""))
    labels = {str(k): str(v) for k, v in podspec.mapping(metadata.get("labels")).items()}
    started = allocation.parse_time(podspec.mapping(obj.get("status")).get("startTime")) or 0.0
    return Pod(
        uid=str(metadata.get("uid", "")),
        key=f"{namespace}/{metadata.get('name', '')}",
        priority=priority_of(obj),
        started=started,
        labels=labels,
        namespace=namespace,
        deleting=metadata.get("deletionTimestamp") is not None,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
    """One PodDisruptionBudget: whom it selects and how many more disruptions it allows."""

    key: str
    namespace: str
    selector: settings.LabelSelector | None  # None: selects nothing (no or a broken selector)
    allowed: int

    def covers(self, pod: Pod) -> bool:
        return self.selector is not None and pod.namespace == self.namespace and self.selector.matches(pod.labels)


def budgets_of(pdbs: Iterable[Mapping[str, Any]]) -> tuple[Budget, ...]:
    """PodDisruptionBudget objects read as `Budget`s (`status.disruptionsAllowed`; 0 where absent)."""
    found: list[Budget] = []
    for pdb in pdbs:
        metadata = podspec.mapping(pdb.get("metadata"))
        namespace = str(metadata.get("namespace", ""))
        raw = podspec.mapping(pdb.get("spec")).get("selector")
        try:
            selector = settings.label_selector(raw, field="selector") if raw is not None else None
        except settings.InvalidSettings:
            selector = None
        allowed = podspec.mapping(pdb.get("status")).get("disruptionsAllowed", 0)
        found.append(
            Budget(
                key=f"{namespace}/{metadata.get('name', '')}",
                namespace=namespace,
                selector=selector,
                allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
            )
        )
    return tuple(found)


def violations(victims: Sequence[Pod], budgets: Sequence[Budget]) -> int:
    """How many victims a budget forbids, counted as kube-scheduler counts them
    (`filterPodsWithPDBViolation`): each victim spends one disruption of every budget that selects
    it; a victim that finds a budget with none left is a violation."""
    left = {budget.key: budget.allowed for budget in budgets}
    count = 0
    for victim in victims:
        violating = False
        for budget in budgets:
            if budget.covers(victim):
                left[budget.key] -= 1
                if left[budget.key] < 0:
                    violating = True
        count += violating
    return count


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """The victims on one node: what to evict, and the card(s) the preemptor gets after."""

    node: str
    cards: tuple[int, ...]
    victims: tuple[Pod, ...]  # most important first (kube-scheduler reads Pods[0] as the highest priority)
    violations: int = 0

    @property
    def uids(self) -> tuple[str, ...]:
        return tuple(victim.uid for victim in self.victims)


def select(
    request: cardrequest.Request,
    state: cards.NodeState,
    *,
    priority: int,
    known: Mapping[str, Pod],
    budgets: Sequence[Budget] = (),
) -> Choice | None:
    """The victims that free `request` on one card (or one set of whole cards) of the node, or None
    where no such set exists: the pod fits already (no victim needed), can never fit here, or every
    way to fit it evicts a pod that is not lower-priority, not bound, or not known (`known`: the
    pods the extender holds, by UID)."""
    if request.problem or request.family is None or request.family is gpu.Family.EXCLUSIVE:
        return None
    if placement.evaluate(request, state, explain=False).verdict is not placement.Verdict.FULL:
        return None  # it fits now, or nothing would make it fit

    def evictable(held: allocation.Allocation) -> Pod | None:
        pod = known.get(held.uid)
        if not held.bound or pod is None or pod.priority >= priority:
            return None
        return pod

    if request.family is gpu.Family.TOPOLOGY:
        sets = _whole_sets(request, state, evictable)
    else:
        sets = _shared_sets(request, state, evictable)
    best: tuple[tuple[object, ...], Choice] | None = None
    for held_set in sets:
        victims = tuple(sorted((pod for _, pod in held_set), key=lambda p: (-p.priority, p.started, p.key)))
        fit = placement.evaluate(request, _without(state, {pod.uid for pod in victims}))
        if not fit.fits:
            continue
        choice = Choice(node=state.name, cards=fit.cards, victims=victims, violations=violations(victims, budgets))
        fresh = [p for p in victims if not p.deleting]  # pods being deleted already cost no eviction
        rank = (
            len(fresh),
            max((p.priority for p in fresh), default=-(2**31) - 1),
            sum(p.priority for p in fresh),
            choice.violations,
            len(victims),
            -min(p.started for p in victims),
            -fit.score,
            fit.cards,
            tuple(p.key for p in victims),
        )
        if best is None or rank < best[0]:
            best = (rank, choice)
    return None if best is None else best[1]


_Evictable = Any  # Callable[[allocation.Allocation], Pod | None]; Any keeps the nested closure's type simple
_Held = tuple[allocation.Allocation, Pod]


def _shared_sets(request: cardrequest.Request, state: cards.NodeState, evictable: _Evictable) -> Iterable[tuple[_Held, ...]]:
    """Per card, the smallest sets of evictable pods whose leaving gives the card the request's
    memory and cores (`select` confirms each with `evaluate`, which also applies the card model)."""
    memory, core = request.memory_gib, request.core_percent
    found: list[tuple[_Held, ...]] = []
    fewest = None
    for card in state.cards:
        if card.card.memory_gib < memory:
            continue
        removable: list[_Held] = []
        stays_whole = False
        for held in card.allocations:
            pod = evictable(held)
            if pod is None:
                stays_whole = stays_whole or held.whole
            else:
                removable.append((held, pod))
        if stays_whole or not removable:
            continue
        used_memory, used_core = card.memory_used, card.core_used

        def frees(chosen: Sequence[_Held]) -> bool:
            return (
                used_memory - sum(h.memory_gib for h, _ in chosen) + memory <= card.card.memory_gib  # noqa: B023 - called in this iteration only
                and used_core - sum(h.core_percent for h, _ in chosen) + core <= gpu.MAX_CORE_PERCENTAGE  # noqa: B023 - likewise
                and not any(h.whole for h, _ in chosen)
            )

        if not frees(removable):
            continue  # even every lower-priority pod leaving is not enough on this card
        if len(removable) > MAX_EXHAUSTIVE_PODS:
            # Greedy: the least important first (lowest priority, youngest), until the card has room.
            ordered = sorted(removable, key=lambda hp: (hp[1].priority, -hp[1].started, hp[1].key))
            for size in range(1, len(ordered) + 1):
                if frees(ordered[:size]):
                    found.append(tuple(ordered[:size]))
                    break
            continue
        for size in range(1, len(removable) + 1):
            if fewest is not None and size > fewest:
                break
            sized = [combo for combo in itertools.combinations(removable, size) if frees(combo)]
            if sized:
                found.extend(sized)
                fewest = size if fewest is None else min(fewest, size)
                break
    return found


def _whole_sets(request: cardrequest.Request, state: cards.NodeState, evictable: _Evictable) -> Iterable[tuple[_Held, ...]]:
    """Sets of N cards every holder of which is evictable; the victims are every pod on them
    (a whole-card pod spanning other cards frees those too)."""
    count = request.cards
    if count > len(state.cards):
        return []
    combos: Iterable[tuple[cards.CardState, ...]]
    total = 1
    for i in range(count):
        total = total * (len(state.cards) - i) // (i + 1)
    if total <= MAX_EXHAUSTIVE_SETS:
        combos = itertools.combinations(state.cards, count)
    else:
        # Greedy: the cards with the fewest holders first.
        combos = [tuple(sorted(state.cards, key=lambda c: (len(c.allocations), c.index))[:count])]
    found: list[tuple[_Held, ...]] = []
    for combo in combos:
        held: dict[str, _Held] = {}
        ok = True
        for card in combo:
            for alloc in card.allocations:
                pod = evictable(alloc)
                if pod is None:
                    ok = False
                    break
                held[alloc.uid] = (alloc, pod)
            if not ok:
                break
        if ok and held:
            found.append(tuple(held.values()))
    return found


def _without(state: cards.NodeState, uids: set[str]) -> cards.NodeState:
    return cards.occupy(state.node, [a for a in state.allocations if a.uid not in uids])


# --- the hold of nominated pods -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Nominee:
    """A pod nominated to a node (`status.nominatedNodeName`), not bound yet."""

    uid: str
    namespace: str
    name: str
    priority: int
    request: cardrequest.Request


def nominee_of(obj: Mapping[str, Any]) -> Nominee:
    metadata = podspec.mapping(obj.get("metadata"))
    return Nominee(
        uid=str(metadata.get("uid", "")),
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        priority=priority_of(obj),
        request=cardrequest.pod_request(obj),
    )


def nominated_node(pod: Mapping[str, Any]) -> str:
    """The node a pod waits for after a preemption: `status.nominatedNodeName` of a pod not bound,
    not finished and not being deleted; "" otherwise."""
    if podspec.mapping(pod.get("spec")).get("nodeName") or allocation.is_terminal(pod):
        return ""
    if podspec.mapping(pod.get("metadata")).get("deletionTimestamp") is not None:
        return ""
    value = podspec.mapping(pod.get("status")).get("nominatedNodeName")
    return value if isinstance(value, str) else ""


def holders(nominees: Iterable[Nominee], *, priority: int, uid: str) -> list[Nominee]:
    """The nominees that hold cards against a pod of `priority` (its own UID left out): those of
    equal or higher priority, most important first (kube-scheduler's rule for nominated pods)."""
    return sorted(
        (n for n in nominees if n.uid != uid and n.priority >= priority and n.request.managed and not n.request.problem),
        key=lambda n: (-n.priority, n.namespace, n.name),
    )


def held(state: cards.NodeState, nominees: Sequence[Nominee], *, going: frozenset[str] = frozenset()) -> cards.NodeState:
    """`state` with each nominee (in order) holding the card(s) it would get once the pods in
    `going` (being deleted: a preemption's victims) have left. A nominee that would not fit even
    then holds nothing. The victims still count until they are gone, so a held card reads as full
    twice over meanwhile: a hold only takes room away."""
    current = state
    for nominee in nominees:
        freed = _without(current, set(going)) if going else current
        fit = placement.evaluate(nominee.request, freed, explain=False)
        if not fit.fits or not fit.cards:
            continue
        hold = allocation.Allocation(
            uid=nominee.uid,
            namespace=nominee.namespace,
            name=nominee.name,
            node=state.name,
            cards=fit.cards,
            memory_gib=nominee.request.memory_gib,
            core_percent=nominee.request.core_percent,
            whole=nominee.request.family is gpu.Family.TOPOLOGY,
            source="nomination",
        )
        current = cards.occupy(current.node, [*current.allocations, hold])
    return current


# --- the durable hold: what the extender recorded when it answered a preemption ------------------
#
# kube-scheduler clears a pod's nomination whenever an attempt for it ends in an error rather than
# "does not fit" (`handleSchedulingFailure` with `clearNominatedNode`: an extender call that fails
# while the extender restarts, a bind refused). The hold above would lapse with it, and a lower pod
# could take the half-freed card. So the preempt verb records each answer in a Lease of the ledger
# namespace (one per node; tenants cannot write there, and only a Lease of the right name naming
# its node is read), and a record holds for its preemptor while `standing` says so. The record only
# names pods: whether it still holds is judged on the live pods every time, so nothing a pod says
# about itself (its annotations, its own nomination) can start or prolong a hold.

HOLDS_ANNOTATION = "gpu-admission.io/preemption-holds"  # on a hold Lease: {preemptor UID: record}
HOLD_LEASE_PREFIX = "gpu-hold."
# A record lapses this long after the answer, whatever else holds: a preemptor whose victims never
# go (a finalizer) or that never fits for another reason blocks a card for no longer than this.
HOLD_MAX_S = 300.0
# Once every victim is gone the preemptor fits and kube-scheduler retries it at once (the victims'
# deletions requeue it; its backoff is at most 10 s): the record lapses this long after that.
HOLD_GRACE_S = 30.0
_MAX_NAME = 253
_HASH_CHARS = 40


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hold:
    """One answer of the preempt verb: the preemptor (by UID), the node, its victims, when."""

    uid: str
    namespace: str
    name: str
    node: str
    priority: int
    victims: frozenset[str]
    at: float  # unix seconds of the answer


def held_note(state: cards.NodeState) -> str:
    """ " (held for <pods>, which preempted here)": what a refusal caused by a hold (`held`) adds."""
    holders = ", ".join(sorted({a.pod_key for a in state.allocations if a.source == "nomination"}))
    return f" (held for {holders}, which preempted here)" if holders else ""


def hold_lease_name(node: str) -> str:
    """The name of a node's hold Lease: the prefix and the node name, or a hash of it where too long."""
    name = HOLD_LEASE_PREFIX + node
    if len(name) <= _MAX_NAME:
        return name
    return HOLD_LEASE_PREFIX + hashlib.sha256(node.encode()).hexdigest()[:_HASH_CHARS]


def hold_lease_node(lease: Mapping[str, Any], *, namespace: str) -> str | None:
    """The node whose hold Lease this is, or None where it is none to trust: it must live in the
    ledger namespace, name its node in the ledger's node annotation and bear `hold_lease_name`."""
    metadata = podspec.mapping(lease.get("metadata"))
    if metadata.get("namespace") != namespace:
        return None
    node = podspec.mapping(metadata.get("annotations")).get(gpu.LEDGER_NODE_ANNOTATION)
    if not isinstance(node, str) or not node or metadata.get("name") != hold_lease_name(node):
        return None
    return node


def read_holds(text: object, *, node: str) -> dict[str, Hold]:
    """The records of a hold Lease's annotation (entries that do not read are left out)."""
    if not isinstance(text, str):
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        return {}
    found: dict[str, Hold] = {}
    for uid, entry in podspec.mapping(raw).items():
        entry = podspec.mapping(entry)
        pod, priority, at, victims = entry.get("pod"), entry.get("priority"), entry.get("at"), entry.get("victims")
        if not isinstance(pod, str) or "/" not in pod or not isinstance(victims, list):
            continue
        if (
            not isinstance(priority, int)
            or isinstance(priority, bool)
            or not isinstance(at, (int, float))
            or isinstance(at, bool)
        ):
            continue
        namespace, name = pod.split("/", 1)
        found[str(uid)] = Hold(
            uid=str(uid),
            namespace=namespace,
            name=name,
            node=node,
            priority=priority,
            victims=frozenset(v for v in victims if isinstance(v, str)),
            at=float(at),
        )
    return found


def encode_holds(holds: Mapping[str, Hold]) -> str:
    return json.dumps(
        {
            uid: {"pod": f"{h.namespace}/{h.name}", "priority": h.priority, "victims": sorted(h.victims), "at": round(h.at, 3)}
            for uid, h in sorted(holds.items())
        },
        separators=(",", ":"),
    )


def with_hold(holds: Mapping[str, Hold], hold: Hold, *, now: float) -> dict[str, Hold]:
    """`holds` less the records past HOLD_MAX_S, with `hold` in (it replaces its preemptor's)."""
    return {uid: h for uid, h in holds.items() if h.at + HOLD_MAX_S > now and uid != hold.uid} | {hold.uid: hold}


def hold_lease_body(node: str, node_uid: str, holds: Mapping[str, Hold], *, namespace: str) -> dict[str, Any]:
    """A node's complete hold Lease, ready to create (add `metadata.resourceVersion` to replace one).
    It carries the ledger label, so the extender's Lease watch sees it; it goes with its Node."""
    metadata: dict[str, Any] = {
        "name": hold_lease_name(node),
        "namespace": namespace,
        "labels": {gpu.LEDGER_LABEL: "true"},
        "annotations": {gpu.LEDGER_NODE_ANNOTATION: node, HOLDS_ANNOTATION: encode_holds(holds)},
    }
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {"holderIdentity": "gpu-admission-extender"},
    }


def standing(
    hold: Hold,
    pod: Mapping[str, Any] | None,
    *,
    now: float,
    evicted: bool,
    victims_left: bool,
    gone_since: float | None,
) -> bool:
    """Whether a record still holds its card: its preemptor (`pod`, the live copy of the pod of the
    record's UID; None where there is none) is pending (not bound anywhere, not finished, not being
    deleted), may preempt, has the priority recorded and is not nominated to another node; the
    record is younger than HOLD_MAX_S; its preemption is under way (`evicted`: a victim is gone or
    being deleted); and a victim is still there (`victims_left`), or they have all been gone (since
    `gone_since`, when this process first saw none) for less than HOLD_GRACE_S."""
    if pod is None or str(podspec.mapping(pod.get("metadata")).get("uid", "")) != hold.uid:
        return False
    if podspec.mapping(pod.get("spec")).get("nodeName") or allocation.is_terminal(pod):
        return False
    if podspec.mapping(pod.get("metadata")).get("deletionTimestamp") is not None or never_preempts(pod):
        return False
    if priority_of(pod) != hold.priority:
        return False
    nominated = podspec.mapping(pod.get("status")).get("nominatedNodeName")
    if isinstance(nominated, str) and nominated and nominated != hold.node:
        return False
    if now >= hold.at + HOLD_MAX_S or not evicted:
        return False
    return victims_left or (gone_since is not None and now < gone_since + HOLD_GRACE_S)


# --- the preempt verb's answer, over the extender's cache ---

PROMISE_S = 60.0  # how long an answer is remembered: a preemption's evictions take a moment, not minutes


class View(Protocol):
    """What the preempt verb's decisions read of the extender's cache (`store.Store`)."""

    def pod(self, uid: str) -> dict[str, Any] | None: ...

    def state(self, name: str, *, now: float, ttl: float, exclude_uid: str = "") -> cards.NodeState | None: ...

    def with_holds(self, node: str, state: cards.NodeState, *, pod: Mapping[str, Any], now: float) -> cards.NodeState: ...

    def hold_nodes(self) -> Mapping[str, Mapping[str, Hold]]: ...

    def held_for(self, node: str, *, now: float) -> list[dict[str, Any]]: ...


class Promises:
    """The victims answered to each preemptor in the last `PROMISE_S` (per process): a second call
    while the first answer's victims are evicted keeps to that answer's card, and the hold record
    (`holds.Recorder`) names them."""

    def __init__(self) -> None:
        self._answered: dict[str, tuple[float, frozenset[str]]] = {}  # preemptor UID -> (when, victims)

    def of(self, uid: str) -> frozenset[str]:
        return self._answered.get(uid, (0.0, frozenset()))[1]

    def current(self, uid: str, *, now: float) -> frozenset[str]:
        """The victims answered to `uid` before, after forgetting every answer older than `PROMISE_S`."""
        for stale in [k for k, (when, _) in self._answered.items() if when + PROMISE_S < now]:
            del self._answered[stale]
        return self.of(uid)

    def answered(self, uid: str, kept: Mapping[str, tuple[list[str], int]], *, before: frozenset[str], now: float) -> None:
        """Remember the victims of `kept` (the answer to `uid`) beside those answered `before`."""
        added = {victim for uids, _ in kept.values() for victim in uids} - before
        if uid and added:
            # Only a new answer restarts the 60 s: a pod that keeps asking while it waits would
            # otherwise be remembered, and held back as "under way", for ever.
            self._answered[uid] = (now, before | added)


def answer(
    cache: View,
    args: wire.PreemptRequest,
    *,
    now: float,
    ttl: float,
    budgets: tuple[Budget, ...],
    promised: frozenset[str] = frozenset(),
    room: Callable[[str, list[str]], bool] | None = None,
) -> dict[str, tuple[list[str], int]]:
    """The preempt verb's answer per offered node. `promised`: victims answered before for this
    preemptor, counted as going (like pods being deleted), so a second call keeps to the first
    answer's card. `room(node, victims)`: whether the pod's namespace has GPU budget for it there
    once the victims are gone (`budgeting.Keeper.room_after`); a node without is not answered, so
    no pod is evicted for a pod its budget would then refuse."""
    wanted = cardrequest.pod_request(args.pod)
    if not wanted.managed:  # nothing of ours to place: kube-scheduler's own choice stands
        return {node: (list(uids), args.violations.get(node, 0)) for node, uids in args.victims.items() if uids}
    if never_preempts(args.pod):
        return {}
    uid = str(podspec.mapping(args.pod.get("metadata")).get("uid", ""))
    priority = priority_of(args.pod)
    if under_way(cache, args.pod, wanted=wanted, promised=promised, ttl=ttl, now=now):
        # This pod's preemption is under way (kube-scheduler's async preemption may call again
        # before the victims of its first answer are marked): it waits for them, as kube-scheduler's
        # own rule has it for the nominated node. Answering the other candidates made it evict a
        # second card on another node: at 500 nodes, for 9 of 20 preemptors.
        return {}
    kept: dict[str, tuple[list[str], int]] = {}
    for node, offered in args.victims.items():
        state = cache.state(node, now=now, ttl=ttl, exclude_uid=uid)
        if state is None:
            continue
        state = cache.with_holds(node, state, pod=args.pod, now=now)
        known = {a.uid: pod_of(pod) for a in state.allocations if a.bound and (pod := cache.pod(a.uid)) is not None}
        for victim in promised & known.keys():
            known[victim] = dataclasses.replace(known[victim], deleting=True)
        choice = select(wanted, state, priority=priority, known=known, budgets=budgets)
        if choice is None or all(victim.deleting for victim in choice.victims):
            # Nothing to evict (the best card's victims are going already: being deleted, or answered
            # before for this pod): its preemption is under way here, the pod waits for them to go.
            # kube-scheduler does the same (no second preemption while victims terminate); an answer
            # naming only such pods made it nominate again with no eviction, and in e2e the pod then
            # missed the last victim's delete event and waited two minutes for an unrelated one.
            continue
        # Offered victims that hold no card here stay as kube-scheduler chose them: it needed them
        # for the node's other resources (CPU, memory), which it counts and we do not.
        holding = {a.uid for a in state.allocations}
        others = [
            pod_of(pod)
            for victim in offered
            if victim not in holding and (pod := cache.pod(victim)) is not None and priority_of(pod) < priority
        ]
        victims = sorted((*choice.victims, *others), key=lambda p: (-p.priority, p.started, p.key))
        if room is not None and not room(node, [p.uid for p in victims]):
            continue
        kept[node] = ([p.uid for p in victims], violations(victims, budgets))
    return kept


def under_way(
    cache: View,
    pod: Mapping[str, Any],
    *,
    wanted: cardrequest.Request,
    promised: frozenset[str],
    ttl: float,
    now: float,
) -> bool:
    """Whether a preemption of this pod is under way: a victim answered to it before is being
    deleted (kube-scheduler evicts only on the node it picked; the victims answered on the other
    candidates stay), or a record of its preemption stands with a victim still there
    (`store.held_for`): the victim's deletion brings the pod back to kube-scheduler; or the pod is
    nominated to a node where it fits now (its victims are gone, and its next attempt places it:
    at 500 nodes kube-scheduler asked again after they had gone, with other candidates). Where it
    does not fit there (a pod of equal priority nominated there too holds the card), nothing is
    under way: an empty answer would leave it waiting for an event that never comes."""
    uid = str(podspec.mapping(pod.get("metadata")).get("uid", ""))
    if any(deleting(cache.pod(victim)) for victim in promised):
        return True
    if any(
        uid == str(podspec.mapping(other.get("metadata")).get("uid", ""))
        for node, records in cache.hold_nodes().items()
        if uid in records and any(cache.pod(v) is not None for v in records[uid].victims)
        for other in cache.held_for(node, now=now)
    ):
        return True
    nominated = nominated_node(pod) or nominated_node(cache.pod(uid) or {})
    state = cache.state(nominated, now=now, ttl=ttl, exclude_uid=uid) if nominated else None
    return (
        state is not None and placement.evaluate(wanted, cache.with_holds(nominated, state, pod=pod, now=now), explain=False).fits
    )


def deleting(pod: Mapping[str, Any] | None) -> bool:
    """Whether the pod is being deleted (its `deletionTimestamp` is set)."""
    return pod is not None and podspec.mapping(pod.get("metadata")).get("deletionTimestamp") is not None
