"""GPU consistency checks that no admission policy can make: they need the node, or every pod at once.

Pure functions over decoded objects; each returns a `findings.Finding` (pass included) or None
where the check does not apply. IDs are stable and continue the built-in numbering:

| id | rule | judges | fails when |
|---|---|---|---|
| GPU201 | gpu-access-without-request | Pod on a GPU node | it requests no GPU but can reach the cards: a privileged container (or one adding SYS_ADMIN/ALL, ephemeral debug containers included), a hostPath on GPU devices or sockets, NVIDIA_VISIBLE_DEVICES set to something but void/none (certain); or a container without NVIDIA_VISIBLE_DEVICES=void, which an image default of `all` would expose (uncertain: warn) |
| GPU202 | card-overcommitted | GPU node | the pods' allocation annotations give one card more memory, more core percentage or more whole-card holders than it has |
| GPU203 | orphaned-reservation | Pod with an allocation | it holds a card reservation but is not bound to that node: no `spec.nodeName`, another node, or it has finished |
| GPU204 | missing-card | Pod with an allocation | its card index does not exist on its node (fewer cards now, or the node is gone) |
| GPU205 | mode-resource-mismatch | GPU node | it advertises a non-zero resource of another mode than its `ack.node.gpu.schedule` (or the mode is unknown) |
| GPU206 | card-model-labels | GPU node | a card-model label (`aliyun.accelerator/nvidia_name`, `_mem`, `_count`) is missing |
| GPU207 | mode-selector | Pod or workload asking for `aliyun.com/gpu-mem` | its nodeSelector/required affinity does not pin one `ack.node.gpu.schedule` (seed `004_79385826ac27146d.txt`: without one, a pod needing isolation can land in the pool without it) |
| GPU208 | mode-resource-missing | GPU node | it advertises none of its own mode's resource (the device plugin is likely not running; seed `003_c28dd89f5a652d9c.txt`) |
| GPU209 | expired-exception | an exception in the settings file | its `expires` has passed: the policies it named apply to its objects again, so the entry is to be removed or renewed |
| GPU212 | stale-allocation | GPU node | cards are still held by pods that are gone: a reservation-ledger entry of a pod that no longer exists, older than the extender takes to release it (`reasons.PRUNE_DEADLINE_S`: the extender is down or cannot prune), or a pod Terminating longer than `reasons.STUCK_TERMINATING_S` past its deletion deadline (its node is likely lost; force-delete it) |
| GPU210 | unaccounted-gpu-pod | bound Pod asking for an extender-managed resource | it holds no card allocation (placed with `spec.nodeName` or by a scheduler without the extender: nothing is accounted), or its allocation does not match its request (another size, another card count, or gpushare and our annotations naming different cards); a card index the node lacks is GPU204's |
| GPU211 | guarded-env-source | ConfigMap or Secret | a key is a name of the GPU environment (`NVIDIA_VISIBLE_DEVICES`, the cGPU/gpushare isolation variables: GPU007's list), or a pod or template takes it by envFrom with a prefix that composes one; it fails (enforce) when a container's envFrom delivers such a name, and warns when none does yet. Keys and names only, never values |
| GPU213 | out-of-band-gpu-process | GPU node with the labeler's usage summary | a process holds a card but belongs to no pod the apiserver has on the node (`docker run --gpus`, `ctr run`, a host process, a static pod without a mirror pod, a leftover of a pod that is gone): the bypass admission cannot see; names the card, PID, memory and container ID where the cgroup shows one |
| GPU214 | pod-exceeds-request | Pod with GPU processes in the usage summary | its processes hold more memory on its card than it asked for (`share`, which does not isolate: any excess; the other shared modes: beyond `USAGE_TOLERANCE_MIB` or `USAGE_TOLERANCE_FRACTION` of the request), or hold memory on a card it was not given, or it asks for no GPU memory at all |
| GPU215 | card-use-exceeds-allocations | shared-mode card with the usage summary | the memory its processes hold (pods and out-of-band) exceeds the sum of its allocations by more than the tolerance |

Actions are fixed (the settings file only knows admission policies): GPU201, GPU202, GPU204,
GPU205 and GPU213 are `enforce` (cards are reachable, double-booked or used outside the accounting
right now), the rest `warn`. A
"GPU node" carries a GPU label (`ack.node.gpu.*`, `aliyun.accelerator/*`,
`gpu-admission.io/gpu-memory-mib`), the labeler's inventory annotation, or non-zero GPU capacity.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from policies import gpu, model, nodeaffinity, podspec, quantity, settings, usage
from policies.builtin import gpu003_host_path, gpu007_env_sources
from webhook.audit import findings
from webhook.extender import cards, reasons

INVENTORY_ANNOTATION = cards.INVENTORY_ANNOTATION
CARD_MODEL_LABELS: tuple[str, ...] = (gpu.CARD_NAME_LABEL, gpu.CARD_MEMORY_LABEL, gpu.CARD_COUNT_LABEL)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# What each mode advertises (DESIGN section 1); every other GPU resource must be absent or 0.
MODE_RESOURCES: Mapping[gpu.Mode, frozenset[str]] = {
    gpu.Mode.DEFAULT: frozenset({gpu.Resource.NVIDIA_GPU}),
    gpu.Mode.CGPU: frozenset({gpu.Resource.GPU_MEM, gpu.Resource.GPU_COUNT}),
    gpu.Mode.SHARE: frozenset({gpu.Resource.GPU_MEM, gpu.Resource.GPU_COUNT}),
    gpu.Mode.MPS: frozenset({gpu.Resource.GPU_MEM, gpu.Resource.GPU_COUNT}),
    gpu.Mode.CORE_MEM: frozenset(
        {gpu.Resource.GPU_MEM, gpu.Resource.GPU_COUNT, gpu.Resource.GPU_CORE_PERCENTAGE}
    ),
    gpu.Mode.TOPOLOGY: frozenset({gpu.Resource.ALIYUN_GPU}),
}
# The resources without which a node of the mode cannot take a single pod of its family.
MODE_ESSENTIALS: Mapping[gpu.Mode, tuple[str, ...]] = {
    gpu.Mode.DEFAULT: (gpu.Resource.NVIDIA_GPU,),
    gpu.Mode.CGPU: (gpu.Resource.GPU_MEM,),
    gpu.Mode.SHARE: (gpu.Resource.GPU_MEM,),
    gpu.Mode.MPS: (gpu.Resource.GPU_MEM,),
    gpu.Mode.CORE_MEM: (gpu.Resource.GPU_MEM, gpu.Resource.GPU_CORE_PERCENTAGE),
    gpu.Mode.TOPOLOGY: (gpu.Resource.ALIYUN_GPU,),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    """A consistency check: stable ID, rule name, one-sentence summary, severity, category, action."""

    id: str
    rule: str
    summary: str
    severity: findings.Severity
    category: str
    action: model.Action

    def finding(
        self,
        subject: findings.ObjectRef,
        *,
        result: model.Result,
        detail: str = "",
        related: Iterable[findings.ObjectRef] = (),
    ) -> findings.Finding:
        """A result of this check; failures get the message `"<id>: <summary>: <detail>"`.

        A `warn` result is an uncertain failure, so it acts at most `warn`.
        """
        action = self.action if result is not model.Result.WARN else model.milder(self.action, model.Action.WARN)
        if result in (model.Result.FAIL, model.Result.WARN, model.Result.ERROR):
            message = f"{self.id}: {self.summary}: {detail}" if detail else f"{self.id}: {self.summary}"
        else:
            message = detail
        return findings.Finding(
            policy=self.id,
            rule=self.rule,
            result=result,
            action=action,
            severity=self.severity,
            category=self.category,
            message=message,
            subject=subject,
            related=tuple(related),
        )


GPU_ACCESS = Check(
    id="GPU201",
    rule="gpu-access-without-request",
    summary="pods on GPU nodes that request no GPU must not be able to reach the cards",
    severity=findings.Severity.HIGH,
    category="GPU Security",
    action=model.Action.ENFORCE,
)
OVERCOMMIT = Check(
    id="GPU202",
    rule="card-overcommitted",
    summary="no card may be allocated beyond its capacity",
    severity=findings.Severity.HIGH,
    category="GPU Allocation",
    action=model.Action.ENFORCE,
)
ORPHANED = Check(
    id="GPU203",
    rule="orphaned-reservation",
    summary="a card reservation must belong to a pod bound to that node",
    severity=findings.Severity.MEDIUM,
    category="GPU Allocation",
    action=model.Action.WARN,
)
MISSING_CARD = Check(
    id="GPU204",
    rule="missing-card",
    summary="a pod's allocated card must exist on its node",
    severity=findings.Severity.HIGH,
    category="GPU Allocation",
    action=model.Action.ENFORCE,
)
MODE_MISMATCH = Check(
    id="GPU205",
    rule="mode-resource-mismatch",
    summary="a GPU node advertises only the resources of its ack.node.gpu.schedule mode",
    severity=findings.Severity.HIGH,
    category="GPU Nodes",
    action=model.Action.ENFORCE,
)
CARD_LABELS = Check(
    id="GPU206",
    rule="card-model-labels",
    summary="GPU nodes carry the card-model labels",
    severity=findings.Severity.MEDIUM,
    category="GPU Nodes",
    action=model.Action.WARN,
)
MODE_SELECTOR = Check(
    id="GPU207",
    rule="mode-selector",
    summary="workloads asking for aliyun.com/gpu-mem select one ack.node.gpu.schedule mode",
    severity=findings.Severity.MEDIUM,
    category="GPU Scheduling",
    action=model.Action.WARN,
)
MODE_MISSING = Check(
    id="GPU208",
    rule="mode-resource-missing",
    summary="a GPU node advertises its mode's GPU resource",
    severity=findings.Severity.MEDIUM,
    category="GPU Nodes",
    action=model.Action.WARN,
)

EXPIRED_EXCEPTION = Check(
    id="GPU209",
    rule="expired-exception",
    summary="exceptions in the settings are removed or renewed when they expire",
    severity=findings.Severity.LOW,
    category="GPU Configuration",
    action=model.Action.WARN,
)

UNACCOUNTED = Check(
    id="GPU210",
    rule="unaccounted-gpu-pod",
    summary="a bound pod asking for extender-managed GPU resources holds the allocation the extender made for its request",
    severity=findings.Severity.HIGH,
    category="GPU Allocation",
    action=model.Action.ENFORCE,
)

ENV_SOURCE = Check(
    id="GPU211",
    rule="guarded-env-source",
    summary="no ConfigMap or Secret delivers a GPU environment variable through envFrom",
    severity=findings.Severity.HIGH,
    category="GPU Security",
    action=model.Action.ENFORCE,
)

STALE_ALLOCATION = Check(
    id="GPU212",
    rule="stale-allocation",
    summary="cards are not held by pods that are gone",
    severity=findings.Severity.MEDIUM,
    category="GPU Allocation",
    action=model.Action.WARN,
)

OUT_OF_BAND = Check(
    id="GPU213",
    rule="out-of-band-gpu-process",
    summary="every process on a GPU belongs to a pod the scheduler accounted for",
    severity=findings.Severity.HIGH,
    category="GPU Usage",
    action=model.Action.ENFORCE,
)

POD_OVER_REQUEST = Check(
    id="GPU214",
    rule="pod-exceeds-request",
    summary="a pod's processes hold no more GPU memory than it asked for, and only on its own card",
    severity=findings.Severity.MEDIUM,
    category="GPU Usage",
    action=model.Action.WARN,
)

CARD_OVER_ALLOCATION = Check(
    id="GPU215",
    rule="card-use-exceeds-allocations",
    summary="a card's real use stays within the sum of its allocations",
    severity=findings.Severity.MEDIUM,
    category="GPU Usage",
    action=model.Action.WARN,
)

CHECKS: tuple[Check, ...] = (
    GPU_ACCESS,
    OVERCOMMIT,
    ORPHANED,
    MISSING_CARD,
    MODE_MISMATCH,
    CARD_LABELS,
    MODE_SELECTOR,
    MODE_MISSING,
    EXPIRED_EXCEPTION,
    UNACCOUNTED,
    ENV_SOURCE,
    STALE_ALLOCATION,
    OUT_OF_BAND,
    POD_OVER_REQUEST,
    CARD_OVER_ALLOCATION,
)


def expired_exception(exception: settings.PolicyException) -> findings.Finding:
    """GPU209 for an exception whose expiry has passed (`settings.expired_exceptions` picks them)."""
    subject = findings.ObjectRef(
        namespace="", kind="GpuAdmissionException", name=exception.name, api_version="gpu-admission.io/v1alpha1"
    )
    expired = exception.expires.isoformat() if exception.expires is not None else "?"
    return EXPIRED_EXCEPTION.finding(
        subject,
        result=model.Result.FAIL,
        detail=f"exception {exception.name!r} for {', '.join(sorted(exception.policies))} expired {expired}",
    )


# --- node facts ---------------------------------------------------------------------------------

def labels_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's labels (empty where absent or malformed)."""
    return podspec.mapping(podspec.mapping(obj.get("metadata")).get("labels"))


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's annotations (empty where absent or malformed)."""
    return podspec.mapping(podspec.mapping(obj.get("metadata")).get("annotations"))


def name_of(obj: Mapping[str, Any]) -> str:
    """An object's name ("" where absent)."""
    value = podspec.mapping(obj.get("metadata")).get("name")
    return value if isinstance(value, str) else ""


def capacity(node: Mapping[str, Any]) -> dict[str, int]:
    """The node's GPU resources from `status.capacity` (read by `policies.quantity`; unparseable as 0)."""
    status = podspec.mapping(podspec.mapping(node.get("status")).get("capacity"))
    return {key: quantity.count(value) or 0 for key, value in status.items() if gpu.is_gpu_resource(key)}


def mode_label(node: Mapping[str, Any]) -> str | None:
    """The raw `ack.node.gpu.schedule` value, None where the label is absent."""
    value = labels_of(node).get(gpu.SCHEDULE_LABEL)
    return None if value is None else str(value)


def mode(node: Mapping[str, Any]) -> gpu.Mode | None:
    """The node's mode (`default` without the label); None for a value that is no mode."""
    value = mode_label(node)
    if value is None:
        return gpu.Mode.DEFAULT
    try:
        return gpu.Mode(value)
    except ValueError:
        return None


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    """Whether the node has GPUs by its labels, inventory annotation or capacity."""
    if any(nodeaffinity.is_gpu_node_label(key, value) for key, value in labels_of(node).items()):
        return True
    if INVENTORY_ANNOTATION in annotations_of(node):
        return True
    return any(count > 0 for count in capacity(node).values())


def _node_ref(node: Mapping[str, Any]) -> findings.ObjectRef:
    return dataclasses.replace(findings.ObjectRef.of(node), namespace="", api_version="v1", kind="Node")


# --- GPU201 ---------------------------------------------------------------------------------------


def _access_reasons(spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(certain, uncertain) ways the pod's containers can reach the node's cards."""
    certain: list[str] = []
    uncertain: list[str] = []
    for ref in podspec.iter_containers(spec, spec_path=""):
        privilege = podspec.gpu_privilege(ref.container)  # privileged, or SYS_ADMIN/ALL added
        if privilege:
            certain.append(f"{ref.label} {privilege}")
        entries = [e for e in podspec.env_entries(ref.container) if e.get("name") == gpu.VISIBLE_DEVICES_ENV]
        if not entries:
            if ref.kind is not podspec.ContainerKind.EPHEMERAL:
                uncertain.append(ref.label)
            continue
        for entry in entries:
            if "valueFrom" in entry and "value" not in entry:
                certain.append(f"{ref.label} sets {gpu.VISIBLE_DEVICES_ENV} through valueFrom")
            elif not gpu.is_safe_visible_devices(entry.get("value", "")):
                certain.append(f"{ref.label} sets {gpu.VISIBLE_DEVICES_ENV}={entry.get('value')}")
    for index, volume in podspec.volumes(spec):
        path = podspec.mapping(volume.get("hostPath")).get("path")
        if isinstance(path, str):
            protected = gpu003_host_path.exposes_gpu(path)
            if protected is not None:
                volume_name = volume.get("name") if isinstance(volume.get("name"), str) else f"volumes[{index}]"
                certain.append(f'volume "{volume_name}" mounts hostPath {path}, covering {protected}')
    return certain, uncertain


def gpu_access_without_request(
    pod: Mapping[str, Any], *, node: Mapping[str, Any] | None
) -> findings.Finding | None:
    """GPU201 for a pod bound to `node`; None unless the pod runs (or will) on a known GPU node."""
    spec = podspec.mapping(pod.get("spec"))
    phase = podspec.mapping(pod.get("status")).get("phase")
    if node is None or not spec.get("nodeName") or phase in TERMINAL_PHASES or not is_gpu_node(node):
        return None
    subject = findings.ObjectRef.of(pod)
    if gpu.pod_requests_gpu(spec):
        return GPU_ACCESS.finding(subject, result=model.Result.PASS, detail="the pod requests a GPU")
    certain, uncertain = _access_reasons(spec)
    where = f"on GPU node {name_of(node)}"
    if certain:
        return GPU_ACCESS.finding(
            subject, result=model.Result.FAIL, detail=f"{where}: " + "; ".join(certain), related=[_node_ref(node)]
        )
    if uncertain:
        detail = (
            f"{where}: {', '.join(uncertain)} {'does' if len(uncertain) == 1 else 'do'} not set "
            f"{gpu.VISIBLE_DEVICES_ENV}={gpu.VISIBLE_DEVICES_VOID}; an image that defaults it to all "
            "would see every card"
        )
        return GPU_ACCESS.finding(subject, result=model.Result.WARN, detail=detail, related=[_node_ref(node)])
    return GPU_ACCESS.finding(subject, result=model.Result.PASS, detail=f"{where}, no way to the cards")


# --- GPU205, GPU206, GPU208 -----------------------------------------------------------------------


def mode_resource_mismatch(node: Mapping[str, Any]) -> findings.Finding | None:
    """GPU205 for a GPU node; None for other nodes."""
    if not is_gpu_node(node):
        return None
    subject = _node_ref(node)
    found = mode(node)
    if found is None:
        known = ", ".join(gpu.Mode)
        return MODE_MISMATCH.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"{gpu.SCHEDULE_LABEL}={mode_label(node)} is no mode (known: {known})",
        )
    allowed = MODE_RESOURCES[found]
    foreign = {key: count for key, count in capacity(node).items() if key not in allowed and count > 0}
    if foreign:
        listed = ", ".join(f"{key}={count}" for key, count in sorted(foreign.items()))
        return MODE_MISMATCH.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"the node is in mode {found} but advertises {listed}; enabling a mode must set "
            "the other modes' resources to 0",
        )
    return MODE_MISMATCH.finding(subject, result=model.Result.PASS, detail=f"mode {found}")


def mode_resource_missing(node: Mapping[str, Any]) -> findings.Finding | None:
    """GPU208 for a GPU node with a known mode; None otherwise."""
    found = mode(node)
    if found is None or not is_gpu_node(node):
        return None
    subject = _node_ref(node)
    advertised = capacity(node)
    missing = [key for key in MODE_ESSENTIALS[found] if advertised.get(key, 0) <= 0]
    if missing:
        return MODE_MISSING.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"the node is in mode {found} but advertises no {', '.join(missing)}; "
            "is its device plugin running?",
        )
    return MODE_MISSING.finding(subject, result=model.Result.PASS, detail=f"mode {found}")


def card_model_labels(node: Mapping[str, Any]) -> findings.Finding | None:
    """GPU206 for a GPU node; None for other nodes."""
    if not is_gpu_node(node):
        return None
    subject = _node_ref(node)
    present = labels_of(node)
    missing = [key for key in CARD_MODEL_LABELS if not present.get(key)]
    if missing:
        return CARD_LABELS.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"missing {', '.join(missing)}; pods cannot select this node's card model "
            "(run the labeler on it)",
        )
    return CARD_LABELS.finding(subject, result=model.Result.PASS, detail=str(present[gpu.CARD_NAME_LABEL]))


# --- GPU207 ---------------------------------------------------------------------------------------


def mode_selector(obj: Mapping[str, Any]) -> findings.Finding | None:
    """GPU207 for a Pod or workload asking for `aliyun.com/gpu-mem` alone; None for anything else."""
    found = podspec.template(obj)
    if found is None:
        return None
    family = gpu.pod_family(found.spec)
    if family is not gpu.Family.SHARED:
        return None
    subject = findings.ObjectRef.of(obj)
    serving = frozenset(gpu.modes_for(family))
    constraint = nodeaffinity.mode_constraint(found.spec)
    if constraint is None:
        return MODE_SELECTOR.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"no nodeSelector {gpu.SCHEDULE_LABEL}; the pods can land on any of "
            f"{', '.join(gpu.modes_for(family))} nodes, with or without memory isolation",
        )
    allowed = sorted(constraint.allowed & serving)
    if not allowed:
        return None  # no serving mode at all: GPU005 refuses that
    if len(allowed) > 1:
        return MODE_SELECTOR.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"its {constraint.source} allows {', '.join(allowed)}; pick one",
        )
    return MODE_SELECTOR.finding(subject, result=model.Result.PASS, detail=constraint.source)


# --- GPU202, GPU203, GPU204: allocation annotations against the nodes ------------------------------
# The card model and occupation come from the extender's `cards` module, so audit, inspect and the
# scheduler extender read the annotations the same way.


# A card or node shared by thousands of pods must not make a message or a report result huge
# (reports live in etcd): name this many pods, then say how many more there are.
MAX_NAMED = 10
MAX_RELATED = 50


def _named(refs: list[findings.ObjectRef]) -> str:
    shown = ", ".join(ref.display for ref in refs[:MAX_NAMED])
    return shown + (f" and {len(refs) - MAX_NAMED} more" if len(refs) > MAX_NAMED else "")


def _pod_ref(namespace: str, pod_name: str, uid: str = "") -> findings.ObjectRef:
    return findings.ObjectRef(namespace=namespace, kind="Pod", name=pod_name, api_version="v1", uid=uid)


def _allocation_ref(allocation: cards.Allocation) -> findings.ObjectRef:
    return _pod_ref(allocation.namespace, allocation.name, allocation.uid)


def _active(pod: Mapping[str, Any]) -> bool:
    return podspec.mapping(pod.get("status")).get("phase") not in TERMINAL_PHASES


def _requested(pod: Mapping[str, Any]) -> dict[str, int]:
    """The GPU resources a pod holds on its node, counted as Kubernetes counts them (sidecars add up)."""
    return dict(gpu.pod_gpu_requests(podspec.mapping(pod.get("spec"))).amounts)


def overcommit(
    node: Mapping[str, Any], *, state: cards.NodeState, pods: Iterable[Mapping[str, Any]]
) -> findings.Finding | None:
    """GPU202 for a GPU node: per card (from allocation annotations) and per node (resource sums).

    `pods` are the pods bound to the node. Per card: more GiB than the card has, more than 100 %
    of its cores, or a whole-card holder sharing it. Per node: the bound pods' GPU resources add up
    to more than the node advertises (pods placed with `spec.nodeName`, past the scheduler).
    """
    if not is_gpu_node(node):
        return None
    subject = _node_ref(node)
    problems: list[str] = []
    involved: dict[findings.ObjectRef, None] = {}
    for card in state.cards:
        holders = [_allocation_ref(a) for a in card.allocations]
        reasons = []
        if card.memory_used > card.card.memory_gib:
            reasons.append(f"{card.memory_used} GiB allocated of {card.card.memory_gib} GiB")
        if card.core_used > cards.CORE_PER_CARD:
            reasons.append(f"{card.core_used}% of the cores")
        if card.whole_used and len(card.allocations) > 1:
            reasons.append(f"held whole by one pod but shared by {len(card.allocations)}")
        if reasons:
            problems.append(f"card {card.index}: {', '.join(reasons)} ({_named(holders)})")
            involved.update(dict.fromkeys(holders))
    advertised = capacity(node)
    used: dict[str, int] = {}
    requested = [(pod, _requested(pod)) for pod in pods if _active(pod)]
    for _, asked in requested:
        for key, amount in asked.items():
            used[key] = used.get(key, 0) + amount
    for key in sorted(used):
        if used[key] > advertised.get(key, 0):
            problems.append(f"pods bound to the node ask for {key}={used[key]}, the node has {advertised.get(key, 0)}")
            involved.update(dict.fromkeys(findings.ObjectRef.of(p) for p, asked in requested if asked.get(key)))
    if problems:
        return OVERCOMMIT.finding(
            subject, result=model.Result.FAIL, detail="; ".join(problems), related=list(involved)[:MAX_RELATED]
        )
    allocated = sum(card.memory_used for card in state.cards)
    detail = f"{allocated} of {state.memory_total} GiB allocated" if state.cards else "within capacity"
    return OVERCOMMIT.finding(subject, result=model.Result.PASS, detail=detail)


def missing_card(
    pod: Mapping[str, Any],
    *,
    nodes: Mapping[str, Mapping[str, Any]],
    now: float,
    models: dict[str, cards.NodeCards] | None = None,
) -> findings.Finding | None:
    """GPU204 for a pod holding a card allocation; None for pods holding none.

    `models` caches each node's card model across calls (one audit reads a node once).
    """
    allocation = cards.pod_allocation(pod, now=now)
    if allocation is None:
        return None
    subject = findings.ObjectRef.of(pod)
    node = nodes.get(allocation.node)
    shown = ",".join(str(index) for index in allocation.cards)
    if node is None:
        return MISSING_CARD.finding(
            subject, result=model.Result.FAIL, detail=f"it holds card {shown} of node {allocation.node}, which no longer exists"
        )
    model_ = models.get(allocation.node) if models is not None else None
    if model_ is None:
        model_ = cards.node_cards(node)
        if models is not None:
            models[allocation.node] = model_
    missing = [index for index in allocation.cards if model_.card(index) is None]
    if missing:
        have = ", ".join(str(card.index) for card in model_.cards) or f"none ({model_.problem})"
        listed = ",".join(str(index) for index in missing)
        return MISSING_CARD.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"it holds card {listed} of node {allocation.node}, whose cards are {have}",
            related=[_node_ref(node)],
        )
    return MISSING_CARD.finding(subject, result=model.Result.PASS, detail=f"card {shown} of node {allocation.node}")


def _annotated_node(pod: Mapping[str, Any]) -> str:
    """The node our allocation annotation names ("" where there is none); a stale one included."""
    text = annotations_of(pod).get(cards.ALLOCATION_ANNOTATION)
    if not isinstance(text, str):
        return ""
    try:
        document = json.loads(text)
    except ValueError:
        return ""
    node = document.get("node") if isinstance(document, Mapping) else None
    return node if isinstance(node, str) else ""


def stale_pod_reservation(pod: Mapping[str, Any]) -> findings.Finding | None:
    """GPU203 for a running pod with our allocation annotation: it must name the node it is bound to."""
    reserved = _annotated_node(pod)
    spec = podspec.mapping(pod.get("spec"))
    bound = spec.get("nodeName")
    if not reserved or not isinstance(bound, str) or not bound or not _active(pod):
        return None
    subject = findings.ObjectRef.of(pod)
    if reserved != bound:
        return ORPHANED.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"its {cards.ALLOCATION_ANNOTATION} reserves cards on node {reserved}, but it is bound to {bound}",
        )
    return ORPHANED.finding(subject, result=model.Result.PASS, detail=f"bound to {bound}")


def orphaned_ledger_entries(
    node: Mapping[str, Any], *, pods_by_uid: Mapping[str, Mapping[str, Any]], now: float
) -> findings.Finding | None:
    """GPU203 for a node's reservation ledger: unexpired entries must belong to a live pod of this node.

    `pods_by_uid` must hold every pod of the cluster. None for a node without a ledger.
    """
    ledger = cards.node_reservations(node)
    if not ledger:
        return None
    subject = _node_ref(node)
    node_name = name_of(node)
    problems: list[str] = []
    involved: list[findings.ObjectRef] = []
    for uid, entry in sorted(ledger.items()):
        if (entry.expires or 0.0) <= now:
            continue  # lapsed: the extender ignores it, nothing is held
        pod = pods_by_uid.get(uid)
        ref = _allocation_ref(entry)
        if pod is None:
            problems.append(f"{entry.pod_key} (uid {uid}) holds card {_cards(entry)} but no longer exists")
        elif not _active(pod):
            problems.append(f"{entry.pod_key} holds card {_cards(entry)} but has finished")
        else:
            bound = podspec.mapping(pod.get("spec")).get("nodeName")
            if bound and bound != node_name:
                problems.append(f"{entry.pod_key} holds card {_cards(entry)} but is bound to {bound}")
            else:
                continue
        involved.append(ref)
    if problems:
        shown = problems[:MAX_NAMED] + ([f"and {len(problems) - MAX_NAMED} more"] if len(problems) > MAX_NAMED else [])
        return ORPHANED.finding(subject, result=model.Result.FAIL, detail="; ".join(shown), related=involved[:MAX_RELATED])
    return ORPHANED.finding(subject, result=model.Result.PASS, detail="every reservation belongs to a pod of this node")


def _cards(allocation: cards.Allocation) -> str:
    return ",".join(str(index) for index in allocation.cards)


# --- GPU210: a bound pod's allocation against its request ----------------------------------------


def _mismatch(allocation: cards.Allocation, request: cards.Request) -> str:
    """How the allocation differs from what the pod asks for ("" where it matches)."""
    held = ",".join(str(index) for index in allocation.cards)
    if request.cards:
        if not allocation.whole or len(allocation.cards) != request.cards:
            return f"it asks for {request.describe()} but its allocation holds card {held}" + (
                "" if allocation.whole else f" with {allocation.memory_gib} GiB"
            )
        return ""
    if allocation.whole or len(allocation.cards) != 1:
        return f"it asks for {request.describe()} but its allocation holds card {held}" + (" whole" if allocation.whole else "")
    if allocation.memory_gib != request.memory_gib:
        return f"it asks for {request.describe()} but its allocation counts {allocation.memory_gib} GiB on card {held}"
    if allocation.source != "gpushare" and allocation.core_percent != request.core_percent:
        return f"it asks for {request.describe()} but its allocation counts {allocation.core_percent}% on card {held}"
    return ""


def _gpushare_disagrees(pod: Mapping[str, Any], allocation: cards.Allocation) -> str:
    """Where gpushare's annotations name other cards or GiB than our allocation ("" where they agree).

    The device plugin hands the container the card `ALIYUN_COM_GPU_MEM_IDX` names while the
    accounting counts our allocation: a difference is a card used but accounted elsewhere.
    """
    if allocation.source != "allocation":
        return ""
    annotations = annotations_of(pod)
    index = annotations.get(gpu.GPUSHARE_MEM_IDX_ANNOTATION)
    held = ",".join(str(card) for card in allocation.cards)
    if index is not None and index != held:
        return f"{gpu.GPUSHARE_MEM_IDX_ANNOTATION}={index} names another card than its {cards.ALLOCATION_ANNOTATION} (card {held})"
    memory = annotations.get(gpu.GPUSHARE_MEM_POD_ANNOTATION)
    if memory is not None and not allocation.whole and memory != str(allocation.memory_gib):
        return f"{gpu.GPUSHARE_MEM_POD_ANNOTATION}={memory} differs from its {cards.ALLOCATION_ANNOTATION} ({allocation.memory_gib} GiB)"
    return ""


def unaccounted_gpu_pod(pod: Mapping[str, Any], *, now: float) -> findings.Finding | None:
    """GPU210 for a running pod bound to a node and asking for an extender-managed resource.

    None for every other pod, and for one whose allocation names another node (GPU203's finding)
    or whose request is malformed (GPU004's).
    """
    bound = podspec.mapping(pod.get("spec")).get("nodeName")
    if not isinstance(bound, str) or not bound or not _active(pod):
        return None
    request = cards.pod_request(pod)
    if request.problem or not request.managed:
        return None
    reserved = _annotated_node(pod)
    if reserved and reserved != bound:
        return None
    subject = findings.ObjectRef.of(pod)
    allocation = cards.pod_allocation(pod, now=now)
    if allocation is None:
        return UNACCOUNTED.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"it runs on node {bound} asking for {request.describe()} but holds no card allocation "
            f"({cards.ALLOCATION_ANNOTATION} or {gpu.GPUSHARE_MEM_IDX_ANNOTATION} and {gpu.GPUSHARE_MEM_POD_ANNOTATION}): "
            "the scheduler extender never placed it (spec.nodeName at create, or a scheduler without the "
            "extender), so no card accounts for it; recreate it without nodeName",
        )
    problem = _mismatch(allocation, request) or _gpushare_disagrees(pod, allocation)
    if problem:
        return UNACCOUNTED.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"on node {bound}: {problem}; the allocation was not made by the extender for this pod",
        )
    return UNACCOUNTED.finding(
        subject, result=model.Result.PASS, detail=f"card {','.join(str(c) for c in allocation.cards)} of node {bound}"
    )


def stale_allocation(
    node: Mapping[str, Any], *, state: cards.NodeState, pods_by_uid: Mapping[str, Mapping[str, Any]], now: float
) -> findings.Finding | None:
    """GPU212 for a GPU node: no card is held by a pod that is gone. `pods_by_uid` must hold every pod.

    The extender stops counting a ledger entry of a deleted pod a few seconds after its bind
    decision and prunes it from the Node; one still there much later means the release did not
    happen. A Terminating pod counts until its object is gone, as kube-scheduler counts it; one
    far past its deletion deadline sits on a lost node and holds the cards for nothing.
    None for a node without cards.
    """
    if not state.node.cards:
        return None
    subject = _node_ref(node)
    problems: list[str] = []
    involved: list[findings.ObjectRef] = []
    for uid, entry in sorted(cards.node_reservations(node).items()):
        if (entry.expires or 0.0) <= now or uid in pods_by_uid:
            continue
        if (entry.assumed_at or 0.0) + reasons.PRUNE_DEADLINE_S > now:
            continue  # the extender releases it on its own; GPU203 names the entry meanwhile
        problems.append(f"{entry.pod_key} (uid {uid}, gone) still holds {entry.memory_gib} GiB on card {_cards(entry)} in the reservation ledger")
        involved.append(_allocation_ref(entry))
    for allocation in state.allocations:
        pod = pods_by_uid.get(allocation.uid)
        deleted = podspec.mapping(pod.get("metadata")).get("deletionTimestamp") if pod is not None else None
        deadline = cards._parse_time(deleted)  # noqa: SLF001 - the card model's one RFC 3339 reader
        if deadline is None or deadline + reasons.STUCK_TERMINATING_S > now:
            continue
        problems.append(
            f"{allocation.pod_key} has been Terminating {int(now - deadline)} s past its deletion deadline and still holds card "
            f"{_cards(allocation)}: its node is likely lost; force-delete the pod to free the card"
        )
        involved.append(_allocation_ref(allocation))
    if problems:
        shown = problems[:MAX_NAMED] + ([f"and {len(problems) - MAX_NAMED} more"] if len(problems) > MAX_NAMED else [])
        return STALE_ALLOCATION.finding(subject, result=model.Result.FAIL, detail="; ".join(shown), related=involved[:MAX_RELATED])
    return STALE_ALLOCATION.finding(subject, result=model.Result.PASS, detail="no card is held by a pod that is gone")


# --- GPU211: ConfigMaps and Secrets that can deliver a guarded name --------------------------------

_SOURCE_REF = {"ConfigMap": "configMapRef", "Secret": "secretRef"}


def env_source_takers(
    source: Mapping[str, Any], *, consumers: Iterable[Mapping[str, Any]]
) -> list[tuple[findings.ObjectRef, str, tuple[str, ...]]]:
    """(object, container label, guarded names) for every container of `consumers` (Pods and
    workloads of the source's namespace) whose envFrom of `source` delivers a guarded name: the
    prefix plus a key of the source, not set by the container's own env (env beats envFrom)."""
    kind = str(source.get("kind"))
    field = _SOURCE_REF.get(kind)
    source_name = name_of(source)
    source_keys = gpu007_env_sources.keys(source)
    if field is None or not source_keys:
        return []
    takers: list[tuple[findings.ObjectRef, str, tuple[str, ...]]] = []
    for obj in consumers:
        found = podspec.template(obj)
        if found is None or (found.is_pod and not _active(obj)):
            continue
        for ref in podspec.iter_containers(found.spec, spec_path=""):
            in_env = {e.get("name") for e in podspec.env_entries(ref.container)}
            delivered: set[str] = set()
            for entry in podspec.sequence(ref.container.get("envFrom")):
                entry = podspec.mapping(entry)
                if str(podspec.mapping(entry.get(field)).get("name", "")) != source_name:
                    continue
                prefix = entry.get("prefix")
                prefix = prefix if isinstance(prefix, str) else ""
                delivered.update(
                    prefix + key for key in source_keys if prefix + key in gpu.GUARDED_ENV and prefix + key not in in_env
                )
            if delivered:
                takers.append((findings.ObjectRef.of(obj), ref.label, tuple(sorted(delivered))))
    return takers


def guarded_env_source(
    source: Mapping[str, Any], *, consumers: Iterable[Mapping[str, Any]]
) -> findings.Finding | None:
    """GPU211 for a ConfigMap or Secret; None where it neither has a guarded key nor delivers one.

    Names keys, containers and variable names only, never a value (`source` may be keys-only,
    `gpu007_env_sources.keys_only`).
    """
    keys = gpu007_env_sources.guarded_keys(source)
    takers = env_source_takers(source, consumers=consumers)
    if not keys and not takers:
        return None
    subject = findings.ObjectRef.of(source)
    own = f"it has the key{'s' if len(keys) > 1 else ''} {', '.join(keys)}" if keys else ""
    if not takers:
        return ENV_SOURCE.finding(
            subject,
            result=model.Result.WARN,
            detail=f"{own}; no container takes it by envFrom yet, but one could: rename or remove "
            f"{'them' if len(keys) > 1 else 'it'} (GPU007 refuses every further write while it stays)",
        )
    described = [f"{ref.display} {label} gets {', '.join(names)}" for ref, label, names in takers]
    shown = "; ".join(described[:MAX_NAMED]) + (f"; and {len(described) - MAX_NAMED} more" if len(described) > MAX_NAMED else "")
    related = list(dict.fromkeys(ref for ref, _, _ in takers))[:MAX_RELATED]
    detail = f"{own + '; ' if own else ''}envFrom delivers it: {shown}; rename the keys, or change the envFrom prefix"
    return ENV_SOURCE.finding(subject, result=model.Result.FAIL, detail=detail, related=related)


# --- GPU213-GPU215: real use, from the labeler's usage summary (policies.usage) ---------------------

# A CUDA context and allocator rounding put a process somewhat above what it computes with; beyond
# this much is no rounding. `share` does not isolate, so there any excess counts.
USAGE_TOLERANCE_MIB = 512
USAGE_TOLERANCE_FRACTION = 0.10


def usage_tolerance_mib(allowed_mib: int) -> int:
    """How far above `allowed_mib` real use may go before GPU214/GPU215 report it."""
    return max(USAGE_TOLERANCE_MIB, int(allowed_mib * USAGE_TOLERANCE_FRACTION))


def node_usage(node: Mapping[str, Any]) -> usage.NodeUsage | None:
    """The labeler's usage summary on a Node (None where it has none)."""
    return _parsed_usage(annotations_of(node).get(usage.USAGE_ANNOTATION))


@functools.lru_cache(maxsize=4096)  # one entry per node summary: every pod of a node reads it
def _parsed_usage_text(text: str) -> usage.NodeUsage | None:
    return usage.parse(text)


def _parsed_usage(text: object) -> usage.NodeUsage | None:
    return _parsed_usage_text(text) if isinstance(text, str) else None


def _mib(value: int | None) -> str:
    return "? MiB" if value is None else f"{value} MiB"


def out_of_band_processes(node: Mapping[str, Any]) -> findings.Finding | None:
    """GPU213 for a node carrying a usage summary; None for a node without one."""
    summary = node_usage(node)
    if summary is None:
        return None
    subject = _node_ref(node)
    problems: list[str] = []
    for card in summary.cards:
        for entry in card.out_of_band:
            where = f"card {card.index}: pid {entry.pid} holds {_mib(entry.used_mib)}"
            if entry.pod_uid:
                where += f" in the cgroup of pod UID {entry.pod_uid}, which the apiserver does not have on this node (a static pod without a mirror pod, or a pod that is gone)"
            elif entry.container_id:
                where += f" in container {entry.container_id[:12]}, started on the node outside Kubernetes"
            else:
                where += ", a process outside any container"
            problems.append(where)
        # `truncated` counts what every list left out, pods' and unattributable ("unknown", e.g. a
        # labeler without the host's /proc) processes' too: only a full out-of-band list says
        # that some of them are out-of-band.
        if card.truncated and len(card.out_of_band) >= usage.MAX_ENTRIES:
            problems.append(f"card {card.index}: {card.truncated} more process(es) not listed in the summary")
    if problems:
        shown = problems[:MAX_NAMED] + ([f"and {len(problems) - MAX_NAMED} more"] if len(problems) > MAX_NAMED else [])
        detail = (
            f"on node {name_of(node)}: " + "; ".join(shown)
            + "; the scheduler does not count this memory: stop it, or run it as a pod that asks for the GPU"
        )
        return OUT_OF_BAND.finding(subject, result=model.Result.FAIL, detail=detail)
    return OUT_OF_BAND.finding(subject, result=model.Result.PASS, detail="every GPU process belongs to a pod of this node")


def pod_exceeds_request(
    pod: Mapping[str, Any], *, node: Mapping[str, Any] | None, now: float
) -> findings.Finding | None:
    """GPU214 for a running pod whose processes appear in its node's usage summary; None otherwise.

    Pods given whole cards (`nvidia.com/gpu`, `aliyun.com/gpu`) may use all of them and are not
    judged on memory, only on using a card that is not theirs where the allocation names it.
    """
    if node is None or not _active(pod):
        return None
    summary = node_usage(node)
    uid = str(podspec.mapping(pod.get("metadata")).get("uid") or "")
    if summary is None or not uid:
        return None
    held = summary.pod_mib(uid)
    if not held:
        return None
    subject = findings.ObjectRef.of(pod)
    spec = podspec.mapping(pod.get("spec"))
    allocation = cards.pod_allocation(pod, now=now)
    request = cards.pod_request(pod)
    node_mode = mode(node)
    problems: list[str] = []
    if allocation is not None and allocation.node == name_of(node):
        own = set(allocation.cards)
        for index, mib in sorted(held.items()):
            if index not in own:
                problems.append(f"its processes hold {mib} MiB on card {index}, which it was not given (its allocation: card {_cards(allocation)})")
        if not allocation.whole:
            allowed = allocation.memory_gib * cards.MIB_PER_GIB
            for index in sorted(own):
                mib = held.get(index, 0)
                limit = allowed if node_mode is gpu.Mode.SHARE else allowed + usage_tolerance_mib(allowed)
                if mib > limit:
                    how = "share does not isolate memory" if node_mode is gpu.Mode.SHARE else f"beyond the tolerance of {limit - allowed} MiB"
                    problems.append(f"its processes hold {mib} MiB on card {index} but it asked for {allocation.memory_gib} GiB ({allowed} MiB; {how})")
    elif not gpu.pod_requests_gpu(spec):
        listed = ", ".join(f"{mib} MiB on card {index}" for index, mib in sorted(held.items()))
        problems.append(f"it asks for no GPU but its processes hold {listed}")
    elif request.managed and not request.cards and not request.problem:
        allowed = request.memory_gib * cards.MIB_PER_GIB
        for index, mib in sorted(held.items()):
            if mib > allowed + (0 if node_mode is gpu.Mode.SHARE else usage_tolerance_mib(allowed)):
                problems.append(f"its processes hold {mib} MiB on card {index} but it asked for {request.memory_gib} GiB and holds no allocation")
    if problems:
        return POD_OVER_REQUEST.finding(
            subject, result=model.Result.FAIL,
            detail=f"on node {name_of(node)}: " + "; ".join(problems) + "; ask for what the job needs, or cap its memory",
            related=[_node_ref(node)],
        )
    used = ", ".join(f"{mib} MiB on card {index}" for index, mib in sorted(held.items()))
    return POD_OVER_REQUEST.finding(subject, result=model.Result.PASS, detail=f"uses {used}")


def card_use_exceeds_allocations(node: Mapping[str, Any], *, state: cards.NodeState) -> findings.Finding | None:
    """GPU215 for a shared-mode node with a usage summary; None otherwise.

    Real use of a card is what its processes hold (pods and out-of-band); where NVML gives no
    per-process figure, the card's memory used. Cards held whole are not judged.
    """
    summary = node_usage(node)
    if summary is None or not state.node.shared or not state.node.cards:
        return None
    subject = _node_ref(node)
    problems: list[str] = []
    for card_state in state.cards:
        real_card = summary.card(card_state.index)
        if real_card is None or card_state.whole_used:
            continue
        figures = [p.used_mib for p in real_card.pods] + [o.used_mib for o in real_card.out_of_band if o.used_mib is not None]
        real = sum(figures) if figures else real_card.used_mib
        if real is None:
            continue
        allocated = card_state.memory_used * cards.MIB_PER_GIB
        if real > allocated + usage_tolerance_mib(allocated):
            problems.append(
                f"card {card_state.index}: processes hold {real} MiB but allocations sum to {card_state.memory_used} GiB ({allocated} MiB)"
                + (f", {real_card.out_of_band_mib} MiB of it out-of-band" if real_card.out_of_band_mib else "")
            )
    if problems:
        return CARD_OVER_ALLOCATION.finding(
            subject, result=model.Result.FAIL,
            detail=f"on node {name_of(node)}: " + "; ".join(problems) + "; pods placed on this card by its allocations may run out of memory",
        )
    return CARD_OVER_ALLOCATION.finding(subject, result=model.Result.PASS, detail="every card's real use is within its allocations")
