"""One GPU pod against every GPU node: admission, request, why each node refuses it, the best node.

Pure: Nodes and Pods in (as the apiserver returns them, or from a snapshot), a `Report` out. The
per-node verdict is the extender's own: node states come from `store.Store` (the extender's cache,
fed with the same objects, so ledger entries of gone pods count exactly as long as they count
there), and the verdict from `placement.diagnose` (`placement.evaluate`, which the extender's
filter and bind run, plus the what-ifs for binds in flight and stale allocations). kube-scheduler's
own node checks, which run before the extender is asked, come from `predicates`.

A node's reservation ledger is its ledger Lease's (in the ledger namespace, naming the node) and,
from earlier versions, its Node annotation's, as the extender reads it (`policies.gpu.reservations`).

Stale allocations: the extender counts a reservation-ledger entry whose pod is not listed for
`reservations.IN_FLIGHT_GRACE_S` after its bind decision (the pod may not be in its watch cache yet), then
stops counting it and prunes it from the ledger within seconds. A pod being deleted
(`deletionTimestamp`) frees its card at once, unless a preemption is under way on its node (a
hold record names it, or a pod of higher priority is nominated there: `Store._counts`). `explain`
calls stale what still holds cards: ledger entries of pods that are not listed, and such victims
past their deletion deadline by more than `reasons.STUCK_TERMINATING_S` (their node is likely
lost: force-deleting them frees the cards).

The best node is the refusing node that needs the smallest change, in this order: nothing but time
or cleanup (binds in flight, stale allocations), an uncordon or a toleration, moving the fewest pods
(then the fewest GiB) off one card or set of cards, and last a change of the pod's selectors.
A node that could never hold the pod (cards too small, wrong mode by resource) is not suggested.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from policies import gpu, model, nodeaffinity, podspec
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import cardrequest, cards, reasons, reservations
from webhook.explain import predicates
from webhook.extender import placement
from webhook.extender import preemption as preemption_  # `preemption` names a verdict's field here
from webhook.extender import store as store_module

if TYPE_CHECKING:  # the note is made by `budget`, which reads this module
    from webhook.explain import budget as budget_

ReasonCode = reasons.Code  # the field `reasons` hides the module inside the dataclasses below

_CAPACITY = frozenset(
    {reasons.Code.FRAGMENTED, reasons.Code.INSUFFICIENT_MEMORY, reasons.Code.CORE_EXHAUSTED, reasons.Code.NO_TOPOLOGY_SET}
)
_WAIT = frozenset({reasons.Code.RESERVED_IN_FLIGHT, reasons.Code.STALE_ALLOCATION})
_SELECTOR = frozenset({reasons.Code.MODE_MISMATCH, reasons.Code.CARD_MODEL})


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeVerdict:
    """One node's answer for the pod."""

    node: str
    fits: bool
    reasons: tuple[reasons.Reason, ...]
    state: cards.NodeState | None
    cards: tuple[int, ...] = ()  # where the pod would go, when it fits
    never: bool = False  # the extender calls it unresolvable: no change of occupation helps
    preemption: preemption_.Choice | None = None  # the victims that would free a card for the pod (issue 27)

    @property
    def codes(self) -> tuple[ReasonCode, ...]:
        return tuple(r.code for r in self.reasons)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Suggestion:
    node: str
    change: str
    moves: tuple[str, ...] = ()  # pods (namespace/name) to move off the node
    cost: tuple[int, int, int] = (0, 0, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bound:
    node: str
    cards: tuple[int, ...]
    memory_gib: int = 0
    core_percent: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class HoldNote:
    """One preemption hold record on a node (`preemption.Hold`, from the node's hold Lease), as
    explain and simulate show it: whom it holds for, what was evicted for it, and whether it still
    holds the card (`preemption.standing`, judged on the live pods as the extender judges it)."""

    node: str
    pod: str  # namespace/name of the preemptor
    uid: str
    priority: int
    victims: tuple[str, ...]  # namespace/name, or "<uid> (gone)"
    at: float  # unix seconds the record was written
    standing: bool
    cards: tuple[int, ...] = ()  # the card(s) it holds, where it stands

    def describe(self, *, now: float) -> str:
        held = f" GPU{','.join(map(str, self.cards))}" if self.cards else ""
        state = "holds the card" if self.standing else "lapsed: holds nothing"
        return (
            f"{self.node}{held}: for {self.pod} (priority {self.priority}), which preempted {', '.join(self.victims) or 'nothing'}; "
            f"recorded {max(0, round(now - self.at))} s ago; {state}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Report:
    pod: str  # namespace/name
    admission: model.Decision | None
    request: cardrequest.Request
    family: str  # what the pod asks for, in words, also for a family the extender does not place
    modes: tuple[str, ...]  # node modes that serve the request
    selectors: tuple[str, ...]  # the pod's nodeSelector and required affinity, as sentences
    bound: Bound | None
    nodes: tuple[NodeVerdict, ...]
    suggestion: Suggestion | None
    # Set when the settings name another GPU scheduler (`policies.schedulers.Profile.notice`): its
    # cards are not the extender's, so the per-node part says nothing about them.
    scheduler: str = ""
    holds: tuple[HoldNote, ...] = ()  # the preemption hold records on the GPU nodes
    # The pod against its namespace's GPU budget (`webhook.explain.budget.BudgetNote`), where it has
    # one to be judged against; None: a bound pod, or one that asks for no GPU.
    budget: budget_.BudgetNote | None = None

    @property
    def managed(self) -> bool:
        return self.request.managed


class Cluster:
    """Nodes and pods as the extender sees them: its cache, plus what `explain` needs beside it."""

    def __init__(
        self,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        *,
        now: float,
        ttl: float = allocation_.DEFAULT_RESERVATION_TTL_S,
        leases: Iterable[Mapping[str, Any]] = (),
        ledger_namespace: str = reservations.LEDGER_NAMESPACE,
        slices: Iterable[Mapping[str, Any]] = (),
        claims: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        self.now, self.ttl = now, ttl
        self.ledger_namespace = ledger_namespace
        self.nodes: dict[str, Mapping[str, Any]] = {}
        for node in nodes:
            name = str(podspec.mapping(node.get("metadata")).get("name", ""))
            if name:
                self.nodes[name] = node
        listed = list(pods)
        self.pods_by_uid = {str(podspec.mapping(p.get("metadata")).get("uid", "")): p for p in listed}
        # The nodes' ledger Leases: only those in the ledger namespace that name their node count.
        leases = list(leases)
        self.leases = reservations.leases_by_node(leases, namespace=ledger_namespace)
        self.store = store_module.Store(namespace=ledger_namespace)
        self.store.replace_nodes(self.nodes.values())
        self.store.replace_pods(listed)
        self.store.replace_leases(self.leases.values())
        for lease in leases:  # the preempt verb's hold records (`gpu-hold.<node>`): trusted as the extender trusts them
            self.store.put_hold_lease(lease)
        # Cards allocated by Dynamic Resource Allocation (`policies.gpu.dra`): counted as the extender counts them.
        self.store.replace_slices(slices)
        self.store.replace_claims(claims)

    def ledger(self, name: str) -> dict[str, allocation_.Allocation]:
        """A node's reservation ledger: its Node annotation's (earlier versions) and its Lease's."""
        node = self.nodes.get(name)
        return reservations.union(node, self.leases.get(name), namespace=self.ledger_namespace) if node is not None else {}

    def gpu_nodes(self) -> list[str]:
        """Nodes with a GPU mode label, card labels, or cards the extender can place on; by name."""
        found = []
        for name, node in sorted(self.nodes.items()):
            labels = podspec.mapping(podspec.mapping(node.get("metadata")).get("labels"))
            if gpu.SCHEDULE_LABEL in labels or gpu.CARD_NAME_LABEL in labels or cards.node_cards(node).cards:
                found.append(name)
        return found

    def state(self, name: str, *, exclude_uid: str = "") -> cards.NodeState | None:
        return self.store.state(name, now=self.now, ttl=self.ttl, exclude_uid=exclude_uid)

    def held(self, name: str, state: cards.NodeState | None, *, pod: Mapping[str, Any]) -> cards.NodeState | None:
        """`state` with the cards held for preemptors of the pod's priority or above, as filter and
        bind judge it (`Store.with_holds`)."""
        return None if state is None else self.store.with_holds(name, state, pod=pod, now=self.now)

    def holds(self, name: str) -> tuple[HoldNote, ...]:
        """The hold records on a node, each with whether it stands and the card(s) it holds."""
        records = self.store.hold_nodes().get(name, {})
        if not records:
            return ()
        standing = {str(podspec.mapping(p.get("metadata")).get("uid", "")) for p in self.store.held_for(name, now=self.now)}
        lowest = {"metadata": {"uid": ""}, "spec": {"priority": -(2**31)}}  # held against: every holder counts
        state = self.held(name, self.state(name), pod=lowest)
        found = []
        for uid, record in sorted(records.items(), key=lambda item: item[1].at):
            victims = tuple(
                sorted(
                    f"{podspec.mapping(p.get('metadata')).get('namespace', '')}/{podspec.mapping(p.get('metadata')).get('name', '')}"
                    if (p := self.pods_by_uid.get(victim)) is not None
                    else f"{victim} (gone)"
                    for victim in record.victims
                )
            )
            held_cards = (
                ()
                if state is None or uid not in standing
                else tuple(
                    sorted({card for a in state.allocations if a.uid == uid and a.source == "nomination" for card in a.cards})
                )
            )
            found.append(
                HoldNote(
                    node=name,
                    pod=f"{record.namespace}/{record.name}",
                    uid=uid,
                    priority=record.priority,
                    victims=victims,
                    at=record.at,
                    standing=uid in standing,
                    cards=held_cards,
                )
            )
        return tuple(found)

    def stale(self, name: str) -> frozenset[str]:
        """UIDs whose allocations on `name` belong to pods that are gone (see the module docstring)."""
        node = self.nodes.get(name)
        if node is None:
            return frozenset()
        gone = {uid for uid in self.ledger(name) if uid not in self.pods_by_uid}
        for pod in self.store.pods_on(name):
            deadline = _time(podspec.mapping(pod.get("metadata")).get("deletionTimestamp"))
            if deadline is not None and deadline + reasons.STUCK_TERMINATING_S <= self.now:
                gone.add(str(podspec.mapping(pod.get("metadata")).get("uid", "")))
        return frozenset(gone)


def judge(pod: Mapping[str, Any], request: cardrequest.Request, *, cluster: Cluster, name: str) -> NodeVerdict:
    """The pod on one node of `cluster`: kube-scheduler's checks, then the extender's (with the
    what-ifs), and, where the node is full, what the extender's preempt verb would answer."""
    uid = str(podspec.mapping(pod.get("metadata")).get("uid", ""))
    state = cluster.state(name, exclude_uid=uid)
    held = cluster.held(name, state, pod=pod)
    found = with_hold_note(
        verdict(pod, request, node=cluster.nodes.get(name, {}), name=name, state=held, stale=cluster.stale(name)), held, state
    )
    return preempting(pod, request, found, known=lambda u: cluster.store.pod(u))


def with_hold_note(found: NodeVerdict, held: cards.NodeState | None, state: cards.NodeState | None) -> NodeVerdict:
    """`found` with its last reason naming the preemptors whose hold refused the pod, as filter's
    refusal names them; unchanged where no hold applies or the pod fits."""
    if held is state or held is None or found.fits or not found.reasons:
        return found
    last = found.reasons[-1]
    note = preemption_.held_note(held)
    return (
        dataclasses.replace(found, reasons=(*found.reasons[:-1], dataclasses.replace(last, message=f"{last.message}{note}")))
        if note
        else found
    )


def preempting(
    pod: Mapping[str, Any],
    request: cardrequest.Request,
    found: NodeVerdict,
    *,
    known: Callable[[str], Mapping[str, Any] | None],
    budgets: Sequence[preemption_.Budget] = (),
    priorities: Mapping[str, int] | None = None,
) -> NodeVerdict:
    """`found` with the preempt verb's answer on a full node: the victims (`preemption`), or the
    reason `PREEMPTION_IMPOSSIBLE`. Only nodes refused by the extender alone, for being full, are
    asked: kube-scheduler's own checks are not something eviction changes. `known` finds a pod by
    UID; `priorities` gives the priority of pods it does not know (simulated ones)."""
    state = found.state
    if found.fits or found.never or state is None or not any(r.code in _CAPACITY for r in found.reasons):
        return found
    if any(r.code not in _CAPACITY | _WAIT for r in found.reasons):
        return found
    candidates: dict[str, preemption_.Pod] = {}
    for held in state.allocations:
        obj = known(held.uid)
        if obj is not None:
            candidates[held.uid] = preemption_.pod_of(obj)
        elif priorities is not None and held.uid in priorities:
            candidates[held.uid] = preemption_.Pod(
                uid=held.uid, key=held.pod_key, priority=priorities[held.uid], namespace=held.namespace
            )
    priority = preemption_.priority_of(pod)
    choice = (
        None
        if preemption_.never_preempts(pod)
        else preemption_.select(request, state, priority=priority, known=candidates, budgets=budgets)
    )
    if choice is not None:
        return dataclasses.replace(found, preemption=choice)
    if priority <= 0 and not any(c.priority < priority for c in candidates.values()):
        return found  # a pod of the default priority beside no lower one: preemption is no question here
    why = (
        "the pod never preempts (preemptionPolicy: Never)"
        if preemption_.never_preempts(pod)
        else (
            f"no set of pods of priority below the pod's ({priority}) frees one card"
            + (" set" if request.cards else "")
            + " for it"
        )
    )
    impossible = reasons.Reason(code=reasons.Code.PREEMPTION_IMPOSSIBLE, message=f"preemption cannot help: {why}")
    return dataclasses.replace(found, reasons=(*found.reasons, impossible))


def verdict(
    pod: Mapping[str, Any],
    request: cardrequest.Request,
    *,
    node: Mapping[str, Any],
    name: str,
    state: cards.NodeState | None,
    stale: frozenset[str] = frozenset(),
) -> NodeVerdict:
    """The pod on one node in a given state (`simulate` passes its own)."""
    before = predicates.check(pod, node)
    if state is None:
        outcome = placement.filter_nodes(request, states={}, names=[name])
        return NodeVerdict(node=name, fits=False, reasons=(*before, *outcome.reasons[name]), state=None)
    fit = placement.diagnose(request, state, stale=stale)
    return NodeVerdict(
        node=name,
        fits=fit.fits and not before,
        reasons=(*before, *fit.reasons),
        state=state,
        cards=fit.cards if fit.fits else (),
        never=fit.verdict is placement.Verdict.NEVER,
    )


def explain(pod: Mapping[str, Any], *, cluster: Cluster, admission: model.Decision | None = None) -> Report:
    """The whole report for one pod."""
    metadata = podspec.mapping(pod.get("metadata"))
    spec = podspec.mapping(pod.get("spec"))
    key = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
    request = cardrequest.pod_request(pod)
    family = request.family or gpu.pod_family(spec)
    common: dict[str, Any] = {
        "pod": key,
        "admission": admission,
        "request": request,
        "family": str(family) if family else "",
        "modes": tuple(str(m) for m in gpu.modes_for(family)) if family else (),
        "selectors": selectors(spec),
    }
    bound_to = spec.get("nodeName")
    if isinstance(bound_to, str) and bound_to:
        allocation = allocation_.pod_allocation(pod, now=cluster.now, ttl=cluster.ttl)
        held = allocation if allocation is not None and allocation.node == bound_to else None
        return Report(
            **common,
            bound=Bound(
                node=bound_to,
                cards=held.cards if held else (),
                memory_gib=held.memory_gib if held else 0,
                core_percent=held.core_percent if held else 0,
            ),
            nodes=(),
            suggestion=None,
        )
    if not request.managed:
        return Report(**common, bound=None, nodes=(), suggestion=None)
    verdicts = tuple(judge(pod, request, cluster=cluster, name=name) for name in cluster.gpu_nodes())
    holds = tuple(note for name in cluster.gpu_nodes() for note in cluster.holds(name))
    return Report(**common, bound=None, nodes=verdicts, suggestion=suggest(request, verdicts), holds=holds)


def selectors(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The pod's nodeSelector entries and required affinity terms, one sentence each."""
    found = [f"nodeSelector {k}={v}" for k, v in sorted(nodeaffinity.node_selector(spec).items())]
    for number, term in enumerate(nodeaffinity.required_terms(spec)):
        parts = [
            f"{e.get('key')} {e.get('operator')}"
            + (f" [{','.join(str(v) for v in podspec.sequence(e.get('values')))}]" if e.get("values") else "")
            for e in nodeaffinity.expressions(term)
        ]
        found.append(f"affinity term {number + 1}: " + " and ".join(parts))
    return tuple(found)


def suggest(request: cardrequest.Request, verdicts: Sequence[NodeVerdict]) -> Suggestion | None:
    """The refusing node that needs the smallest change; None when a node fits or none can."""
    if any(v.fits for v in verdicts):
        return None
    options = [option for option in (_option(request, v) for v in verdicts) if option is not None]
    return min(options, key=lambda o: (o.cost, o.node), default=None)


def _option(request: cardrequest.Request, verdict: NodeVerdict) -> Suggestion | None:
    codes = set(verdict.codes)
    if verdict.state is None or not codes or (verdict.never and not codes <= _SELECTOR | {reasons.Code.UNSCHEDULABLE}):
        return None
    if not codes <= _CAPACITY | _WAIT | _SELECTOR | {reasons.Code.UNSCHEDULABLE}:
        return None
    changes: list[str] = []
    tier, moved, gib = 0, 0, 0
    moves: tuple[str, ...] = ()
    if codes & _WAIT:
        for reason in verdict.reasons:
            if reason.code is reasons.Code.STALE_ALLOCATION:
                changes.append("force-delete the gone pods' allocations (" + reason.message.split(": ", 1)[-1] + ")")
            elif reason.code is reasons.Code.RESERVED_IN_FLIGHT:
                changes.append("wait for the binds in flight to finish or expire")
    elif codes & _CAPACITY:
        found = moves_for(request, verdict.state)
        if found is None:
            return None
        moves, gib, where = found
        tier, moved = 2, len(moves)
        changes.append(
            f"move {', '.join(moves)} off {where} (frees {gib} GiB)"
            if request.memory_gib
            else f"move {', '.join(moves)} off {where}"
        )
    if reasons.Code.UNSCHEDULABLE in codes:
        tier = max(tier, 1)
        changes.append("uncordon the node or tolerate its taints")
    if codes & _SELECTOR:
        tier = 3
        changes.append(
            "change the pod's selectors or the node's labels: "
            + "; ".join(r.message for r in verdict.reasons if r.code in _SELECTOR)
        )
    return Suggestion(node=verdict.node, change="; then ".join(changes), moves=moves, cost=(tier, moved, gib))


def moves_for(request: cardrequest.Request, state: cards.NodeState) -> tuple[tuple[str, ...], int, str] | None:
    """The fewest bound pods to move (then the fewest GiB) so that the pod fits: (pods, GiB, where)."""
    best: tuple[tuple[int, int], tuple[str, ...], int, str] | None = None
    if request.family is gpu.Family.TOPOLOGY:
        busy = sorted((c for c in state.cards if not c.idle), key=lambda c: (len(c.allocations), c.index))
        short = request.cards - state.idle_cards
        if short <= 0 or short > len(busy) or any(not a.bound for c in busy[:short] for a in c.allocations):
            return None
        chosen = busy[:short]
        pods = tuple(dict.fromkeys(a.pod_key for c in chosen for a in c.allocations))
        return pods, sum(c.card.memory_gib for c in chosen), ", ".join(f"GPU{c.index}" for c in chosen)
    for card in state.cards:
        if card.card.memory_gib < request.memory_gib:
            continue
        need_memory = request.memory_gib - card.memory_free
        need_core = request.core_percent - card.core_free
        movable = sorted((a for a in card.allocations if a.bound), key=lambda a: (-a.memory_gib, -a.core_percent, a.pod_key))
        taken: list[allocation_.Allocation] = []
        for allocation in movable:
            if need_memory <= 0 and need_core <= 0:
                break
            taken.append(allocation)
            need_memory -= allocation.memory_gib
            need_core -= allocation.core_percent
        if need_memory > 0 or need_core > 0 or not taken:
            continue
        cost = (len(taken), sum(a.memory_gib for a in taken))
        if best is None or cost < best[0]:
            best = (cost, tuple(a.pod_key for a in taken), cost[1], f"GPU{card.index}")
    return None if best is None else (best[1], best[2], best[3])


def _time(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)).timestamp()
