"""Defragmentation plans: which pods to move so that whole cards come free, or so that a given pod fits.

Pure: a `analysis.Cluster` and the PodDisruptionBudgets in, a `Plan` out. A pod is moved only when
a controller recreates it (its controlling owner is a ReplicaSet, StatefulSet, ReplicationController
or Job; a bare pod or a DaemonSet's is never moved) and no PodDisruptionBudget that selects it is out
of disruptions (`status.disruptionsAllowed`; a plan moves at most that many pods of one budget, so
every eviction of the plan is one the Eviction API allows right now).

Where the replacement lands is decided as for `simulate`: kube-scheduler's node checks, the
extender's filter and score, the extender's card choice, with the card(s) being freed held so
the replacement cannot go back onto them. A card is freed only when every pod on it can be
moved and placed elsewhere; moves are committed to the copy one card at a time, so later
choices see earlier ones.

Goals:
- whole cards (no `--for`): the shared cards with the least memory in use first (cheapest to
  empty), until no further card can be emptied or `max_moves` is reached;
- room for one pod (`--for FILE`): on each node where kube-scheduler's checks pass, the fewest
  pods (then GiB) to move off one card (or set of cards, for whole-card pods), as `explain`'s
  best-node suggestion computes them; the cheapest node whose moves all find a place wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from policies import podspec
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import cardrequest, cards
from webhook.explain import analysis, predicates
from webhook.extender import placement, preemption

CONTROLLERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController", "Job"})
DEFAULT_MAX_MOVES = 20
_HOLD = "defrag-hold"
_MOVED = "moved-"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Move:
    namespace: str
    name: str
    uid: str
    owner: str  # Kind/name of the controller that recreates it
    owner_uid: str
    node: str
    cards: tuple[int, ...]
    memory_gib: int
    to_node: str
    to_cards: tuple[int, ...]

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    goal: str
    moves: tuple[Move, ...]
    freed: tuple[tuple[str, tuple[int, ...]], ...]  # (node, cards) freed
    skipped: tuple[str, ...] = ()  # why cards or nodes could not be used, for people
    target_node: str = ""  # --for: where the pod then fits


def owner(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The controlling owner (kind, name, uid) when it is one that recreates the pod."""
    for reference in podspec.sequence(podspec.mapping(pod.get("metadata")).get("ownerReferences")):
        if isinstance(reference, Mapping) and reference.get("controller") is True and reference.get("kind") in CONTROLLERS:
            return str(reference.get("kind")), str(reference.get("name", "")), str(reference.get("uid", ""))
    return None


class Budgets:
    """PodDisruptionBudgets (read as the extender's preemption reads them: `preemption.budgets_of`)
    and how many more disruptions the plan may still spend on each."""

    def __init__(self, pdbs: Sequence[Mapping[str, Any]]) -> None:
        self._budgets = preemption.budgets_of(pdbs)
        self.left: dict[str, int] = {budget.key: budget.allowed for budget in self._budgets}

    def covering(self, pod: Mapping[str, Any]) -> list[str]:
        metadata = podspec.mapping(pod.get("metadata"))
        labels = {str(k): str(v) for k, v in podspec.mapping(metadata.get("labels")).items()}
        namespace = metadata.get("namespace")
        return [
            budget.key
            for budget in self._budgets
            if namespace == budget.namespace and budget.selector is not None and budget.selector.matches(labels)
        ]


def plan(
    cluster: analysis.Cluster,
    *,
    pdbs: Sequence[Mapping[str, Any]] = (),
    target: Mapping[str, Any] | None = None,
    max_moves: int = DEFAULT_MAX_MOVES,
) -> Plan:
    """The moves for the goal (`target`: room for that pod; else free whole cards)."""
    names = [name for name in cluster.gpu_nodes()]
    states = {name: state for name in names if (state := cluster.state(name)) is not None}
    budgets = Budgets(pdbs)
    if target is not None:
        return _for_pod(cluster, states=states, budgets=budgets, target=target, max_moves=max_moves)
    moves: list[Move] = []
    freed: list[tuple[str, tuple[int, ...]]] = []
    skipped: list[str] = []
    candidates = sorted(
        (
            (name, card.index, card.memory_used)
            for name, state in states.items()
            if state.node.shared
            for card in state.cards
            if card.allocations
        ),
        key=lambda item: (item[2], item[0], item[1]),
    )
    for name, index, _ in candidates:
        state = states[name]
        card = state.card(index)
        if card is None or any(a.uid == _HOLD or a.uid.startswith(_MOVED) for a in card.allocations):
            continue  # freed already, or holding pods this plan moves there
        if len(moves) + len(card.allocations) > max_moves:
            continue
        trial = _empty(cluster, states=states, budgets=budgets, node=name, indices=(index,), allocations=card.allocations)
        if isinstance(trial, str):
            skipped.append(f"{name} GPU{index}: {trial}")
            continue
        trial_moves, trial_states, spent = trial
        if _idle(trial_states) <= _idle(states):
            skipped.append(f"{name} GPU{index}: its pods would only take another empty card")
            continue
        states = trial_states
        for key in spent:
            budgets.left[key] -= 1
        moves.extend(trial_moves)
        freed.append((name, (index,)))
    return Plan(goal="free whole cards", moves=tuple(moves), freed=tuple(freed), skipped=tuple(skipped))


def _for_pod(
    cluster: analysis.Cluster, *, states: dict[str, cards.NodeState], budgets: Budgets, target: Mapping[str, Any], max_moves: int
) -> Plan:
    request = cardrequest.pod_request(target)
    metadata = podspec.mapping(target.get("metadata"))
    goal = f"room for {metadata.get('namespace', 'default') or 'default'}/{metadata.get('name', '')} ({request.describe()})"
    if not request.managed or request.problem:
        return Plan(goal=goal, moves=(), freed=(), skipped=("the pod asks for nothing the extender places",))
    for name, state in sorted(states.items()):
        if placement.evaluate(request, state).fits and not predicates.check(target, cluster.nodes[name]):
            return Plan(goal=goal, moves=(), freed=(), target_node=name, skipped=(f"the pod fits {name} already",))
    options: list[tuple[tuple[int, int, str], list[Move], str, tuple[int, ...]]] = []
    skipped: list[str] = []
    for name, state in sorted(states.items()):
        verdict = placement.evaluate(request, state)
        if verdict.verdict is placement.Verdict.NEVER or predicates.check(target, cluster.nodes[name]):
            continue
        found = analysis.moves_for(request, state)
        if found is None:
            continue
        keys, gib, where = found
        if len(keys) > max_moves:
            continue
        indices = tuple(int(part.strip()[3:]) for part in where.split(","))
        chosen = [a for a in state.allocations if a.pod_key in keys]
        trial = _empty(cluster, states=states, budgets=budgets, node=name, indices=indices, allocations=chosen)
        if isinstance(trial, str):
            skipped.append(f"{name} {where}: {trial}")
            continue
        options.append(((len(keys), gib, name), trial[0], name, indices))
    if not options:
        return Plan(goal=goal, moves=(), freed=(), skipped=tuple(skipped) or ("no node can make room by moving pods",))
    _, moves, name, indices = min(options, key=lambda option: option[0])
    return Plan(goal=goal, moves=tuple(moves), freed=((name, indices),), target_node=name, skipped=tuple(skipped))


def _empty(
    cluster: analysis.Cluster,
    *,
    states: dict[str, cards.NodeState],
    budgets: Budgets,
    node: str,
    indices: tuple[int, ...],
    allocations: Sequence[allocation_.Allocation],
) -> tuple[list[Move], dict[str, cards.NodeState], list[str]] | str:
    """Move `allocations` off `indices` of `node` (held meanwhile), or why not."""
    spent: dict[str, int] = {}
    movers: list[tuple[allocation_.Allocation, Mapping[str, Any], tuple[str, str, str]]] = []
    for allocation in allocations:
        pod = cluster.pods_by_uid.get(allocation.uid)
        if pod is None or not allocation.bound:
            return f"{allocation.pod_key} is not a bound pod"
        controller = owner(pod)
        if controller is None:
            return f"{allocation.pod_key} has no controller that would recreate it"
        for key in budgets.covering(pod):
            spent[key] = spent.get(key, 0) + 1
            if spent[key] > budgets.left.get(key, 0):
                return f"{allocation.pod_key}: PodDisruptionBudget {key} allows no further disruption now"
        movers.append((allocation, pod, controller))
    uids = {a.uid for a, _, _ in movers}
    state = states[node]
    hold = allocation_.Allocation(uid=_HOLD, namespace="", name=_HOLD, node=node, cards=indices, whole=True, bound=True)
    trial = dict(states)
    trial[node] = cards.occupy(state.node, [*(a for a in state.allocations if a.uid not in uids), *state.orphans, hold])
    moves: list[Move] = []
    for allocation, pod, controller in sorted(movers, key=lambda item: (-item[0].memory_gib, item[0].pod_key)):
        replacement = _unbound(pod)
        request = cardrequest.pod_request(replacement)
        landed = _place(cluster, trial, replacement, request)
        if landed is None:
            return f"{allocation.pod_key} ({request.describe()}) would fit nowhere else"
        to_node, to_cards = landed
        placed = dataclasses.replace(allocation, node=to_node, cards=to_cards, uid=f"{_MOVED}{allocation.uid}")
        target_state = trial[to_node]
        trial[to_node] = cards.occupy(target_state.node, [*target_state.allocations, *target_state.orphans, placed])
        moves.append(
            Move(
                namespace=allocation.namespace,
                name=allocation.name,
                uid=allocation.uid,
                owner=f"{controller[0]}/{controller[1]}",
                owner_uid=controller[2],
                node=node,
                cards=allocation.cards,
                memory_gib=allocation.memory_gib,
                to_node=to_node,
                to_cards=to_cards,
            )
        )
    return moves, trial, list(spent)


def _place(
    cluster: analysis.Cluster, states: Mapping[str, cards.NodeState], pod: Mapping[str, Any], request: cardrequest.Request
) -> tuple[str, tuple[int, ...]] | None:
    """Where the scheduler and extender would put `pod` now (as `simulate` decides)."""
    candidates = [
        name
        for name, state in states.items()
        if placement.evaluate(request, state, decide=False, explain=False).fits
        and not predicates.check(pod, cluster.nodes.get(name, {}))
    ]
    if not candidates:
        return None
    scores = placement.scores(request, states=states, names=candidates)
    top = max(scores.values())
    chosen = min(name for name in candidates if scores[name] == top)
    fit = placement.evaluate(request, states[chosen])
    return chosen, fit.cards


def _unbound(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The replacement a controller would create: the same spec, not bound, no allocation."""
    spec = {k: v for k, v in podspec.mapping(pod.get("spec")).items() if k != "nodeName"}
    metadata = {k: v for k, v in podspec.mapping(pod.get("metadata")).items() if k != "annotations"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _idle(states: Mapping[str, cards.NodeState]) -> int:
    """Cards with nothing on them, a card held for freeing counted as idle."""
    return sum(1 for state in states.values() for card in state.cards if all(a.uid == _HOLD for a in card.allocations))
