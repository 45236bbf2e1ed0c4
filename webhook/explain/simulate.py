"""Place a batch of GPU pods, in order, on a copy of the cluster's allocation: where each would land.

Each pod goes through what the real path does, in the same order: the admission engine (its
mutations, e.g. GPU101's mode selector, change where the pod may go; a denied pod never exists),
kube-scheduler's node checks (`predicates`), the extender's filter and prioritize
(`placement.evaluate`, `placement.scores`), and the extender's card choice on the chosen node
(`placement.choose`: binpack/spread, topology sets). The pod's allocation is then added to the
copy, so the next pod sees it. Nothing is written anywhere.

kube-scheduler adds the extender's score (weight 5 in `deploy/scheduler-config.yaml`) to its own
plugins' scores, and picks at random among equal totals. GPU pods on otherwise equal nodes get equal
in-tree scores, so the simulation takes the highest extender score and, among equal ones, the first
node by name, and reports the other equally good nodes as `ties`: the real scheduler may pick any
of them.

Workloads in the manifests (Deployment, ReplicaSet, StatefulSet, ReplicationController: `replicas`;
Job: `parallelism`) become that many pods of their template, named `<name>-<i>`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from policies import gpu, podspec
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import cardrequest, cards
from webhook.explain import analysis, predicates
from webhook.extender import placement, preemption

Object = dict[str, Any]
REPLICATED = {
    "Deployment": "replicas",
    "ReplicaSet": "replicas",
    "StatefulSet": "replicas",
    "ReplicationController": "replicas",
    "Job": "parallelism",
}
MAX_ADDED_NODES = 1000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Landing:
    pod: str  # namespace/name
    node: str = ""  # "" where it does not fit
    cards: tuple[int, ...] = ()
    ties: tuple[str, ...] = ()  # other nodes with the same extender score
    denied: str = ""  # the admission denial, where there is one
    verdicts: tuple[analysis.NodeVerdict, ...] = ()  # why no node took it
    managed: bool = True  # False: asks for nothing the extender places (not simulated)
    preempted: tuple[str, ...] = ()  # pods (namespace/name) evicted to make room (issue 27)

    @property
    def placed(self) -> bool:
        return bool(self.node)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
    landings: tuple[Landing, ...]
    states: dict[str, cards.NodeState]
    added: int = 0  # nodes added from the template (--add-nodes)
    holds: tuple[analysis.HoldNote, ...] = ()  # the preemption hold records on the nodes, honoured as bind honours them

    @property
    def unplaced(self) -> int:
        return sum(1 for landing in self.landings if landing.managed and not landing.placed)


def expand(objects: Sequence[Mapping[str, Any]]) -> list[Object]:
    """Pods of the manifests, workloads expanded to their replicas, in order."""
    pods: list[Object] = []
    for obj in objects:
        kind = obj.get("kind")
        metadata = podspec.mapping(obj.get("metadata"))
        if kind == "Pod":
            pods.append(copy.deepcopy(dict(obj)))
        elif kind in REPLICATED or kind == "CronJob":
            spec = podspec.mapping(obj.get("spec"))
            if kind == "CronJob":
                spec = podspec.mapping(podspec.mapping(spec.get("jobTemplate")).get("spec"))
            count = spec.get(REPLICATED.get(str(kind), "parallelism"), 1)
            count = count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 1
            template = podspec.mapping(spec.get("template"))
            for index in range(count):
                pods.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            **copy.deepcopy(dict(podspec.mapping(template.get("metadata")))),
                            "name": f"{metadata.get('name', 'pod')}-{index}",
                            "namespace": metadata.get("namespace", ""),
                        },
                        "spec": copy.deepcopy(dict(podspec.mapping(template.get("spec")))),
                    }
                )
    return pods


def run(
    pods: Sequence[Mapping[str, Any]],
    *,
    cluster: analysis.Cluster,
    denials: Mapping[int, str] | None = None,
    extra_nodes: Sequence[Mapping[str, Any]] = (),
) -> Result:
    """Place `pods` in order (`denials`: pod position -> admission message; those are skipped)."""
    nodes: dict[str, Mapping[str, Any]] = {name: cluster.nodes[name] for name in cluster.gpu_nodes()}
    states: dict[str, cards.NodeState] = {}
    for name in nodes:
        state = cluster.state(name)
        if state is not None:
            states[name] = state
    stale = {name: cluster.stale(name) for name in nodes}
    for extra in extra_nodes:
        name = str(podspec.mapping(extra.get("metadata")).get("name", ""))
        nodes[name] = extra
        states[name] = cards.node_state(extra, (), now=cluster.now, ttl=cluster.ttl, reservations={})
        stale[name] = frozenset()
    # Caches: kube-scheduler's checks depend only on the pod's scheduling fields and the node; a
    # verdict only on those, the request and the node's state (versioned: bumped when a pod lands).
    checked: dict[tuple[str, str], bool] = {}
    judged: dict[tuple[str, cardrequest.Request, str, int, int], analysis.NodeVerdict] = {}
    held_nodes = {name for name in nodes if cluster.holds(name)} | set(cluster.store.nominated_nodes())
    versions = dict.fromkeys(nodes, 0)
    landings: list[Landing] = []
    priorities: dict[str, int] = {}  # simulated pods' priorities (`spec.priority`), by their simulated UID
    for position, pod in enumerate(pods):
        metadata = podspec.mapping(pod.get("metadata"))
        key = f"{metadata.get('namespace', '') or 'default'}/{metadata.get('name', '')}"
        if denials and position in denials:
            landings.append(Landing(pod=key, denied=denials[position]))
            continue
        request = cardrequest.pod_request(pod)
        if not request.managed:
            landings.append(Landing(pod=key, managed=False))
            continue
        signature = _scheduling_signature(pod)

        def seen(name: str, state: cards.NodeState, pod: Mapping[str, Any] = pod) -> cards.NodeState:
            """The node's state as this pod is judged on it: with the cards held for preemptors of
            its priority or above (`analysis.Cluster.held`), where any is."""
            return cluster.store.with_holds(name, state, pod=pod, now=cluster.now) if name in held_nodes else state

        candidates = []
        for name, node in nodes.items():
            passes = checked.get((signature, name))
            if passes is None:
                passes = checked[(signature, name)] = not predicates.check(pod, node)
            if (
                passes
                and name in states
                and placement.evaluate(request, seen(name, states[name]), decide=False, explain=False).fits
            ):
                candidates.append(name)
        if not candidates:
            verdicts = []
            for name, node in nodes.items():
                cache_key = (signature, request, name, versions[name], preemption.priority_of(pod))
                found = judged.get(cache_key)
                if found is None:
                    state = states.get(name)
                    held = None if state is None else seen(name, state)
                    found = judged[cache_key] = analysis.with_hold_note(
                        analysis.verdict(pod, request, node=node, name=name, state=held, stale=stale[name]), held, state
                    )
                verdicts.append(found)
            # Priorities count: the extender's preempt verb would free one card on one of the full
            # nodes; kube-scheduler picks among them (fewest budget violations, then the lowest
            # highest priority, the lowest sum, the fewest victims), the victims leave, the pod lands.
            preempting = [
                analysis.preempting(
                    pod, request, v, known=lambda u: cluster.store.pod(u) if u not in priorities else None, priorities=priorities
                )
                for v in verdicts
            ]
            able = [v for v in preempting if v.preemption is not None]
            if not able:
                landings.append(Landing(pod=key, verdicts=tuple(preempting)))
                continue
            target = min(able, key=_preemption_rank)
            choice = target.preemption
            assert choice is not None and target.state is not None  # `able` and `preempting` guarantee both
            gone = set(choice.uids)
            state = states.get(target.node, target.state)  # as it is: a hold judged it, it is not part of it
            states[target.node] = cards.occupy(state.node, [a for a in (*state.allocations, *state.orphans) if a.uid not in gone])
            versions[target.node] += 1
            fit = placement.evaluate(request, seen(target.node, states[target.node]))
            priorities[_place(states, target.node, position, metadata, request, fit.cards, now=cluster.now)] = (
                preemption.priority_of(pod)
            )
            versions[target.node] += 1
            landings.append(Landing(pod=key, node=target.node, cards=fit.cards, preempted=tuple(p.key for p in choice.victims)))
            continue
        scores = placement.scores(request, states={name: seen(name, states[name]) for name in candidates}, names=candidates)
        top = max(scores.values())
        best = sorted(name for name in candidates if scores[name] == top)
        chosen = best[0]
        fit = placement.evaluate(request, seen(chosen, states[chosen]))
        priorities[_place(states, chosen, position, metadata, request, fit.cards, now=cluster.now)] = preemption.priority_of(pod)
        versions[chosen] += 1
        landings.append(Landing(pod=key, node=chosen, cards=fit.cards, ties=tuple(best[1:])))
    holds = tuple(note for name in cluster.gpu_nodes() for note in cluster.holds(name))
    return Result(landings=tuple(landings), states=states, added=len(extra_nodes), holds=holds)


def _place(
    states: dict[str, cards.NodeState],
    name: str,
    position: int,
    metadata: Mapping[str, Any],
    request: cardrequest.Request,
    chosen: tuple[int, ...],
    *,
    now: float,
) -> str:
    """The simulated pod's allocation added to the node's state; its simulated UID."""
    state = states[name]
    uid = f"simulated-{position}"
    allocation = allocation_.Allocation(
        uid=uid,
        namespace=str(metadata.get("namespace", "") or "default"),
        name=str(metadata.get("name", "")),
        node=name,
        cards=chosen,
        memory_gib=request.memory_gib,
        core_percent=request.core_percent,
        whole=bool(request.cards),
        assumed_at=now,
        bound=True,
    )
    states[name] = cards.occupy(state.node, [*state.allocations, *state.orphans, allocation])
    return uid


def _preemption_rank(verdict: analysis.NodeVerdict) -> tuple[int, int, int, int, str]:
    """kube-scheduler's order among preemption candidates (`pickOneNodeForPreemption`), then the name."""
    choice = verdict.preemption
    assert choice is not None
    return (
        choice.violations,
        max(p.priority for p in choice.victims),
        sum(p.priority for p in choice.victims),
        len(choice.victims),
        verdict.node,
    )


def copies(templates: Sequence[Mapping[str, Any]], count: int) -> list[Object]:
    """`count` new nodes cycling through `templates`, named `<template>-added-<i>`, with no ledger."""
    made: list[Object] = []
    for index in range(count):
        template = templates[index % len(templates)]
        node = copy.deepcopy(dict(template))
        metadata = dict(podspec.mapping(node.get("metadata")))
        metadata["name"] = f"{metadata.get('name', 'node')}-added-{index + 1}"
        annotations = {k: v for k, v in podspec.mapping(metadata.get("annotations")).items() if k != gpu.RESERVATIONS_ANNOTATION}
        metadata["annotations"] = annotations
        node["metadata"] = metadata
        made.append(node)
    return made


def with_added_nodes(
    pods: Sequence[Mapping[str, Any]],
    *,
    cluster: analysis.Cluster,
    templates: Sequence[Mapping[str, Any]],
    denials: Mapping[int, str] | None = None,
) -> Result | None:
    """The fewest copies of `templates` with which every pod fits (doubling, then bisection);
    None where even MAX_ADDED_NODES do not do (the pods do not fit that kind of node)."""
    first = run(pods, cluster=cluster, denials=denials)
    if not first.unplaced:
        return first
    if not templates:
        return None
    kinds = copies(templates, len(templates))
    empty = [(node, cards.node_state(node, (), now=cluster.now, ttl=cluster.ttl, reservations={})) for node in kinds]
    for position, landing in enumerate(first.landings):
        if not landing.managed or landing.placed or landing.denied:
            continue
        request = cardrequest.pod_request(pods[position])
        if not any(
            placement.evaluate(request, state).fits and not predicates.check(pods[position], node) for node, state in empty
        ):
            return None  # not even an empty node of the kind takes this pod
    low, high = 0, 1
    found: Result | None = None
    while high <= MAX_ADDED_NODES:
        attempt = run(pods, cluster=cluster, denials=denials, extra_nodes=copies(templates, high))
        if not attempt.unplaced:
            found = attempt
            break
        low, high = high, high * 2
    if found is None:
        return None
    while high - low > 1:
        middle = (low + high) // 2
        attempt = run(pods, cluster=cluster, denials=denials, extra_nodes=copies(templates, middle))
        if attempt.unplaced:
            low = middle
        else:
            high, found = middle, attempt
    return found


def _scheduling_signature(pod: Mapping[str, Any]) -> str:
    """The fields kube-scheduler's node checks read, as one string (a cache key)."""
    spec = podspec.mapping(pod.get("spec"))
    return json.dumps([spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")], sort_keys=True, default=str)
